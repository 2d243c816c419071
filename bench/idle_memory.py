#!/usr/bin/env python3
"""Resident memory of a running tollgate: idle, and with N open keep-alive
connections (each has had one request answered, so its buffers are in use).
The numbers the Kubernetes resource requests are sized from.

    bench/idle_memory.py BINARY [N ...]        (default N: 1000 4000)

Starts BINARY serve on free loopback ports with a temp SQLite file, prints
VmRSS (KiB) idle and at each N, and the increase per connection.
"""
import os, socket, subprocess, sys, tempfile, time, resource

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def main():
    binary = sys.argv[1]
    counts = [int(n) for n in sys.argv[2:]] or [1000, 4000]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    d = tempfile.mkdtemp()
    port, admin = free_port(), free_port()
    open(f"{d}/t.yaml", "w").write(f"""
server: {{ listen: ["127.0.0.1:{port}"], max_connections: 100000, max_connections_per_ip: 100000 }}
admin: {{ listen: "127.0.0.1:{admin}" }}
store: {{ backend: sqlite, path: "{d}/t.db" }}
limiters:
  global: {{ algorithm: fixed_window, limit: 1000000, window: 60s, key: client }}
routes:
  - {{ name: ping, match: {{ path: /ping }}, respond: {{ status: 200, body: "pong\\n" }}, limiters: [global] }}
""")
    proc = subprocess.Popen([binary, "serve", "--config", f"{d}/t.yaml"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", admin), timeout=1).close(); break
            except OSError:
                time.sleep(0.1)
        # One request first, so lazily built state (the route, the store) is counted as idle.
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); c.recv(4096); c.close()
        time.sleep(2)
        idle = rss_kib(proc.pid)
        print(f"idle: {idle} KiB")
        conns, answered = [], 0
        for n in counts:
            while len(conns) < n:
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
                conns.append(s)
            for s in conns[answered:]:
                s.settimeout(5)
                assert s.recv(4096).startswith(b"HTTP/1.1 200"), "a connection was refused"
            answered = len(conns)
            time.sleep(2)
            now = rss_kib(proc.pid)
            print(f"{n} open connections: {now} KiB, {(now - idle) / n:.1f} KiB per connection over idle")
    finally:
        proc.terminate(); proc.wait(timeout=30)

main()
