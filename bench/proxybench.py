#!/usr/bin/env python3
"""tollgate side by side with nginx and HAProxy on loopback.

Starts an nginx upstream (`return 200`), nginx (limit_req) and HAProxy
(stick table) as rate-limiting proxies, and tollgate (release build, SQLite
store and memory store), then runs interleaved wrk rounds for the allow path
(a limit that never triggers) and the reject path (1 request/s per IP), and
prints medians, same-round ratios, CPU per request (from /proc/<pid>/stat)
and RSS. `--keys N` instead measures memory for N distinct client keys and
that pruning gives it back.

    bench/proxybench.py                    # c=64 and c=256, 5 rounds of 10 s
    bench/proxybench.py --quick            # c=64, 3 rounds of 5 s
    bench/proxybench.py --keys 1000000     # memory for 1M tracked keys
    bench/proxybench.py --access-log       # the access log's cost: off vs json vs text, same run
    bench/proxybench.py --floor            # adds the hyper floor (benches/hyper_floor.rs) on both paths
    bench/proxybench.py --floor --pin      # the fair race on two cores: wrk on one, the proxy on the other
    bench/proxybench.py --floor --pin --profile dist   # the same, tollgate and the floor as the image ships them
    bench/proxybench.py --floor --pin --also OTHER     # + a second tollgate build in the same rounds (an A/B)

Needs nginx, haproxy and wrk (Debian packages; installed with apt-get when
missing and running as root). Everything listens on 127.0.0.1:19080-19131 and
is stopped when the script exits.

The rows `tollgate` and `tollgate-memory` run as nginx and HAProxy do here:
no per-request log (`log.access: false`) and no audit row
(`audit.enabled: false`). `tollgate-logged` is the SQLite one with both at
their defaults (on), so what they cost stays in sight in the same rounds.

`--floor` adds a bare hyper 1.x forwarding proxy (no limiting, no header
rewriting, no logging; 2 workers like tollgate's default) as the row
`floor`, a hyper server answering every request with tollgate's 429
(`hyper_floor --reject`, same headers and body size) as `floor-reject`,
and an `x/floor` column: how far tollgate is from what hyper itself does on
this machine, measured in the same rounds.

`--pin` makes the race fair on two cores: wrk and the upstream run on CPU 0
(`taskset -c 0`), every proxy on CPU 1, each with one worker (tollgate's
`server.workers: 1`, the floor's `--workers 1`; nginx and HAProxy always run
one). Without it everything floats, and tollgate and the floor run one
worker per core.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from hyper_floor import floor_binary  # noqa: E402 (after the path it is found on)

CLK = os.sysconf("SC_CLK_TCK")
PORTS = {"upstream": 19080, "nginx": 19090, "nginx_reject": 19091, "haproxy": 19092, "haproxy_reject": 19093,
         "tollgate": 19100, "tollgate_admin": 19101, "tollgate_mem": 19110, "tollgate_mem_admin": 19111,
         "log_off": 19120, "log_off_admin": 19121, "log_json": 19122, "log_json_admin": 19123,
         "log_text": 19124, "log_text_admin": 19125, "floor": 19130, "floor_reject": 19131,
         "tollgate_logged": 19102, "tollgate_logged_admin": 19103,
         "tollgate_also": 19104, "tollgate_also_admin": 19105}

# What the `tollgate` and `tollgate-memory` rows leave off, as the peers here
# do (`access_log off`); `tollgate-logged` keeps both defaults.
UNLOGGED = "audit: { enabled: false }\nlog: { access: false }\n"

# --pin: the CPU the load generator and the upstream share, and the one
# every proxy under test gets to itself.
LOAD_CPU, PROXY_CPU = "0", "1"

# --access-log: three tollgates that differ only in `log:` (memory store, so
# the log is the only per-request write). Their stdout, which carries the
# access log, goes to a file in the run directory, as it would to a disk.
ACCESS_LOG = {"log_off": "{ access: false }", "log_json": "{ format: json, access: true }",
              "log_text": "{ format: text, access: true }"}

procs = []


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def need(cmd, package):
    if shutil.which(cmd):
        return
    if os.geteuid() != 0:
        sys.exit(f"{cmd} is missing: apt-get install {package}")
    log(f"installing {package}")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True)


def start(name, argv, workdir):
    out = open(os.path.join(workdir, f"{name}.log"), "w")
    p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    procs.append((name, p))
    return p


def stop_all():
    for _, p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for _, p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def wait_http(url, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args[0]} exited during startup")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # it answers, even if with 429
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{url} did not answer within {timeout}s")


def tree(pid):
    pids = [pid]
    for line in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split():
        pids += tree(int(line))
    return pids


def cpu_ticks(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total


def rss_kib(pids, skip_root=False):
    total = 0
    for i, p in enumerate(pids):
        if skip_root and i == 0 and len(pids) > 1:
            continue
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


def wrk(url, conns, duration, script=None, pin=False):
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{duration}s", "--latency", url]
    if script:
        argv[1:1] = ["-s", script]
    out = subprocess.run(pinned(argv, LOAD_CPU, pin), capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)

    def pct(p):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)", out, re.M)
        if not m:
            return float("nan")
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v

    return {"rps": rps, "requests": total, "non2xx": int(non2xx.group(1)) if non2xx else 0,
            "sockerr": sum(int(x) for x in errors.groups()) if errors else 0, "p50": pct(50), "p99": pct(99)}


def pinned(argv, cpu, pin):
    return ["taskset", "-c", cpu, *argv] if pin else argv


def write_configs(d, workers=None, also=False):
    up = PORTS["upstream"]
    common = f"pid {d}/%s.pid;\nerror_log {d}/%s-error.log warn;\nworker_rlimit_nofile 65536;\nevents {{ worker_connections 16384; }}\n"
    http_common = (f"access_log off; keepalive_requests 100000000; keepalive_timeout 300s;"
                   f" client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;"
                   f" uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;")
    os.makedirs(f"{d}/tmp", exist_ok=True)
    with open(f"{d}/upstream.conf", "w") as f:
        f.write(common % ("up", "up") + f"worker_processes 1;\nhttp {{ {http_common}\n"
                f"  server {{ listen 127.0.0.1:{up} backlog=4096; location / {{ default_type text/plain; return 200 \"ok\\n\"; }} }} }}\n")
    with open(f"{d}/nginx.conf", "w") as f:
        f.write(common % ("ng", "ng") + "worker_processes 1;\nhttp { " + http_common + "\n"
                "  limit_req_zone $binary_remote_addr zone=allow:10m rate=100000000r/s;\n"
                "  limit_req_zone $binary_remote_addr zone=reject:10m rate=1r/s;\n"
                "  limit_req_status 429; limit_req_log_level info;\n"
                f"  upstream app {{ server 127.0.0.1:{up}; keepalive 1024; keepalive_requests 100000000; }}\n"
                f"  server {{ listen 127.0.0.1:{PORTS['nginx']} backlog=4096; location / {{ limit_req zone=allow burst=1000000 nodelay;"
                " proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }\n"
                f"  server {{ listen 127.0.0.1:{PORTS['nginx_reject']} backlog=4096; location / {{ limit_req zone=reject;"
                " proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }\n}\n")
    with open(f"{d}/haproxy.cfg", "w") as f:
        f.write("global\n  nbthread 1\n  maxconn 8000\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n"
                "  timeout server 300s\n  timeout http-keep-alive 300s\n  http-reuse always\n"
                f"backend app\n  server s1 127.0.0.1:{up}\n"
                f"frontend allow\n  bind 127.0.0.1:{PORTS['haproxy']}\n  stick-table type ip size 100k expire 60s store http_req_rate(60s)\n"
                "  http-request track-sc0 src\n  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 2000000000 }\n  default_backend app\n"
                f"frontend reject\n  bind 127.0.0.1:{PORTS['haproxy_reject']}\n  stick-table type ip size 100k expire 60s store http_req_rate(1s)\n"
                "  http-request track-sc0 src\n  http-request deny deny_status 429 if { sc_http_req_rate(0) gt 1 }\n  default_backend app\n")
    # `path` belongs to the SQLite store only (tollgate refuses it on another backend).
    stores = {"tollgate": (f'{{ backend: sqlite, path: "{d}/tollgate.db" }}', UNLOGGED),
              "tollgate_mem": ("{ backend: memory }", UNLOGGED),
              "tollgate_logged": (f'{{ backend: sqlite, path: "{d}/logged.db" }}', "")}
    if also:
        stores["tollgate_also"] = (f'{{ backend: sqlite, path: "{d}/also.db" }}', UNLOGGED)
    threads = f", workers: {workers}" if workers else ""
    for name, (store, logging) in stores.items():
        with open(f"{d}/{name}.yaml", "w") as f:
            f.write(f"""server: {{ listen: ["127.0.0.1:{PORTS[name]}"]{threads} }}
admin: {{ listen: "127.0.0.1:{PORTS[name + '_admin']}" }}
store: {store}
{logging}upstreams:
  app: {{ url: "http://127.0.0.1:{up}" }}
limiters:
  allow: {{ algorithm: fixed_window, limit: 1000000000, window: 60s, key: ip }}
  reject: {{ algorithm: fixed_window, limit: 1, window: 1s, key: ip }}
routes:
  - {{ name: reject, match: {{ path_prefix: /reject }}, upstream: app, limiters: [reject] }}
  - {{ name: allow, match: {{ path_prefix: / }}, upstream: app, limiters: [allow] }}
""")


def write_access_log_configs(d):
    for name, log_yaml in ACCESS_LOG.items():
        with open(f"{d}/{name}.yaml", "w") as f:
            f.write(f"""server: {{ listen: ["127.0.0.1:{PORTS[name]}"] }}
admin: {{ listen: "127.0.0.1:{PORTS[name + '_admin']}" }}
store: {{ backend: memory }}
log: {log_yaml}
upstreams:
  app: {{ url: "http://127.0.0.1:{PORTS['upstream']}" }}
limiters:
  allow: {{ algorithm: fixed_window, limit: 1000000000, window: 60s, key: ip }}
routes:
  - {{ name: allow, match: {{ path_prefix: / }}, upstream: app, limiters: [allow] }}
""")


def ratio_median(rounds, target, ref):
    rs = [r[target]["rps"] / r[ref]["rps"] for r in rounds if target in r and ref in r and r[ref]["rps"] > 0]
    return statistics.median(rs) if rs else float("nan")


def benchmark(args, d, tollgate_bin):
    write_configs(d, workers=1 if args.pin else None, also=bool(args.also))
    if args.access_log:
        write_access_log_configs(d)
    servers = {
        "upstream": (["nginx", "-p", d, "-e", f"{d}/up-error.log", "-c", f"{d}/upstream.conf", "-g", "daemon off;"], PORTS["upstream"]),
        "nginx": (["nginx", "-p", d, "-e", f"{d}/ng-error.log", "-c", f"{d}/nginx.conf", "-g", "daemon off;"], PORTS["nginx"]),
        "haproxy": (["haproxy", "-db", "-f", f"{d}/haproxy.cfg"], PORTS["haproxy"]),
        "tollgate": ([tollgate_bin, "--config", f"{d}/tollgate.yaml"], PORTS["tollgate"]),
        "tollgate_mem": ([tollgate_bin, "--config", f"{d}/tollgate_mem.yaml"], PORTS["tollgate_mem"]),
        "tollgate_logged": ([tollgate_bin, "--config", f"{d}/tollgate_logged.yaml"], PORTS["tollgate_logged"]),
    }
    if args.also:
        servers["tollgate_also"] = ([args.also, "--config", f"{d}/tollgate_also.yaml"], PORTS["tollgate_also"])
    if args.floor:
        workers = "1" if args.pin else "2"
        for name, extra in (("floor", []), ("floor_reject", ["--reject"])):
            servers[name] = ([args.floor, "serve", f"127.0.0.1:{PORTS[name]}", f"127.0.0.1:{PORTS['upstream']}",
                              "--workers", workers, *extra], PORTS[name])
    if args.access_log:
        # nginx stays as the reference of the eff/ng column; haproxy is not needed here.
        servers = {name: servers[name] for name in ("upstream", "nginx")}
        for name in ACCESS_LOG:
            servers[name] = ([tollgate_bin, "--config", f"{d}/{name}.yaml"], PORTS[name])
    pids = {}
    for name, (argv, port) in servers.items():
        p = start(name, pinned(argv, LOAD_CPU if name == "upstream" else PROXY_CPU, args.pin), d)
        wait_http(f"http://127.0.0.1:{port}/", p)
        pids[name] = p.pid
    time.sleep(0.5)
    targets = {
        ("direct", "allow"): ("upstream", f"http://127.0.0.1:{PORTS['upstream']}/"),
        ("nginx", "allow"): ("nginx", f"http://127.0.0.1:{PORTS['nginx']}/"),
        ("haproxy", "allow"): ("haproxy", f"http://127.0.0.1:{PORTS['haproxy']}/"),
        ("tollgate", "allow"): ("tollgate", f"http://127.0.0.1:{PORTS['tollgate']}/"),
        ("tollgate-memory", "allow"): ("tollgate_mem", f"http://127.0.0.1:{PORTS['tollgate_mem']}/"),
        ("tollgate-logged", "allow"): ("tollgate_logged", f"http://127.0.0.1:{PORTS['tollgate_logged']}/"),
        ("nginx", "reject"): ("nginx", f"http://127.0.0.1:{PORTS['nginx_reject']}/"),
        ("haproxy", "reject"): ("haproxy", f"http://127.0.0.1:{PORTS['haproxy_reject']}/"),
        ("tollgate", "reject"): ("tollgate", f"http://127.0.0.1:{PORTS['tollgate']}/reject"),
        ("tollgate-logged", "reject"): ("tollgate_logged", f"http://127.0.0.1:{PORTS['tollgate_logged']}/reject"),
    }
    if args.also:
        targets[("tollgate-also", "allow")] = ("tollgate_also", f"http://127.0.0.1:{PORTS['tollgate_also']}/")
        targets[("tollgate-also", "reject")] = ("tollgate_also", f"http://127.0.0.1:{PORTS['tollgate_also']}/reject")
    if args.floor:
        targets[("floor", "allow")] = ("floor", f"http://127.0.0.1:{PORTS['floor']}/")
        targets[("floor-reject", "reject")] = ("floor_reject", f"http://127.0.0.1:{PORTS['floor_reject']}/reject")
    if args.access_log:
        targets = {key: t for key, t in targets.items() if key[1] == "allow" and key[0] in ("direct", "nginx")}
        for name in ACCESS_LOG:
            targets[(name.replace("_", "-"), "allow")] = (name, f"http://127.0.0.1:{PORTS[name]}/")
    trees = {name: tree(pid) for name, pid in pids.items()}
    mem = {name: {"idle": rss_kib(t, skip_root=name in ("nginx", "upstream")), "peak": 0} for name, t in trees.items()}
    sampling = True

    def sample():
        while sampling:
            for name, t in trees.items():
                mem[name]["peak"] = max(mem[name]["peak"], rss_kib(t, skip_root=name in ("nginx", "upstream")))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results = {}
    keys = list(targets)
    for conns in args.conns:
        log(f"c={conns}: warm-up")
        for key in keys:
            wrk(targets[key][1], conns, args.warmup, pin=args.pin)
        rounds = []
        for r in range(args.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            row = {}
            for key in order:
                name, url = targets[key]
                time.sleep(args.pause)
                before = cpu_ticks(trees[name])
                res = wrk(url, conns, args.duration, pin=args.pin)
                used = cpu_ticks(trees[name]) - before
                res["cpu_us"] = used / CLK * 1e6 / max(res["requests"], 1)
                row[key] = res
            rounds.append(row)
            log(f"c={conns}: round {r + 1}/{args.rounds} done")
        results[conns] = rounds
    sampling = False
    sampler.join()
    return results, mem


def summarize(results, mem, args):
    lines = []
    # Each path's own floor: the forwarding one for allow, the prebuilt 429 for reject.
    floors = {"allow": ("floor", "allow"), "reject": ("floor-reject", "reject")}
    for conns, rounds in results.items():
        with_floor = floors["allow"] in rounds[0]
        lines.append(f"\n-c{conns}, {len(rounds)} rounds of {args.duration}s (medians; ratios are medians of same-round ratios)")
        lines.append(f"{'scenario':8} {'target':16} {'rps':>9} {'p50ms':>7} {'p99ms':>7} {'non2xx%':>8} {'cpu/req':>8} "
                     f"{'eff/ng':>7} {'x/direct':>8} {'x/nginx':>8} {'x/haproxy':>9}" + (f" {'x/floor':>8} {'cpu/floor':>9}" if with_floor else ""))
        for key in rounds[0]:
            target, scenario = key
            med = lambda f: statistics.median(r[key][f] for r in rounds)
            reqs = sum(r[key]["requests"] for r in rounds)
            non2xx = 100.0 * sum(r[key]["non2xx"] for r in rounds) / max(reqs, 1)
            err = sum(r[key]["sockerr"] for r in rounds)
            ng = ("nginx", scenario)
            eff = statistics.median(r[ng]["cpu_us"] for r in rounds) / med("cpu_us")
            line = (f"{scenario:8} {target:16} {med('rps'):9.0f} {med('p50'):7.2f} {med('p99'):7.2f} {non2xx:8.1f} "
                    f"{med('cpu_us'):7.1f}u {eff:7.2f} {ratio_median(rounds, key, ('direct', 'allow')):8.2f} "
                    f"{ratio_median(rounds, key, ng):8.2f} {ratio_median(rounds, key, ('haproxy', scenario)):9.2f}")
            if with_floor:
                ref = floors[scenario]
                cpu = statistics.median(r[key]["cpu_us"] / r[ref]["cpu_us"] for r in rounds)
                line += f" {ratio_median(rounds, key, ref):8.2f} {cpu:9.2f}"
            if err:
                line += f"  sockerr={err}"
            lines.append(line)
        if args.access_log:
            off = ("log-off", "allow")
            lines.append("access log vs off (medians of same-round ratios): rps, cpu/req")
            for target in ("log-json", "log-text"):
                key = (target, "allow")
                cpu = statistics.median(r[key]["cpu_us"] / r[off]["cpu_us"] for r in rounds)
                lines.append(f"  {target:10} rps x{ratio_median(rounds, key, off):.3f}   cpu/req x{cpu:.3f}")
    lines.append("\nmemory (KiB)   idle RSS   peak RSS   (nginx: workers only)")
    for name, m in mem.items():
        lines.append(f"{name:14} {m['idle']:9} {m['peak']:10}")
    return "\n".join(lines)


def keys_test(args, d, tollgate_bin):
    """Memory for N distinct client keys, and that pruning gives it back."""
    window = 120  # longer than the fill: no key may expire before the count is reached
    with open(f"{d}/keys.yaml", "w") as f:
        f.write(f"""server: {{ listen: ["127.0.0.1:{PORTS['tollgate']}"] }}
admin: {{ listen: "127.0.0.1:{PORTS['tollgate_admin']}" }}
store: {{ backend: sqlite, path: "{d}/keys.db", prune_interval: 2s, max_keys: {args.keys + 1000} }}
audit: {{ enabled: false }}
limiters:
  per_key: {{ algorithm: fixed_window, limit: 100, window: {window}s, key: api_key }}
routes:
  - {{ name: r, match: {{ path_prefix: / }}, respond: {{ status: 200, body: "ok" }}, limiters: [per_key] }}
""")
    with open(f"{d}/keys.lua", "w") as f:
        f.write('local n = 0\nrequest = function()\n  n = n + 1\n  return wrk.format("GET", "/", { ["X-Client-Key"] = "client-" .. n })\nend\n')
    p = start("tollgate", [tollgate_bin, "--config", f"{d}/keys.yaml"], d)
    wait_http(f"http://127.0.0.1:{PORTS['tollgate']}/", p)
    time.sleep(0.5)
    idle = rss_kib([p.pid])

    def tracked():
        text = urllib.request.urlopen(f"http://127.0.0.1:{PORTS['tollgate_admin']}/metrics").read().decode()
        return int(float(re.search(r"^tollgate_tracked_keys (\S+)", text, re.M).group(1)))

    load = subprocess.Popen(["wrk", "-t1", "-c64", "-d120s", "-s", f"{d}/keys.lua", f"http://127.0.0.1:{PORTS['tollgate']}/"],
                            stdout=subprocess.DEVNULL)
    started = time.time()
    peak = 0
    while tracked() < args.keys and time.time() - started < 115:
        peak = max(peak, rss_kib([p.pid]))
        time.sleep(0.5)
    load.terminate()
    load.wait()
    time.sleep(1)
    n = tracked()
    full = rss_kib([p.pid])
    peak = max(peak, full)
    log(f"{n} keys tracked after {time.time() - started:.0f}s; waiting for their windows to expire and be pruned")
    deadline = time.time() + 3 * window + 20
    while tracked() > 0 and time.time() < deadline:
        time.sleep(1)
    time.sleep(3)
    after = rss_kib([p.pid])
    return (f"keys: {n} distinct client keys\n  idle RSS {idle} KiB\n  RSS with {n} keys {full} KiB (peak {peak} KiB)\n"
            f"  after expiry and prune: {tracked()} keys, RSS {after} KiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--conns", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    ap.add_argument("--quick", action="store_true", help="c=64, 3 rounds of 5 s")
    ap.add_argument("--keys", type=int, default=0, help="run the N-distinct-keys memory test instead")
    ap.add_argument("--access-log", action="store_true",
                    help="allow path only: tollgate with log.access off, json and text, same rounds")
    ap.add_argument("--tollgate", help="the build to measure (default: target/PROFILE/tollgate, built when missing)")
    ap.add_argument("--profile", default="release",
                    help="cargo profile of the default tollgate and of the floor built by --floor (dist: what the image and packages ship)")
    ap.add_argument("--also", metavar="TOLLGATE",
                    help="a second build (another commit or profile) as the row tollgate-also, configured as `tollgate`, in the same rounds")
    ap.add_argument("--floor", nargs="?", const="build", default=None,
                    help="add the hyper floor row; optionally the hyper_floor binary (default: cargo build --profile PROFILE --bench hyper_floor)")
    ap.add_argument("--pin", action="store_true",
                    help="wrk and the upstream on CPU 0, each proxy on CPU 1 with one worker")
    ap.add_argument("--port-offset", type=int, default=0,
                    help="added to every port, so two runs can share the machine")
    ap.add_argument("--json", help="also write raw results here")
    args = ap.parse_args()
    for name in PORTS:
        PORTS[name] += args.port_offset
    if args.quick:
        args.rounds, args.duration, args.conns = 3, 5, [64]
    peers = (("nginx", "nginx"), ("wrk", "wrk")) if args.access_log else (("nginx", "nginx"), ("haproxy", "haproxy"), ("wrk", "wrk"))
    for cmd, pkg in peers:
        need(cmd, pkg)
    if args.tollgate is None:
        args.tollgate = os.path.join(ROOT, "target", args.profile, "tollgate")
        if not os.path.exists(args.tollgate):
            log(f"building tollgate (cargo build --profile {args.profile})")
            subprocess.run(["cargo", "build", "--profile", args.profile, "--bin", "tollgate"], cwd=ROOT, check=True)
    if args.floor == "build":
        args.floor = floor_binary(args.profile)
    d = tempfile.mkdtemp(prefix="tollgate-bench.")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.keys:
            print(keys_test(args, d, args.tollgate))
            return
        results, mem = benchmark(args, d, args.tollgate)
        text = summarize(results, mem, args)
        placement = "pinned: wrk and upstream on CPU 0, each proxy alone on CPU 1, one worker" if args.pin else "unpinned"
        also = f"; tollgate-also {args.also}" if args.also else ""
        print(f"machine: {os.cpu_count()} cores; wrk -t1; {placement}; tollgate {args.tollgate}{also}; floor {args.floor}")
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({str(c): [{f"{k[0]}/{k[1]}": v for k, v in r.items()} for r in rounds] for c, rounds in results.items()}, f, indent=1)
    finally:
        stop_all()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
