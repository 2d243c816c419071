#!/usr/bin/env bash
# tollgate with the Redis store against tollgate with the SQLite store, same machine, same run.
#
# Starts a redis-server (no persistence) and two release-build tollgates that
# differ only in `store:`, each answering `/ping` itself behind one
# fixed-window limiter that never triggers (every request still runs the
# full check → record path in its store). Then runs interleaved wrk rounds
# (sqlite, redis, sqlite, redis, …) and prints requests/s and p99 latency per
# round and their medians.
#
#   bench/redis_vs_sqlite.sh                 # 3 rounds of 10 s, 64 connections
#   ROUNDS=5 DURATION=20s CONNECTIONS=128 bench/redis_vs_sqlite.sh
#
# Needs redis-server and wrk (apt-get install -y redis-server wrk). Listens on
# 127.0.0.1:19200-19221; everything is stopped when the script exits.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TOLLGATE_BIN:-$ROOT/target/release/tollgate}

for tool in redis-server wrk; do
    command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y $tool)" >&2; exit 1; }
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

redis-server --port 19200 --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)

config() { # name port admin store-yaml
    cat >"$WORK/$1.yaml" <<EOF
server: { listen: ["127.0.0.1:$2"] }
admin: { listen: "127.0.0.1:$3" }
store: $4
audit: { enabled: false }
limiters:
  roomy: { algorithm: fixed_window, limit: 1000000000, window: 60s, key: client }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200, body: "pong\n" }, limiters: [roomy] }
EOF
    (cd "$WORK" && TOLLGATE_LOG=warn "$BIN" serve --config "$WORK/$1.yaml" >"$WORK/$1.log" 2>&1) &
    PIDS+=($!)
}
config sqlite 19210 19211 "{ backend: sqlite, path: $WORK/tollgate.db }"
config redis 19220 19221 "{ backend: redis, url: \"redis://127.0.0.1:19200/0\", timeout: 50ms, on_error: deny }"

for admin in 19211 19221; do
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break
        sleep 0.1
    done
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null || { echo "tollgate on admin $admin never got ready" >&2; cat "$WORK"/*.log >&2; exit 1; }
done

# A percentile ("50%", "99%") from wrk --latency, in milliseconds.
pct_ms() {
    awk -v p="$1" '$1 == p { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 } print v }'
}
rps() { awk '/^Requests\/sec:/ { print $2 }'; }

declare -A RPS P50 P99
echo "wrk -t$THREADS -c$CONNECTIONS -d$DURATION --latency http://127.0.0.1:<port>/ping, $ROUNDS interleaved rounds"
printf '%-6s %-7s %12s %10s %10s\n' round store 'req/s' 'p50 ms' 'p99 ms'
for round in $(seq "$ROUNDS"); do
    for store in sqlite redis; do
        port=19210; [ "$store" = redis ] && port=19220
        out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency "http://127.0.0.1:$port/ping")
        if echo "$out" | grep -q 'Non-2xx'; then
            echo "$store: non-2xx answers during the run:" >&2; echo "$out" >&2; exit 1
        fi
        r=$(echo "$out" | rps); m=$(echo "$out" | pct_ms 50%); p=$(echo "$out" | pct_ms 99%)
        RPS[$store]+="$r "; P50[$store]+="$m "; P99[$store]+="$p "
        printf '%-6s %-7s %12s %10s %10s\n' "$round" "$store" "$r" "$m" "$p"
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo
printf '%-7s %12s %10s %10s\n' median 'req/s' 'p50 ms' 'p99 ms'
for store in sqlite redis; do
    printf '%-7s %12s %10s %10s\n' "$store" "$(echo "${RPS[$store]}" | median)" \
        "$(echo "${P50[$store]}" | median)" "$(echo "${P99[$store]}" | median)"
done
