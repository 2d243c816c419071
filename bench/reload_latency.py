#!/usr/bin/env python3
"""Reload latency: time from a config edit to the new limit being enforced.

Starts the release binary with a 1/60s limit, uses it up, rewrites the config
(in place, or write-and-rename like most editors) with a higher limit, and
polls every 5 ms until a request is admitted. Repeats and prints the median.

    bench/reload_latency.py [--runs 10] [--tollgate target/release/tollgate]
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT, ADMIN = 19200, 19201


def config(limit, db):
    return (f'server: {{ listen: ["127.0.0.1:{PORT}"] }}\nadmin: {{ listen: "127.0.0.1:{ADMIN}" }}\n'
            f'store: {{ path: "{db}" }}\nlimiters:\n  l: {{ limit: {limit}, window: 60s }}\n'
            f'routes:\n  - {{ name: r, match: {{ path: /ping }}, respond: {{ status: 200, body: pong }}, limiters: [l] }}\n')


def status():
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{PORT}/ping", timeout=2).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--tollgate", default=os.path.join(ROOT, "target/release/tollgate"))
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="tollgate-reload.")
    path, db = os.path.join(d, "tollgate.yaml"), os.path.join(d, "t.db")
    results = {"in place": [], "rename": []}
    for run in range(args.runs):
        for how in results:
            with open(path, "w") as f:
                f.write(config(1, db))
            if os.path.exists(db):
                os.remove(db)
            p = subprocess.Popen([args.tollgate, "--config", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while status() == 0:
                time.sleep(0.02)
            status()
            assert status() == 429
            edited = time.monotonic()
            if how == "in place":
                with open(path, "w") as f:
                    f.write(config(1000, db))
            else:
                with open(path + ".tmp", "w") as f:
                    f.write(config(1000, db))
                os.rename(path + ".tmp", path)
            while status() != 200:
                time.sleep(0.005)
            results[how].append(time.monotonic() - edited)
            p.terminate()
            p.wait()
    for how, r in results.items():
        print(f"{how:9}: median {statistics.median(r) * 1000:.0f} ms, min {min(r) * 1000:.0f} ms, "
              f"max {max(r) * 1000:.0f} ms over {len(r)} runs (250 ms poll, applied after one still poll)")


if __name__ == "__main__":
    main()
