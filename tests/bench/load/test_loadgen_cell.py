"""gpudoctor/bench/load/loadgen.py: one cell measured against a real OpenAI-compatible
server on loopback (tests/bench/openai_loopback.py, in-process: fast), with a real
tokenizer trained here in milliseconds: the record a cell returns, the raw file written
as requests complete, warmup (and its fail-fast on a 4xx), SGLang's cache flush and
accept length (from the stream, else from /server_info after a successful flush), the
cell's deadline, the trace, the GPU slot sampled. test_loadgen_live.py does the same
against a real `transformers serve` (slower)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer  # noqa: F401 - at collection: forked runs start warm

from gpudoctor.bench.cell_spec import SLO, CellTarget, WorkloadSpec
from gpudoctor.bench.load import sse_transport
from gpudoctor.bench.load.arrivals import arrival_offsets
from gpudoctor.bench.load.loadgen import (
    WARMUP_MAX_TOKENS,
    _trace_offsets,
    _warmup_prompts,
    count_text_tokens,
    measure_cell,
    retokenize_chunks,
)
from gpudoctor.bench.load.workload import Prompt, load_tokenizer
from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.fsio import FsioError
from tests.bench.load.test_sse_transport_lifecycle import RecordingLoop
from tests.bench.load.test_telemetry_sampling import FakePynvml
from tests.bench.load.test_workload_prompts import make_tokenizer
from tests.bench.metrics_server import MetricsServer, recorded
from tests.bench.openai_loopback import OpenAIServer
from tests.bench.scripted_http import ScriptedHttpServer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model directory holding only its tokenizer (what measure_cell reads)."""
    path = tmp_path_factory.mktemp("tokenizer")
    make_tokenizer().save_pretrained(path)
    return str(path)


def spec(**kw) -> WorkloadSpec:
    return WorkloadSpec(**{"input_len": 8, "output_len": 3, "num_prompts": 4, "warmup": 0,
                           "ignore_eos": False, **kw})  # fmt: skip


def raw_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------- a cell


def test_a_cell_records_every_request_as_it_completes(tokenizer_dir, tmp_path):
    raw = tmp_path / "run" / "raw" / "cell.jsonl"  # its folders do not exist yet
    progress: list[tuple[int, int]] = []
    with OpenAIServer(hold_until=2) as srv:
        target = CellTarget(srv.url, "served", tokenizer_dir, raw_path=raw,
                            metrics_note="this test serves no /metrics")  # fmt: skip
        cpu0 = time.process_time()
        cell = measure_cell(target, spec(output_len=40, num_prompts=5, warmup=2), 2,
                            telemetry=False, progress=lambda d, t: progress.append((d, t)))  # fmt: skip
        cpu = time.process_time() - cpu0
        again = measure_cell(target, spec(num_prompts=2), 1, telemetry=False)
    warm, measured = srv.requests[:2], srv.requests[2:7]
    assert [s.body["max_tokens"] for s in warm] == [WARMUP_MAX_TOKENS] * 2
    assert [s.body["max_tokens"] for s in measured] == [40] * 5
    assert all(s.body["model"] == "served" and "ignore_eos" not in s.body for s in measured)
    assert (cell["concurrency"], cell["num_prompts"], cell["completed"]) == (2, 5, 5)
    assert cell["metrics"]["completed"] == 5 and cell["metrics"]["failed"] == 0
    assert cell["metrics"]["itl_split_by_tokens"] is False
    assert set(cell["errors"].values()) == {0} and cell["first_error"] is None
    assert cell["accept_length"] is None and cell["accept_length_source"] is None
    assert cell["prompts_cut"] == 0 and cell["telemetry"] == {} and cell["duration_s"] > 0
    assert progress == [(n, 5) for n in range(1, 6)]
    client = cell["client"]
    assert len(client["run_id"]) == 12 and int(client["run_id"], 16) >= 0
    assert client["run_id"] != again["client"]["run_id"]
    assert (client["api"], client["url"]) == ("completions", srv.url + "/v1/completions")
    assert (client["request_rate"], client["burstiness"], client["ignore_eos"]) == (
        None,
        None,
        False,
    )
    assert client["chunks"] == 5 * 40 and client["max_in_flight"] in (1, 2)
    assert 0 < client["cpu_s"] <= cpu and cell["metrics"]["token_count_mismatches"] == 0
    assert client["audit"]["achieved_rate"] > 0 and client["audit"]["cpu_busy"] > 0
    assert cell["metrics"]["usage_overclaims"] == 0 and cell["metrics"]["short_replies"] is None
    assert client["chunks_per_cpu_s"] == pytest.approx(200 / client["cpu_s"])
    assert client["warmup"] == {"sent": 2, "failed": 0} and client["flush_cache_error"] is None
    assert (client["keep_text"], client["timeout_s"], client["cell_timeout_s"]) == (
        False,
        600.0,
        None,
    )
    assert client["deadline_hit"] is False and client["audit"]["target_rate"] is None
    signals = cell["server_signals"]
    assert signals["url"] is None and signals["interval_s"] == 1.0
    assert signals["signals"]["running"] == {"available": False,
                                             "why": "this test serves no /metrics"}  # fmt: skip
    rows = raw_rows(raw)
    assert len(rows) == 7  # the second cell appended, the first kept; no warmup record
    assert {r["run_id"] for r in rows[:5]} == {client["run_id"]}
    assert sorted(r["index"] for r in rows[:5]) == list(range(5))
    assert all(r["ok"] and r["output_tokens"] == 40 for r in rows[:5])
    assert again["num_prompts"] == 2 and again["client"]["warmup"] == {"sent": 0, "failed": 0}


def open_paths() -> set[str]:
    """Return the files this process holds open (``ls -l /proc/self/fd``)."""
    fds = Path("/proc/self/fd")
    paths = set()
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            paths.add(os.readlink(fd))
    return paths


def test_a_cell_stopped_by_an_exception_gives_its_raw_file_back(tokenizer_dir, tmp_path):
    raw = tmp_path / "raw.jsonl"

    def interrupted(done: int, total: int) -> None:
        raise RuntimeError("progress display failed")  # as the first request completes

    with OpenAIServer() as srv, pytest.raises(RuntimeError) as stopped:
        measure_cell(CellTarget(srv.url, "m", tokenizer_dir, raw_path=raw), spec(), 1,
                     telemetry=False, progress=interrupted)  # fmt: skip
    assert stopped.traceback  # the cell's frames are still alive here, and yet:
    assert str(raw) not in open_paths()
    assert len(raw_rows(raw)) == 1  # the record written before the stop is on disk


def test_a_chat_cell_with_ignore_eos_and_an_open_loop(tokenizer_dir, tmp_path):
    raw = tmp_path / "raw.jsonl"
    workload = spec(api="chat", ignore_eos=True, request_rate=2000.0, burstiness=2.0, seed=5)
    with OpenAIServer() as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, raw_path=raw)
        cell = measure_cell(target, workload, 4, telemetry=False, timeout_s=30.0)
    assert all(s.path == "/v1/chat/completions" for s in srv.requests)
    assert all(s.body["ignore_eos"] is True for s in srv.requests)
    client = cell["client"]
    assert (client["api"], client["url"]) == ("chat", srv.url + "/v1/chat/completions")
    assert (client["request_rate"], client["burstiness"], client["ignore_eos"]) == (
        2000.0,
        2.0,
        True,
    )
    assert client["timeout_s"] == 30.0 and cell["completed"] == 4
    assert cell["metrics"]["token_count_mismatches"] == 0  # every reply had max_tokens
    intended = sorted(r["intended_s"] for r in raw_rows(raw))
    assert intended == arrival_offsets(4, 2000.0, 2.0, 5)


def test_a_server_that_goes_silent_fails_each_request_at_its_time_limit(tokenizer_dir):
    with ScriptedHttpServer([], hang=True) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir)
        cell = measure_cell(target, spec(num_prompts=2), 2, telemetry=False, timeout_s=0.2)
    assert cell["errors"]["timeout"] == 2 and cell["completed"] == 0
    assert cell["client"]["deadline_hit"] is False
    assert cell["first_error"]["kind"] == "timeout"


def test_the_first_error_is_the_earliest_sent_failure(tokenizer_dir):
    busy = (500, b'{"error": "busy"}')
    with OpenAIServer(status={1: busy, 3: busy}) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir)
        cell = measure_cell(target, spec(), 1, telemetry=False)
    assert cell["first_error"] == {"index": 1, "kind": "http_5xx", "status_code": 500,
                                   "message": 'HTTP 500: {"error": "busy"}'}  # fmt: skip
    assert cell["errors"]["http_5xx"] == 2 and cell["completed"] == 2


def test_dataset_prompts_too_long_for_the_context_are_cut_and_counted(tokenizer_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    long = " ".join(["the model stream token prompt server cache batch"] * 8)
    data.write_text(json.dumps({"prompt": long}) + "\n" + json.dumps({"prompt": "the"}) + "\n")
    workload = spec(kind="jsonl", dataset_path=str(data), num_prompts=2)
    with OpenAIServer() as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir)
        cell = measure_cell(target, workload, 1, telemetry=False, max_total_tokens=20)
        whole = measure_cell(target, workload, 1, telemetry=False)
    assert cell["prompts_cut"] == 1 and whole["prompts_cut"] == 0


# ---------------------------------------------------------------------------- warmup


@pytest.mark.parametrize("status", [400, 422, 499])
def test_a_warmup_rejected_with_a_4xx_ends_the_cell_before_measuring(tokenizer_dir, status):
    message = b"Unexpected fields in the request: {'ignore_eos'}"
    with OpenAIServer(status={0: (status, message)}) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        cell = measure_cell(target, spec(warmup=2), 2, telemetry=False)
    text = f"HTTP {status}: {message.decode()}"
    assert len(srv.requests) == 2 and srv.other == []  # no flush, no measured request
    assert cell["client"]["warmup"] == {"sent": 2, "failed": 1, "first_error": text,
                                        "rejected": True}  # fmt: skip
    assert cell["first_error"] == {"index": 0, "kind": "http_4xx", "status_code": status,
                                   "message": text}  # fmt: skip
    assert cell["completed"] == 0 and cell["num_prompts"] == 4 and cell["duration_s"] == 0.0
    assert cell["client"]["cpu_s"] == 0.0 and cell["client"]["chunks_per_cpu_s"] is None
    assert cell["telemetry"] == {} and cell["server_signals"] == {}


def test_a_warmup_failing_otherwise_is_counted_and_the_cell_goes_on(tokenizer_dir):
    with OpenAIServer(status={0: (500, b"busy")}) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir)
        cell = measure_cell(target, spec(warmup=1), 2, telemetry=False)
    assert cell["client"]["warmup"] == {"sent": 1, "failed": 1, "first_error": "HTTP 500: busy"}
    assert cell["completed"] == 4 and cell["first_error"] is None


def test_a_warmup_that_cannot_connect_is_not_a_rejection(tokenizer_dir):
    from tests.bench.llm_server import free_port

    target = CellTarget(f"http://127.0.0.1:{free_port()}", "m", tokenizer_dir)
    cell = measure_cell(target, spec(warmup=1, num_prompts=1), 1, telemetry=False)
    assert "rejected" not in cell["client"]["warmup"] and cell["errors"]["connect"] == 1


def test_warmup_prompts_cycle_the_cells_prompts_without_schedule_or_order():
    prompts = [Prompt("a", 1, 40, after=None, at_s=1.0), Prompt("b", 1, 8, after=0, at_s=0.0)]
    warm = _warmup_prompts(prompts, 3)
    assert [(p.text, p.output_len, p.after, p.at_s) for p in warm] == [
        ("a", WARMUP_MAX_TOKENS, None, None), ("b", 8, None, None), ("a", 32, None, None)]  # fmt: skip


def test_a_trace_replays_its_own_send_times_only_when_every_prompt_has_one():
    timed = [Prompt("a", 1, 1, at_s=0.0), Prompt("b", 1, 1, at_s=2.5)]
    assert _trace_offsets(timed) == [0.0, 2.5]
    assert _trace_offsets([*timed, Prompt("c", 1, 1)]) is None
    assert _trace_offsets([]) is None


# ---------------------------------------------------------------------------- accept length


def test_the_accept_length_comes_from_the_stream_when_the_server_sends_it(tokenizer_dir):
    with OpenAIServer(spec_verify_ct=2, server_info={}) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        cell = measure_cell(target, spec(output_len=6), 2, telemetry=False)
    assert (cell["accept_length"], cell["accept_length_source"]) == (3.0, "meta_info")
    assert srv.log[0] == "POST /flush_cache" and "GET /server_info" not in srv.log
    assert cell["client"]["flush_cache_error"] is None


def test_else_from_server_info_after_a_successful_flush(tokenizer_dir):
    info = {"internal_states": [{"avg_spec_accept_length": 2.5}]}
    with OpenAIServer(server_info=info) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        cell = measure_cell(target, spec(), 2, telemetry=False)
    assert (cell["accept_length"], cell["accept_length_source"]) == (2.5, "server_info")
    assert srv.log[0] == "POST /flush_cache" and srv.log[-1] == "GET /server_info"
    with OpenAIServer(server_info=info, flush_status=500) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        failed = measure_cell(target, spec(), 2, telemetry=False)
    assert failed["client"]["flush_cache_error"] == "HTTP 500"
    assert failed["accept_length"] is None and "GET /server_info" not in srv.log
    with OpenAIServer(server_info=info) as srv:
        unflushed = measure_cell(CellTarget(srv.url, "m", tokenizer_dir), spec(), 2,
                                 telemetry=False)  # fmt: skip
    assert unflushed["accept_length"] is None and srv.other == []  # a gauge never flushed


def test_no_accept_length_when_server_info_has_none(tokenizer_dir):
    with OpenAIServer(server_info={"internal_states": [{}]}) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        cell = measure_cell(target, spec(), 2, telemetry=False)
    assert cell["accept_length"] is None and cell["accept_length_source"] is None


def test_server_info_unanswered_by_the_deadline_gives_no_accept_length(tokenizer_dir):
    with OpenAIServer(hang=("/server_info",)) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        cell = measure_cell(target, spec(), 2, telemetry=False, cell_timeout_s=1.0)
    assert cell["completed"] == 4 and cell["accept_length"] is None
    assert cell["client"]["deadline_hit"] is True


@pytest.mark.parametrize("keep_text", [True, False])
def test_the_itl_is_split_by_tokens_only_with_an_accept_length_and_the_text(
    tokenizer_dir, tmp_path, keep_text
):
    raw = tmp_path / "raw.jsonl"
    with OpenAIServer(spec_verify_ct=1) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, raw_path=raw)
        cell = measure_cell(target, spec(), 2, telemetry=False, keep_text=keep_text)
    assert cell["accept_length"] == 3.0 and cell["client"]["keep_text"] is keep_text
    assert cell["metrics"]["itl_split_by_tokens"] is keep_text
    kept = [row.get("text_chunks") or [] for row in raw_rows(raw)]
    assert kept == ([[" tok"] * 3] * 4 if keep_text else [[]] * 4)  # the text, only if asked


def test_retokenizing_counts_each_chunks_own_tokens(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    text = "the model stream"
    record = RequestRecord(0, 1, 2, 0.0, True, chunk_times_s=(0.1, 0.2), chunk_tokens=(1, 1),
                           text_chunks=(text, ""))  # fmt: skip
    counted = retokenize_chunks(record, tok)
    assert counted.chunk_tokens == (len(tok.encode(text, add_special_tokens=False)), 1)
    assert counted.chunk_tokens[0] == len(tok.encode(text)) - 1  # no <s> counted
    assert counted.output_tokens == sum(counted.chunk_tokens)  # the tokens that arrived
    failed = RequestRecord(0, 1, 2, 0.0, False, text_chunks=(text,), chunk_tokens=(1,))
    assert retokenize_chunks(failed, tok) is failed


def test_kept_text_is_counted_with_the_models_tokenizer(tokenizer_dir):
    """Issue 45.1: a chunk may carry several tokens; the text that arrived is counted."""
    tok = load_tokenizer(tokenizer_dir)
    chunks = ("the model", " stream")
    record = RequestRecord(0, 1, 2, 0.0, True, chunk_times_s=(0.1, 0.2), chunk_tokens=(1, 1),
                           output_tokens=2, text_chunks=chunks)  # fmt: skip
    counted = count_text_tokens(record, tok)
    assert counted.output_tokens == len(tok.encode("the model stream", add_special_tokens=False))
    assert counted.output_tokens > 2 and counted.chunk_tokens == (1, 1)
    failed = RequestRecord(0, 1, 2, 0.0, False, text_chunks=chunks, output_tokens=2)
    assert count_text_tokens(failed, tok) is failed
    no_text = RequestRecord(0, 1, 2, 0.0, True, output_tokens=2)
    assert count_text_tokens(no_text, tok) is no_text


# ---------------------------------------------------------------------------- deadline, trace


def test_the_cells_deadline_ends_a_flush_that_never_answers(tokenizer_dir):
    with OpenAIServer(hang=("/flush_cache",)) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
        cell = measure_cell(target, spec(num_prompts=2), 2, telemetry=False, cell_timeout_s=0.3)
    client = cell["client"]
    assert client["flush_cache_error"] == "the cell's deadline passed"
    assert client["deadline_hit"] is True and client["cell_timeout_s"] == 0.3
    assert cell["errors"]["deadline"] == 2 and srv.requests == []  # never sent


class RecordingPolicy(asyncio.DefaultEventLoopPolicy):
    """The default policy, whose new loops (asyncio.run's) are RecordingLoops."""

    def __init__(self) -> None:
        super().__init__()
        self.loops: list[RecordingLoop] = []

    def new_event_loop(self) -> RecordingLoop:
        self.loops.append(RecordingLoop())
        return self.loops[-1]


def test_a_flush_waits_only_until_the_cells_deadline(tokenizer_dir):
    policy = RecordingPolicy()
    saved = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(policy)
    try:
        with OpenAIServer(hang=("/flush_cache",)) as srv:
            target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
            cell = measure_cell(target, spec(num_prompts=1), 1, telemetry=False, cell_timeout_s=0.4)
    finally:
        asyncio.set_event_loop_policy(saved)
    assert cell["client"]["flush_cache_error"] == "the cell's deadline passed"
    cell_loop = policy.loops[-1]  # the server's loop came first
    assert 0 < cell_loop.timers[0] <= 0.4  # the flush's limit: what is left of the cell


def test_the_server_info_query_waits_only_until_the_cells_deadline(tokenizer_dir):
    policy = RecordingPolicy()
    saved = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(policy)
    try:
        with OpenAIServer(hang=("/server_info",)) as srv:
            target = CellTarget(srv.url, "m", tokenizer_dir, flush_cache_path="/flush_cache")
            cell = measure_cell(target, spec(num_prompts=1), 1, telemetry=False, cell_timeout_s=1.0)
    finally:
        asyncio.set_event_loop_policy(saved)
    assert cell["completed"] == 1 and cell["accept_length"] is None
    loop = policy.loops[-1]
    last_request = max(i for i, c in enumerate(loop.callbacks) if c is sse_transport._watch)
    after = loop.timers[last_request + 1 :]  # the query's own limit, then httpx's inside it
    assert after and 0 < after[0] <= 1.0


def test_a_trace_is_written_when_asked(tokenizer_dir, tmp_path):
    path = tmp_path / "trace" / "c1.json"
    with OpenAIServer() as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir, trace_path=path, label="cell-one")
        measure_cell(target, spec(num_prompts=2), 2, telemetry=False)
    assert "cell-one" in path.read_text()


# ---------------------------------------------------------------------------- GPU telemetry


GPU = {"util": 50, "mem_bytes": 2**30, "milliwatts": 100000, "sm_mhz": 1500, "temp": 40,
       "reasons": 0}  # fmt: skip


def test_telemetry_samples_the_cells_gpus_only(tokenizer_dir, monkeypatch):
    """NVML with GPUs cannot exist here: FakePynvml stands for nvidia-ml-py on a host
    with two GPUs, the cell's slot being the second."""
    fake = FakePynvml([{**GPU, "uuid": b"GPU-a"}, {**GPU, "uuid": b"GPU-b", "temp": 70}])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with OpenAIServer() as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir)
        slot = measure_cell(target, spec(), 2, telemetry_gpus=["GPU-b"])
        off = measure_cell(target, spec(), 2, telemetry=False, telemetry_gpus=["GPU-b"])
    assert slot["telemetry"]["gpus"] == 1 and slot["telemetry"]["temp_c"]["max"] == 70
    assert off["telemetry"] == {}


# ---------------------------------------------------------------------------- more of a cell


def test_a_warmup_ends_at_the_cells_deadline_too(tokenizer_dir):
    with ScriptedHttpServer([], hang=True) as srv:
        target = CellTarget(srv.url, "m", tokenizer_dir)
        cell = measure_cell(target, spec(warmup=1, num_prompts=2), 1, telemetry=False,
                            timeout_s=30.0, cell_timeout_s=0.3)  # fmt: skip
    warmup = cell["client"]["warmup"]
    assert warmup == {"sent": 1, "failed": 1, "first_error": "the cell's deadline passed"}
    assert cell["errors"]["deadline"] == 2


def test_server_signals_slo_and_trace(tokenizer_dir, tmp_path):
    trace = tmp_path / "trace.json"
    with OpenAIServer() as srv, MetricsServer(recorded("vllm")) as metrics:
        target = CellTarget(srv.url, "m", tokenizer_dir, metrics_url=metrics.url,
                            trace_path=trace, label="c")  # fmt: skip
        cell = measure_cell(target, spec(), 2, SLO(ttft_ms=60_000.0), telemetry=False)
    signals = cell["server_signals"]
    assert signals["url"] == metrics.url and signals["dialect"] == "vllm"
    assert signals["scrapes"] >= 2 and signals["failed"] == 0  # at the start and at the end
    assert cell["metrics"]["good_requests"] == 4 and cell["metrics"]["slo_attainment"] == 1.0
    document = json.loads(trace.read_text())
    assert document["metadata"]["cell"] == "c" and document["metadata"]["requests"] == 4
    counters = [e for e in document["traceEvents"] if e["ph"] == "C"]
    assert counters and all(e["pid"] == 2 for e in counters)  # the server's scraped signals


def test_a_trace_workload_is_sent_at_its_own_times(tokenizer_dir, tmp_path):
    data = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": t, "input_length": 8, "output_length": 2, "hash_ids": [1]}
            for t in (1000, 1010, 1030)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = tmp_path / "raw.jsonl"
    workload = spec(kind="trace", dataset_path=str(data), num_prompts=3, trace_block_size=4)
    with OpenAIServer() as srv:
        measure_cell(CellTarget(srv.url, "m", tokenizer_dir, raw_path=raw), workload, 3,
                     telemetry=False)  # fmt: skip
    assert sorted(r["intended_s"] for r in raw_rows(raw)) == pytest.approx([0.0, 0.01, 0.03])


def test_a_raw_file_in_a_directory_others_can_write_is_refused(tokenizer_dir, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user could swap the file for a link
    with OpenAIServer() as srv, pytest.raises(FsioError):
        measure_cell(CellTarget(srv.url, "m", tokenizer_dir, raw_path=shared / "raw.jsonl"),
                     spec(), 1, telemetry=False)  # fmt: skip
    assert srv.requests == [] and not (shared / "raw.jsonl").exists()
