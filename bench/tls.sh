#!/usr/bin/env bash
# TLS cost, measured in one run against one tollgate: new connections per
# second with a full handshake each (h2load, and openssl s_time), then requests
# per second on kept-alive connections for plain HTTP/1.1, HTTP/1.1 over TLS and
# HTTP/2 over TLS (h2load, from Debian's nghttp2-client). The load generator
# runs on the same machine: on a small one it takes half the CPU.
# The route answers locally (`respond`), so what differs is only the transport.
#
#   bench/tls.sh [seconds-per-run]        (default 10)
#
# Needs: a release build (cargo build --release), openssl, h2load.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
command -v h2load >/dev/null || { apt-get update -qq && apt-get install -y -qq nghttp2-client >/dev/null; }
bin=target/release/tollgate
[ -x "$bin" ] || cargo build --release --locked

work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
# ECDSA P-256, what certbot issues by default.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
    -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
cat >"$work/tollgate.yaml" <<EOF
server:
  listen: ["127.0.0.1:18080"]
  tls: { cert: $work/cert.pem, key: $work/key.pem, listen: ["127.0.0.1:18443"] }
admin: { listen: "127.0.0.1:19901" }
store: { backend: memory }
audit: { enabled: false }
routes:
  - { name: ping, match: { path: /ping }, respond: { status: 200, body: "pong\n" } }
EOF
TOLLGATE_LOG=warn "$bin" serve --config "$work/tollgate.yaml" &
pid=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/18443) 2>/dev/null && break; sleep 0.1; done

tck=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; } # tollgate's user+system ticks

echo "== new connections: one handshake + one request each (h2load -n N -c N), with tollgate's CPU per connection"
conns() { # conns <label> <h2load args...>
    local label=$1 a b
    shift
    a=$(cpu)
    h2load "$@" -n 10000 -c 10000 -t 1 2>/dev/null | grep -E "^finished in" | while read -r line; do echo "$label: $line"; done
    b=$(cpu)
    echo "$label: tollgate CPU $(( (b - a) * 1000000 / tck / 10000 )) us per connection"
}
conns "TLS 1.3 + h2      " https://127.0.0.1:18443/ping
conns "TLS 1.3 + HTTP/1.1" --h1 https://127.0.0.1:18443/ping
conns "plain HTTP/1.1    " --h1 http://127.0.0.1:18080/ping

echo "== full TLS handshakes, one client at a time (openssl s_time -new)"
for v in -tls1_3 -tls1_2; do
    echo "-- $v"
    openssl s_time -connect 127.0.0.1:18443 -new "$v" -time "$secs" 2>/dev/null | grep -E "real seconds"
done

run() { # run <label> <h2load args...>
    echo "-- $1"
    shift
    h2load "$@" 2>/dev/null | grep -E "^finished in|^requests:|^status codes:"
}
echo "== requests (h2load, ${secs}s each, 50 connections)"
run "HTTP/1.1 plain"            --h1 -D "$secs" -c 50 -t 1 http://127.0.0.1:18080/ping
run "HTTP/1.1 over TLS"         --h1 -D "$secs" -c 50 -t 1 https://127.0.0.1:18443/ping
run "HTTP/2 over TLS, 1 stream" -D "$secs" -c 50 -m 1 -t 1 https://127.0.0.1:18443/ping
run "HTTP/2 over TLS, 10 streams" -D "$secs" -c 50 -m 10 -t 1 https://127.0.0.1:18443/ping
