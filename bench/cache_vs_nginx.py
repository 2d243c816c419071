#!/usr/bin/env python3
"""tollgate's response cache against nginx's fastcgi_cache, in front of the same php-fpm pool, in one run.

Two tables:

1. hits: one stored page asked for again and again (wrk -t2 -cC on one URL):
   requests/s and the front's own CPU per request (user + system time of
   its processes, from /proc, over the run, divided by the requests wrk
   counted), tollgate (server.workers: 2) against nginx (worker_processes 2),
   rounds interleaved, medians shown;
2. scraper: wrk walks a product site with a Zipf(1.0) popularity over 10,000
   pages, 10 % of its requests one-off URLs (ids never asked twice); PHP
   logs each render itself, so the table shows PHP renders per 1,000
   requests and wrk's p99 for tollgate with `cache:`, nginx with
   fastcgi_cache, and tollgate without a cache.

The PHP page builds a ~20 KB product page with some work per render (a few
ms of CPU), sends no cache headers (as WordPress does), and appends one line
to a render log. Both caches keep a page 60 s (`ttl: 60s`,
`fastcgi_cache_valid 200 301 404 60s`), lock concurrent misses
(fastcgi_cache_lock on) and serve stale on errors. nginx's cache is the
standard setup: fastcgi_cache_path on disk (the page cache keeps it in
memory), keys_zone 16m, `$scheme$request_method$host$request_uri`. Neither
front logs requests. Only one front runs at a time: tollgate keeps its
FastCGI connections, which bind php-fpm children.

    bench/cache_vs_nginx.py [--rounds 3] [--seconds 10] [--conns 64]

Needs: a release build (cargo build --release), php-fpm, nginx, wrk.
"""

import argparse
import glob
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/tollgate")
TICK = os.sysconf("SC_CLK_TCK")

PAGE = r"""<?php
file_put_contents(__DIR__ . '/../renders.log', "r\n", FILE_APPEND | LOCK_EX);
$id = (int)($_GET['id'] ?? 0);
mt_srand($id);
$rows = '';
for ($i = 0; $i < 200; $i++) {
    $price = number_format(mt_rand(100, 99999) / 100, 2);
    $rows .= '<tr><td>Item ' . md5($id . ':' . $i) . '</td><td>' . $price . "</td></tr>\n";
}
$words = [];
for ($i = 0; $i < 2000; $i++) { $words[] = substr(sha1($id . $i), 0, 6); }
sort($words);
header('Content-Type: text/html; charset=utf-8');
echo "<!doctype html><html><head><title>Product $id</title></head><body><h1>Product $id</h1>";
echo '<p>' . implode(' ', array_slice($words, 0, 300)) . '</p><table>' . $rows . '</table></body></html>';
"""

# wrk: Zipf(1.0) over 10,000 pages by inverse CDF, and 1 request in 10 for
# an id no one asked for before (per thread: a counter past 10^6).
SCRAPER_LUA = r"""
local pages, cdf, n = 10000, {}, 0
local thread_id = 0
function setup(thread) thread_id = thread_id + 1; thread:set("tid", thread_id) end
function init(args)
  local sum = 0
  for i = 1, pages do sum = sum + 1 / i; cdf[i] = sum end
  for i = 1, pages do cdf[i] = cdf[i] / sum end
  math.randomseed(tid * 7919)
end
local function zipf()
  local u, lo, hi = math.random(), 1, pages
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return lo
end
function request()
  n = n + 1
  local id
  if math.random() < 0.1 then id = 1000000 * tid + n else id = zipf() end
  return wrk.format("GET", "/product.php?id=" .. id)
end
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


def tree(pid):
    """pid and its descendants (nginx's workers)."""
    kids = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = open(stat).read().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_seconds(pids):
    total = 0
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / TICK


def wrk(url, seconds, conns, script=None):
    cmd = ["wrk", "-t2", f"-c{conns}", f"-d{seconds}s", "--latency"]
    if script:
        cmd += ["-s", script]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        sys.exit(f"errors from {url}:\n{out}")
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return requests, rps, float(p99.group(1)) * scale


class Front:
    def __init__(self, name, cmd, port, env=None):
        self.name, self.cmd, self.port, self.env, self.proc = name, cmd, port, env, None

    def start(self):
        env = dict(os.environ, TOLLGATE_LOG="warn", **(self.env or {}))
        self.proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"


def setup(work, tollgate):
    os.makedirs(f"{work}/www")
    with open(f"{work}/www/product.php", "w") as f:
        f.write(PAGE)
    open(f"{work}/renders.log", "w").close()
    fpm = sorted(glob.glob("/usr/sbin/php-fpm*"))[-1]
    with open(f"{work}/php-fpm.conf", "w") as f:
        f.write(f"[global]\nerror_log = {work}/php-fpm.log\ndaemonize = no\npid = {work}/php-fpm.pid\n"
                f"[www]\nlisten = {work}/php-fpm.sock\npm = static\npm.max_children = 4\n")
    php = subprocess.Popen([fpm, "-n", "-R", "-F", "-y", f"{work}/php-fpm.conf"])
    for _ in range(100):
        if os.path.exists(f"{work}/php-fpm.sock"):
            break
        time.sleep(0.05)
    fronts = {}
    for name, cache in [("tollgate", "cache: { ttl: 60s }"), ("tollgate-nocache", "")]:
        port, admin = free_port(), free_port()
        comma = ", " if cache else ""
        with open(f"{work}/{name}.yaml", "w") as f:
            f.write(f"""server: {{ listen: ["127.0.0.1:{port}"], workers: 2 }}
admin: {{ listen: "127.0.0.1:{admin}" }}
store: {{ backend: memory }}
audit: {{ enabled: false }}
log: {{ access: false }}
upstreams:
  php: {{ url: "fastcgi://{work}/php-fpm.sock", root: "{work}/www", max_conns: 4 }}
routes:
  - {{ name: site, match: {{ path_prefix: / }}, upstream: php{comma}{cache} }}
""")
        fronts[name] = Front(name, [tollgate, "serve", "--config", f"{work}/{name}.yaml"], port)
    port = free_port()
    os.makedirs(f"{work}/nginx")
    with open(f"{work}/nginx.conf", "w") as f:
        f.write(f"""worker_processes 2;
user {os.environ.get('USER', 'root')};
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx/body;
    fastcgi_temp_path {work}/nginx/fastcgi;
    fastcgi_cache_path {work}/nginx/cache levels=1:2 keys_zone=php:16m max_size=1g inactive=60m use_temp_path=off;
    fastcgi_cache_key "$scheme$request_method$host$request_uri";
    upstream php {{ server unix:{work}/php-fpm.sock; }}
    server {{
        listen 127.0.0.1:{port};
        root {work}/www;
        location ~ \\.php$ {{
            try_files $fastcgi_script_name =404;
            include /etc/nginx/fastcgi.conf;
            fastcgi_pass php;
            fastcgi_cache php;
            fastcgi_cache_valid 200 301 404 60s;
            fastcgi_cache_use_stale error timeout updating http_500 http_503;
            fastcgi_cache_background_update on;
            fastcgi_cache_lock on;
            add_header X-Cache $upstream_cache_status;
        }}
    }}
}}
""")
    fronts["nginx"] = Front("nginx", ["nginx", "-p", f"{work}/nginx", "-c", f"{work}/nginx.conf"], port)
    return php, fronts


def renders(work):
    with open(f"{work}/renders.log") as f:
        return sum(1 for _ in f)


def hits(fronts, args):
    rows = {n: [] for n in ("tollgate", "nginx")}
    for r in range(args.rounds):
        for name in rows:
            front = fronts[name]
            front.start()
            url = front.url("/product.php?id=1")
            wrk(url, 2, args.conns)  # warm: stored, connections open
            pids = tree(front.proc.pid)
            before = cpu_seconds(pids)
            requests, rps, _ = wrk(url, args.seconds, args.conns)
            cpu = cpu_seconds(pids) - before
            front.stop()
            rows[name].append((rps, cpu / requests * 1e6))
            print(f"round {r + 1}: {name} {rps:.0f} req/s, {cpu / requests * 1e6:.1f} µs CPU/request", flush=True)
    return rows


def scraper(fronts, work, args):
    script = f"{work}/scraper.lua"
    with open(script, "w") as f:
        f.write(SCRAPER_LUA)
    out = {}
    for name in ("tollgate", "nginx", "tollgate-nocache"):
        front = fronts[name]
        if name == "nginx":
            shutil.rmtree(f"{work}/nginx/cache", ignore_errors=True)
        front.start()
        before = renders(work)
        requests, rps, p99 = wrk(front.url("/"), args.scraper_seconds, args.scraper_conns, script)
        done = renders(work) - before
        front.stop()
        out[name] = (requests, rps, p99, done)
        print(f"scraper: {name} {requests} requests, {done} PHP renders, p99 {p99:.1f} ms", flush=True)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--conns", type=int, default=64)
    p.add_argument("--scraper-seconds", type=int, default=20)
    p.add_argument("--scraper-conns", type=int, default=16)
    p.add_argument("--tollgate", default=BIN, help="the tollgate binary (default: target/release/tollgate)")
    args = p.parse_args()
    for tool in ("nginx", "wrk"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing")
    if args.tollgate == BIN and not os.access(BIN, os.X_OK):
        subprocess.run(["cargo", "build", "--release", "--locked"], cwd=ROOT, check=True)
    work = tempfile.mkdtemp()
    php = None
    try:
        php, fronts = setup(work, args.tollgate)
        h = hits(fronts, args)
        s = scraper(fronts, work, args)
    finally:
        if php:
            php.terminate()
            php.wait()
        shutil.rmtree(work, ignore_errors=True)
    med = {n: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for n, v in h.items()}
    print(f"\n| cache hits (one stored page, wrk -t2 -c{args.conns}, median of {args.rounds} × {args.seconds}s) | requests/s | front CPU µs/request |")
    print("| --- | --- | --- |")
    for n, label in (("tollgate", "tollgate `cache:`"), ("nginx", "nginx fastcgi_cache")):
        print(f"| {label} | {med[n][0]:.0f} | {med[n][1]:.1f} |")
    t, n = med["tollgate"], med["nginx"]
    print(f"tollgate / nginx: {t[0] / n[0]:.2f}× requests/s, {t[1] / n[1]:.2f}× CPU per request")
    print(f"\n| scraper (Zipf 1.0 over 10,000 pages + 10 % one-off, wrk -t2 -c{args.scraper_conns}, {args.scraper_seconds}s) | requests | PHP renders per 1,000 requests | p99 |")
    print("| --- | --- | --- | --- |")
    labels = {"tollgate": "tollgate `cache: { ttl: 60s }`", "nginx": "nginx fastcgi_cache (60s)", "tollgate-nocache": "tollgate, no cache"}
    for name, (requests, _, p99, done) in s.items():
        print(f"| {labels[name]} | {requests} | {done * 1000 / requests:.0f} | {p99:.1f} ms |")


if __name__ == "__main__":
    main()
