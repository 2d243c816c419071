#!/usr/bin/env bash
# tollgate → php-fpm against nginx → php-fpm, over TCP and over a unix
# socket, for pages of 2, 20, 100 and 200 KB: p50 and p99 latency and
# requests/s for one kept-alive client (wrk -c1) and for a concurrent load
# (wrk -c<connections>). All three fronts stand before the SAME php-fpm (one
# master, two pools: `tcp` on 127.0.0.1, `unix` on a socket, `pm = static`,
# 4 children each) and run in interleaved rounds (tollgate, nginx, nginx with
# kept connections, tollgate, …) so that load from elsewhere on the machine
# hits them alike; the tables show the median of the rounds.
#
# The fronts:
# - tollgate: 2 workers, no limiter on the route, `max_conns: 4` (the pool's
#   children); it keeps its FastCGI connections open.
# - nginx: its stock FastCGI setup, a connection per request.
# - nginx-keep: `fastcgi_keep_conn on` with `keepalive 1` per worker. (More
#   idle connections than php-fpm has children stall it: each child stays
#   bound to an idle kept connection and nginx has no queue to wait for one.)
# Each checks that the script exists before php-fpm hears of it (tollgate
# always; nginx with `try_files $fastcgi_script_name =404`), each runs 2
# worker threads/processes without an access log. A front runs only during
# its own round: kept connections hold php-fpm's children, which would leave
# none for the next front.
#
# The page is `str_repeat('x', n)`: php-fpm writes its header block, then the
# rest, and leaves Nagle's algorithm on, so over TCP a front that keeps the
# connection and acknowledges late waits a delayed ACK (40 ms or more) per page.
#
#   bench/fastcgi_vs_nginx.sh [rounds] [seconds-per-run] [connections]
#                                        (default 3 5 16)
#   TOLLGATE=/path/to/tollgate bench/fastcgi_vs_nginx.sh …   (another build)
#
# With perf installed, the one-client runs also count each front's syscalls
# and context switches per page (a third table).
#
# Needs: a release build (cargo build --release), php-fpm, nginx (nginx-light),
# wrk, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
secs=${2:-5}
conns=${3:-16}
# TOLLGATE=<binary> measures another build (an older commit's) in the same setup.
bin=${TOLLGATE:-target/release/tollgate}
[ -x "$bin" ] || cargo build --release --locked
fpm=$(compgen -G "/usr/sbin/php-fpm*" | sort | tail -n1) || true
[ -n "$fpm" ] || { echo "php-fpm is missing (apt-get install php-fpm)" >&2; exit 1; }
command -v nginx >/dev/null || { echo "nginx is missing (apt-get install nginx-light)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install wrk)" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

fpm_port=$(free_port)
front_port=$(free_port)
admin_port=$(free_port)
sizes=(2048 20480 102400 204800)
mkdir -p "$work/www"
printf '<?php\n' > "$work/www/index.php"   # a directory's index, which no request asks for
# The same script under /tcp/ and /unix/: each front sends the first to the
# TCP pool and the second to the socket.
for t in tcp unix; do
    mkdir -p "$work/www/$t"
    printf '<?php\necho str_repeat("x", (int) ($_GET["n"] ?? 0));\n' > "$work/www/$t/page.php"
done

cat > "$work/php-fpm.conf" <<EOF
[global]
error_log = $work/php-fpm.log
daemonize = no
pid = $work/php-fpm.pid
[tcp]
listen = 127.0.0.1:$fpm_port
pm = static
pm.max_children = 4
[unix]
listen = $work/php-fpm.sock
pm = static
pm.max_children = 4
EOF
"$fpm" -n -R -F -y "$work/php-fpm.conf" &
pids+=($!)

cat > "$work/tollgate.yaml" <<EOF
server:
  listen: ["127.0.0.1:$front_port"]
  workers: 2
admin: { listen: "127.0.0.1:$admin_port" }
store: { backend: memory }
audit: { enabled: false }
log: { access: false }
upstreams:
  tcp: { url: "fastcgi://127.0.0.1:$fpm_port", root: "$work/www", max_conns: 4 }
  unix: { url: "fastcgi://$work/php-fpm.sock", root: "$work/www", max_conns: 4 }
routes:
  - { name: tcp, match: { path_prefix: /tcp/ }, upstream: tcp }
  - { name: unix, match: { path_prefix: /unix/ }, upstream: unix }
EOF

mkdir -p "$work/nginx"
# nginx_conf <keep: 0|1>: nginx on the front port, /tcp/ and /unix/ to the two pools.
nginx_conf() {
    local pool upstreams="" pass="" keepalive="" keep_conn=""
    if [ "$1" = 1 ]; then keepalive=" keepalive 1;"; keep_conn="fastcgi_keep_conn on;"; fi
    for pool in tcp unix; do
        local server="127.0.0.1:$fpm_port"
        [ "$pool" != unix ] || server="unix:$work/php-fpm.sock"
        upstreams+="    upstream $pool { server $server;$keepalive }"$'\n'
        pass+="        location ~ ^/$pool/.*\\.php\$ {
            try_files \$fastcgi_script_name =404;
            include /etc/nginx/fastcgi.conf;
            $keep_conn
            fastcgi_pass $pool;
        }"$'\n'
    done
    cat <<EOF
worker_processes 2;
# The master runs as whoever runs the bench; workers as the same user, so
# they can open the temp document root and php-fpm's socket.
user $(id -un);
daemon off;
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    fastcgi_temp_path $work/nginx/fastcgi;
$upstreams
    server {
        listen 127.0.0.1:$front_port;
        root $work/www;
$pass
    }
}
EOF
}
nginx_conf 0 > "$work/nginx.conf"
nginx_conf 1 > "$work/nginx-keep.conf"

front=""
# start <tollgate|nginx|nginx-keep>: runs it until stop.
start() {
    case "$1" in
        tollgate) TOLLGATE_LOG=warn "$bin" serve --config "$work/tollgate.yaml" & ;;
        nginx) nginx -p "$work/nginx" -c "$work/nginx.conf" & ;;
        nginx-keep) nginx -p "$work/nginx" -c "$work/nginx-keep.conf" & ;;
    esac
    front=$!
    pids+=("$front")
    for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$front_port") 2>/dev/null && break; sleep 0.1; done
    local t n
    for t in tcp unix; do
        for n in "${sizes[@]}"; do
            [ "$(curl -s "http://127.0.0.1:$front_port/$t/page.php?n=$n" | wc -c)" = "$n" ] \
                || { echo "$1: no page of $n bytes from /$t/" >&2; exit 1; }
        done
    done
}
stop() { kill "$front"; wait "$front" 2>/dev/null || true; }

# The front's processes: tollgate's one, nginx's workers.
front_pids() {
    if [ "$1" = tollgate ]; then echo "$front"; else pgrep -d, -P "$front"; fi
}

# run <front> <transport> <size> <clients>: one wrk run, one result line.
# With perf, a one-client run also counts the front's syscalls and context
# switches (every thread, the kernel's share that no timing isolates).
run() {
    local out url="http://127.0.0.1:$front_port/$2/page.php?n=$3" threads=2 perf_pid=""
    [ "$4" = 1 ] && threads=1
    if [ "$4" = 1 ] && command -v perf >/dev/null; then
        perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$(front_pids "$1")" \
            -o "$work/perf" -- sleep "$secs" 2>/dev/null &
        perf_pid=$!
    fi
    out=$(wrk -t"$threads" -c"$4" -d"${secs}s" --latency "$url")
    local syscalls=- switches=-
    if [ -n "$perf_pid" ] && wait "$perf_pid" 2>/dev/null; then
        syscalls=$(awk -F, '$3 == "raw_syscalls:sys_enter" { print $1 }' "$work/perf")
        switches=$(awk -F, '$3 == "context-switches" { print $1 }' "$work/perf")
    fi
    # Requests wrk gave up on (its 2 s timeout) are a result, shown in the
    # table; any other error or a non-2xx answer stops the bench.
    if grep -qE "Non-2xx|Socket errors: connect [1-9]|read [1-9]|write [1-9]" <<<"$out"; then
        echo "errors from $1 $url:" >&2; echo "$out" >&2; exit 1
    fi
    awk -v f="$1" -v t="$2" -v n="$3" -v c="$4" -v sc="$syscalls" -v sw="$switches" '
        function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
        $1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) } /^Requests\/sec/ { rps = $2 }
        /Socket errors/ { timeouts = $NF }
        /requests in/ { requests = $1 }
        END { printf "%s %s %s %s %.3f %.3f %.0f %d %d %s %s\n", f, t, n, c, p50, p99, rps, timeouts, requests, sc, sw }' <<<"$out"
}

results=$work/results
for r in $(seq "$rounds"); do
    for f in tollgate nginx nginx-keep; do
        start "$f"
        for t in tcp unix; do
            for n in "${sizes[@]}"; do
                for c in 1 "$conns"; do run "$f" "$t" "$n" "$c" >> "$results"; done
            done
        done
        stop
        echo "round $r: $f done" >&2
    done
done

python3 - "$results" "$rounds" "$secs" "$conns" <<'PY'
import statistics, sys
from collections import defaultdict
path, rounds, secs, conns = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
cells = defaultdict(list)
per_page = defaultdict(list)
for line in open(path):
    f, t, n, c, p50, p99, rps, timeouts, requests, syscalls, switches = line.split()
    cells[(f, t, int(n), int(c))].append((float(p50), float(p99), float(rps), int(timeouts)))
    if syscalls != "-" and int(requests) > 0:
        # perf counts over the run's seconds, wrk's requests over the same.
        per_page[(f, t, int(n))].append((float(syscalls) / int(requests), float(switches) / int(requests)))
fronts = ["tollgate", "nginx", "nginx-keep"]
def med(values, i):
    return statistics.median(v[i] for v in values)
for c, title in [(1, "one kept-alive client (wrk -t1 -c1)"), (int(conns), f"concurrent (wrk -t2 -c{conns})")]:
    print(f"\n{title}, median of {rounds} rounds x {secs} s: p50 / p99 ms, requests/s"
          " (requests wrk gave up on after 2 s, all rounds)\n")
    print("| php-fpm over | page | " + " | ".join(fronts) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in fronts) + " |")
    for t in ["tcp", "unix"]:
        for n in sorted({k[2] for k in cells}):
            row = []
            for f in fronts:
                v = cells[(f, t, n, c)]
                timeouts = sum(x[3] for x in v)
                late = f" ({timeouts} timed out)" if timeouts else ""
                row.append(f"{med(v, 0):.2f} / {med(v, 1):.2f}, {med(v, 2):,.0f}{late}")
            print(f"| {'TCP' if t == 'tcp' else 'unix socket'} | {n // 1024} KB | " + " | ".join(row) + " |")
if per_page:
    print(f"\nthe front's syscalls / context switches per page, one client (perf stat), median of {rounds} rounds\n")
    print("| php-fpm over | page | " + " | ".join(fronts) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in fronts) + " |")
    for t in ["tcp", "unix"]:
        for n in sorted({k[2] for k in per_page}):
            row = [f"{med(per_page[(f, t, n)], 0):.1f} / {med(per_page[(f, t, n)], 1):.2f}" if per_page[(f, t, n)] else "-"
                   for f in fronts]
            print(f"| {'TCP' if t == 'tcp' else 'unix socket'} | {n // 1024} KB | " + " | ".join(row) + " |")
PY
