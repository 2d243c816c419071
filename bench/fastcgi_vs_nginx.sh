#!/usr/bin/env bash
# tollgate → php-fpm against nginx → php-fpm: requests per second for a
# trivial PHP script, both in front of the SAME php-fpm pool (one master, a
# unix socket, pm = static), measured in the same run, in interleaved rounds
# (tollgate, nginx, tollgate, …) so that load from elsewhere on the machine
# hits both alike; the table shows the median of the rounds.
#
# tollgate keeps its FastCGI connections open, at most `max_conns` (= the
# pool's 4 children); nginx runs its stock FastCGI setup, a connection per
# request. (nginx with `fastcgi_keep_conn on` + `keepalive` stalls as soon as
# more requests run than php-fpm has children: each child stays bound to an
# idle kept connection, and nginx has no queue to wait for one; measured
# here at ~100 req/s with wrk timeouts.) Both check that the
# script exists before php-fpm hears of it (tollgate always; nginx with
# `try_files $fastcgi_script_name =404`), both run 2 worker threads/processes,
# no access log, and tollgate has no limiter on the route (the cost of limits
# is measured elsewhere: bench/proxybench.py).
#
#   bench/fastcgi_vs_nginx.sh [rounds] [seconds-per-round] [connections]
#                                        (default 5 10 32)
#
# Needs: a release build (cargo build --release), php-fpm, nginx (nginx-light), wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-10}
conns=${3:-32}
bin=target/release/tollgate
[ -x "$bin" ] || cargo build --release --locked
fpm=$(compgen -G "/usr/sbin/php-fpm*" | sort | tail -n1)
[ -n "$fpm" ] || { echo "php-fpm is missing (apt-get install php-fpm)" >&2; exit 1; }
command -v nginx >/dev/null || { echo "nginx is missing (apt-get install nginx-light)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is missing (apt-get install wrk)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/www"
printf '<?php\necho "hello\\n";\n' > "$work/www/hello.php"

cat > "$work/php-fpm.conf" <<EOF
[global]
error_log = $work/php-fpm.log
daemonize = no
pid = $work/php-fpm.pid
[www]
listen = $work/php-fpm.sock
pm = static
pm.max_children = 4
EOF
"$fpm" -n -R -F -y "$work/php-fpm.conf" &
pids+=($!)

cat > "$work/tollgate.yaml" <<EOF
server:
  listen: ["127.0.0.1:18081"]
  workers: 2
admin: { listen: "127.0.0.1:19902" }
store: { backend: memory }
audit: { enabled: false }
upstreams:
  php: { url: "fastcgi://$work/php-fpm.sock", root: "$work/www", max_conns: 4 }
routes:
  - { name: php, match: { path_prefix: / }, upstream: php }
EOF
# tollgate runs only during its own rounds: its kept connections bind php-fpm
# children (all 4 of them when idle), which would leave none for nginx.
tg=""
start_tollgate() {
    TOLLGATE_LOG=warn "$bin" serve --config "$work/tollgate.yaml" &
    tg=$!
    pids+=("$tg")
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18081) 2>/dev/null && break; sleep 0.1; done
}
stop_tollgate() { kill "$tg"; wait "$tg" 2>/dev/null || true; }

mkdir -p "$work/nginx"
cat > "$work/nginx.conf" <<EOF
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
    upstream php { server unix:$work/php-fpm.sock; }
    server {
        listen 127.0.0.1:18082;
        root $work/www;
        location ~ \.php\$ {
            try_files \$fastcgi_script_name =404;
            include /etc/nginx/fastcgi.conf;
            fastcgi_pass php;
        }
    }
}
EOF
nginx -p "$work/nginx" -c "$work/nginx.conf" &
pids+=($!)

for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18082) 2>/dev/null && break; sleep 0.1; done
start_tollgate
for url in http://127.0.0.1:18081/hello.php http://127.0.0.1:18082/hello.php; do
    [ "$(curl -s "$url")" = "hello" ] || { echo "no hello from $url" >&2; exit 1; }
done

rps() { # rps <url>: requests/s of one wrk run (non-2xx answers are an error)
    local out
    out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency "$1")
    if grep -qE "Non-2xx|Socket errors" <<<"$out"; then echo "errors from $1:" >&2; echo "$out" >&2; exit 1; fi
    awk '/^Requests\/sec/ {print $2}' <<<"$out"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

# Warm both (php-fpm's opcache is off with -n: each request compiles the script, for both alike).
wrk -t2 -c"$conns" -d2s http://127.0.0.1:18081/hello.php >/dev/null
stop_tollgate
wrk -t2 -c"$conns" -d2s http://127.0.0.1:18082/hello.php >/dev/null

t=() n=()
for r in $(seq "$rounds"); do
    start_tollgate
    t+=("$(rps http://127.0.0.1:18081/hello.php)")
    stop_tollgate
    n+=("$(rps http://127.0.0.1:18082/hello.php)")
    echo "round $r: tollgate ${t[-1]} req/s, nginx ${n[-1]} req/s"
done
tm=$(printf '%s\n' "${t[@]}" | median)
nm=$(printf '%s\n' "${n[@]}" | median)
echo
echo "| front of php-fpm | requests/s (median of $rounds × ${secs}s, wrk -t2 -c$conns) | all rounds |"
echo "| --- | --- | --- |"
echo "| tollgate → php-fpm | $tm | ${t[*]} |"
echo "| nginx → php-fpm | $nm | ${n[*]} |"
awk -v t="$tm" -v n="$nm" 'BEGIN { printf "tollgate / nginx: %.2f\n", t / n }'
