"""`bench merge` as a user meets it (issue 34.1: it never replaces a run) and as an
attacker meets it (issue 33.1: a run directory another user made).

Every test runs the real CLI in a subprocess on real directories. The inputs are made
by hand (a run directory is data: plan.toml, results.jsonl, raw/, logs/), so the merge is
tested on exactly the records an attacker would write; tests/bench/launch/test_shards.py
merges real launches.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.launch.test_out_security import as_nobody

PLAN = 'name = "x"\n'
VICTIM = "root only\n"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def _record(key: str, status: str = "ok", at: str = "2026-01-01T00:00:00Z") -> dict:
    return {"key": key, "config": f"c-{key}", "tp": 1, "concurrency": 1, "status": status,
            "recorded_at": at, "raw": f"raw/{key}.jsonl",
            "measurement": {"output_throughput": 1.0, "duration_s": 1.0}}  # fmt: skip


def _run(path: Path, *keys: str, status: str = "ok") -> Path:
    """A run directory of ``keys`` (one ok record each, its raw file, a server log)."""
    (path / "raw").mkdir(parents=True)
    (path / "logs").mkdir()
    (path / "plan.toml").write_text(PLAN)
    (path / "results.jsonl").write_text(
        "".join(json.dumps(_record(k, status)) + "\n" for k in keys)
    )
    for key in keys:
        (path / "raw" / f"{key}.jsonl").write_text(json.dumps({"request": key}) + "\n")
    (path / "logs" / "c.log").write_text(f"log of {path.name}\n")
    return path


def _keys(run: Path) -> list[str]:
    return sorted(str(r["key"]) for r in read_records(run / "results.jsonl")[0])


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_merge_never_replaces_a_run_directory(tmp_path: Path) -> None:
    """34.1: `bench merge A --out RUN` with RUN an existing run replaced its results.jsonl
    and raw/ (exit 0, no word); the old report stayed, describing data that was gone."""
    run = _run(tmp_path / "run", "aaaa", "bbbb")
    (run / "report.md").write_text("# report of run\n")
    shard = _run(tmp_path / "shard", "cccc")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    line = _error_line(_cli("merge", str(shard), "--out", str(run)))
    assert f"{run} is not empty" in line and "holds no earlier merge" in line
    assert "choose a new --out" in line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine\n")
    assert "is not empty (todo.txt)" in _error_line(_cli("merge", str(shard), "--out", str(other)))
    assert sorted(p.name for p in other.iterdir()) == ["todo.txt"]


def test_merge_into_an_earlier_merge_keeps_every_cell(tmp_path: Path) -> None:
    """34.1: a second merge into an earlier merge of other inputs dropped the first merge's
    cells. Now they stay (said in one line), duplicates stay in duplicates.jsonl, and the
    same inputs merged again add nothing twice."""
    a = _run(tmp_path / "a", "aaaa", "bbbb")
    b = _run(tmp_path / "b", "cccc")
    c = _run(tmp_path / "c", "aaaa", status="crashed")
    merged = tmp_path / "m"
    first = _cli("merge", str(a), str(c), "--out", str(merged))
    assert first.returncode == 0, first.stderr
    assert (merged / "duplicates.jsonl").read_text().count("\n") == 1
    (merged / "report.md").write_text("# report of the first merge\n")
    second = _cli("merge", str(b), "--out", str(merged))
    assert second.returncode == 0, second.stderr
    assert (
        "held an earlier merge (2 cells): merged into it, every cell it held kept" in second.stdout
    )
    assert "report.md and its plots describe the merge before this one" in second.stderr
    assert _keys(merged) == ["aaaa", "bbbb", "cccc"]
    records = {r["key"]: r for r in read_records(merged / "results.jsonl")[0]}
    assert {k: r["merged_from"] for k, r in records.items()} == {
        "aaaa": "a",
        "bbbb": "a",
        "cccc": "b",
    }
    for key in records:
        assert (merged / "raw" / f"{key}.jsonl").read_text() == json.dumps({"request": key}) + "\n"
    assert (merged / "duplicates.jsonl").read_text().count("\n") == 1  # the first merge's, kept
    assert (merged / "logs" / "a" / "c.log").read_text() == "log of a\n"
    assert (merged / "logs" / "b" / "c.log").read_text() == "log of b\n"
    again = _cli("merge", str(a), str(b), "--out", str(merged), "--json")
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["cells"] == 3 and doc["duplicates"] == [] and doc["earlier"] == 3
    meta = json.loads((merged / "merge.json").read_text())
    assert sorted(i["name"] for i in meta["inputs"]) == ["a", "b", "c"]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file only root may read (as /etc/shadow)."""
    path = tmp_path / "secret"
    path.write_text(VICTIM)
    os.chmod(path, 0o600)
    return path


def test_merge_refuses_a_run_directory_another_user_controls(
    public_tmp_path: Path, victim: Path, tmp_path: Path
) -> None:
    """33.1: nobody makes /tmp/x/run (theirs) with raw/k.jsonl -> /secret and a record
    keyed ../../cron/x; root's `bench merge /tmp/x/run --out M` copied /secret into M
    (0644) and wrote nobody's bytes outside M. An input another user owns is refused."""
    public = public_tmp_path / "public"
    public.mkdir(mode=0o1777)
    os.chmod(public, 0o1777)
    run = public / "run"
    as_nobody(f"mkdir -m 0755 {run} {run}/raw && printf %s {shlex.quote(PLAN)} > {run}/plan.toml"
              f" && ln -s {victim} {run}/raw/k.jsonl && printf '%s\\n' "
              f"{shlex.quote(json.dumps(_record('k')))} > {run}/results.jsonl")  # fmt: skip
    assert _keys(run) == ["k"]
    merged = tmp_path / "m"
    line = _error_line(_cli("merge", str(run), "--out", str(merged)))
    assert "belongs to nobody (uid 65534)" in line and "run the merge as that user" in line
    assert not merged.exists()


def test_merge_writes_nothing_outside_out_and_never_reads_through_a_link(
    public_tmp_path: Path, victim: Path, tmp_path: Path
) -> None:
    """33.1: records an attacker wrote, in a directory root copied (`cp -r`, links kept):
    a key of ../../escape and an absolute key made root write the record's raw bytes at
    any *.jsonl path (parents created); raw/k.jsonl, plan.toml and logs/x.log linked to a
    root-only file were copied into the merge, mode 0644. Now: the keys are left out
    (a warning), the links refused, nothing lands outside M, the secret nowhere in M."""
    run = tmp_path / "copied"
    outside = tmp_path / "outside"
    absolute = public_tmp_path / "abs"
    (run / "raw").mkdir(parents=True)
    (run / "logs").mkdir()
    records = [_record("good"), {**_record("../../outside/escape"), "raw": "raw/good.jsonl"},
               {**_record(str(absolute / "x")), "raw": "raw/good.jsonl"},
               _record("k")]  # fmt: skip
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "raw" / "good.jsonl").write_text("attacker bytes\n")
    os.symlink(victim, run / "raw" / "k.jsonl")
    os.symlink(victim, run / "logs" / "x.log")
    merged = tmp_path / "deep" / "m"
    done = _cli("merge", str(run), "--out", str(merged))
    assert done.returncode == 0, done.stderr
    assert "left out 2 record(s) whose key is not a plain name" in done.stderr
    assert "logs/x.log not copied" in done.stderr
    assert not outside.exists() and not absolute.exists()
    assert _keys(merged) == ["good", "k"]
    assert all(not p.is_symlink() for p in merged.rglob("*"))
    for path in merged.rglob("*"):
        assert not path.is_file() or VICTIM not in path.read_text(), path
    assert not (merged / "raw" / "k.jsonl").exists()
    os.symlink(victim, run / "plan.toml")
    line = _error_line(_cli("merge", str(run), "--out", str(tmp_path / "m2")))
    assert "plan.toml is a symlink" in line
    assert not (tmp_path / "m2" / "plan.toml").exists()
