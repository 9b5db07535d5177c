"""`bench run --shard I/N` and `bench merge` with real launches, then report/compare and
status on the merged run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.launch.schedule import shard_of
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write

CONFIGS = "".join(
    f'[[configs]]\nname = "s{i}"\nargs = {{ max-model-len = {2048 + i} }}\n' for i in range(3)
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def test_shards_cover_the_matrix_once_and_merge_reports_duplicates(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan_path = write(tmp_path, stub_plan(tiny_model_dir, configs=CONFIGS, concurrency="[1, 2]"))
    plan = load_plan(plan_path)
    dirs = []
    for i in (1, 2, 3):
        out = tmp_path / f"shard{i}"
        done = _cli("run", str(plan_path), "--shard", f"{i}/3", "--out", str(out), "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["total"] == sum(
            1 for c in plan.cells() if shard_of(c.key, 3) == i
        )
        records = read_records(out / "results.jsonl")[0]
        assert all(shard_of(r["key"], 3) == i and r["shard"] == f"{i}/3" for r in records)
        dirs.append(out)
    merged = tmp_path / "merged"
    result = _cli("merge", *map(str, dirs), "--out", str(merged), "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cells"] == 6 and doc["duplicates"] == []
    keys = [r["key"] for r in read_records(merged / "results.jsonl")[0]]
    assert sorted(keys) == sorted(c.key for c in plan.cells())
    report = _cli("report", str(merged))
    assert report.returncode == 0, report.stderr
    assert "6 cells: 6 ok" in (merged / "report.md").read_text()
    compare = _cli("compare", str(merged), str(merged), "--json")
    assert compare.returncode == 0 and len(json.loads(compare.stdout)["cells"]) == 6
    # the same shard run twice (two hosts given the same --shard): reported, kept once
    again = tmp_path / "shard1-again"
    assert _cli("run", str(plan_path), "--shard", "1/3", "--out", str(again)).returncode == 0
    twice = _cli("merge", *map(str, dirs), str(again), "--out", str(tmp_path / "m2"))
    assert twice.returncode == 0, twice.stderr
    n_first = len(read_records(dirs[0] / "results.jsonl")[0])
    assert twice.stdout.count("duplicate: ") == n_first
    assert len(read_records(tmp_path / "m2" / "results.jsonl")[0]) == 6
    assert len(read_records(tmp_path / "m2" / "duplicates.jsonl")[0]) == n_first
    status = _cli("status", str(tmp_path / "m2"), "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["progress"] == {"recorded": 6, "total": 6} and st["groups"][0]["done"] == 6


def test_merge_refuses_other_plans_and_bad_shards(tmp_path: Path, tiny_model_dir: Path) -> None:
    a = write(tmp_path, stub_plan(tiny_model_dir, configs=CONFIGS, concurrency="[1]"), "a.toml")
    b = write(tmp_path, stub_plan(tiny_model_dir, configs=CONFIGS, concurrency="[2]"), "b.toml")
    assert _cli("run", str(a), "--out", str(tmp_path / "ra")).returncode == 0
    assert _cli("run", str(b), "--out", str(tmp_path / "rb")).returncode == 0
    refused = _cli(
        "merge", str(tmp_path / "ra"), str(tmp_path / "rb"), "--out", str(tmp_path / "m")
    )
    assert refused.returncode == 1 and "different plans" in refused.stderr
    bad = _cli("run", str(a), "--shard", "4/3", "--dry-run", "--no-validate")
    assert bad.returncode == 2 and "expected I/N" in bad.stderr
