"""`bench merge`: a cell measured ok in one shard keeps that measurement, whatever another
shard recorded for it later (a crash, a skip); the later copy is kept aside in
duplicates.jsonl, never lost, never chosen over the measurement.

Real run directories made by the real campaign loop (servers: tests/bench/stream_server.py
behind a small wrapper that crashes at start when told to, as a broken node would), merged
by `gpudoctor bench merge` as a real process, in both input orders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import (
    STREAM_SERVER,
    local_quirks,
    stub_plan,
    wait_no_leftovers,
    write,
)

__all__ = ["local_quirks"]  # autouse: the crash's learned quirk goes to a per-test table


def wrapped_plan(tmp_path: Path, model: Path, crash_line: str) -> tuple[Path, Path]:
    """Return (plan, marker): the plan's server crashes at start, printing ``crash_line``,
    while ``marker`` exists (its ``--help`` still answers); otherwise it is the stream server."""
    marker = tmp_path / "crash-now"
    said = tmp_path / "crash-line.txt"
    said.write_text(crash_line + "\n", encoding="utf-8")
    wrapper = tmp_path / "server.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ -e "{marker}" ] && [ "$1" != --help ]; then cat "{said}" >&2; exit 1; fi\n'
        f'exec "{sys.executable}" "{STREAM_SERVER}" "$@"\n'
    )
    wrapper.chmod(0o755)
    text = stub_plan(model, '[[configs]]\nname = "a"\n', "[1, 2]")
    text = text.replace(f'"{sys.executable}", "{STREAM_SERVER}"', f'"{wrapper}"')
    assert str(wrapper) in text
    return write(tmp_path, text), marker


@pytest.fixture
def shards(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, Path]:
    """Return (measured, crashed later): two runs of one plan, the second after the first."""
    plan_path, marker = wrapped_plan(tmp_path, tiny_model_dir, "CUDA error: out of memory")
    plan = load_plan(plan_path)
    good, bad = tmp_path / "good", tmp_path / "bad"
    assert run_campaign(plan, LaunchOptions(out=good)).ok == 2
    last = max(r["recorded_at"] for r in read_records(good / "results.jsonl")[0])
    while time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) <= last:
        time.sleep(0.05)  # records are stamped to the second: the crash must be newer
    marker.touch()
    assert run_campaign(plan, LaunchOptions(out=bad)).crashed == 2
    for run in (good, bad):
        assert wait_no_leftovers(run) == []
    return good, bad


def _merge(out: Path, *inputs: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "merge", *map(str, inputs),
                           "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("order", ["good-first", "bad-first"])
def test_a_later_crash_never_replaces_another_shards_measurement(
    tmp_path: Path, shards: tuple[Path, Path], order: str
) -> None:
    good, bad = shards
    measured = {r["key"]: r for r in read_records(good / "results.jsonl")[0]}
    crashed = read_records(bad / "results.jsonl")[0]
    assert {r["status"] for r in crashed} == {"crashed"}
    assert min(r["recorded_at"] for r in crashed) > max(
        r["recorded_at"] for r in measured.values()
    )  # the crash is the newer record
    out = tmp_path / f"merged-{order}"
    result = _merge(out, *((good, bad) if order == "good-first" else (bad, good)))
    assert result["cells"] == 2
    merged = read_records(out / "results.jsonl")[0]
    assert {r["key"]: r["status"] for r in merged} == {k: "ok" for k in measured}
    for r in merged:
        assert r["measurement"] == measured[r["key"]]["measurement"]
        assert r["merged_from"] == "good"
    aside = read_records(out / "duplicates.jsonl")[0]
    assert sorted((r["key"], r["status"]) for r in aside) == sorted(
        (r["key"], "crashed") for r in crashed
    )


def test_merging_again_into_the_same_directory_gives_the_same_result(
    tmp_path: Path, shards: tuple[Path, Path]
) -> None:
    """`--out` may be an earlier merge of the same inputs (more shards finished since):
    merging again succeeds and gives the same cells, each input's logs copied afresh."""
    good, bad = shards
    out = tmp_path / "merged"
    first = _merge(out, good, bad)
    assert (out / "logs" / "good").is_dir() and (out / "logs" / "bad").is_dir()
    before = sorted((r["key"], r["status"]) for r in read_records(out / "results.jsonl")[0])
    again = _merge(out, good, bad)
    assert again["cells"] == first["cells"] == 2
    after = sorted((r["key"], r["status"]) for r in read_records(out / "results.jsonl")[0])
    assert after == before
    logs = sorted(p.relative_to(out).as_posix() for p in (out / "logs").rglob("*") if p.is_file())
    sources = sorted(
        f"logs/{run.name}/{p.relative_to(run / 'logs').as_posix()}"
        for run in (good, bad)
        for p in (run / "logs").rglob("*")
        if p.is_file()
    )
    assert logs == sources
