#!/usr/bin/env python3
"""Instructions and syscalls per request: tollgate, the hyper floor and nginx, same load.

Requests per second on a shared 2-core machine swing by tens of percent with
whatever else runs; the instructions a server executes per request do not.
This runs each proxy under `valgrind --tool=callgrind` (instrumentation off
while it starts), warms it up, zeroes the counters, sends a fixed number of
requests from a small keep-alive client, dumps the counters and divides:
user-space instructions per request, every thread of the process included,
startup and shutdown excluded. With `--syscalls` it instead runs each proxy
natively under `perf stat -e raw_syscalls:sys_enter,context-switches` for
the same load (the kernel's share, which callgrind does not see).

    cargo build --release && cargo build --release --bench hyper_floor
    bench/instructions.py                          # tollgate allow+reject, floor, nginx allow+reject
    bench/instructions.py --only tollgate          # one proxy (repeat runs for an A/B)
    bench/instructions.py --syscalls               # syscalls and context switches per request
    bench/instructions.py --only tollgate --challenge   # + a challenge flood: unsolved pages, forged solutions
    bench/instructions.py --budget-allow 40000 --budget-reject 20000   # exit 1 above these (CI)
    bench/instructions.py --only tollgate --accept-encoding 'gzip, deflate, br'   # as a browser asks
    bench/instructions.py --only tollgate --redirect   # + a `path_regex` route's redirect (captures, limited)
    bench/instructions.py --ladder [--write docs/PERFORMANCE.md]   # what each feature adds to the allow path
    bench/instructions.py --ladder --steps bare --keep DIR   # one step (and the floor), dumps kept for an A/B

The targets are those of bench/proxybench.py: an nginx upstream (`return
200`, not measured) on 127.0.0.1:19180; tollgate (SQLite store, 2 workers)
with a limit that never triggers on `/` and 1 request per hour per IP on
`/reject`; nginx with `limit_req` the same way (1 request per minute, its
slowest rate); the hyper floor (benches/hyper_floor.rs, 2 workers) forwarding
(allow) and answering every request with tollgate's 429 (`--reject`: the
429 floor). The client keeps `--conns` connections busy with one request at
a time each, as wrk does. Needs valgrind, nginx and (for --syscalls) perf.

With `--ladder`, tollgate's allow path (a GET forwarded to the upstream,
200) is measured under a sequence of configs, from a bare one (one route
forwarding, nothing else) to one with every common feature, each config
adding one feature to the one before (LADDER below), then the floor
forwarding the same GET. Every config is checked with `tollgate check`
first. It prints a markdown table; `--write FILE` also puts it between
the `<!-- ladder:begin -->` and `<!-- ladder:end -->` lines of FILE.

With `--budget-allow` / `--budget-reject`, tollgate's instructions per
request are checked against those budgets after the run: above either, the
script says which and exits 1 (CI runs it so, and the hot path cannot
silently regain what was taken off it).
"""

import argparse
import glob
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from hyper_floor import floor_binary  # noqa: E402 (after the path it is found on)

PORTS = {"upstream": 19180, "tollgate": 19181, "tollgate_admin": 19182, "nginx": 19183,
         "nginx_reject": 19184, "floor": 19185, "floor_reject": 19186}


def log(msg):
    print(f"[instructions] {msg}", file=sys.stderr, flush=True)


# `--accept-encoding`: sent with every plain GET (a browser sends one).
ACCEPT_ENCODING = None


def request_bytes(port, path):
    """The request a scenario sends: a plain GET of `path`, or a prepared
    request (bytes) as the challenge scenarios send."""
    if isinstance(path, bytes):
        return path
    extra = f"Accept-Encoding: {ACCEPT_ENCODING}\r\n" if ACCEPT_ENCODING else ""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()


def post_request(port, size):
    """A keep-alive POST of `/` with a `size`-byte body and its Content-Length
    (a form or an API call: `--post`)."""
    return (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {size}\r\n\r\n").encode() + b"p" * size


def receive(s, buf, until):
    """`buf` and more from `s` until `until(buf)` holds."""
    while not until(buf):
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    return buf


def read_exactly(s, buf, length):
    """Reads a body of `length` bytes; returns what follows it."""
    return receive(s, buf, lambda b: len(b) >= length)[length:]


def read_chunked(s, buf):
    """Reads a chunked body (a compressed answer's); returns what follows it."""
    while True:
        buf = receive(s, buf, lambda b: b"\r\n" in b)
        line, _, buf = buf.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        buf = read_exactly(s, buf, size + 2)  # the chunk and its CRLF
        if size == 0:
            return buf


def one_connection(port, path, count, failures):
    """`count` keep-alive requests, one at a time, on one connection."""
    request = request_bytes(port, path)
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=300)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        for _ in range(count):
            s.sendall(request)
            buf = receive(s, buf, lambda b: b"\r\n\r\n" in b)
            head, _, buf = buf.partition(b"\r\n\r\n")
            m = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.I)
            if m:
                buf = read_exactly(s, buf, int(m.group(1)))
            elif re.search(rb"\r\ntransfer-encoding:\s*chunked", head, re.I):
                buf = read_chunked(s, buf)
            else:
                raise ValueError(f"no Content-Length in {head[:200]!r}")
        s.close()
    except Exception as e:  # reported once the load is over
        failures.append(repr(e))


def load(port, path, total, conns):
    failures = []
    per = total // conns
    threads = [threading.Thread(target=one_connection, args=(port, path, per, failures)) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit(f"load on :{port}{path} failed: {failures[0]}")
    return per * conns


def wait_port(port, proc, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args} exited during startup")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"port {port} did not open within {timeout}s")


def challenge_requests(port):
    """The two challenge-flood scenarios: a browser-looking GET of a route
    with `challenge: { when: always }` (each gets a fresh signed challenge
    page, 403), and a solution post with a real challenge but a nonce that
    does not solve it (one MAC, one SHA-256, 400); and, to compare with
    `allow`, a GET of that route carrying a valid pass (forwarded, 200)."""
    host = f"Host: 127.0.0.1:{port}\r\n"
    page = (f"GET /challenged/page HTTP/1.1\r\n{host}"
            "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(page)
    buf = b""
    m = None
    while m is None:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        m = re.search(rb'name="c" value="([^"]+)"', buf)
    s.close()
    if not m:
        sys.exit(f"no challenge in the page: {buf[:300]!r}")
    challenge = m.group(1).decode()
    quoted = challenge.replace('%', '%25').replace('/', '%2F').replace('+', '%2B').replace('=', '%3D')

    def post(nonce):
        form = f"c={quoted}&n={nonce}&r=%2F&via=js".encode()
        return (f"POST /.well-known/tollgate/pass HTTP/1.1\r\n{host}"
                "Content-Type: application/x-www-form-urlencoded\r\n"
                f"Content-Length: {len(form)}\r\n\r\n").encode() + form

    # A browser's pass: the challenge solved as the page does it.
    bits = int(challenge.split("~")[2])
    nonce = next(n for n in range(1 << 30)
                 if int.from_bytes(hashlib.sha256(f"{challenge}{n}".encode()).digest()[:4], "big") >> (32 - bits) == 0)
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(post(nonce))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(65536)
        if not chunk:
            break
        head += chunk
    s.close()
    m = re.search(rb"\r\nset-cookie:\s*([^;\r]+)", head, re.I)
    if not m:
        sys.exit(f"the solution earned no pass: {head[:300]!r}")
    passed = (f"GET /challenged/page HTTP/1.1\r\n{host}"
              "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n"
              f"Cookie: {m.group(1).decode()}\r\n\r\n").encode()
    return page, post(12345), passed


def write_configs(d, store, access_log, audit="true", challenge=False, redirect=False):
    up = PORTS["upstream"]
    common = (f"daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/%s.pid;\nerror_log {d}/%s-error.log warn;\n"
              "events { worker_connections 4096; }\n")
    http_common = (f"access_log off; keepalive_requests 100000000; keepalive_timeout 300s;"
                   f" client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;"
                   f" uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;")
    os.makedirs(f"{d}/tmp", exist_ok=True)
    with open(f"{d}/upstream.conf", "w") as f:
        f.write(common % ("up", "up") + f"http {{ {http_common}\n"
                f"  server {{ listen 127.0.0.1:{up} backlog=4096; location / {{ default_type text/plain; return 200 \"ok\\n\"; }} }} }}\n")
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(common % ("ng", "ng") + "http { " + http_common + "\n"
                "  limit_req_zone $binary_remote_addr zone=allow:10m rate=100000000r/s;\n"
                "  limit_req_zone $binary_remote_addr zone=reject:10m rate=1r/m;\n"
                "  limit_req_status 429; limit_req_log_level info;\n"
                f"  upstream app {{ server 127.0.0.1:{up}; keepalive 1024; keepalive_requests 100000000; }}\n"
                f"  server {{ listen 127.0.0.1:{PORTS['nginx']} backlog=4096; location / {{ limit_req zone=allow burst=1000000 nodelay;"
                " proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }\n"
                f"  server {{ listen 127.0.0.1:{PORTS['nginx_reject']} backlog=4096; location / {{ limit_req zone=reject;"
                " proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }\n}\n")
    pass_keys, challenged = "", ""
    if challenge:
        with open(f"{d}/pass.keys", "w") as f:
            f.write("0123456789abcdef0123456789abcdef-instructions\n")
        pass_keys = f'identity: {{ pass: {{ secret_file: "{d}/pass.keys" }} }}\n'
        challenged = ("  - { name: challenged, match: { path_prefix: /challenged }, upstream: app,"
                      " challenge: { when: always }, limiters: [allow] }\n")
    redirect = ("  - { name: redirect, match: { path_regex: '^/old/(\\d+)/(.*)$' },"
                " redirect: { to: '/new/$1/$2' }, limiters: [allow] }\n") if redirect else ""
    # `path` belongs to the SQLite store only (tollgate refuses it on another backend).
    path = f', path: "{d}/tollgate.db"' if store == "sqlite" else ""
    with open(f"{d}/tollgate.yaml", "w") as f:
        f.write(f"""server: {{ listen: ["127.0.0.1:{PORTS['tollgate']}"] }}
admin: {{ listen: "127.0.0.1:{PORTS['tollgate_admin']}" }}
store: {{ backend: {store}{path} }}
log: {{ access: {access_log} }}
audit: {{ enabled: {audit} }}
{pass_keys}upstreams:
  app: {{ url: "http://127.0.0.1:{up}" }}
limiters:
  allow: {{ algorithm: fixed_window, limit: 1000000000, window: 60s, key: ip }}
  reject: {{ algorithm: fixed_window, limit: 1, window: 1h, key: ip }}
routes:
{challenged}{redirect}  - {{ name: reject, match: {{ path_prefix: /reject }}, upstream: app, limiters: [reject] }}
  - {{ name: allow, match: {{ path_prefix: / }}, upstream: app, limiters: [allow] }}
""")


# The feature-cost ladder (`--ladder`): each step keeps the features of the
# steps before it and adds its own, so "added" is what that one feature
# costs with the ones above it already on (a rate-limit header needs a
# limiter; an audit row is written by the SQLite store every step uses).
# (key, row name, what the step configures)
LADDER = [
    ("bare", "bare", "one route forwarding; no limiter, audit, access log, compression, challenge, site rule or cache"),
    ("identity", "+ identity", "the client is read from `X-Forwarded-For` (`identity.trusted_proxies: [127.0.0.1/32]`); "
     "the GET carries one from here on"),
    ("limiter", "+ one limiter", "`fixed_window`, `key: client`, never triggered; `rate_limit_headers: none`"),
    ("headers", "+ rate-limit headers", "`rate_limit_headers: both` (the default)"),
    ("access_log", "+ access log", "`log.access: true` (text, stdout to a file)"),
    ("audit", "+ audit row", "`audit.enabled: true`: one SQLite `api_calls` row per forwarded request"),
    ("compression", "+ compression check", "`server.compression: true`; the GET sends no `Accept-Encoding`, "
     "so the answer (3 bytes of `text/plain`) goes out as it came, with `Vary: Accept-Encoding`"),
    ("challenge", "+ challenge check", "`identity.pass` and `challenge: { when: always }`; the GET is no browser's "
     "(no `Accept: text/html`), so no page"),
    ("site", "+ site rules", "a `path_regex` redirect route before the route and a response `headers` rule "
     "removing `X-Powered-By`; neither matches"),
    ("cache", "+ cache lookup", "`cache: {}`: a miss every time; the answer says nothing of its freshness "
     "and there is no `ttl`, so it is never stored (and, remembered as not storable, no request waits on "
     "another's render)"),
]
# Measured after the ladder, outside it: the last step's config with one
# feature (the second key) replaced. (key, replaced key, row name, what)
LADDER_ASIDES = [
    ("cache_hit", "cache", "aside: cache hit", "`cache: { ttl: 60s }` instead: every measured request is answered "
     "from the cache, the upstream is not asked"),
]
LADDER_BEGIN, LADDER_END = "<!-- ladder:begin -->", "<!-- ladder:end -->"


def ladder_config(d, step, on):
    """tollgate's config for one ladder step: `on` holds the keys of the
    features it has. The SQLite store throughout (the default)."""
    yes = lambda key: "true" if key in on else "false"
    identity = []
    if "identity" in on:
        identity.append("trusted_proxies: [127.0.0.1/32]")
    if "challenge" in on:
        with open(f"{d}/pass.keys", "w") as f:
            f.write("0123456789abcdef0123456789abcdef-instructions\n")
        identity.append(f'pass: {{ secret_file: "{d}/pass.keys" }}')
    route = ["  - name: site", "    match: { path_prefix: / }", "    upstream: app"]
    if "limiter" in on:
        route += ["    limiters: [allow]", f"    rate_limit_headers: {'both' if 'headers' in on else 'none'}"]
    if "challenge" in on:
        route.append("    challenge: { when: always }")
    if "site" in on:
        route.append("    headers: { response: { remove: [X-Powered-By] } }")
    if "cache_hit" in on:
        route.append("    cache: { ttl: 60s }")
    if "cache" in on:
        route.append("    cache: {}")
    lines = [f'server: {{ listen: ["127.0.0.1:{PORTS["tollgate"]}"], compression: {yes("compression")} }}',
             f'admin: {{ listen: "127.0.0.1:{PORTS["tollgate_admin"]}" }}',
             f'store: {{ backend: sqlite, path: "{d}/ladder-{step}.db" }}',
             f'audit: {{ enabled: {yes("audit")} }}',
             f'log: {{ access: {yes("access_log")} }}']
    if identity:
        lines.append(f"identity: {{ {', '.join(identity)} }}")
    lines += ["upstreams:", f'  app: {{ url: "http://127.0.0.1:{PORTS["upstream"]}" }}']
    if "limiter" in on:
        lines += ["limiters:", "  allow: { algorithm: fixed_window, limit: 1000000000, window: 60s, key: client }"]
    lines.append("routes:")
    if "site" in on:
        lines.append("  - { name: old-links, match: { path_regex: '^/old/(\\d+)/(.*)$' }, redirect: { to: '/new/$1/$2' } }")
    path = f"{d}/ladder-{step}.yaml"
    with open(path, "w") as f:
        f.write("\n".join(lines + route) + "\n")
    return path


def ladder_request(port, on):
    """The ladder's GET of `/`: from the identity step on, as a trusted proxy
    forwards it (`X-Forwarded-For` naming the client)."""
    request = request_bytes(port, "/")
    if "identity" in on:
        request = request[:-2] + b"X-Forwarded-For: 203.0.113.7\r\n\r\n"
    return request


def ladder_plan(d, tollgate, only=None):
    """One plan entry per ladder step and aside (those in `only`, when
    given), each config checked by `tollgate check` first (a config it
    refuses ends the run)."""
    plan, on = [], set()
    steps = [(key, key) for key, _, _ in LADDER] + [(key, replaced) for key, replaced, _, _ in LADDER_ASIDES]
    for i, (key, replaced) in enumerate(steps):
        on = (on - {replaced}) | {key}
        if only and key not in only:
            continue
        config = ladder_config(d, i, on)
        check = subprocess.run([tollgate, "check", "--config", config], capture_output=True, text=True)
        if check.returncode != 0:
            sys.exit(f"tollgate check refuses the ladder's {key!r} config:\n{open(config).read()}\n"
                     f"{check.stdout}{check.stderr}")
        log(f"ladder {key}: tollgate check passed")
        request = ladder_request(PORTS["tollgate"], on)
        plan.append((key, [tollgate, "--config", config],
                     [("allow", PORTS["tollgate"], lambda key=key, request=request: ladder_probe(key, request))]))
    return plan


def ladder_probe(key, request):
    """Asks twice before the warm-up and returns `request` if the second
    answer is what the step should measure: a 200, with the cache a miss
    that is not stored, or a hit."""
    for _ in range(2):
        s = socket.create_connection(("127.0.0.1", PORTS["tollgate"]), timeout=60)
        s.sendall(request)
        head = receive(s, b"", lambda b: b"\r\n\r\n" in b).partition(b"\r\n\r\n")[0]
        s.close()
    status = re.search(rb"cache-status:\s*([^\r]*)", head, re.I)
    status = status.group(1).decode() if status else ""
    wrong = (not head.startswith(b"HTTP/1.1 200 ")
             or (key == "cache" and ("fwd=miss" not in status or "stored" in status))
             or (key == "cache_hit" and "hit" not in status)
             or (key not in ("cache", "cache_hit") and status))
    if wrong:
        sys.exit(f"the ladder's {key!r} step answers what it should not measure:\n{head.decode(errors='replace')}")
    first_line = head.split(b"\r\n")[0].decode()
    log(f"ladder {key}: {first_line}{'; Cache-Status: ' + status if status else ''}")
    return request


def ladder_table(rows, args):
    """The ladder as markdown: a caption, the table, a line naming the run."""
    values = {name: v for _, name, v in rows}
    floor = values["floor"]
    sent = f"`Accept-Encoding: {ACCEPT_ENCODING}`" if ACCEPT_ENCODING else "no `Accept-Encoding`"
    out = [f"Each row adds one feature to the row above it and keeps the rest, so *added* is what that feature "
           f"costs with every feature above it on; the asides change the last row's config instead. The request: "
           f"a keep-alive `GET /` with {sent}, forwarded to the nginx upstream's 200 (3 bytes of `text/plain`); "
           f"SQLite store, 2 workers, {args.requests:,} requests over {args.conns} connections after "
           f"{args.warmup:,} warm-up requests, each row a fresh process. The floor is "
           f"`benches/hyper_floor.rs` forwarding the bare row's GET.",
           "",
           "| feature | instructions per request | added by this feature | × floor |",
           "| --- | ---: | ---: | ---: |",
           f"| hyper floor: bare hyper forwarding, nothing else | {floor:,.0f} | | 1.00 |"]
    previous = floor
    for key, name, what in LADDER:
        value = values[key]
        out.append(f"| **{name}**: {what} | {value:,.0f} | {value - previous:+,.0f} | {value / floor:.2f} |")
        previous = value
    for key, _, name, what in LADDER_ASIDES:
        value = values[key]
        out.append(f"| {name}: {what} | {value:,.0f} | {value - previous:+,.0f} vs the last row | {value / floor:.2f} |")
    bare, full = values["bare"], values[LADDER[-1][0]]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "src", "benches", "Cargo.toml", "Cargo.lock"],
                           capture_output=True, text=True).stdout.strip()
    command = " ".join(["bench/instructions.py"] + sys.argv[1:])
    out += ["", f"Bare is **{bare / floor:.2f}×** the floor (the goal: at most 1.10×, "
            f"{'met' if bare / floor <= 1.10 else 'not met'}); with every feature on, {full / floor:.2f}× "
            f"({full - bare:+,.0f} over bare). Generated by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())}, "
            f"release build of {commit or 'an unknown commit'}{' with uncommitted changes' if dirty else ''}."]
    return "\n".join(out)


def write_between_markers(path, text):
    """Replaces what lies between LADDER_BEGIN and LADDER_END in `path`."""
    doc = open(path).read()
    start, end = doc.find(LADDER_BEGIN), doc.find(LADDER_END)
    if start < 0 or end < start:
        sys.exit(f"{path}: no {LADDER_BEGIN} line followed by a {LADDER_END} line to write between")
    with open(path, "w") as f:
        f.write(doc[:start + len(LADDER_BEGIN)] + "\n" + text + "\n" + doc[end:])
    log(f"wrote the ladder into {path}")


class Callgrind:
    """A server under callgrind: counters zeroed and dumped around each load."""

    def __init__(self, name, argv, d):
        self.out = f"{d}/{name}.callgrind"
        self.proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                      f"--callgrind-out-file={self.out}"] + argv,
                                     stdout=open(f"{d}/{name}.log", "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.dumps = 0

    def control(self, *args):
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True, capture_output=True)

    def started(self):
        self.control("-i", "on")

    def measure(self, run):
        self.control("-z")
        n = run()
        self.control("-d")
        self.dumps += 1
        path = f"{self.out}.{self.dumps}"
        for _ in range(100):
            if os.path.exists(path) and re.search(r"^totals:", open(path).read(), re.M):
                break
            time.sleep(0.1)
        total = int(re.search(r"^totals:\s+(\d+)", open(path).read(), re.M).group(1))
        return total / n

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class PerfStat:
    """A server run natively; `perf stat` counts its syscalls around each load."""

    def __init__(self, name, argv, d):
        self.d, self.name = d, name
        self.proc = subprocess.Popen(argv, stdout=open(f"{d}/{name}.log", "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def started(self):
        pass

    def measure(self, run):
        out = f"{self.d}/{self.name}.perf"
        perf = subprocess.Popen(["perf", "stat", "-x,", "-o", out, "-e",
                                 "raw_syscalls:sys_enter,context-switches,task-clock", "-p", str(self.proc.pid)])
        time.sleep(0.3)
        n = run()
        perf.send_signal(signal.SIGINT)
        perf.wait()
        counts = {}
        for line in open(out):
            parts = line.strip().split(",")
            if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
                counts[parts[2]] = float(parts[0])
        return {"syscalls": counts.get("raw_syscalls:sys_enter", 0) / n,
                "switches": counts.get("context-switches", 0) / n,
                "cpu_us": counts.get("task-clock", 0) * 1000 / n}

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def over_budget(rows, budgets):
    """What exceeds its budget: tollgate's instructions per request, per scenario."""
    over = []
    for scenario, name, value in rows:
        budget = budgets.get(scenario)
        if name == "tollgate" and budget is not None and value > budget:
            over.append(f"tollgate {scenario}: {value:.0f} instructions per request > budget {budget}")
    missing = [s for s, b in budgets.items() if b is not None and not any(r[0] == s and r[1] == "tollgate" for r in rows)]
    over += [f"tollgate {s}: not measured, but a budget was given" for s in missing]
    return over


def measure(plan, args, d, servers):
    """Runs each planned server in turn (appended to `servers`, so the caller
    can stop it whatever happens) and measures its scenarios: a list of
    (scenario, server name, value)."""
    kind = PerfStat if args.syscalls else Callgrind
    rows = []
    for name, argv, scenarios in plan:
        log(f"{name}: starting")
        server = kind(name, argv, d)
        servers.append(server)
        wait_port(scenarios[0][1], server.proc, 180)
        server.started()
        for scenario, port, path in scenarios:
            if callable(path):
                path = path()
            load(port, path, args.warmup, args.conns)
            value = server.measure(lambda: load(port, path, args.requests, args.conns))
            rows.append((scenario, name, value))
            if args.keep and not args.syscalls:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(f"{server.out}.{server.dumps}", f"{args.keep}/{name}-{scenario}.callgrind")
            log(f"{name} {scenario}: {value}")
        server.stop()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000, help="measured requests per scenario")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--only", action="append", choices=["tollgate", "floor", "nginx"],
                    help="measure only these (repeatable)")
    ap.add_argument("--syscalls", action="store_true", help="perf stat syscalls per request instead of callgrind")
    ap.add_argument("--tollgate", default=os.path.join(ROOT, "target/release/tollgate"))
    ap.add_argument("--floor", help="the hyper_floor binary (default: built with cargo)")
    ap.add_argument("--store", choices=["sqlite", "memory"], default="sqlite",
                    help="tollgate's store (SQLite also writes an audit row per proxied request, unless --audit off)")
    ap.add_argument("--access-log", choices=["on", "off"], default="on",
                    help="tollgate's access log (on by default; the nginx peer runs with access_log off)")
    ap.add_argument("--audit", choices=["on", "off"], default="on",
                    help="tollgate's SQLite audit row per forwarded request (on by default, as shipped; "
                         "docs/PERFORMANCE.md's goals are measured with it and the access log off)")
    ap.add_argument("--keep", help="copy the callgrind dumps here (for callgrind_annotate)")
    ap.add_argument("--challenge", action="store_true",
                    help="tollgate also answers a challenge flood: browser GETs of an `always` route"
                         " (a signed page each) and forged solution posts")
    ap.add_argument("--port-offset", type=int, default=0,
                    help="added to every port, so two runs can share the machine")
    ap.add_argument("--floor-args", default="--workers 2", help="extra arguments for the floor, e.g. '--auto'")
    ap.add_argument("--accept-encoding", help="send this Accept-Encoding with every request, as a browser does "
                    "(e.g. 'gzip, deflate, br')")
    ap.add_argument("--redirect", action="store_true",
                    help="tollgate also answers a redirect: a `path_regex` route with captures, behind a limiter")
    ap.add_argument("--ladder", action="store_true",
                    help="the feature-cost ladder: tollgate's allow path under configs adding one feature each, and the floor")
    ap.add_argument("--steps", help="with --ladder: only these steps, comma-separated (e.g. bare,identity); "
                    "prints instructions per request instead of the table")
    ap.add_argument("--write", metavar="FILE", help="with --ladder: put the table between FILE's ladder markers")
    ap.add_argument("--post", type=int, metavar="SIZE",
                    help="also measure a POST with a SIZE-byte body through each proxy (scenario `post`)")
    ap.add_argument("--budget-allow", type=int, help="exit 1 if tollgate's allow path exceeds this many instructions per request")
    ap.add_argument("--budget-reject", type=int, help="exit 1 if tollgate's 429 exceeds this many instructions per request")
    args = ap.parse_args()
    global ACCEPT_ENCODING
    ACCEPT_ENCODING = args.accept_encoding
    for name in PORTS:
        PORTS[name] += args.port_offset
    only = args.only or ["tollgate", "floor", "nginx"]
    if args.write and not args.ladder:
        sys.exit("--write writes the ladder's table: it needs --ladder")
    steps = args.steps.split(",") if args.steps else None
    known = [key for key, _, _ in LADDER] + [key for key, _, _, _ in LADDER_ASIDES]
    if steps and (not args.ladder or args.write or set(steps) - set(known)):
        sys.exit(f"--steps needs --ladder, no --write, and steps among {known}")
    if args.ladder and (args.syscalls or args.only or args.challenge or args.redirect):
        sys.exit("--ladder measures its own configs under callgrind: no --syscalls, --only, --challenge or --redirect")
    for tool in ("nginx", "perf" if args.syscalls else "valgrind"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing")
    d = tempfile.mkdtemp(prefix="tollgate-instr.")
    write_configs(d, args.store, "true" if args.access_log == "on" else "false",
                  "true" if args.audit == "on" else "false", args.challenge, args.redirect)
    upstream = subprocess.Popen(["nginx", "-p", d, "-e", f"{d}/up-error.log", "-c", f"{d}/upstream.conf"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    servers = []
    try:
        wait_port(PORTS["upstream"], upstream, 30)
        if args.ladder:
            floor = args.floor or floor_binary()
            plan = ladder_plan(d, args.tollgate, steps) + [
                ("floor", [floor, "serve", f"127.0.0.1:{PORTS['floor']}", f"127.0.0.1:{PORTS['upstream']}",
                           *args.floor_args.split()], [("allow", PORTS["floor"], "/")])]
            rows = measure(plan, args, d, servers)
            if steps:
                for _, name, v in rows:
                    print(f"{name:12} {v:>10.0f}")
                return
            table = ladder_table(rows, args)
            print(table)
            if args.write:
                write_between_markers(args.write, table)
            return
        plan = []
        if "tollgate" in only:
            tollgate_scenarios = [("allow", PORTS["tollgate"], "/"), ("reject", PORTS["tollgate"], "/reject")]
            if args.redirect:
                tollgate_scenarios.append(("redirect", PORTS["tollgate"], "/old/2024/page"))
            if args.post is not None:
                tollgate_scenarios.append(("post", PORTS["tollgate"], post_request(PORTS["tollgate"], args.post)))
            if args.challenge:
                # Prepared once the server is up (the forged post needs a real challenge).
                flood = {}
                def challenge_request(which):
                    if not flood:
                        flood["page"], flood["forged"], flood["pass"] = challenge_requests(PORTS["tollgate"])
                    return flood[which]
                tollgate_scenarios += [("challenged", PORTS["tollgate"], lambda: challenge_request("page")),
                                       ("forged", PORTS["tollgate"], lambda: challenge_request("forged")),
                                       ("pass", PORTS["tollgate"], lambda: challenge_request("pass"))]
            plan.append(("tollgate", [args.tollgate, "--config", f"{d}/tollgate.yaml"], tollgate_scenarios))
        if "floor" in only:
            floor = args.floor or floor_binary()
            floor_scenarios = [("allow", PORTS["floor"], "/")]
            if args.post is not None:
                floor_scenarios.append(("post", PORTS["floor"], post_request(PORTS["floor"], args.post)))
            plan.append(("floor", [floor, "serve", f"127.0.0.1:{PORTS['floor']}", f"127.0.0.1:{PORTS['upstream']}",
                                   *args.floor_args.split()], floor_scenarios))
            plan.append(("floor", [floor, "serve", f"127.0.0.1:{PORTS['floor_reject']}",
                                   f"127.0.0.1:{PORTS['upstream']}", *args.floor_args.split(), "--reject"],
                         [("reject", PORTS["floor_reject"], "/reject")]))
        if "nginx" in only:
            nginx_scenarios = [("allow", PORTS["nginx"], "/"), ("reject", PORTS["nginx_reject"], "/")]
            if args.post is not None:
                nginx_scenarios.append(("post", PORTS["nginx"], post_request(PORTS["nginx"], args.post)))
            plan.append(("nginx", ["nginx", "-p", d, "-e", f"{d}/ng-error.log", "-c", f"{d}/nginx.conf"],
                         nginx_scenarios))
        rows = measure(plan, args, d, servers)
        print(f"{args.requests} requests, {args.conns} connections, after {args.warmup} warm-up requests")
        if args.syscalls:
            print(f"{'scenario':8} {'target':10} {'syscalls/req':>12} {'ctxsw/req':>10} {'cpu us/req':>10}")
            for scenario, name, v in rows:
                print(f"{scenario:8} {name:10} {v['syscalls']:12.2f} {v['switches']:10.3f} {v['cpu_us']:10.1f}")
        else:
            ng = {s: v for s, n, v in rows if n == "nginx"}
            fl = {s: v for s, n, v in rows if n == "floor"}
            print(f"{'scenario':8} {'target':10} {'instr/req':>10} {'x nginx':>8} {'x floor':>8}")
            for scenario, name, v in rows:
                ratio = f"{v / ng[scenario]:8.2f}" if scenario in ng else f"{'':8}"
                floor_ratio = f"{v / fl[scenario]:8.2f}" if scenario in fl else f"{'':8}"
                print(f"{scenario:8} {name:10} {v:10.0f} {ratio} {floor_ratio}")
            over = over_budget(rows, {"allow": args.budget_allow, "reject": args.budget_reject})
            if over:
                for line in over:
                    print(f"OVER BUDGET: {line}")
                sys.exit(1)
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.stop()
        os.killpg(upstream.pid, signal.SIGTERM)
        upstream.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
