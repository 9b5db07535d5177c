"""``--retry-crashed`` drops the crashed records from results.jsonl only once they are
safe in superseded.jsonl: when they cannot be saved there, results.jsonl still holds
every record, byte for byte. A real run directory on disk; the save fails for real
(superseded.jsonl is a directory, as a wrong manual fix would leave it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import RunDir, RunDirError, read_records

PLAN = '[model]\npath = "/m"\n[engine]\nname = "vllm"\n[axes]\nconcurrency = [1, 2]\n'


def test_a_failed_save_of_the_dropped_records_loses_nothing(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN, None)
        for key, status in (("a", "ok"), ("b", "crashed"), ("c", "crashed")):
            rd.append({"key": key, "status": status})
    before = (tmp_path / "results.jsonl").read_bytes()
    (tmp_path / "superseded.jsonl").mkdir()  # the save cannot succeed
    with RunDir(tmp_path) as rd, pytest.raises((RunDirError, OSError)):
        rd.drop_records({"b", "c"})
    assert (tmp_path / "results.jsonl").read_bytes() == before
    assert [r["key"] for r in read_records(tmp_path / "results.jsonl")[0]] == ["a", "b", "c"]


def test_dropped_records_are_in_superseded_when_results_no_longer_has_them(
    tmp_path: Path,
) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN, None)
        rd.append({"key": "a", "status": "crashed", "reason": "first try"})
        assert rd.drop_records({"a"}) == 1
    assert read_records(tmp_path / "results.jsonl")[0] == []
    saved = read_records(tmp_path / "superseded.jsonl")[0]
    assert saved == [{"key": "a", "status": "crashed", "reason": "first try"}]
