"""The workload kinds (multi-turn, shared prefix, Mooncake trace, ShareGPT) run by the
real campaign against tests/bench/stream_server.py, which logs every request it gets:
the assertions read what the server received."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.load.workload import load_tokenizer
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
ONE = '[[configs]]\nname = "a"\n'


def _run(tmp_path: Path, model: Path, workload: str, concurrency: str = "[2]",
         max_len: int = 2048) -> tuple[list[dict], list[dict], Path]:  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "requests.jsonl"
    args = f'request-log = "{log}", max-model-len = {max_len}, token-delay-ms = 1'
    plan = load_plan(write(tmp_path, stub_plan(model, ONE, concurrency, workload, args)))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    # every cell measured: ok, or (a scheduled kind on a starved box: a trace replay's p99
    # delay passed 10 ms here under a mutation run) client-bound, which gpudoctor rightly
    # calls no result; what these tests check is what the server received, late or not
    assert summary.ok + summary.client_bound == len(plan.cells()), summary
    assert summary.failed == summary.crashed == summary.skipped == 0
    received = [json.loads(line) for line in log.read_text().splitlines()]
    return read_records(out / "results.jsonl")[0], received, out


def _raw(out: Path, record: dict) -> list[dict]:
    return [json.loads(line) for line in (out / record["raw"]).read_text().splitlines()]


def test_multi_turn_sends_the_history_turn_after_turn(tmp_path: Path, tiny_model_dir: Path) -> None:
    workload = ('kind = "multi_turn"\napi = "chat"\nturns = 3\ninput_len = 20\noutput_len = 6\n'
                "num_prompts = 6\nwarmup = 0")  # fmt: skip
    records, received, out = _run(tmp_path, tiny_model_dir, workload)
    assert len(received) == 6 and records[0]["measurement"]["completed"] == 6
    by_conversation: dict[str, list[dict]] = {}
    for request in received:  # arrival order
        by_conversation.setdefault(request["messages"][0]["content"], []).append(request)
    assert len(by_conversation) == 2
    for turns in by_conversation.values():
        sizes = [len(t["messages"]) for t in turns]
        assert sizes == [1, 3, 5]  # turn k arrives after turn k-1, carrying it
        for earlier, later in itertools.pairwise(turns):
            assert later["messages"][: len(earlier["messages"])] == earlier["messages"]
            assert later["messages"][len(earlier["messages"])]["role"] == "assistant"
    raw = sorted(_raw(out, records[0]), key=lambda r: r["index"])
    for i in (1, 2, 4, 5):  # a turn is sent once its previous turn is over
        assert raw[i]["send_s"] >= raw[i - 1]["send_s"] + raw[i - 1]["wall_s"] - 1e-3


def test_multi_turn_from_a_sharegpt_file_uses_its_replies(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    dataset = EXAMPLES / "sharegpt-small.json"
    workload = (f'kind = "multi_turn"\napi = "chat"\ndataset_path = "{dataset}"\nturns = 3\n'
                "num_prompts = 9\nwarmup = 0")  # fmt: skip
    _, received, _ = _run(tmp_path, tiny_model_dir, workload)
    replies = {t["value"] for c in json.loads(dataset.read_text()) for t in c["conversations"]
               if t["from"] == "gpt"}  # fmt: skip
    assistant = [m["content"] for r in received for m in r["messages"] if m["role"] == "assistant"]
    assert assistant and set(assistant) <= replies


def test_shared_prefix_groups_share_one_system_prompt(tmp_path: Path, tiny_model_dir: Path) -> None:
    workload = ('kind = "shared_prefix"\ngroups = 2\nprompts_per_group = 3\nsystem_prompt_len = 64\n'
                "input_len = 12\noutput_len = 4\nwarmup = 0")  # fmt: skip
    records, received, _ = _run(tmp_path, tiny_model_dir, workload)
    assert records[0]["measurement"]["num_prompts"] == 6 and len(received) == 6
    systems = [r["prompt"].split("\n\n")[0] for r in received]
    assert sorted(systems.count(s) for s in set(systems)) == [3, 3]
    assert len({r["prompt"] for r in received}) == 6
    tokenizer = load_tokenizer(str(tiny_model_dir))
    for system in set(systems):
        assert abs(len(tokenizer.encode(system, add_special_tokens=False)) - 64) <= 2


def test_trace_replay_keeps_times_lengths_and_shared_prefixes(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    trace = EXAMPLES / "mooncake-trace-small.jsonl"
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    workload = (f'kind = "trace"\ndataset_path = "{trace}"\ntrace_block_size = 64\n'
                "trace_slowdown = 0.5\nnum_prompts = 16\nwarmup = 0")  # fmt: skip
    records, received, out = _run(tmp_path, tiny_model_dir, workload, "[16]")
    assert len(received) == len(rows) == 16
    raw = sorted(_raw(out, records[0]), key=lambda r: r["index"])
    start = rows[0]["timestamp"]
    for row, request in zip(rows, raw, strict=True):
        assert request["send_s"] >= (row["timestamp"] - start) / 1000 * 0.5 - 1e-3
        assert abs(request["prompt_len"] - row["input_length"]) <= 2
        assert request["max_tokens"] == row["output_length"]
    prompts = [r["prompt"] for r in sorted(received, key=lambda r: r["t"])]
    # requests 0 and 2 share hash ids [0, 1], requests 0 and 1 only [0]: longer shared text
    common = [len(_common_prefix(prompts[0], prompts[i])) for i in (1, 2)]
    assert common[1] > common[0] > 0


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def test_sharegpt_output_lengths_come_from_the_replies(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    dataset = EXAMPLES / "sharegpt-small.json"
    workload = f'kind = "sharegpt"\ndataset_path = "{dataset}"\nnum_prompts = 8\nwarmup = 0'
    _, received, _ = _run(tmp_path, tiny_model_dir, workload)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    pairs = {c["conversations"][0]["value"]: c["conversations"][1]["value"]
             for c in json.loads(dataset.read_text())}  # fmt: skip
    assert len(received) == 8
    for request in received:
        reply = pairs[request["prompt"]]
        assert request["max_tokens"] == len(tokenizer.encode(reply, add_special_tokens=False))


def test_every_kind_is_clamped_to_the_servers_real_context(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A 160-token server: multi-turn histories and trace prompts are cut to fit (the
    record says how many), and no request overflows the context."""
    workload = ('kind = "multi_turn"\napi = "chat"\nturns = 4\ninput_len = 40\noutput_len = 8\n'
                "num_prompts = 4\nwarmup = 0")  # fmt: skip
    records, received, _ = _run(tmp_path / "mt", tiny_model_dir, workload, max_len=160)
    measurement = records[0]["measurement"]
    assert measurement["prompts_cut"] >= 1 and records[0]["clamp"]["prompts_cut"] >= 1
    assert sum(measurement["errors"].values()) == 0 and len(received) == 4
    trace = EXAMPLES / "mooncake-trace-small.jsonl"
    workload = (f'kind = "trace"\ndataset_path = "{trace}"\ntrace_block_size = 64\n'
                "trace_slowdown = 0.1\nnum_prompts = 6\nwarmup = 0")  # fmt: skip
    records, _, _ = _run(tmp_path / "tr", tiny_model_dir, workload, max_len=160)
    measurement = records[0]["measurement"]
    assert measurement["prompts_cut"] == 6 and sum(measurement["errors"].values()) == 0
