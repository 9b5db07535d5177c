"""The run directory: exactly-once records, torn tails, plan changes, corrupt lines."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import RunDir, RunDirError, read_records, scan_records

PLAN_A = '[model]\npath = "/m"\n[engine]\nname = "vllm"\n[axes]\nconcurrency = [1, 2]\n'


def test_rundir_repairs_a_torn_tail_and_resumes(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
        assert not opened.resumed and (tmp_path / "plan.toml").read_text() == PLAN_A
        assert not opened.same_plan  # there was none
        rd.append({"key": "k1", "status": "ok"})
        rd.append({"key": "k2", "status": "crashed"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k3", "sta')  # the launcher was killed mid-write
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
        assert set(opened.done) == {"k1", "k2"} and opened.dropped_bytes == 18
        assert opened.same_plan  # its records are this plan's, whatever their key form
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
        changed = rd.open(PLAN_A + "# changed\n", True)
        assert set(changed.done) == {"k1"} and not changed.same_plan
    assert next(iter(tmp_path.glob("plan-before-*.toml"))).read_text() == PLAN_A
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, False)
        assert opened.done == {} and opened.archived and not opened.same_plan
    other = tmp_path / "other"  # the same plan, archived: nothing of it is kept
    other.mkdir()
    with RunDir(other) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k2", "status": "ok"})
    with RunDir(other) as rd:
        again = rd.open(PLAN_A, False)
        assert again.archived and again.done == {} and not again.same_plan
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


def test_paths_inside_the_run_directory(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert rd.results_path == tmp_path / "results.jsonl"
    assert rd.log_path("org/model@tp2") == tmp_path / "logs" / "org_model@tp2.log"
    assert rd.raw_path("abc") == tmp_path / "raw" / "abc.jsonl"


def test_scan_skips_blank_lines_and_counts_non_objects_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"key": "a"}\n\n  \n[1, 2]\n"text"\n{"key": "b"}\n{"no_key": 1}\n{"ke')
    scan = scan_records(path)
    assert [r.get("key") for r in scan.records] == ["a", "b", None]
    assert scan.corrupt_lines == (4, 5) and scan.dropped_bytes == 4
    assert path.read_bytes().endswith(b'{"ke')  # no repair asked: nothing cut
    assert scan_records(tmp_path / "missing.jsonl") == type(scan)([])
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, True)
    assert set(opened.done) == {"a", "b"}  # a record without a key is no cell
    assert opened.resumed and path.read_bytes().endswith(b'{"no_key": 1}\n')


def test_the_same_plan_resumes_without_a_backup_copy(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        first = rd.open(PLAN_A, None)
    assert first == type(first)(resumed=False, done={})
    with RunDir(tmp_path) as rd:
        again = rd.open(PLAN_A, None)
        rd.append({"key": "k", "status": "ok"})
    assert again.resumed is False and again.archived is None
    with RunDir(tmp_path) as rd:
        assert rd.open(PLAN_A, True).resumed is True
    assert not list(tmp_path.glob("plan-before-*")) and not list(tmp_path.glob("previous-*"))


def test_results_without_a_plan_file_resume_under_the_new_plan(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text('{"key": "k1"}\n')
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
    assert set(opened.done) == {"k1"} and (tmp_path / "plan.toml").read_text() == PLAN_A
    assert not list(tmp_path.glob("plan-before-*"))


def test_no_resume_archives_every_earlier_file(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k1"})
        rd.append_preflight({"check": "x", "status": "PASS"})
        rd.write_run_json({"tag": "t1"})
        rd.log_path("a@tp1").parent.mkdir(exist_ok=True)
        rd.log_path("a@tp1").write_text("log\n")
        rd.raw_path("k1").parent.mkdir(exist_ok=True)
        rd.raw_path("k1").write_text("{}\n")
        rd.append_server({"label": "a@tp1"})
        rd.append_gpu_out({"uuid": "GPU-0"})
        rd.drop_records({"k1"})
        rd.append({"key": "k1"})
    (tmp_path / "state.json").write_text("{}")  # issue 47: these stayed behind
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "k1.json").write_text("{}")
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, False)
    archive = Path(opened.archived or "")
    assert archive.parent == tmp_path and archive.name.startswith("previous-")
    names = ("plan.toml", "results.jsonl", "run.json", "preflight.jsonl", "logs", "raw",
             "servers.jsonl", "gpus.jsonl", "superseded.jsonl", "state.json", "trace")  # fmt: skip
    assert sorted(p.name for p in archive.iterdir()) == sorted(names)
    assert (archive / "logs" / "a@tp1.log").read_text() == "log\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".lock", archive.name, "plan.toml"]
    )
    assert json.loads((archive / "preflight.jsonl").read_text()) == {"check": "x", "status": "PASS"}


def test_drop_records_of_no_key_changes_nothing(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "a", "z": 1, "b": 2})
        before = rd.results_path.read_bytes()
        assert rd.drop_records({"nope"}) == 0
        assert rd.results_path.read_bytes() == before
        assert not (tmp_path / "superseded.jsonl").exists()
        assert before == b'{"b": 2, "key": "a", "z": 1}\n'  # one sorted JSON line per record


def test_run_json_keeps_earlier_launches(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.write_run_json({"tag": "t1", "host": "a"})
        rd.write_run_json({"tag": "t1", "host": "b"})  # the same launch rewrites its facts
        assert json.loads((tmp_path / "run.json").read_text()) == {
            "tag": "t1", "host": "b", "launches": []
        }  # fmt: skip
        rd.write_run_json({"tag": "t2", "host": "c"})
        doc = json.loads((tmp_path / "run.json").read_text())
        assert doc == {"tag": "t2", "host": "c", "launches": [{"tag": "t1", "host": "b"}]}
        for n in range(3, 30):
            rd.write_run_json({"tag": f"t{n}"})
        launches = json.loads((tmp_path / "run.json").read_text())["launches"]
        assert len(launches) == 20 and launches[-1] == {"tag": "t28"}
        (tmp_path / "run.json").write_text("not json")
        rd.write_run_json({"tag": "t9"})
        assert json.loads((tmp_path / "run.json").read_text()) == {"tag": "t9", "launches": []}


def test_environment_facts_without_a_gpu(tmp_path: Path) -> None:
    import shutil

    from gpudoctor import __version__
    from gpudoctor.bench.results.run_dir import environment_facts

    facts = environment_facts("vllm", "0.3.1", "cpu")
    assert (facts["engine"], facts["engine_version"], facts["gpu_arch"]) == ("vllm", "0.3.1", "cpu")
    assert facts["gpudoctor_version"] == __version__
    assert facts["host"] and facts["os"] and facts["python"].count(".") == 2
    assert facts["started_at"].endswith("Z") and len(facts["started_at"]) == 20
    if not shutil.which("nvidia-smi"):
        assert facts["gpus"] == [] and facts["driver"] is None and facts["gpu_error"]


def test_run_json_is_sorted_indented_text_and_paths_are_written_as_text(tmp_path: Path) -> None:
    """run.json is for people and diffs: keys sorted, two-space indent; a Path (or any
    value JSON has no type for) is written as its text, never a crash."""
    with RunDir(tmp_path) as rd:
        rd.write_run_json({"tag": "t1", "model": Path("/models/m"), "gpus": [{"b": 1, "a": 2}]})
    assert (tmp_path / "run.json").read_text() == (
        '{\n  "gpus": [\n    {\n      "a": 2,\n      "b": 1\n    }\n  ],\n  "launches": [],\n'
        '  "model": "/models/m",\n  "tag": "t1"\n}'
    )


def test_run_json_of_an_older_version_without_launches_is_kept(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text('{"tag": "t0", "host": "a"}')
    with RunDir(tmp_path) as rd:
        rd.write_run_json({"tag": "t0", "host": "b"})
        assert json.loads((tmp_path / "run.json").read_text())["launches"] == []
        (tmp_path / "run.json").write_text('{"tag": "t0", "host": "a"}')
        rd.write_run_json({"tag": "t1"})
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc == {"tag": "t1", "launches": [{"tag": "t0", "host": "a"}]}


def test_run_files_get_0644_never_the_mode_of_the_file_they_replace(tmp_path: Path) -> None:
    """A run.json or plan.toml that was made writable by all (0666) is replaced by one
    only its owner can write: the old mode is not carried over."""
    (tmp_path / "run.json").write_text("{}")
    os.chmod(tmp_path / "run.json", 0o666)
    old_umask = os.umask(0o022)
    try:
        with RunDir(tmp_path) as rd:
            rd.write_run_json({"tag": "t"})
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(tmp_path / "run.json").st_mode) == 0o644


def test_records_with_paths_are_written_as_text_one_line_each(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "a", "log": Path("/logs/a.log")})
        for key in ("b", "c", "d"):
            rd.append({"key": key, "status": "crashed"})
        rd.append({"z": 1, "key": "e", "b": 2})
        assert rd.drop_records({"b", "d"}) == 2
    superseded = (tmp_path / "superseded.jsonl").read_text().splitlines()
    assert [json.loads(line)["key"] for line in superseded] == ["b", "d"]
    assert (tmp_path / "results.jsonl").read_text() == (
        '{"key": "a", "log": "/logs/a.log"}\n{"key": "c", "status": "crashed"}\n'
        '{"b": 2, "key": "e", "z": 1}\n'
    )  # the kept lines are byte for byte the lines appended


def test_retrying_cuts_a_torn_tail_so_the_next_record_stands_alone(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_bytes(b'{"key": "a"}\n{"key": "b", "sta')
    with RunDir(tmp_path) as rd:
        assert rd.drop_records({"nope"}) == 0
        rd.append({"key": "c"})
    assert [r["key"] for r in read_records(tmp_path / "results.jsonl")[0]] == ["a", "c"]


def test_reading_records_changes_nothing_unless_repair_is_asked(tmp_path: Path) -> None:
    """``bench status`` and ``report`` read a run another launcher may still be writing:
    a torn tail is counted, never cut; a launcher (``repair=True``) cuts it."""
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"key": "a"}\n{"ke')
    assert read_records(path) == ([{"key": "a"}], 4)
    assert path.read_bytes() == b'{"key": "a"}\n{"ke'
    assert read_records(path, repair=True) == ([{"key": "a"}], 4)
    assert path.read_bytes() == b'{"key": "a"}\n'


def test_a_plan_file_that_is_not_utf8_is_a_different_plan_kept_as_a_backup(
    tmp_path: Path,
) -> None:
    (tmp_path / "plan.toml").write_bytes(b'[model]\npath = "/m\xff"\n')
    with RunDir(tmp_path) as rd, pytest.raises(RunDirError) as caught:
        rd.open(PLAN_A, None)
    assert str(caught.value) == (
        f"{tmp_path} holds a different plan: pass --resume to reuse its finished cells"
        " (matched by key), --no-resume to archive it, or another --out"
    )
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, True)
    (backup,) = tmp_path.glob("plan-before-*.toml")
    assert re.fullmatch(r"plan-before-\d{8}T\d{6}\.toml", backup.name)
    assert backup.read_text() == '[model]\npath = "/m\ufffd"\n'
    assert (tmp_path / "plan.toml").read_text() == PLAN_A


def test_a_plan_without_results_still_refuses_a_different_plan(tmp_path: Path) -> None:
    (tmp_path / "plan.toml").write_text(PLAN_A)
    with RunDir(tmp_path) as rd, pytest.raises(RunDirError, match="holds a different plan"):
        rd.open(PLAN_A + "# changed\n", None)
    assert (tmp_path / "plan.toml").read_text() == PLAN_A


def test_no_resume_archives_results_left_without_a_plan(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text('{"key": "k1"}\n')
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, False)
    assert opened.done == {} and opened.archived is not None
    archive = Path(opened.archived)
    assert re.fullmatch(r"previous-\d{8}T\d{6}", archive.name)
    assert (archive / "results.jsonl").read_text() == '{"key": "k1"}\n'
    assert not (tmp_path / "results.jsonl").exists()


def test_no_resume_in_a_fresh_directory_archives_nothing(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, False)
    assert opened == type(opened)(resumed=False, done={})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "plan.toml"]


def test_the_archive_is_on_disk_before_the_new_plan_takes_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--no-resume's moves are fsync'ed (the run directory) while the old plan is gone
    and the new one not yet written: a power cut then leaves the old run archived whole.
    The fsync spy stands for the power cut this test cannot make."""
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k1"})
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), (tmp_path / "plan.toml").exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, False)
    assert (str(tmp_path), False) in synced


def test_retrying_rewrites_kept_lines_with_sorted_keys_as_append_writes_them(
    tmp_path: Path,
) -> None:
    """Lines written by hand or by another tool (keys in any order) come out of
    drop_records in append's one form: sorted keys, so every line of the file compares."""
    (tmp_path / "results.jsonl").write_text(
        '{"status": "ok", "key": "a", "cell": {"tp": 1, "conc": 2}}\n{"key": "b"}\n'
    )
    with RunDir(tmp_path) as rd:
        assert rd.drop_records({"b"}) == 1
    assert (tmp_path / "results.jsonl").read_text() == (
        '{"cell": {"conc": 2, "tp": 1}, "key": "a", "status": "ok"}\n'
    )
