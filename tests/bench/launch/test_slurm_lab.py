"""`bench submit --slurm` against a real Slurm on 127.0.0.1 (tests/lab/slurm.py): a real
job array whose tasks run `bench run --shard` on the GPUs Slurm gives them (stand-ins:
CUDA_VISIBLE_DEVICES from the gres, each GPU held by stream_server.py --hold-gpus), a
real dependent merge job, a cancelled task resubmitted for its missing cells only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.bench.launch.schedule import shard_of
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import write
from tests.bench.launch.test_packing import UUIDS, packed_plan, tp1_configs
from tests.conftest import lab_unavailable
from tests.lab.slurm import SlurmCluster, SlurmLabError, missing_programs


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[SlurmCluster]:
    """A one-node Slurm with 4 GPUs (gres), started for the test and torn down after."""
    if os.geteuid() != 0:
        lab_unavailable("the Slurm lab needs root (slurmd runs jobs as root here)")
    missing = missing_programs()
    if missing:
        lab_unavailable(f"Slurm lab: {', '.join(missing)} missing (apt install slurm-wlm munge)")
    cluster = SlurmCluster(tmp_path / "slurm")
    try:
        cluster.start()
    except (SlurmLabError, OSError, subprocess.SubprocessError) as exc:
        cluster.stop()
        lab_unavailable(f"Slurm lab cannot start: {exc}")
    yield cluster
    cluster.stop()


def _env(cluster: SlurmCluster, locks: Path) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, "GPUDOCTOR_FAKE_GPUS": ",".join(UUIDS), "GPUDOCTOR_FAKE_GPU_LOCKS": str(locks),
            "COLUMNS": "200"}  # fmt: skip


def _bench(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip


def _wait_job_gone(cluster: SlurmCluster, job: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not cluster.run("squeue", "-h", "-j", job).stdout.strip():
            return
        time.sleep(0.5)
    raise AssertionError(
        f"job {job} still queued: {cluster.run('squeue').stdout} {cluster.log_tail()}"
    )


def plan_filling_every_shard(tmp_path: Path, model_dir: Path, configs: str, shards: int,
                             delay_ms: float = 20) -> Path:  # fmt: skip
    """Write a plan of ``configs`` whose cells fill each of ``shards`` shards. A cell's shard
    follows from its key, which holds the (per-session) model path, so a small plan can
    leave a shard empty by chance (no task for it then); a last config's ``max-model-len``
    is varied until no shard is empty, so the test never depends on that chance."""
    for salt in range(200):
        extra = f'[[configs]]\nname = "fill"\nargs = {{ max-model-len = {4096 + salt} }}\n'
        path = write(tmp_path, packed_plan(model_dir, configs + extra, delay_ms=delay_ms))
        if {shard_of(c.key, shards) for c in load_plan(path).cells()} == set(range(1, shards + 1)):
            return path
    raise AssertionError(f"no plan of {configs!r} fills {shards} shards")


def test_job_array_runs_every_shard_on_its_gres_and_merges(slurm: SlurmCluster, tmp_path: Path,
                                                            tiny_model_dir: Path) -> None:  # fmt: skip
    locks = tmp_path / "locks"
    locks.mkdir()
    env = _env(slurm, locks)
    configs = tp1_configs(2) + '[[configs]]\nname = "wide"\ntp = [2]\n'
    plan_path = plan_filling_every_shard(tmp_path, tiny_model_dir, configs, shards=3)
    plan = load_plan(plan_path)
    out = tmp_path / "campaign"
    done = _bench(
        env, "submit", "--slurm", str(plan_path), "--out", str(out), "--shards", "3", "--json"
    )
    assert done.returncode == 0, done.stderr
    sub = json.loads(done.stdout)
    assert sub["tasks"] == [1, 2, 3] and sub["gres"] == 2 and sub["array_job"] and sub["merge_job"]
    shown = slurm.run("scontrol", "-o", "show", "job", sub["merge_job"]).stdout
    assert f"afterany:{sub['array_job']}" in shown
    _wait_job_gone(slurm, sub["array_job"])
    _wait_job_gone(slurm, sub["merge_job"])
    merged = read_records(out / "merged" / "results.jsonl")[0]
    assert sorted(r["key"] for r in merged) == sorted(c.key for c in plan.cells())
    assert all(r["status"] == "ok" for r in merged), [r.get("reason") for r in merged]
    for r in merged:
        assert r["shard"] == f"{shard_of(r['key'], 3)}/3"
        assert len(r["gpus"]) == r["tp"] and set(r["gpus"]) <= set(UUIDS)
    status = _bench(env, "status", str(out), "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["progress"] == {"recorded": 8, "total": 8}
    assert set(st["slurm"]["tasks"][sub["array_job"]].values()) == {"COMPLETED"}
    assert st["merged"]["progress"]["recorded"] == 8
    again = _bench(env, "submit", "--slurm", str(plan_path), "--out", str(out), "--json")
    assert json.loads(again.stdout)["tasks"] == []  # nothing missing: nothing submitted


def test_a_cancelled_task_is_resubmitted_for_its_missing_cells_only(slurm: SlurmCluster, tmp_path: Path,
                                                                     tiny_model_dir: Path) -> None:  # fmt: skip
    locks = tmp_path / "locks"
    locks.mkdir()
    env = _env(slurm, locks)
    plan_path = plan_filling_every_shard(tmp_path, tiny_model_dir, tp1_configs(3), 2, delay_ms=120)
    plan = load_plan(plan_path)
    out = tmp_path / "campaign"
    sub = json.loads(_bench(env, "submit", "--slurm", str(plan_path), "--out", str(out),
                            "--shards", "2", "--gpus-per-task", "2", "--json").stdout)  # fmt: skip
    array = sub["array_job"]
    state = out / "shards" / "2" / "state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if json.loads(state.read_text())["running"]:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    else:
        raise AssertionError(f"shard 2 never started: {slurm.log_tail()}")
    assert slurm.run("scancel", f"{array}_2").returncode == 0
    _wait_job_gone(slurm, array)
    _wait_job_gone(slurm, sub["merge_job"])
    st = json.loads(_bench(env, "status", str(out), "--json").stdout)
    assert (
        st["slurm"]["tasks"][array]["2"] == "CANCELLED"
        and st["slurm"]["tasks"][array]["1"] == "COMPLETED"
    )
    before = {r["key"] for r in read_records(out / "shards" / "2" / "results.jsonl")[0]}
    shard2 = {c.key for c in plan.cells() if shard_of(c.key, 2) == 2}
    assert before < shard2  # cancelled part way
    again = json.loads(
        _bench(env, "submit", "--slurm", str(plan_path), "--out", str(out), "--json").stdout
    )
    assert again["tasks"] == [2] and "all cells recorded" in again["skipped"]["1"]
    _wait_job_gone(slurm, again["array_job"])
    _wait_job_gone(slurm, again["merge_job"])
    shard_records = read_records(out / "shards" / "2" / "results.jsonl")[0]
    assert sorted(r["key"] for r in shard_records) == sorted(
        shard2
    )  # each once: only the missing ran
    merged = read_records(out / "merged" / "results.jsonl")[0]
    assert sorted(r["key"] for r in merged) == sorted(c.key for c in plan.cells())
