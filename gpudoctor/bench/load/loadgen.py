"""Measure one cell: warmup, then ``num_prompts`` requests at one concurrency.

``measure_cell`` is the measuring half's single entry point for the launcher (the
contract is in ``gpudoctor/bench/cell_spec.py``). It is synchronous (runs asyncio inside),
never raises for server-side failures (they become error counts and a partial record),
and streams every request's raw record to ``target.raw_path`` as it completes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from gpudoctor import fsio
from gpudoctor.bench.cell_spec import SLO, CellTarget, WorkloadSpec, rate_to_json
from gpudoctor.bench.load import accept_length as spec
from gpudoctor.bench.load.client import ClientOptions, make_client, run_requests
from gpudoctor.bench.load.scraper import MetricsScraper, busy_spans
from gpudoctor.bench.load.telemetry import GpuSampler
from gpudoctor.bench.load.workload import Prompt, load_tokenizer
from gpudoctor.bench.load.workloads import build_prompts
from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.metrics import (
    client_audit,
    compute_metrics,
    count_errors,
    max_in_flight,
    token_truth,
)

# /metrics scrapes during a cell, seconds apart (AIPerf: 0.333 s; per-cell means need no
# more); the cost on the client
# is measured by benchmarks/scrape_overhead.py
SCRAPE_INTERVAL_S = 1.0
WARMUP_MAX_TOKENS = 32  # as SGLang's warmup: min(output_len, 32)


def retokenize_chunks(record: RequestRecord, tokenizer: Any) -> RequestRecord:
    """Return ``record`` with each content chunk's token count from re-tokenizing its text.

    SGLang's bench_serving does this (and only this) when the cell has a speculative
    accept length: a chunk then carries several tokens and its gap is split over them
    for the ITL. Without speculative decoding every chunk gap counts as one ITL, as there.
    """
    if not record.ok:
        return record
    counts = tuple(
        max(len(tokenizer.encode(text, add_special_tokens=False)), 1) for text in record.text_chunks
    )
    return replace(record, chunk_tokens=counts, output_tokens=sum(counts))


def count_text_tokens(record: RequestRecord, tokenizer: Any) -> RequestRecord:
    """Return ``record`` with its output tokens counted by the model's tokenizer on the
    text that arrived (bench_serving's retokenized output length); unchanged when it failed
    or kept no text."""
    if not record.ok or not record.text_chunks:
        return record
    text = "".join(record.text_chunks)
    return replace(record, output_tokens=len(tokenizer.encode(text, add_special_tokens=False)))


def _trace_offsets(prompts: Sequence[Prompt]) -> list[float] | None:
    """Return the prompts' own send times (a trace replay), None when they have none."""
    if prompts and all(p.at_s is not None for p in prompts):
        return [float(p.at_s or 0.0) for p in prompts]
    return None


def _error_of(record: RequestRecord) -> dict[str, Any]:
    """Return a failed request's error as the record's ``first_error`` (message verbatim)."""
    return {"index": record.index, "kind": record.error_kind, "status_code": record.status_code,
            "message": record.error}  # fmt: skip


def _warmup_prompts(prompts: Sequence[Prompt], count: int) -> list[Prompt]:
    return [
        replace(p, output_len=min(p.output_len, WARMUP_MAX_TOKENS), after=None, at_s=None)
        for p in (prompts[i % len(prompts)] for i in range(count))
    ]


async def _run_cell(
    target: CellTarget,
    workload: WorkloadSpec,
    concurrency: int,
    prompts: list[Prompt],
    options: ClientOptions,
    on_record: Callable[[RequestRecord], RequestRecord],
    telemetry: bool,
    deadline: float,
    telemetry_gpus: Sequence[str] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"flush_error": None, "accept_length": None, "accept_source": None}

    def left() -> float:
        return max(deadline - time.perf_counter(), 0.0)

    async with make_client(max(concurrency, workload.warmup, 1), options.timeout_s) as client:
        if workload.warmup > 0 and prompts:
            warm, _ = await run_requests(
                client, options, _warmup_prompts(prompts, workload.warmup), workload.warmup,
                deadline=deadline,
            )  # fmt: skip
            failed = [r for r in warm if not r.ok]
            out["warmup"] = {"sent": len(warm), "failed": len(failed)}
            if failed:
                out["warmup"]["first_error"] = failed[0].error
            rejected = [
                r for r in failed if r.status_code is not None and 400 <= r.status_code < 500
            ]
            if rejected:  # fail fast: the measured requests would be rejected the same way
                out["warmup"]["rejected"] = True
                out["first_error"] = _error_of(rejected[0])
                out.update(cpu_s=0.0, records=[], duration_s=0.0, telemetry={}, server_signals={})
                return out
        if target.flush_cache_path:
            try:
                out["flush_error"] = await asyncio.wait_for(
                    spec.flush_cache(client, target.base_url, target.flush_cache_path), left()
                )
            except asyncio.TimeoutError:
                out["flush_error"] = "the cell's deadline passed"
        cpu0 = time.process_time()
        scraper = MetricsScraper(target.metrics_url, SCRAPE_INTERVAL_S, target.metrics_note)
        with GpuSampler(enabled=telemetry, gpus=telemetry_gpus) as sampler, scraper:
            records, duration = await run_requests(
                client,
                options,
                prompts,
                concurrency,
                request_rate=workload.request_rate,
                burstiness=workload.burstiness,
                offsets=_trace_offsets(prompts),
                seed=workload.seed,
                on_record=on_record,
                deadline=deadline,
            )
        out["cpu_s"] = time.process_time() - cpu0
        out["records"], out["duration_s"] = records, duration
        out["telemetry"] = sampler.summary()
        out["server_signals"] = scraper.summary(busy=busy_spans(records, duration))
        from_meta = spec.from_records(records)
        if from_meta is not None:
            out["accept_length"], out["accept_source"] = from_meta, "meta_info"
        elif target.flush_cache_path and out["flush_error"] is None:
            try:
                from_info = await asyncio.wait_for(
                    spec.query_server_info(client, target.base_url), min(left(), 30.0)
                )
            except asyncio.TimeoutError:
                from_info = None
            if from_info is not None:
                out["accept_length"], out["accept_source"] = from_info, "server_info"
    return out


def measure_cell(
    target: CellTarget,
    workload: WorkloadSpec,
    concurrency: int,
    slo: SLO | None = None,
    *,
    telemetry: bool = True,
    progress: Callable[[int, int], None] | None = None,
    timeout_s: float = 600.0,
    cell_timeout_s: float | None = None,
    keep_text: bool = False,
    max_total_tokens: int | None = None,
    telemetry_gpus: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run one cell and return its JSON-ready record.

    Returns ``{"concurrency", "num_prompts", "completed", "duration_s" (s), "metrics"
    (see ``metrics.compute_metrics``), "errors" (failed requests by kind), "accept_length"
    (float or None), "accept_length_source", "telemetry" (``{}`` without GPUs), "client"
    (client-side facts: CPU seconds, chunks, observed peak in-flight requests, warmup;
    ``audit``: the pacing self-audit of ``metrics.client_audit``), "first_error" (the
    first failed request's ``{index, kind, status_code, message}``, None when none)}``.
    A warmup request answered HTTP 4xx ends the cell before measuring (``client.warmup
    .rejected``): the measured requests would be rejected the same way.
    Server failures never raise: a server killed mid-cell gives a partial record.
    ``progress(done, total)`` is called as each measured request completes.
    ``timeout_s``: the longest one request may take (send -> end), seconds.
    ``cell_timeout_s``: the cell's deadline, from now (warmup, flush, requests and the
    accept-length query all end by then; unsent requests count as ``deadline`` errors).
    ``keep_text``: keep the streamed text in the records and the raw file (else only
    chunk times and counts; a speculative cell's ITL is then not split by tokens).
    ``max_total_tokens``: prompt + output tokens one request may use; dataset prompts
    longer than that are cut (``prompts_cut`` in the record says how many).
    ``telemetry_gpus``: sample only these GPUs (UUIDs: the cell's slot), else every GPU.
    """
    deadline = time.perf_counter() + (cell_timeout_s if cell_timeout_s else 1e9)
    tokenizer = load_tokenizer(target.tokenizer_dir)
    prompts = build_prompts(workload, tokenizer, max_total=max_total_tokens)
    options = ClientOptions(
        base_url=target.base_url,
        model=target.served_model,
        api=workload.api,
        ignore_eos=workload.ignore_eos,
        timeout_s=timeout_s,
        keep_text=keep_text,
    )
    run_id = uuid.uuid4().hex[:12]
    raw_file: IO[str] | None = None
    if target.raw_path is not None:
        Path(target.raw_path).parent.mkdir(parents=True, exist_ok=True)
        raw_fd = fsio.open_append(target.raw_path, require_trusted_dir=True)  # never a link
        raw_file = os.fdopen(raw_fd, "a", encoding="utf-8")  # closed below
    done = 0

    def on_record(record: RequestRecord) -> RequestRecord:
        nonlocal done
        if raw_file is not None:
            raw_file.write(json.dumps({"run_id": run_id, **record.to_json()}) + "\n")
            raw_file.flush()
        done += 1
        if progress is not None:
            progress(done, len(prompts))
        return record

    try:
        result = asyncio.run(
            _run_cell(
                target,
                workload,
                concurrency,
                prompts,
                options,
                on_record,
                telemetry,
                deadline,
                telemetry_gpus,
            )
        )
    finally:
        if raw_file is not None:
            raw_file.close()
    records: list[RequestRecord] = result["records"]
    if target.trace_path is not None:
        from gpudoctor.bench.results.trace import write_trace

        write_trace(target.trace_path, target.label, records, result["server_signals"])
    split_itl = bool(result["accept_length"]) and keep_text
    if split_itl:  # outside the timed loop: tokenizing costs CPU per chunk
        records = [retokenize_chunks(r, tokenizer) for r in records]
    elif keep_text:  # the text arrived: count its tokens (a chunk may hold several)
        records = [count_text_tokens(r, tokenizer) for r in records]
    metrics = compute_metrics(records, max(result["duration_s"], 1e-9), slo)
    metrics["itl_split_by_tokens"] = split_itl
    chunks = sum(len(r.chunk_times_s) for r in records)
    failures = sorted((r for r in records if not r.ok), key=lambda r: r.send_s)
    first_error = result.get("first_error") or (_error_of(failures[0]) if failures else None)
    metrics.update(token_truth(records, forced=workload.ignore_eos))
    client = {
        "run_id": run_id,
        "api": workload.api,
        "url": options.url,
        "request_rate": rate_to_json(workload.request_rate),
        "burstiness": workload.burstiness,
        "ignore_eos": workload.ignore_eos,
        "cpu_s": result["cpu_s"],
        "chunks": chunks,
        "chunks_per_cpu_s": chunks / result["cpu_s"] if result["cpu_s"] > 0 else None,
        "max_in_flight": max_in_flight(records),
        "warmup": result.get("warmup", {"sent": 0, "failed": 0}),
        "flush_cache_error": result["flush_error"],
        "keep_text": keep_text,
        "timeout_s": timeout_s,
        "cell_timeout_s": cell_timeout_s,
        "deadline_hit": time.perf_counter() >= deadline,
        "audit": client_audit(records, result["duration_s"], result["cpu_s"]),
    }
    return {
        "concurrency": concurrency,
        "num_prompts": len(prompts),
        "completed": metrics["completed"],
        "duration_s": result["duration_s"],
        "metrics": metrics,
        "errors": count_errors(records),
        "first_error": first_error,
        "accept_length": result["accept_length"],
        "accept_length_source": result["accept_source"],
        "prompts_cut": sum(1 for p in prompts if p.cut_from is not None),
        "telemetry": result["telemetry"],
        "server_signals": result["server_signals"],
        "client": client,
    }
