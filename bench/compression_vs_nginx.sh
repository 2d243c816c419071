#!/usr/bin/env bash
# tollgate's static files + compression against nginx `gzip on`, serving the
# SAME files, measured in the same run in interleaved rounds (tollgate gzip,
# tollgate br, nginx gzip on, nginx gzip_comp_level 5, …; tollgate at the
# levels of its source, src/compression/stream.rs), so load from
# elsewhere on the machine hits all alike; the table shows medians.
#
# The files: the dashboard's HTML, JS and CSS and a 2000-record JSON
# document (what a site sends most). wrk cycles through them with
# `Accept-Encoding` set; CPU per request is read from /proc/<pid>/stat
# (utime + stime of the server's processes) around each round, and the
# bytes per response from one request of each file.
#
#   bench/compression_vs_nginx.sh [rounds] [seconds-per-round] [connections]
#                                              (default 5 10 32)
#
# Needs: a release build (cargo build --release), nginx (nginx-light), wrk.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-10}
conns=${3:-32}
bin=target/release/tollgate
[ -x "$bin" ] || cargo build --release --locked
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

mkdir -p "$work/www" "$work/nginx"
# nginx workers run as an unprivileged user: mktemp -d is 0700.
chmod 755 "$work"
# Realistic files where Debian has them (python3's policy manual, Bootstrap
# 4's stylesheet, jQuery), else the dashboard's: the same as
# benches/compression.rs uses.
first() { for f in "$@"; do [ -r "$f" ] && { echo "$f"; return; }; done; }
cp "$(first /usr/share/doc/python3/python-policy.html src/dashboard/index.html)" "$work/www/page.html"
cp "$(first /usr/share/javascript/jquery/jquery.min.js src/dashboard/dashboard.js)" "$work/www/app.js"
cp "$(first /usr/share/javascript/bootstrap4/css/bootstrap.min.css src/dashboard/dashboard.css)" "$work/www/style.css"
python3 -c '
import json
print(json.dumps([{"id": i, "name": f"user{i}", "email": f"user{i}@example.com",
                   "active": i % 3 != 0, "roles": ["reader", "writer"]} for i in range(2000)]))
' > "$work/www/users.json"
files=(page.html app.js style.css users.json)
cat > "$work/paths.lua" <<'EOF'
local paths = {"/page.html", "/app.js", "/style.css", "/users.json"}
local i = 0
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
EOF

cat > "$work/tollgate.yaml" <<EOF
server:
  listen: ["127.0.0.1:18181"]
  workers: 2
log: { access: false }
admin: { listen: "127.0.0.1:19912" }
store: { backend: memory }
audit: { enabled: false }
upstreams:
  site: { url: "fastcgi://$work/nobody.sock", root: "$work/www" }
routes:
  - { name: site, match: { path_prefix: / }, upstream: site }
EOF
TOLLGATE_LOG=warn "$bin" serve --config "$work/tollgate.yaml" &
tg=$!
pids+=("$tg")

# nginx's own defaults besides `gzip on`: gzip_comp_level 1, gzip_min_length 20;
# gzip_types as Debian's default site suggests. A second server at level 5
# (tollgate's gzip level) for the like-for-like row.
nginx_conf() { # nginx_conf <port> <level>
cat > "$work/nginx/$1.conf" <<EOF
worker_processes 2;
pid $work/nginx/$1.pid;
error_log $work/nginx/$1.err;
daemon off;
events { worker_connections 1024; }
http {
    include /etc/nginx/mime.types;
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    gzip on;
    gzip_comp_level $2;
    gzip_types text/css application/javascript text/javascript application/json;
    server {
        listen 127.0.0.1:$1;
        root $work/www;
    }
}
EOF
nginx -c "$work/nginx/$1.conf" -p "$work/nginx" &
pids+=($!)
}
nginx_conf 18182 1
nginx_conf 18183 5
for port in 18181 18182 18183; do
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done

# CPU ticks of a server: its processes (nginx: the master and its workers).
ticks() { # ticks <pid>
    local total=0 p
    for p in $1 $(pgrep -P "$1" || true); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo "$total"
}
hz=$(getconf CLK_TCK)

declare -A rps cpu
gz=$(sed -n 's/^pub const GZIP_LEVEL: u32 = \([0-9]*\);/\1/p' src/compression/stream.rs)
br=$(sed -n 's/^pub const BROTLI_QUALITY: u32 = \([0-9]*\);/\1/p' src/compression/stream.rs)
names=("tollgate gzip $gz" "tollgate br $br" "nginx gzip on (level 1)" "nginx gzip level 5")
ports=(18181 18181 18182 18183)
accept=("gzip" "gzip, br" "gzip" "gzip")
servers=("$tg" "$tg" "${pids[1]}" "${pids[2]}")

echo "bytes per response (Accept-Encoding as in the rows):"
for i in "${!names[@]}"; do
    sizes=""
    for f in "${files[@]}"; do
        n=$(curl -s -H "Accept-Encoding: ${accept[$i]}" "http://127.0.0.1:${ports[$i]}/$f" | wc -c)
        sizes+="$f $n  "
    done
    echo "  ${names[$i]}: $sizes"
done
orig=""
for f in "${files[@]}"; do orig+="$f $(wc -c < "$work/www/$f")  "; done
echo "  uncompressed: $orig"

# Interleaved, and the order rotates each round, so no row always runs
# first (or right after the same neighbour).
n=${#names[@]}
for r in $(seq "$rounds"); do
    for k in $(seq 0 $((n - 1))); do
        i=$(( (k + r - 1) % n ))
        before=$(ticks "${servers[$i]}")
        out=$(wrk -t2 -c"$conns" -d"${secs}s" -s "$work/paths.lua" \
            -H "Accept-Encoding: ${accept[$i]}" "http://127.0.0.1:${ports[$i]}")
        after=$(ticks "${servers[$i]}")
        reqs=$(echo "$out" | awk '/requests in/ {print $1}')
        r_s=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
        us=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$reqs" 'BEGIN {printf "%.1f", t / hz * 1e6 / n}')
        rps[$i]+="$r_s "
        cpu[$i]+="$us "
        echo "round $r ${names[$i]}: $r_s req/s, $us µs CPU/request, load $(cut -d' ' -f1 /proc/loadavg)" >&2
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| server | requests/s (median of $rounds × ${secs}s) | CPU µs per request (median) | all rounds (req/s) |"
echo "| --- | --- | --- | --- |"
for i in "${!names[@]}"; do
    echo "| ${names[$i]} | $(echo "${rps[$i]}" | median) | $(echo "${cpu[$i]}" | median) | ${rps[$i]}|"
done

# Same-round ratios (row / nginx at level 5, the like-for-like gzip row):
# medians of the per-round ratios, which load from elsewhere hits alike.
ratio() { # ratio <values a> <values b>
    paste <(echo "$1" | tr ' ' '\n' | grep -v '^$') <(echo "$2" | tr ' ' '\n' | grep -v '^$') |
        awk '{print $1 / $2}' | median
}
echo
echo "| server | req/s ÷ nginx level 5 (median of same-round ratios) | CPU per request ÷ nginx level 5 |"
echo "| --- | --- | --- |"
for i in "${!names[@]}"; do
    echo "| ${names[$i]} | $(ratio "${rps[$i]}" "${rps[3]}") | $(ratio "${cpu[$i]}" "${cpu[3]}") |"
done
