"""How many streamed chunks per CPU-second can gpudoctor's bench client absorb?

Starts a trivial OpenAI-style streaming endpoint (plain asyncio HTTP/1.1, chunked SSE,
events shaped like SGLang's ``/v1/completions`` chunks, ~260 bytes each) in a child
process pinned to another core, then runs the real client (``gpudoctor.bench.load.client``)
against it pinned to one core (both its transports: the default ``fast`` asyncio
Protocol and ``httpx``), and reports chunks / client CPU-second (goal: >= 20,000).

Two server modes:
  burst: every stream sends its events back to back (reads often hold several events);
  paced: every stream sends one event per ``--gap-ms`` (a GPU server's cadence: one
         event per read, the client's worst case per chunk).

Usage: .venv/bin/python benchmarks/client_overhead.py [--streams 64] [--tokens 512]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

EVENT = (
    '{"id":"0123456789abcdef0123456789abcdef","object":"text_completion","created":1764000000,'
    '"model":"bench-model","choices":[{"index":0,"text":" token","logprobs":null,'
    '"finish_reason":null,"matched_stop":null}],"usage":null}'
)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """Return one HTTP/1.1 request's head and body (by its content-length) from ``reader``."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, (await reader.readexactly(length) if length else b"")


async def _serve(port: int, mode: str, gap_s: float) -> None:
    """The trivial endpoint: reads one request, streams ``max_tokens`` events + usage."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                _, raw = await read_request(reader)
                body = json.loads(raw)
                tokens = int(body.get("max_tokens", 16))
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                event = f"data: {EVENT}\n\n".encode()
                frame = f"{len(event):x}\r\n".encode() + event + b"\r\n"
                for _ in range(tokens):
                    writer.write(frame)
                    if mode == "paced":
                        await writer.drain()
                        await asyncio.sleep(gap_s)
                usage = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 4, "completion_tokens": tokens}}  # fmt: skip
                last = f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
                writer.write(f"{len(last):x}\r\n".encode() + last + b"\r\n0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int) -> None:
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("endpoint did not start")


async def _measure(port: int, streams: int, tokens: int, requests: int, transport: str) -> dict:
    from gpudoctor.bench.load.client import ClientOptions, make_client, run_requests
    from gpudoctor.bench.load.workload import Prompt

    options = ClientOptions(f"http://127.0.0.1:{port}", "bench-model", transport=transport)
    prompts = [Prompt("hello", 4, tokens) for _ in range(requests)]
    async with make_client(streams, 60) as client:
        await run_requests(client, options, prompts[:streams], streams)  # warm the pool
        cpu0, wall0 = time.process_time(), time.perf_counter()
        records, _ = await run_requests(client, options, prompts, streams)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    chunks = sum(len(r.chunk_times_s) for r in records)
    failed = sum(1 for r in records if not r.ok)
    assert failed == 0, f"{failed} requests failed"
    assert all(r.output_tokens == tokens for r in records)
    return {"chunks": chunks, "client_cpu_s": cpu, "wall_s": wall,
            "chunks_per_cpu_s": chunks / cpu, "chunks_per_wall_s": chunks / wall}  # fmt: skip


def run_mode(
    mode: str, transport: str, streams: int, tokens: int, requests: int, gap_ms: float
) -> dict:
    """Start the endpoint in ``mode``, measure the client; return the numbers."""
    port = _free_port()
    cores = sorted(os.sched_getaffinity(0))
    server_core, client_core = (cores[-1], cores[0]) if len(cores) > 1 else (cores[0], cores[0])
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--mode", mode, "--gap-ms", str(gap_ms)]
    )
    try:
        os.sched_setaffinity(child.pid, {server_core})
        os.sched_setaffinity(0, {client_core})
        _wait_port(port)
        result = asyncio.run(_measure(port, streams, tokens, requests, transport))
    finally:
        child.terminate()
        child.wait(10)
        os.sched_setaffinity(0, set(cores))
    return {
        "mode": mode,
        "transport": transport,
        "streams": streams,
        "tokens": tokens,
        "requests": requests,
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["burst", "paced"], default="burst")
    parser.add_argument("--gap-ms", type=float, default=2.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--transports", default="fast,httpx", help="comma-separated")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.mode, args.gap_ms / 1000))
        return
    results = [
        run_mode(mode, transport, args.streams, args.tokens, args.requests, args.gap_ms)
        for transport in args.transports.split(",")
        for mode in ("burst", "paced")
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"{r['transport']:>5} {r['mode']:>5}: {r['chunks']} chunks, client CPU {r['client_cpu_s']:.2f} s, "
              f"wall {r['wall_s']:.2f} s -> {r['chunks_per_cpu_s']:,.0f} chunks/CPU-s "
              f"({r['chunks_per_wall_s']:,.0f}/s wall)")  # fmt: skip


if __name__ == "__main__":
    main()
