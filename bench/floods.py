#!/usr/bin/env python3
"""Connection floods against a real tollgate on 127.0.0.1: idle, slowloris, slow body, slow read.

    python3 bench/floods.py [path/to/tollgate] [--scale 1.0]

For each flood it starts a fresh tollgate (in front of an upstream in this
script that counts its open connections), runs the flood for a bounded
time, and meanwhile probes as a normal client every 100 ms from another
source address (127.0.0.2). It prints one row per flood: connections the
flood tried and tollgate held, refusals, peak RSS, peak upstream
connections, and the probe's worst latency and misses.
Everything stays on loopback; every loop is bounded.
"""

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time

BINARY = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "target/debug/tollgate"
# --baseline: a build without the connection and body keys (the config omits them).
BASELINE = "--baseline" in sys.argv
SCALE = float(sys.argv[sys.argv.index("--scale") + 1]) if "--scale" in sys.argv else 1.0
BIG = b"x" * (1 << 20)
# Keys an older build does not know.
BASELINE_LESS = ("max_connections", "idle_timeout", "request_body_", "send_timeout")
# Each flood's settings: the timers that should stop it, shorter than the 15 s run.
EXTRA = {
    "idle": "  max_connections: 8000\n  request_header_timeout: 5s\n",
    "idle_capped": "  max_connections: 2000\n  request_header_timeout: 5s\n",
    "slowloris": "  request_header_timeout: 5s\n",
    "slow_body": "  request_body_timeout: 5s\n",
    "slow_read": "  send_timeout: 5s\n",
}


class UpstreamStats:
    """Open and peak connections, shared with the upstream's own process."""

    def __init__(self):
        import multiprocessing
        self._open = multiprocessing.Value("i", 0)
        self._peak = multiprocessing.Value("i", 0)

    @property
    def peak(self):
        return self._peak.value

    def opened(self):
        with self._open.get_lock():
            self._open.value += 1
            self._peak.value = max(self._peak.value, self._open.value)

    def closed(self):
        with self._open.get_lock():
            self._open.value -= 1


def upstream_process(stats, port_out):
    """The upstream, in a process of its own so the flood cannot slow it."""
    async def serve():
        server = await asyncio.start_server(lambda r, w: upstream_conn(stats, r, w), "127.0.0.1", 0)
        port_out.value = server.sockets[0].getsockname()[1]
        await asyncio.Event().wait()
    asyncio.run(serve())


async def upstream_conn(stats, reader, writer):
    stats.opened()
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            if m:
                await reader.readexactly(int(m.group(1)))
            elif re.search(rb"(?i)\r\ntransfer-encoding: *chunked", head):
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            body = BIG if head.split(b" ")[1].startswith(b"/big") else b"ok\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        stats.closed()
        writer.close()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def http_get(port, path, source="127.0.0.2", timeout=2.0):
    r, w = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), timeout)
    try:
        # The admin API answers only a Host naming it (its guard against DNS rebinding).
        w.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(r.read(), timeout)
        return data
    finally:
        w.close()


async def metric(admin, name):
    text = (await http_get(admin, "/metrics", source="127.0.0.1")).decode()
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else None


async def attacker(port, source, kind, held, stop):
    try:
        r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError:
        return
    try:
        if kind == "slowloris":
            w.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        elif kind == "slow_body":
            w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        elif kind == "slow_read":
            w.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        await w.drain()
        held[0] += 1
        while not stop.is_set():
            if kind == "slowloris":
                w.write(b"X-a: b\r\n")
            elif kind == "slow_body":
                w.write(b"0123456789")
            await w.drain()
            # Slow read: never read; everyone else: notice a close.
            try:
                got = await asyncio.wait_for(r.read(1 if kind != "slow_read" else 0), 1.0)
                if kind != "slow_read" and got == b"":
                    break
            except asyncio.TimeoutError:
                pass
    except (ConnectionError, OSError):
        pass
    finally:
        held[0] -= 1
        w.close()


async def flood(kind, count, seconds, config_extra=""):
    import multiprocessing
    stats = UpstreamStats()
    port_out = multiprocessing.Value("i", 0)
    server = multiprocessing.Process(target=upstream_process, args=(stats, port_out), daemon=True)
    server.start()
    while port_out.value == 0:
        await asyncio.sleep(0.01)
    up = port_out.value
    port, admin = free_port(), free_port()
    if BASELINE:
        config_extra = "".join(l + "\n" for l in config_extra.splitlines()
                               if not any(k in l for k in BASELINE_LESS))
    tmp = tempfile.mkdtemp()
    cfg = os.path.join(tmp, "tollgate.yaml")
    with open(cfg, "w") as f:
        f.write(f"""server:
  listen: ["127.0.0.1:{port}"]
{config_extra}admin:
  listen: "127.0.0.1:{admin}"
store:
  backend: memory
upstreams:
  app: {{ url: "http://127.0.0.1:{up}", timeout: 30s }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, upstream: app }}
""")
    proc = subprocess.Popen([BINARY, "serve", "--config", cfg],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                await http_get(admin, "/healthz", source="127.0.0.1")
                break
            except OSError:
                await asyncio.sleep(0.05)
        base_rss = rss_kb(proc.pid)
        stop = asyncio.Event()
        held = [0]
        # 100 connections per source address, so the per-address cap (256)
        # is not what stops the flood: the total cap and the timers are.
        tasks = []
        for i in range(count):
            source = f"127.0.1.{1 + i // 100 % 250}" if count > 100 else "127.0.1.1"
            tasks.append(asyncio.create_task(attacker(port, source, kind, held, stop)))
            if i % 500 == 499:
                await asyncio.sleep(0.05)
        peak = {"held": 0, "rss": base_rss, "open": 0, "worst_ms": 0.0, "missed": 0, "probes": 0, "admin_missed": 0}
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            t0 = time.monotonic()
            try:
                data = await http_get(port, "/probe", timeout=1.0)
                ok = data.startswith(b"HTTP/1.1 200")
            except (OSError, asyncio.TimeoutError):
                ok = False
            ms = (time.monotonic() - t0) * 1000
            peak["probes"] += 1
            if not ok or ms > 100:
                peak["missed"] += 1
            peak["worst_ms"] = max(peak["worst_ms"], ms)
            try:
                peak["open"] = max(peak["open"], await metric(admin, "tollgate_open_connections") or 0)
            except (OSError, asyncio.TimeoutError):
                peak["admin_missed"] += 1
            peak["held"] = max(peak["held"], held[0])
            peak["rss"] = max(peak["rss"], rss_kb(proc.pid))
            await asyncio.sleep(max(0, 0.1 - (time.monotonic() - t0)))
        # A slow reader never reads, so it never sees the close: count what tollgate still holds.
        open_end = held[0] if kind != "slow_read" else await metric(admin, "tollgate_open_connections") or 0
        refused = await metric(admin, "tollgate_connections_refused_total") or 0
        closed = await metric(admin, "tollgate_connections_closed_total") or 0
        closed += await metric(admin, "tollgate_request_body_timeouts_total") or 0
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        print(f"| {kind} | {count} | {int(peak['open'])} | {int(open_end)} | {int(refused)} | {int(closed)} | "
              f"{base_rss // 1024} → {peak['rss'] // 1024} MB | {stats.peak} | "
              f"{peak['probes'] - peak['missed']}/{peak['probes']} (worst {peak['worst_ms']:.0f} ms) | "
              f"{'yes' if peak['admin_missed'] == 0 else 'missed ' + str(peak['admin_missed'])} |", flush=True)
    finally:
        proc.terminate()
        # Quiet the asyncio noise of upstream handlers cancelled at exit.
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: None)
        proc.wait(timeout=20)
        server.terminate()
        server.join()


async def main():
    n = lambda x: max(1, int(x * SCALE))
    print("| flood | connections tried | peak open in tollgate | attackers still connected at 15 s | refused | closed by a timer (incl. 408) | RSS | peak upstream conns | probes within 100 ms | admin answered |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    if only:
        extra = EXTRA[only]
        counts = {"idle": 12000, "idle_capped": 12000, "slowloris": 3000, "slow_body": 1500, "slow_read": 1000}
        await flood(only.replace("_capped", ""), n(counts[only]), 15, extra)
        return
    await flood("idle", n(12000), 15, EXTRA["idle"])
    await flood("slowloris", n(3000), 15, EXTRA["slowloris"])
    await flood("slow_body", n(1500), 15, EXTRA["slow_body"])
    await flood("slow_read", n(1000), 15, EXTRA["slow_read"])


if __name__ == "__main__":
    asyncio.run(main())
