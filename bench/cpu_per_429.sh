#!/bin/bash
# CPU per 429, measured natively (not under callgrind): one tollgate binary,
# 2 workers, SQLite store, one route refusing every request after the first;
# wrk keeps 16 connections busy for 10 s after a 3 s warm-up, optionally with
# an Accept-Encoding (a browser sends 'gzip, deflate, br'); the CPU is the
# process's utime + stime over the measured run. Alternate two binaries for
# an A/B on a shared machine:
#
#   bench/cpu_per_429.sh target/release/tollgate 'gzip, deflate, br'
#   PORT=24181 bench/cpu_per_429.sh /tmp/ab/tollgate-A
set -euo pipefail
bin=$1
accept=${2:-}
port=${PORT:-23181}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/c.yaml" <<YAML
server: { listen: ["127.0.0.1:$port"], workers: 2 }
admin: { listen: "127.0.0.1:$((port + 1))" }
store: { backend: sqlite, path: $dir/x.db }
limiters: { one: { algorithm: fixed_window, limit: 1, window: 3600s, key: client } }
routes:
  - { name: r, match: { path_prefix: / }, respond: { status: 200, body: ok }, limiters: [one] }
YAML
"$bin" --config "$dir/c.yaml" > "$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
header=()
[ -n "$accept" ] && header=(-H "Accept-Encoding: $accept")
wrk -t1 -c16 -d3s "${header[@]}" "http://127.0.0.1:$port/" > /dev/null
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(cpu)
out=$(wrk -t1 -c16 -d10s "${header[@]}" "http://127.0.0.1:$port/")
after=$(cpu)
requests=$(echo "$out" | grep -o '[0-9]* requests in' | awk '{print $1}')
refused=$(echo "$out" | grep -o 'Non-2xx or 3xx responses: [0-9]*' | awk '{print $NF}')
ticks=$(getconf CLK_TCK)
python3 -c "
cpu = ($after - $before) / $ticks
print(f'$(basename "$bin") [$accept]: {$requests} requests ({${refused:-0}} refused), {cpu:.2f} s CPU, {cpu / $requests * 1e6:.1f} us per request, {$requests / 10:.0f} per second')"
