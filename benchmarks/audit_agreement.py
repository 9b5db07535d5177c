"""Is the load generator's self-audit the server's truth? Side by side, at rates held and not.

A zero-work streaming server (HTTP/1.1, ``/v1/completions`` SSE) runs pinned to one core
and takes each request's arrival from the kernel's receive stamp of its bytes
(``SO_TIMESTAMPNS``), with the request's number (carried in its prompt). gpudoctor's real client (``run_requests``, Poisson arrivals,
a concurrency cap high enough to be no limit unless ``--concurrency`` says so) runs pinned
to another core. Per rate it prints what the audit says (``client_audit``: sent rate,
schedule delay p99) beside what the server saw (its arrivals' rate; each arrival minus the
schedule's intended send), their ratio, and the audit of before issue 45.9 (send stamped
before the connect, slot waits taken out) on the same records.

    nice .venv/bin/python benchmarks/audit_agreement.py [--rates 200,1000,2000,4000,8000]
        [--seconds 2] [--concurrency 100000] [--server-core 0] [--client-core 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import contextlib

from client_overhead import _free_port, _wait_port

EVENT = (b'data: {"id":"x","object":"text_completion","choices":[{"index":0,"text":" tok",'
         b'"finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n'
         b"data: [DONE]\n\n")  # fmt: skip


def serve(port: int, log_path: str) -> None:
    """The zero-work endpoint: one event per request. Each request's arrival is the
    KERNEL's receive stamp of its bytes (``SO_TIMESTAMPNS``, wall clock): when they reached
    the server's socket, whenever this process gets to read them (a busy server's own lag
    is not the client's). Writes ``[[number, arrival], ...]`` to ``log_path`` on SIGTERM."""
    import selectors
    import socket
    import struct

    stamp = getattr(socket, "SO_TIMESTAMPNS", 35)
    arrivals: list[tuple[int, float]] = []
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, stamp, 1)  # inherited by every accepted socket
    listener.bind(("127.0.0.1", port))
    listener.listen(8192)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    pending: dict[socket.socket, list] = {}  # socket -> [bytes so far, first kernel stamp]
    frame = b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT)
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
              b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n" + frame)  # fmt: skip

    def stop(*_: object) -> None:
        Path(log_path).write_text(json.dumps(arrivals))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                try:
                    conn, _addr = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                pending[conn] = [b"", None]
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj  # type: ignore[assignment]
            try:
                data, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(16))
            except BlockingIOError:
                continue
            state = pending[conn]
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == stamp and state[1] is None:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    state[1] = sec + nsec * 1e-9
            state[0] += data
            head, sep, body = state[0].partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            if data and not (sep and len(body) >= length):
                continue  # the rest of the request is still to come
            sel.unregister(conn)
            del pending[conn]
            if data and state[1] is not None:
                number = int(json.loads(body[:length]).get("prompt", "req -1").split()[1])
                arrivals.append((number, state[1]))
                with contextlib.suppress(OSError):
                    conn.sendall(answer)
            conn.close()


def client(port: int, rate: float, count: int, concurrency: int, out: str) -> None:
    """Run gpudoctor's client at ``rate``; write its records and the cell's start to ``out``."""
    from gpudoctor.bench.load.client import ClientOptions, make_client, run_requests
    from gpudoctor.bench.load.workload import Prompt

    async def go() -> dict:
        options = ClientOptions(f"http://127.0.0.1:{port}", "bench-model")
        prompts = [Prompt(f"req {i} x", 4, 1) for i in range(count)]
        async with make_client(64, 60) as http:
            cpu0 = time.process_time()
            t0 = time.perf_counter()  # run_requests' own start is a few microseconds later
            offset = time.time() - time.perf_counter()  # the server's stamps are wall clock
            records, wall = await run_requests(http, options, prompts, concurrency,
                                               request_rate=rate, seed=1)  # fmt: skip
            cpu = time.process_time() - cpu0
        return {"t0": t0 + offset, "wall": wall, "cpu": cpu,
                "records": [r.to_json() for r in records]}  # fmt: skip

    Path(out).write_text(json.dumps(asyncio.run(go())))


def _p99(values: list[float]) -> float | None:
    from gpudoctor.bench.results.metrics import percentile

    return percentile(values, 99) if values else None


def compare(rate: float, seconds: float, concurrency: int, server_core: int,
            client_core: int) -> dict:  # fmt: skip
    """Return one rate's row: the audit beside the server's view (and the old audit)."""
    from gpudoctor.bench.request_record import RequestRecord
    from gpudoctor.bench.results.metrics import client_audit

    port, count = _free_port(), max(int(rate * seconds), 50)
    with tempfile.TemporaryDirectory() as tmp:
        log, out = Path(tmp) / "arrivals.json", Path(tmp) / "client.json"
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port), "--log", str(log)]
        )
        os.sched_setaffinity(server.pid, {server_core})
        try:
            _wait_port(port)
            subprocess.run(["taskset", "-c", str(client_core), sys.executable, __file__,
                            "--client", str(port), "--rate", str(rate), "--count", str(count),
                            "--concurrency", str(concurrency), "--out", str(out)],
                           check=True, timeout=seconds * 30 + 120)  # fmt: skip
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(20)
        arrivals = dict((n, t) for n, t in json.loads(log.read_text()) if n >= 0)
        data = json.loads(out.read_text())
    records = [RequestRecord.from_json(r) for r in data["records"]]
    audit = client_audit(records, data["wall"], data["cpu"])
    seen = sorted(arrivals.values())
    server_rate = (len(seen) - 1) / (seen[-1] - seen[0]) if len(seen) >= 2 else None
    t0 = data["t0"]
    server_delays = [max(arrivals[r.index] - t0 - r.intended_s, 0.0) for r in records
                     if r.index in arrivals and r.intended_s is not None]  # fmt: skip
    sent = sorted((r for r in records if r.wall_s), key=lambda r: r.send_s)  # the audit before
    old_rate = (len(sent) - 1) / (sent[-1].send_s - sent[0].send_s) if len(sent) >= 2 else None
    old_delays = [max(r.send_s - r.intended_s - (r.queued_s or 0.0), 0.0) for r in sent
                  if r.intended_s is not None]  # fmt: skip
    server_p99 = _p99(server_delays)
    return {
        "rate": rate, "count": count, "server_seen": len(seen), "ok": sum(r.ok for r in records),
        "audit_rate": audit["achieved_rate"], "server_rate": server_rate,
        "rate_audit_over_server": (audit["achieved_rate"] or 0) / server_rate if server_rate else None,
        "old_rate_over_server": (old_rate or 0) / server_rate if server_rate else None,
        "audit_delay_p99_ms": audit["schedule_delay_ms_p99"],
        "server_delay_p99_ms": None if server_p99 is None else server_p99 * 1000,
        "old_delay_p99_ms": None if not old_delays else (_p99(old_delays) or 0) * 1000,
        "rate_ratio": audit["rate_ratio"], "server_ratio": server_rate / rate if server_rate else None,
        "cpu_busy": audit["cpu_busy"],
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", type=int)
    p.add_argument("--log")
    p.add_argument("--client", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--count", type=int)
    p.add_argument("--out")
    p.add_argument("--rates", default="200,1000,2000,4000,8000")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=100000)
    p.add_argument("--server-core", type=int, default=0)
    p.add_argument("--client-core", type=int, default=1)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    if args.serve is not None:
        serve(args.serve, args.log)
        return
    if args.client is not None:
        client(args.client, args.rate, args.count, args.concurrency, args.out)
        return
    rows = []
    print(f"{'rate':>6} {'sent/target':>11} {'audit req/s':>11} {'server req/s':>12} "
          f"{'audit/server':>12} {'old/server':>10} {'audit p99 ms':>12} {'server p99 ms':>13} "
          f"{'old p99 ms':>10}")  # fmt: skip
    for rate in (float(r) for r in args.rates.split(",")):
        row = compare(rate, args.seconds, args.concurrency, args.server_core, args.client_core)
        rows.append(row)

        def f(v: float | None, spec: str) -> str:
            return "-" if v is None else format(v, spec)

        print(f"{rate:>6.0f} {f(row['server_ratio'], '.3f'):>11} {f(row['audit_rate'], '.0f'):>11} "
              f"{f(row['server_rate'], '.0f'):>12} {f(row['rate_audit_over_server'], '.4f'):>12} "
              f"{f(row['old_rate_over_server'], '.4f'):>10} {f(row['audit_delay_p99_ms'], '.2f'):>12} "
              f"{f(row['server_delay_p99_ms'], '.2f'):>13} {f(row['old_delay_p99_ms'], '.2f'):>10}",
              flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
