"""How high a request rate does each load generator hold? gpudoctor beside AIPerf and guidellm.

A zero-work streaming server (asyncio HTTP/1.1, ``/v1/completions`` SSE, ``--tokens``
events per request, no delay) runs pinned to its own core and logs the arrival time of
every request; each client runs pinned to another core, Poisson arrivals at each rate
for ``--seconds``. Printed per (tool, rate): achieved / target by the server's own
request log (``(n - 1) / (last - first arrival)``), the client's own count, and for
gpudoctor its self-audit (schedule delay p50/p99, rate ratio, client CPU busy).

AIPerf and guidellm are not gpudoctor dependencies: install each in its own venv and
point ``--aiperf`` / ``--guidellm`` at their console scripts (a missing one is skipped):

    python -m venv V/aiperf && V/aiperf/bin/pip install aiperf
    python -m venv V/guidellm && V/guidellm/bin/pip install guidellm
    nice .venv/bin/python benchmarks/loadgen_ceiling.py --aiperf V/aiperf/bin/aiperf \\
        --guidellm V/guidellm/bin/guidellm --tokenizer DIR [--rates 50,200,500,1000,2000,4000]

``--tokenizer``: a local HF tokenizer directory (the peers need one to build prompts).
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

from client_overhead import _free_port, _wait_port, read_request

EVENT = b'{"id":"x","object":"text_completion","model":"bench-model","choices":[{"index":0,"text":" tok","finish_reason":null}]}'


def serve(port: int, log_path: str, gap_s: float = 0.0) -> None:
    """The zero-work endpoint; writes every request's arrival time (s) to ``log_path`` on SIGTERM."""
    arrivals: list[float] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head, body = await read_request(reader)
                if head.startswith(b"GET"):
                    data = b'{"object":"list","data":[{"id":"bench-model","object":"model"}]}'
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(data), data))  # fmt: skip
                    await writer.drain()
                    continue
                arrivals.append(time.time())
                tokens = int(json.loads(body or b"{}").get("max_tokens") or 8)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
                event = b"data: " + EVENT + b"\n\n"
                frame = b"%x\r\n%s\r\n" % (len(event), event)
                last = (b'data: {"id":"x","object":"text_completion","model":"bench-model",'
                        b'"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":'
                        b'{"prompt_tokens":16,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                        b"data: [DONE]\n\n") % (tokens, tokens + 16)  # fmt: skip
                if gap_s:  # a decode cadence: one event per gap (metric agreement)
                    for _ in range(tokens):
                        await asyncio.sleep(gap_s)
                        writer.write(frame)
                        await writer.drain()
                    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
                else:
                    writer.write(frame * tokens + b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            writer.close()

    def stop(*_: object) -> None:
        Path(log_path).write_text(json.dumps(arrivals))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def gpudoctor_client(port: int, rate: float, count: int, tokens: int = 8) -> None:
    """Run gpudoctor's client (the real ``run_requests``) and print its self-audit as JSON."""
    from gpudoctor.bench.load.client import ClientOptions, make_client, run_requests
    from gpudoctor.bench.load.workload import Prompt
    from gpudoctor.bench.results.metrics import client_audit, compute_metrics

    async def go() -> dict:
        options = ClientOptions(f"http://127.0.0.1:{port}", "bench-model")
        prompts = [Prompt("hello " * 16, 16, tokens) for _ in range(count)]
        async with make_client(64, 60) as client:
            cpu0 = time.process_time()
            records, wall = await run_requests(client, options, prompts, 100000,
                                               request_rate=rate, seed=1)  # fmt: skip
            cpu = time.process_time() - cpu0
        audit = client_audit(records, wall, cpu)
        metrics = compute_metrics(records, wall)
        return {"ok": sum(r.ok for r in records), "sent": len(records), "cpu_s": cpu,
                "wall_s": wall, **audit,
                **{k: metrics[k] for k in ("median_ttft_ms", "median_tpot_ms", "median_itl_ms")}}  # fmt: skip

    print(json.dumps(asyncio.run(go())))


def _server_rate(arrivals: list[float], count: int) -> tuple[int, float | None]:
    """Return the requests seen and their rate (the last ``count``: a peer's readiness
    probe before the run is not part of it)."""
    arrivals = sorted(arrivals)[-count:]
    if len(arrivals) < 2:
        return len(arrivals), None
    return len(arrivals), (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


def _aiperf_medians(work: Path) -> dict:
    """Return AIPerf's own TTFT / TPOT / ITL medians (ms) from its export, {} if none.
    AIPerf's ``inter_token_latency`` is per request (E2E - TTFT) / (tokens - 1): TPOT."""
    found = list(work.rglob("profile_export_aiperf.json"))
    if not found:
        return {}
    data = json.loads(found[0].read_text())
    records = data.get("records", data)

    def p50(name: str) -> float | None:
        entry = records.get(name) if isinstance(records, dict) else None
        return entry.get("p50") if isinstance(entry, dict) else None

    return {"aiperf_median_ttft_ms": p50("time_to_first_token"),
            "aiperf_median_tpot_ms": p50("inter_token_latency"),
            "aiperf_median_itl_ms": p50("inter_chunk_latency")}  # fmt: skip


def _peer_argv(tool: str, exe: str, port: int, rate: float, count: int, tokenizer: str,
               work: Path, tokens: int = 8) -> list[str]:  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    if tool == "aiperf":
        return [exe, "profile", "--model", "bench-model", "--url", url, "--endpoint-type",
                "completions", "--streaming", "--request-rate", str(rate), "--arrival-pattern",
                "poisson", "--request-count", str(count), "--prompt-input-tokens-mean", "16",
                "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(tokens),
                "--tokenizer", tokenizer, "--ui-type", "none", "--artifact-dir", str(work),
                "--random-seed", "1", "--use-server-token-count"]  # fmt: skip
    return [exe, "run", "--backend", f"kind=openai_http,target={url},model=bench-model",
            "--profile", f"kind=poisson,rate={rate}", "--constraint",
            f"kind=max_requests,count={count}", "--data",
            "kind=synthetic_text,prompt_tokens=16,output_tokens=8", "--tokenizer",
            f"kind=huggingface_auto,model={tokenizer}", "--output",
            f"kind=json,path={work}.json", "--disable-console-interactive"]  # fmt: skip


def measure(tool: str, exe: str, rate: float, seconds: float, tokenizer: str,
            server_core: int, client_core: int, tokens: int = 8, gap_ms: float = 0.0) -> dict:  # fmt: skip
    """Return one (tool, rate) row: the server's view and the client's own."""
    port = _free_port()
    count = max(int(rate * seconds), 50)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "arrivals.json"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--log", str(log),
                                   "--gap-ms", str(gap_ms)])  # fmt: skip
        os.sched_setaffinity(server.pid, {server_core})
        try:
            _wait_port(port)
            if tool == "gpudoctor":
                argv = [sys.executable, __file__, "--client", str(port), "--rate", str(rate),
                        "--count", str(count), "--tokens", str(tokens)]  # fmt: skip
            else:
                argv = _peer_argv(
                    tool, exe, port, rate, count, tokenizer, Path(tmp) / "work", tokens
                )
            t0 = time.perf_counter()
            done = subprocess.run(["taskset", "-c", str(client_core), *argv], capture_output=True,
                                  text=True, timeout=seconds * 20 + 120)  # fmt: skip
            wall = time.perf_counter() - t0
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(20)
        arrivals = json.loads(log.read_text()) if log.exists() else []
        peer = _aiperf_medians(Path(tmp) / "work") if tool == "aiperf" else {}
    n, at_server = _server_rate(arrivals, count)
    row = {"tool": tool, "rate": rate, "count": count, "server_seen": n,
           "server_ratio": None if at_server is None else at_server / rate,
           "rc": done.returncode, "tool_wall_s": wall}  # fmt: skip
    row.update(peer)
    if tool == "gpudoctor" and done.returncode == 0:
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    elif done.returncode != 0:
        row["error"] = (done.stderr or done.stdout)[-400:]
    return row


def agree(aiperf: str, tokenizer: str, server_core: int, client_core: int) -> None:
    """Print gpudoctor's TTFT / TPOT / ITL medians beside AIPerf's (same paced server: one
    event per 5 ms, 32 tokens, 10 req/s for 10 s) and their ratios (goal: within 2 %)."""
    ours = measure("gpudoctor", "", 10.0, 10.0, tokenizer, server_core, client_core, 32, 5.0)
    theirs = measure("aiperf", aiperf, 10.0, 10.0, tokenizer, server_core, client_core, 32, 5.0)
    for name in ("ttft", "tpot", "itl"):
        a, b = ours.get(f"median_{name}_ms"), theirs.get(f"aiperf_median_{name}_ms")
        ratio = f"{a / b:.4f}" if a and b else "-"
        print(f"median {name.upper():4s} gpudoctor {a} ms, AIPerf {b} ms, ratio {ratio}")
    print(json.dumps({"gpudoctor": ours, "aiperf": theirs}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--client", type=int, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=100, help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=100.0, help=argparse.SUPPRESS)
    p.add_argument("--rates", default="50,200,500,1000,2000,4000")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per rate")
    p.add_argument("--aiperf", default="", help="AIPerf's console script (own venv)")
    p.add_argument("--guidellm", default="", help="guidellm's console script (own venv)")
    p.add_argument("--tokenizer", default="", help="a local tokenizer directory for the peers")
    p.add_argument("--tools", default="gpudoctor,aiperf,guidellm")
    p.add_argument("--tokens", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--gap-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument(
        "--agree",
        action="store_true",
        help="instead: TTFT/TPOT/ITL medians of gpudoctor vs AIPerf (paced server)",
    )
    args = p.parse_args()
    if args.serve:
        serve(args.serve, args.log, args.gap_ms / 1000)
        return
    if args.client:
        gpudoctor_client(args.client, args.rate, args.count, args.tokens)
        return
    cores = sorted(os.sched_getaffinity(0))
    server_core, client_core = (cores[-1], cores[0]) if len(cores) > 1 else (cores[0], cores[0])
    exes = {"gpudoctor": "", "aiperf": args.aiperf, "guidellm": args.guidellm}
    tools = [t for t in args.tools.split(",") if t == "gpudoctor" or exes.get(t)]
    if args.agree:
        agree(exes["aiperf"], args.tokenizer, server_core, client_core)
        return
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        for tool in tools:
            row = measure(tool, exes[tool], rate, args.seconds, args.tokenizer, server_core,
                          client_core)  # fmt: skip
            rows.append(row)
            lag = (f" send lag p50/p99/max {row['schedule_delay_ms_p50']:.2f}/"
                   f"{row['schedule_delay_ms_p99']:.2f}/{row['schedule_delay_ms_max']:.1f} ms,"
                   f" rate ratio {row['rate_ratio']:.3f}, client CPU busy {row['cpu_busy']:.2f},"
                   f" CPU/request {row['cpu_s'] / max(row['sent'], 1) * 1000:.3f} ms"
                   if row.get("schedule_delay_ms_p99") is not None else "")  # fmt: skip
            ratio = "-" if row["server_ratio"] is None else f"{row['server_ratio']:.3f}"
            print(f"{tool:9s} {rate:6.0f} req/s: server saw {row['server_seen']}/{row['count']},"
                  f" achieved/target {ratio}{lag}" + (f" rc={row['rc']} {row.get('error', '')[-200:]!r}"
                                                      if row["rc"] else ""), flush=True)  # fmt: skip
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
