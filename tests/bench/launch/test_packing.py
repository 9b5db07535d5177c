"""Packing cells onto GPUs with real server processes: stand-in GPUs declared by
environment (GPUDOCTOR_FAKE_GPUS), each held by tests/bench/stream_server.py --hold-gpus
with an exclusive flock, so two servers given the same GPU cannot both start."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.launch.dry_run import dry_run
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.compare import compare_runs
from gpudoctor.bench.results.report import write_report
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import STREAM_SERVER, wait_no_leftovers, write

UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}" for i in range(4)]


@pytest.fixture
def standin_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Declare 4 stand-in GPUs; return the directory their holds are logged in."""
    locks = tmp_path / "gpu-locks"
    locks.mkdir()
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPUS", ",".join(UUIDS))
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPU_LOCKS", str(locks))
    return locks


def packed_plan(model_dir: Path, configs: str, extra: str = "", delay_ms: float = 20) -> str:
    """Return a plan whose servers hold ``tp`` stand-in GPUs each."""
    command = [sys.executable, str(STREAM_SERVER), "--model", "{model}", "--host", "{host}",
               "--port", "{port}", "--hold-gpus", "{tp}"]  # fmt: skip
    cmd = ", ".join(f'"{w}"' for w in command)
    return textwrap.dedent(f"""\
        name = "packed"
        [model]
        path = "{model_dir}"
        [engine]
        name = "command"
        command = [{cmd}]
        version = "stub-1"
        startup_timeout_s = 30
        stop_timeout_s = 5
        args = {{ token-delay-ms = {delay_ms} }}
        [axes]
        concurrency = [1, 2]
        [preflight]
        enabled = false
        [workload]
        input_len = 16
        output_len = 8
        num_prompts = 4
        warmup = 0
        """) + extra + configs  # fmt: skip


def tp1_configs(n: int) -> str:
    return "".join(f'[[configs]]\nname = "c{i}"\nargs = {{ max-model-len = {2048 + i} }}\n'
                   for i in range(n))  # fmt: skip


def holds(locks: Path) -> list[tuple[str, int, float, float]]:
    path = locks / "holds.log"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        uuid, pid, start, end = line.split()
        rows.append((uuid, int(pid), float(start), float(end)))
    return rows


def max_overlap(rows: list[tuple[str, int, float, float]]) -> int:
    """Return the most servers (pids) that held GPUs at the same moment."""
    spans = {pid: (start, end) for _, pid, start, end in rows}
    events = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def _alive(pid: int) -> bool:
    """Return whether ``pid`` runs (a zombie waiting for init to reap it does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_tp1_cells_fill_every_gpu_and_tp2_waits_for_two(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    configs = tp1_configs(5) + '[[configs]]\nname = "wide"\ntp = [2]\n'
    plan = load_plan(write(tmp_path, packed_plan(tiny_model_dir, configs)))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    assert (summary.ok, summary.crashed, summary.skipped) == (12, 0, 0)
    records = read_records(out / "results.jsonl")[0]
    assert sorted(r["key"] for r in records) == sorted(c.key for c in plan.cells())
    for r in records:
        assert len(r["gpus"]) == r["tp"] and set(r["gpus"]) <= set(UUIDS), r
        assert isinstance(r["slot"], int)
    rows = holds(standin_gpus)
    assert len({pid for _, pid, _, _ in rows}) == 6  # one server per configuration
    assert max_overlap(rows) >= 2  # servers really ran side by side
    by_uuid: dict[str, list[tuple[float, float]]] = {}
    for uuid, _, start, end in rows:
        by_uuid.setdefault(uuid, []).append((start, end))
    for spans in by_uuid.values():  # never two servers on one GPU at a time
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    servers = [json.loads(x) for x in (out / "servers.jsonl").read_text().splitlines()]
    assert {s["label"]: len(s["gpus"]) for s in servers}["wide@tp2"] == 2
    state = json.loads((out / "state.json").read_text())
    assert state["finished"] is True and state["running"] == []
    report = write_report(out).markdown.read_text()
    assert "## Where each cell ran" in report
    wide = next(r for r in records if r["config"] == "wide")
    assert (
        f"| wide | 2 | {wide['concurrency']} | {wide['slot']} | {', '.join(wide['gpus'])} |"
        in report
    )
    compared = compare_runs(out, out)
    assert all(c.gpus_a == c.gpus_b and len(c.gpus_a) == c.tp for c in compared.cells)
    assert wait_no_leftovers(out) == []


def test_failed_gpu_leaves_the_pool_and_crash_frees_only_its_slot(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = tmp_path / "faults"
    faults.write_text(f"{UUIDS[1]} 2 uncorrected ECC errors\n")
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPU_FAULTS", str(faults))
    configs = tp1_configs(4) + '[[configs]]\nname = "crashy"\nargs = { exit-after-requests = 1 }\n'
    plan = load_plan(write(tmp_path, packed_plan(tiny_model_dir, configs)))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    records = read_records(out / "results.jsonl")[0]
    assert summary.ok == 8 and summary.crashed + summary.skipped == 2
    assert all(UUIDS[1] not in r.get("gpus", []) for r in records)
    out_lines = [json.loads(x) for x in (out / "gpus.jsonl").read_text().splitlines()]
    assert [(g["uuid"], g["reason"]) for g in out_lines] == [(UUIDS[1], "2 uncorrected ECC errors")]
    crashed = [r for r in records if r["status"] == "crashed"]
    assert crashed and crashed[0]["config"] == "crashy" and crashed[0]["gpus"]
    assert {h[0] for h in holds(standin_gpus)} == {UUIDS[0], UUIDS[2], UUIDS[3]}


def test_hardware_caps_the_pool_and_a_too_wide_config_is_skipped(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    configs = tp1_configs(2) + '[[configs]]\nname = "huge"\ntp = [4]\n'
    text = packed_plan(tiny_model_dir, configs, extra="[hardware]\ngpus = [2, 3]\n")
    plan = load_plan(write(tmp_path, text))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    assert (summary.ok, summary.skipped) == (4, 2)
    records = read_records(out / "results.jsonl")[0]
    assert {u for r in records for u in r.get("gpus", [])} <= {UUIDS[2], UUIDS[3]}
    skipped = [r for r in records if r["status"] == "skipped"]
    assert all("needs 4 GPU(s); the pool has 2" in r["reason"] for r in skipped)


def test_dry_run_shows_cells_on_gpus_in_waves(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    configs = tp1_configs(6) + '[[configs]]\nname = "wide"\ntp = [2]\n'
    plan = load_plan(write(tmp_path, packed_plan(tiny_model_dir, configs)))
    result = dry_run(plan, LaunchOptions(out=tmp_path / "run"), validate=False)
    sched = result["schedule"]
    assert sched["packed"] and len(sched["gpus"]) == 4
    placed = {p["label"]: p for p in sched["placements"]}
    assert len(placed["wide@tp2"]["gpus"]) == 2 and placed["wide@tp2"]["wave"] == 1
    waves = [p["wave"] for p in placed.values()]  # 2 + 6 GPU-jobs of equal length on 4 GPUs
    assert (waves.count(1), waves.count(2)) == (3, 4)
    assert sched["expected_s"] == pytest.approx(2 * placed["wide@tp2"]["end_s"])
    assert sched["expected_s"] < sched["serial_s"]
    cli = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "run", str(tmp_path / "plan.toml"),
                          "--dry-run", "--no-validate"], capture_output=True, text=True,
                         timeout=120, env=os.environ.copy())  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "wave 1" in cli.stdout and "wide@tp2" in cli.stdout and "expected" in cli.stdout


def test_sigkill_with_four_servers_up_leaves_no_orphan_and_resume_runs_the_rest(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    configs = tp1_configs(6)
    plan_path = write(tmp_path, packed_plan(tiny_model_dir, configs, delay_ms=150))
    out = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "gpudoctor", "bench", "run", str(plan_path),
                                 "--out", str(out)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=os.environ.copy())  # fmt: skip
    deadline = time.monotonic() + 90
    running: list = []
    while time.monotonic() < deadline:
        try:
            running = json.loads((out / "state.json").read_text())["running"]
        except (OSError, ValueError, KeyError):
            running = []
        if len(running) == 4:
            break
        time.sleep(0.1)
    assert len(running) == 4, "four servers never ran at once"
    pids = [r["pid"] for r in running]
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)
    assert wait_no_leftovers(out) == []
    assert [pid for pid in pids if _alive(pid)] == []
    before = {r["key"] for r in read_records(out / "results.jsonl")[0]}
    plan = load_plan(plan_path)
    summary = run_campaign(plan, LaunchOptions(out=out))
    records = read_records(out / "results.jsonl")[0]
    assert len(records) == len(plan.cells()) == 12
    assert len({r["key"] for r in records}) == 12  # exactly once
    assert summary.already_done == len(before) and summary.ok == 12 - len(before)
