#!/usr/bin/env bash
# tollgate on one Redis node against tollgate on a 3-primary Redis Cluster, same machine, same run.
#
# Starts one redis-server and a 3-primary cluster (no replicas, no
# persistence), and two release-build tollgates that differ only in `store:`
# (`url:` vs `cluster:`), each answering `/ping` itself behind one per-client
# fixed-window limiter that never triggers. wrk sends every request as another
# client (a random X-Forwarded-For from 127.0.0.1, a trusted proxy), so the
# cluster spreads the keys over its three primaries. Interleaved rounds (node,
# cluster, node, …); prints requests/s (= limiter decisions/s) and p50/p99 per
# round and their medians.
#
#   bench/redis_node_vs_cluster.sh           # 3 rounds of 10 s, 64 connections
#   ROUNDS=5 DURATION=20s bench/redis_node_vs_cluster.sh
#   TIMEOUT=500ms bench/redis_node_vs_cluster.sh   # store.timeout (default 50ms) on a loaded machine
#
# On one machine the cluster's three primaries share its cores with wrk and
# tollgate: this measures the cost of the cluster client, not the fleet-wide
# ceiling (which grows with the primaries' machines). Listens on
# 127.0.0.1:19300-19331; everything is stopped when the script exits.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
TIMEOUT=${TIMEOUT:-50ms}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TOLLGATE_BIN:-$ROOT/target/release/tollgate}

for tool in redis-server redis-cli wrk; do
    command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y redis-server wrk)" >&2; exit 1; }
done
[ -n "${TOLLGATE_BIN:-}" ] || (cd "$ROOT" && cargo build --release --quiet)

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

redis() { # port [extra args]
    local port=$1; shift
    mkdir -p "$WORK/r$port"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/r$port" "$@" >"$WORK/r$port.log" 2>&1 &
    PIDS+=($!)
}
redis 19300
for port in 19301 19302 19303; do
    redis "$port" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000
done
for port in 19300 19301 19302 19303; do
    for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
done
redis-cli --cluster create 127.0.0.1:19301 127.0.0.1:19302 127.0.0.1:19303 --cluster-yes >"$WORK/create.log"
for _ in $(seq 100); do
    redis-cli -p 19301 cluster info | grep -q cluster_state:ok && break
    sleep 0.1
done

config() { # name port admin store-yaml
    cat >"$WORK/$1.yaml" <<EOF
server: { listen: ["127.0.0.1:$2"] }
admin: { listen: "127.0.0.1:$3" }
store: $4
audit: { enabled: false }
identity: { trusted_proxies: [127.0.0.1/32] }
limiters:
  roomy: { algorithm: fixed_window, limit: 1000000000, window: 60s, key: client }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200, body: "pong\n" }, limiters: [roomy] }
EOF
    (cd "$WORK" && TOLLGATE_LOG=warn exec "$BIN" serve --config "$WORK/$1.yaml" >"$WORK/$1.log" 2>&1) &
    PIDS+=($!)
}
config node 19310 19311 "{ backend: redis, url: \"redis://127.0.0.1:19300/0\", timeout: $TIMEOUT, on_error: deny }"
config cluster 19320 19321 "{ backend: redis, cluster: [\"redis://127.0.0.1:19301\"], timeout: $TIMEOUT, on_error: deny }"

for admin in 19311 19321; do
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break
        sleep 0.1
    done
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null || { echo "tollgate on admin $admin never got ready" >&2; cat "$WORK"/*.log >&2; exit 1; }
done

cat >"$WORK/clients.lua" <<'EOF'
-- Every request from another of 65,536 clients.
request = function()
  local ip = "10.1." .. math.random(0, 255) .. "." .. math.random(0, 255)
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = ip })
end
EOF

pct_ms() {
    awk -v p="$1" '$1 == p { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 } print v }'
}
rps() { awk '/^Requests\/sec:/ { print $2 }'; }

declare -A RPS P50 P99
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency -s clients.lua http://127.0.0.1:<port>/ping, $ROUNDS interleaved rounds"
printf '%-6s %-8s %12s %10s %10s\n' round store 'req/s' 'p50 ms' 'p99 ms'
for round in $(seq "$ROUNDS"); do
    for store in node cluster; do
        port=19310; [ "$store" = cluster ] && port=19320
        out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$WORK/clients.lua" "http://127.0.0.1:$port/ping")
        if echo "$out" | grep -q 'Non-2xx'; then
            echo "$store: non-2xx answers during the run:" >&2; echo "$out" >&2
            tail -5 "$WORK/$store.log" >&2
            curl -s "http://127.0.0.1:$((port + 1))/metrics" | grep -E '^tollgate_store_(errors|fallback)_total' >&2; exit 1
        fi
        r=$(echo "$out" | rps); m=$(echo "$out" | pct_ms 50%); p=$(echo "$out" | pct_ms 99%)
        RPS[$store]+="$r "; P50[$store]+="$m "; P99[$store]+="$p "
        printf '%-6s %-8s %12s %10s %10s\n' "$round" "$store" "$r" "$m" "$p"
    done
done

echo
echo "keys per cluster primary (spread by client):"
for port in 19301 19302 19303; do
    echo "  127.0.0.1:$port $(redis-cli -p "$port" dbsize)"
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo
printf '%-8s %12s %10s %10s\n' median 'req/s' 'p50 ms' 'p99 ms'
for store in node cluster; do
    printf '%-8s %12s %10s %10s\n' "$store" "$(echo "${RPS[$store]}" | median)" \
        "$(echo "${P50[$store]}" | median)" "$(echo "${P99[$store]}" | median)"
done
