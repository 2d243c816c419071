#!/usr/bin/env bash
# Counters changed while the SQLite store could not be written: how many reach the file?
#
#   lock: sqlite3 holds BEGIN EXCLUSIVE for LOCK_SECONDS while KEYS clients
#         each make 3 requests; then COMMIT, a pause, SIGTERM.
#   full: (root) a 4 MiB tmpfs is filled while KEYS clients each make 3
#         requests; then the filler is removed, a pause, SIGTERM.
# Each prints the keys stored of those counted during the fault, the exit status,
# how many writes failed (proof the fault bit), and the slowest request meanwhile.
#
#   bench/store_faults.sh                       # both, 100 keys, 15 s lock
#   KEYS=40 LOCK_SECONDS=10 bench/store_faults.sh lock
#   BIN=target/release/tollgate bench/store_faults.sh full
#
# Needs curl and sqlite3. Listens on 127.0.0.1:19300-19301.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/debug/tollgate}
KEYS=${KEYS:-100}
LOCK_SECONDS=${LOCK_SECONDS:-15}
SCENARIOS=${*:-lock full}
[ -x "$BIN" ] || cargo build --quiet

work=$(mktemp -d)
tg_pid=""
cleanup() {
    [ -n "$tg_pid" ] && kill -9 "$tg_pid" 2>/dev/null || true
    mountpoint -q "$work/disk" 2>/dev/null && umount -l "$work/disk"
    rm -rf "$work"
}
trap cleanup EXIT

start() { # start <db path>
    cat > "$work/tollgate.yaml" <<EOF
server: { listen: ["127.0.0.1:19300"] }
admin: { listen: "127.0.0.1:19301" }
store: { path: "$1", flush_interval: 100ms }
limiters:
  two: { limit: 2, window: 86400s, key: "header:X-User" }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200, body: pong }, limiters: [two] }
EOF
    "$BIN" serve --config "$work/tollgate.yaml" > "$work/log" 2>&1 &
    tg_pid=$!
    for _ in $(seq 100); do
        curl -fs http://127.0.0.1:19301/healthz > /dev/null && return
        sleep 0.1
    done
    echo "tollgate did not start:"; cat "$work/log"; exit 1
}

load() { # load <tag>: 3 requests per key; prints the slowest in ms
    local slowest=0 t
    for i in $(seq "$KEYS"); do
        for _ in 1 2 3; do
            t=$(curl -s -o /dev/null -w '%{time_total}' -H "X-User: $1-$i" http://127.0.0.1:19300/ping)
            slowest=$(awk -v a="$slowest" -v b="$t" 'BEGIN { print (b * 1000 > a) ? b * 1000 : a }')
        done
    done
    printf '%.0f' "$slowest"
}

stop() { # stop: SIGTERM; sets $status to the exit status
    kill -TERM "$tg_pid"
    status=0
    wait "$tg_pid" || status=$?
    tg_pid=""
}

failed_writes() { grep -c "persisting counters to SQLite failed" "$work/log" || true; }

stored() { # stored <db> <tag>
    sqlite3 "$1" "SELECT count(*) FROM rate_limit_windows WHERE key LIKE '%$2-%' AND count = 3"
}

for scenario in $SCENARIOS; do
    case $scenario in
    lock)
        db="$work/lock.db"
        start "$db"
        coproc HOLD { sqlite3 "$db"; }
        echo "BEGIN EXCLUSIVE; SELECT 'locked';" >&"${HOLD[1]}"
        read -r _ <&"${HOLD[0]}"
        started=$(date +%s)
        slowest=$(load locked)
        sleep $((LOCK_SECONDS - ($(date +%s) - started) > 0 ? LOCK_SECONDS - ($(date +%s) - started) : 0))
        echo "COMMIT;" >&"${HOLD[1]}"
        exec {HOLD[1]}>&-
        wait "$HOLD_PID" || true
        sleep 6
        stop
        echo "lock ${LOCK_SECONDS}s: $(stored "$db" locked) of $KEYS keys stored; exit $status; $(failed_writes) failed writes; slowest request during the lock ${slowest} ms"
        ;;
    full)
        if [ "$(id -u)" -ne 0 ]; then
            echo "full: SKIPPED (needs root to mount a tmpfs)"
            continue
        fi
        mkdir "$work/disk"
        mount -t tmpfs -o size=4m tmpfs "$work/disk"
        db="$work/disk/full.db"
        start "$db"
        sleep 0.5
        dd if=/dev/zero of="$work/disk/filler" bs=64k 2>/dev/null || true
        slowest=$(load full)
        sleep 1
        rm "$work/disk/filler"
        sleep 6
        stop
        echo "disk full: $(stored "$db" full) of $KEYS keys stored; exit $status; $(failed_writes) failed writes; slowest request while full ${slowest} ms"
        umount -l "$work/disk"
        ;;
    *) echo "unknown scenario $scenario (lock, full)"; exit 1 ;;
    esac
done
