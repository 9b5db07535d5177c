"""A hostile or broken inference server must neither hang a cell nor grow the client's
memory (issue 12.4). Each attack runs against a real loopback server
(tests/bench/hostile_server.py): the cell ends at its deadline, or sooner at a cap,
with an error kind recorded; the measuring process's RSS stays under 200 MB."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpudoctor.bench.cell_spec import CellTarget, WorkloadSpec
from gpudoctor.bench.load.loadgen import measure_cell
from tests.bench.hostile_server import HostileServer

RSS_LIMIT = 200 * 1024 * 1024
CELL_DEADLINE_S = 2.0
SPEC = WorkloadSpec(input_len=16, output_len=8, num_prompts=4, ignore_eos=False, warmup=1)

# (mode, pace_s, content, the error kind every request must end with, the attack)
ATTACKS = [
    ("header", 0.0, True, "oversize", "an endless response header, flooded"),
    ("header", 0.01, True, "deadline", "an endless header trickled: no idle timeout fires"),
    ("line", 0.0, True, "oversize", "an endless `data:` line, flooded"),
    ("line", 0.01, True, "deadline", "an endless `data:` line trickled"),
    ("events", 0.0, True, "oversize", "endless valid token events, more than max_tokens"),
    ("events", 0.0, False, "deadline", "endless valid empty events, flooded"),
    ("events", 0.01, False, "deadline", "endless valid empty events trickled"),
]
IDS = [f"{m}-{'flood' if p == 0 else 'trickle'}-{'content' if c else 'empty'}"
       for m, p, c, _, _ in ATTACKS]  # fmt: skip

CLIENT = """
import asyncio, json, sys, time
from gpudoctor.bench.load.client import ClientOptions, run_requests
from gpudoctor.bench.load.workload import Prompt
url, deadline_s = sys.argv[1], float(sys.argv[2])
options = ClientOptions(url, "m", timeout_s=600.0)
prompts = [Prompt("hello", 2, 8)] * 4
async def go():
    return await run_requests(None, options, prompts, 2, deadline=time.perf_counter() + deadline_s)
records, wall = asyncio.run(go())
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"kinds": [r.error_kind for r in records], "wall_s": wall, "maxrss": hwm * 1024}))
"""


@pytest.mark.parametrize(("mode", "pace_s", "content", "kind", "attack"), ATTACKS, ids=IDS)
def test_hostile_server_cannot_hang_a_cell_or_grow_memory(
    mode: str, pace_s: float, content: bool, kind: str, attack: str
) -> None:
    """Attack: a hostile inference server sends ``attack`` to the measuring client (a
    separate process, as the launcher is); before the caps and deadlines the client
    buffered it forever, never returned, and grew without bound. Now every request
    ends with ``kind`` by the cell's deadline and the client's peak RSS (psutil,
    sampled every 20 ms, and the kernel's high-water mark VmHWM) stays under 200 MB."""
    with HostileServer(mode, pace_s, content) as srv:
        child = subprocess.Popen([sys.executable, "-c", CLIENT, srv.url, str(CELL_DEADLINE_S)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        proc, peak = psutil.Process(child.pid), 0
        started = time.monotonic()
        while child.poll() is None and time.monotonic() - started < 120:
            try:
                peak = max(peak, proc.memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.02)
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    result = json.loads(out)
    assert result["kinds"] == [kind] * 4, result
    assert peak < RSS_LIMIT and result["maxrss"] < RSS_LIMIT, (peak, result["maxrss"])
    if kind == "deadline":
        assert result["wall_s"] >= CELL_DEADLINE_S  # it ran until its deadline, not less
    assert srv.bytes_sent > 0


@pytest.mark.parametrize(("mode", "pace_s", "content", "kind", "attack"), ATTACKS, ids=IDS)
def test_measure_cell_ends_at_its_deadline_with_the_kind_recorded(
    tiny_model_dir: Path, tmp_path: Path, mode: str, pace_s: float, content: bool, kind: str,
    attack: str,
) -> None:  # fmt: skip
    """Attack: ``attack``, through the launcher's entry point ``measure_cell`` (warmup,
    measured requests, raw file): the cell returns a record with every failure counted
    under ``kind``, and the measuring process grew by less than 200 MB."""
    raw = tmp_path / "raw.jsonl"
    before = psutil.Process().memory_info().rss
    with HostileServer(mode, pace_s, content) as srv:
        target = CellTarget(srv.url, "m", str(tiny_model_dir), raw_path=raw)
        cell = measure_cell(target, SPEC, 2, telemetry=False, timeout_s=600.0,
                            cell_timeout_s=CELL_DEADLINE_S)  # fmt: skip
    assert cell["completed"] == 0 and cell["errors"][kind] == SPEC.num_prompts
    assert cell["client"]["warmup"]["failed"] == 1
    assert cell["client"]["deadline_hit"] is (kind == "deadline")
    assert len(raw.read_text().splitlines()) == SPEC.num_prompts
    assert psutil.Process().memory_info().rss - before < RSS_LIMIT


def test_request_timeout_is_a_total_limit_not_an_idle_one(tiny_model_dir: Path) -> None:
    """Attack: a server trickling valid empty events resets an idle timeout forever;
    ``limits.request_timeout_s`` now bounds each request from its send."""
    with HostileServer("events", 0.01, content=False) as srv:
        target = CellTarget(srv.url, "m", str(tiny_model_dir))
        spec = WorkloadSpec(input_len=16, output_len=8, num_prompts=2, ignore_eos=False, warmup=0)
        cell = measure_cell(target, spec, 2, telemetry=False, timeout_s=0.5, cell_timeout_s=60)
    assert cell["errors"]["timeout"] == 2 and cell["client"]["deadline_hit"] is False
