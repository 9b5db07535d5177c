"""The run directory: exactly-once records, torn tails, plan changes, corrupt lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import RunDir, RunDirError, read_records, scan_records

PLAN_A = '[model]\npath = "/m"\n[engine]\nname = "vllm"\n[axes]\nconcurrency = [1, 2]\n'


def test_rundir_repairs_a_torn_tail_and_resumes(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
        assert not opened.resumed and (tmp_path / "plan.toml").read_text() == PLAN_A
        rd.append({"key": "k1", "status": "ok"})
        rd.append({"key": "k2", "status": "crashed"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k3", "sta')  # the launcher was killed mid-write
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
        assert set(opened.done) == {"k1", "k2"} and opened.dropped_bytes == 18
        rd.append({"key": "k3", "status": "ok"})
    records, dropped = read_records(tmp_path / "results.jsonl")
    assert [r["key"] for r in records] == ["k1", "k2", "k3"] and dropped == 0


def test_rundir_plan_changes_and_archives(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k1", "status": "ok"})
    with RunDir(tmp_path) as rd, pytest.raises(RunDirError, match="holds a different plan"):
        rd.open(PLAN_A + "# changed\n", None)
    with RunDir(tmp_path) as rd:
        assert set(rd.open(PLAN_A + "# changed\n", True).done) == {"k1"}
    assert next(iter(tmp_path.glob("plan-before-*.toml"))).read_text() == PLAN_A
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, False)
        assert opened.done == {} and opened.archived
    assert json.loads((Path(opened.archived) / "results.jsonl").read_text())["key"] == "k1"


def test_rundir_is_exclusive_and_drops_retried_records(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        with pytest.raises(RunDirError, match="another gpudoctor bench"), RunDir(tmp_path):
            pass
        for key, status in (("a", "ok"), ("b", "crashed"), ("c", "ok")):
            rd.append({"key": key, "status": status})
        assert rd.drop_records({"b"}) == 1
    assert [r["key"] for r in read_records(tmp_path / "results.jsonl")[0]] == ["a", "c"]
    assert json.loads((tmp_path / "superseded.jsonl").read_text())["key"] == "b"


def test_rundir_keeps_the_records_after_a_corrupt_middle_line(tmp_path: Path) -> None:
    """Fault: a corrupt line in the middle of results.jsonl (disk error, a torn write
    followed by a later launch's appends) used to be taken for the torn tail: open()
    truncated the file there, losing every finished cell after it."""
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k1", "status": "ok"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k2", "sta\n')  # torn, then a later launch appended after it
    with RunDir(tmp_path) as rd:
        rd.append({"key": "k3", "status": "ok"})
        rd.append({"key": "k4", "status": "crashed"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k5"')  # and a torn tail
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
    assert set(opened.done) == {"k1", "k3", "k4"}
    assert opened.corrupt_lines == (2,) and opened.dropped_bytes == 12
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[3])["key"] == "k4"  # nothing after line 2 cut
    scan = scan_records(tmp_path / "results.jsonl")
    assert [r["key"] for r in scan.records] == ["k1", "k3", "k4"] and scan.corrupt_lines == (2,)
