#!/usr/bin/env python3
"""Where a 429's CPU goes, natively: kernel and user space per 429, tollgate against the 429 floor.

The pinned reject race of bench/proxybench.py, one server at a time: the
server alone on CPU 1 with one worker (tollgate's `tollgate.yaml` of that
script: SQLite store, no access log, no audit row; the floor's
`hyper_floor --reject`, which answers every request with a prebuilt 429 of
the same headers and body size), `wrk -t1` on CPU 0, and `perf record -e
cpu-clock` on the server for the middle of the load. For each it prints the
429s a second, the CPU's split per 429 (`perf report --sort dso`) and the
share of the samples in the wake-up of the client's reader
(`_raw_spin_unlock_irqrestore`, reached from `sock_def_readable`).

    cargo build --release --bins --bench hyper_floor
    bench/perf_429.py --tollgate target/release/tollgate [--floor HF] [--conns 64] [--seconds 8]

Needs perf (Debian's linux-perf), nginx (the upstream the first request of
each second goes to) and wrk; the ports are proxybench's.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import proxybench as pb  # noqa: E402 (after the path it is found on)
from hyper_floor import floor_binary  # noqa: E402

HZ = 4999
WAKE_UP = "_raw_spin_unlock_irqrestore"


def shares(data, sort):
    """`perf report --sort SORT`'s overhead per entry, in percent."""
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", sort],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
        if m:
            rows[m.group(2)] = rows.get(m.group(2), 0.0) + float(m.group(1))
    return rows


def samples(data):
    """How many samples `data` holds: the sum of `--show-nr-samples`' column (the header rounds to thousands)."""
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "--show-nr-samples",
                          "--sort", "dso"], capture_output=True, text=True, check=True).stdout
    return sum(int(m.group(1)) for m in re.finditer(r"^\s*[\d.]+%\s+(\d+)\s", out, re.M))


def profile(name, argv, url, d, args):
    p = pb.start(name, pb.pinned(argv, pb.PROXY_CPU, True), d)
    pb.wait_http(url, p)
    load = subprocess.Popen(pb.pinned(["wrk", "-t1", f"-c{args.conns}", f"-d{args.seconds + 4}s", url],
                                      pb.LOAD_CPU, True), stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    data = f"{d}/{name}.data"
    subprocess.run(["perf", "record", "-q", "-F", str(HZ), "-e", "cpu-clock", "-o", data, "-p", str(p.pid),
                    "--", "sleep", str(args.seconds)], check=True, capture_output=True)
    out = load.communicate()[0]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    dso = shares(data, "dso")
    kernel = sum(v for k, v in dso.items() if "kernel" in k) / 100
    cpu_per_429 = samples(data) / HZ / (rate * args.seconds) * 1e6
    wake = shares(data, "sym")
    wake_up = sum(v for k, v in wake.items() if k.endswith(WAKE_UP)) / 100
    print(f"{name:10} {rate:10.0f} {cpu_per_429:8.1f} {cpu_per_429 * kernel:8.1f} "
          f"{cpu_per_429 * (1 - kernel):8.1f} {kernel * 100:8.1f} {wake_up * 100:7.1f} {cpu_per_429 * wake_up:8.1f}")
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(timeout=10)
    pb.procs.remove((name, p))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tollgate", default=os.path.join(ROOT, "target/release/tollgate"))
    ap.add_argument("--floor", help="the hyper_floor binary (default: cargo build --release --bench hyper_floor)")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=8, help="how long perf records, in the middle of the load")
    args = ap.parse_args()
    for cmd, package in (("perf", "linux-perf"), ("nginx", "nginx-light"), ("wrk", "wrk")):
        pb.need(cmd, package)
    floor = args.floor or floor_binary()
    with tempfile.TemporaryDirectory() as d:
        pb.write_configs(d, workers=1)
        try:
            up = pb.start("upstream", pb.pinned(["nginx", "-p", d, "-e", f"{d}/up-error.log", "-c",
                                                 f"{d}/upstream.conf", "-g", "daemon off;"], pb.LOAD_CPU, True), d)
            pb.wait_http(f"http://127.0.0.1:{pb.PORTS['upstream']}/", up)
            print(f"{'server':10} {'429s/s':>10} {'cpu µs':>8} {'kernel':>8} {'user':>8} {'kernel%':>8} "
                  f"{'wake%':>7} {'wake µs':>8}")
            for name, argv, url in (
                    ("floor", [floor, "serve", f"127.0.0.1:{pb.PORTS['floor_reject']}",
                               f"127.0.0.1:{pb.PORTS['upstream']}", "--workers", "1", "--reject"],
                     f"http://127.0.0.1:{pb.PORTS['floor_reject']}/reject"),
                    ("tollgate", [args.tollgate, "--config", f"{d}/tollgate.yaml"],
                     f"http://127.0.0.1:{pb.PORTS['tollgate']}/reject")):
                profile(name, argv, url, d, args)
        finally:
            pb.stop_all()


if __name__ == "__main__":
    main()
