"""`bench merge` in process, on real run directories in tmp_path: which copy of a cell a
user gets when shards disagree (a measurement is never replaced by a later crash or skip),
what every output file holds, each refusal's one line, and what an input may not make a
merge read or write (a path as a key, a link as a raw file or log).

test_merge_cli.py and test_merge_keeps_measurements.py drive the same code through the CLI
and real campaigns; these are the fast tests the mutation run uses (tests/mutation/beyond.toml).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpudoctor.bench.results.merge import Duplicate, MergeError, merge_runs
from gpudoctor.bench.results.merge_inputs import (
    InputError,
    check_input,
    log_files,
    read_file,
    read_raw,
    safe_key,
)

PLAN = '[[configs]]\nname = "a"\n'


def _record(key: str, status: str = "ok", at: str = "2026-01-01T00:00:00Z", **extra) -> dict:
    return {"key": key, "config": f"c-{key}", "tp": 1, "concurrency": 4, "status": status,
            "recorded_at": at, "raw": f"raw/{key}.jsonl", **extra}  # fmt: skip


def _run(path: Path, *records: dict, plan: str | None = PLAN, log: bool = True) -> Path:
    """A run directory holding ``records`` (each with its raw file) and one server log."""
    (path / "raw").mkdir(parents=True)
    if plan is not None:
        (path / "plan.toml").write_text(plan)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for r in records:
        (path / "raw" / f"{r['key']}.jsonl").write_text(f"{path.name} {r['status']}\n")
    if log:
        (path / "logs").mkdir()
        (path / "logs" / "server.log").write_text(f"log of {path.name}\n")
    return path


def _results(run: Path) -> dict[str, dict]:
    lines = (run / "results.jsonl").read_text().splitlines()
    return {r["key"]: r for r in map(json.loads, lines)}


def _duplicates(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "duplicates.jsonl").read_text().splitlines()]


# which copy of a cell is kept


@pytest.mark.parametrize("later", ["crashed", "skipped", "cancelled"])
@pytest.mark.parametrize("ok_first", [True, False])
def test_a_later_crash_or_skip_never_replaces_another_shards_ok(
    tmp_path: Path, later: str, ok_first: bool
) -> None:
    good = _run(tmp_path / "good", _record("k", "ok", "2026-01-01T00:00:00Z"))
    bad = _run(tmp_path / "bad", _record("k", later, "2026-01-02T00:00:00Z"))
    out = tmp_path / "m"
    done = merge_runs([good, bad] if ok_first else [bad, good], out)
    kept = _results(out)["k"]
    assert (kept["status"], kept["merged_from"]) == ("ok", "good")
    assert (out / "raw" / "k.jsonl").read_text() == "good ok\n" and kept["raw"] == "raw/k.jsonl"
    statuses = ("ok", later) if ok_first else (later, "ok")
    assert done.duplicates == (Duplicate("k", "c-k", 4, "good", ("bad",), statuses),)
    aside = _duplicates(out)
    assert len(aside) == 1
    assert (aside[0]["status"], aside[0]["merged_from"], aside[0]["duplicate_of"]) == (
        later, "bad", "good")  # fmt: skip
    assert done.by_input == {"good": 1, "bad": 0} and done.cells == 1


def test_a_crash_is_kept_over_a_skip_whatever_their_times(tmp_path: Path) -> None:
    crashed = _run(tmp_path / "crashed", _record("k", "crashed", "2026-01-01T00:00:00Z"))
    skipped = _run(tmp_path / "skipped", _record("k", "skipped", "2026-01-09T00:00:00Z"))
    for order in ([crashed, skipped], [skipped, crashed]):
        out = tmp_path / f"m-{order[0].name}"
        merge_runs(order, out)
        assert _results(out)["k"]["status"] == "crashed"


def test_of_two_measurements_the_newest_is_kept(tmp_path: Path) -> None:
    old = _run(tmp_path / "old", _record("k", "ok", "2026-01-01T00:00:00Z"))
    new = _run(tmp_path / "new", _record("k", "ok", "2026-01-01T00:00:01Z"))
    for order in ([old, new], [new, old]):
        out = tmp_path / f"m-{order[0].name}"
        done = merge_runs(order, out)
        assert _results(out)["k"]["merged_from"] == "new"
        assert done.duplicates[0].kept == "new" and done.duplicates[0].dropped == ("old",)


def test_a_full_tie_keeps_the_copy_of_the_input_named_first(tmp_path: Path) -> None:
    one = _run(tmp_path / "one", _record("k", "ok", "2026-01-01T00:00:00Z", value=1))
    two = _run(tmp_path / "two", _record("k", "ok", "2026-01-01T00:00:00Z", value=2))
    assert merge_runs([one, two], tmp_path / "m12").duplicates[0].kept == "one"
    assert merge_runs([two, one], tmp_path / "m21").duplicates[0].kept == "two"


def test_the_same_measurement_in_two_inputs_is_one_cell_and_no_duplicate(tmp_path: Path) -> None:
    one = _run(tmp_path / "one", _record("k"))
    two = _run(tmp_path / "two", _record("k"))
    done = merge_runs([one, two], tmp_path / "m")
    assert done.duplicates == () and done.cells == 1
    assert _results(tmp_path / "m")["k"]["merged_from"] == "two"
    assert _duplicates(tmp_path / "m") == []


def test_cells_of_every_input_are_kept_and_counted(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1"), _record("k2"))
    b = _run(tmp_path / "b", _record("k3"))
    out = tmp_path / "m"
    done = merge_runs([a, b], out)
    assert (done.cells, done.by_input, done.earlier) == (3, {"a": 2, "b": 1}, None)
    assert {k: r["merged_from"] for k, r in _results(out).items()} == {
        "k1": "a", "k2": "a", "k3": "b"}  # fmt: skip
    assert (out / "raw" / "k3.jsonl").read_text() == "b ok\n"
    assert (out / "plan.toml").read_text() == PLAN
    assert (out / "logs" / "a" / "server.log").read_text() == "log of a\n"
    assert (out / "logs" / "b" / "server.log").read_text() == "log of b\n"
    meta = json.loads((out / "merge.json").read_text())
    assert meta == {"inputs": [{"name": "a", "path": str(a)}, {"name": "b", "path": str(b)}],
                    "cells": 3, "duplicates": [], "plan_dir": None}  # fmt: skip
    assert done.to_json() == {"out": str(out), "cells": 3, "by_input": {"a": 2, "b": 1},
                              "duplicates": [], "warnings": [], "earlier": None}  # fmt: skip


def test_inputs_of_the_same_name_get_numbered_names(tmp_path: Path) -> None:
    a = _run(tmp_path / "x" / "run", _record("k1"))
    b = _run(tmp_path / "y" / "run", _record("k2"))
    c = _run(tmp_path / "z" / "run", _record("k3"))
    done = merge_runs([a, b, c], tmp_path / "m")
    assert done.by_input == {"run": 1, "run-2": 1, "run-3": 1}
    assert (tmp_path / "m" / "logs" / "run-3" / "server.log").read_text() == "log of run\n"


def test_a_record_without_its_raw_file_is_kept_as_it_was(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k"))
    (a / "raw" / "k.jsonl").unlink()
    merge_runs([a], tmp_path / "m")
    assert _results(tmp_path / "m")["k"]["raw"] == "raw/k.jsonl"
    assert not (tmp_path / "m" / "raw" / "k.jsonl").exists()


def test_the_plan_directory_comes_from_the_first_input_that_names_one(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1"))
    b = _run(tmp_path / "b", _record("k2"))
    c = _run(tmp_path / "c", _record("k3"))
    (a / "run.json").write_text("not json")
    (b / "run.json").write_text(json.dumps({"plan_dir": 7}))
    (c / "run.json").write_text(json.dumps({"plan_dir": "/plans/one"}))
    merge_runs([a, b, c], tmp_path / "m")
    assert json.loads((tmp_path / "m" / "merge.json").read_text())["plan_dir"] == "/plans/one"


# warnings about what an input held


def test_corrupt_lines_a_torn_tail_and_unsafe_keys_are_left_out_with_a_warning(
    tmp_path: Path,
) -> None:
    a = _run(tmp_path / "a", _record("k1"))
    with (a / "results.jsonl").open("a") as f:
        f.write("{not json\n[1]\n")
        f.write(json.dumps(_record("../escape")) + "\n" + json.dumps(_record("/etc/x")) + "\n")
        f.write(json.dumps({"status": "ok"}) + "\n")
        f.write('{"key": "k9", "sta')
    done = merge_runs([a], tmp_path / "m")
    assert done.warnings == (
        f"{a}: skipped 2 corrupt line(s)",
        f"{a}: a torn last line (18 bytes) left out",
        f"{a}: left out 2 record(s) whose key is not a plain name (a path such as ../x is"
        " never written)",
    )
    assert list(_results(tmp_path / "m")) == ["k1"]
    assert not (tmp_path / "escape.jsonl").exists()


def test_a_clean_input_gives_no_warning(tmp_path: Path) -> None:
    assert merge_runs([_run(tmp_path / "a", _record("k"))], tmp_path / "m").warnings == ()


def test_an_input_without_logs_or_plan_merges(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k"), plan=None, log=False)
    done = merge_runs([a], tmp_path / "m")
    assert done.cells == 1 and not (tmp_path / "m" / "plan.toml").exists()
    assert not (tmp_path / "m" / "logs").exists()


# refusals: one line each, nothing written


def test_nothing_to_merge_is_refused() -> None:
    with pytest.raises(MergeError, match=r"^nothing to merge: name the run directories$"):
        merge_runs([], Path("/nonexistent-out"))


def test_merging_into_one_of_the_inputs_is_refused(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k"))
    with pytest.raises(MergeError) as err:
        merge_runs([a], a)
    assert str(err.value) == f"{a} is one of the inputs; merge into a new directory"


def test_a_directory_that_is_no_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeError) as err:
        merge_runs([tmp_path / "empty"], tmp_path / "m")
    assert str(err.value) == (
        f"{tmp_path / 'empty'}: neither results.jsonl nor plan.toml; is it a run directory?"
    )
    assert not (tmp_path / "m").exists()


def test_a_run_with_only_a_plan_or_only_results_is_an_input(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "plan.toml").write_text(PLAN)
    b = tmp_path / "b"
    b.mkdir()
    (b / "results.jsonl").write_text(json.dumps(_record("k")) + "\n")
    assert merge_runs([a, b], tmp_path / "m").cells == 1


def test_inputs_of_different_plans_are_refused_unless_asked(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1"))
    b = _run(tmp_path / "b", _record("k2"), plan='[[configs]]\nname = "b"\n')
    with pytest.raises(MergeError) as err:
        merge_runs([a, b], tmp_path / "m")
    assert str(err.value) == (
        "the inputs hold different plans (plan.toml differs); merge shards of one plan, or"
        " pass --any-plan to match cells by key anyway"
    )
    assert set(os.listdir(tmp_path / "m")) <= {".lock"}  # nothing written but the merge's lock
    assert merge_runs([a, b], tmp_path / "m", allow_other_plan=True).cells == 2
    assert (tmp_path / "m" / "plan.toml").read_text() == PLAN


def test_a_directory_of_other_files_is_never_merged_into(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k"))
    out = tmp_path / "photos"
    out.mkdir()
    for name in ("e", "d", "c", "b", "a"):
        (out / name).write_text(name)
    with pytest.raises(MergeError) as err:
        merge_runs([a], out)
    assert str(err.value) == (
        f"{out} is not empty (a, b, c, d, ...) and holds no earlier merge: merging there would"
        f" replace what it holds; choose a new --out, or merge it too: gpudoctor bench merge"
        f" {out} RUN... --out NEW"
    )
    assert sorted(os.listdir(out)) == ["a", "b", "c", "d", "e"]
    (out / "e").unlink()
    with pytest.raises(MergeError, match=r"is not empty \(a, b, c, d\) and holds"):
        merge_runs([a], out)


def test_a_run_directory_is_never_merged_into(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1"))
    b = _run(tmp_path / "b", _record("k2"))
    (b / "merge.json").write_text(json.dumps({"inputs": "not a list"}))
    with pytest.raises(MergeError, match="holds no earlier merge"):
        merge_runs([a], b)
    (b / "merge.json").write_text("{broken")
    with pytest.raises(MergeError, match="holds no earlier merge"):
        merge_runs([a], b)
    assert list(_results(b)) == ["k2"]


def test_an_empty_out_with_only_a_lock_file_is_new(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / ".lock").write_text("")
    assert merge_runs([_run(tmp_path / "a", _record("k"))], out).earlier is None


# merging into an earlier merge


def test_merging_into_an_earlier_merge_keeps_its_cells_names_and_duplicates(
    tmp_path: Path,
) -> None:
    a = _run(tmp_path / "a", _record("k1", "ok", "2026-01-01T00:00:00Z"))
    a2 = _run(tmp_path / "x" / "a", _record("k1", "crashed", "2026-01-02T00:00:00Z"))
    out = tmp_path / "m"
    first = merge_runs([a, a2], out)
    assert first.by_input == {"a": 1, "a-2": 0}
    (a / "run.json").write_text(json.dumps({"plan_dir": "/plans/p"}))
    merge_runs([a], out)  # the same input again: its name and cells stay
    (out / "report.md").write_text("old report\n")
    c = _run(tmp_path / "y" / "a", _record("k2"))
    done = merge_runs([c], out)
    assert done.earlier == 1 and done.cells == 2
    assert done.by_input == {"a-3": 1, "a": 1}
    assert {k: r["merged_from"] for k, r in _results(out).items()} == {"k1": "a", "k2": "a-3"}
    assert [(d["status"], d["merged_from"]) for d in _duplicates(out)] == [("crashed", "a-2")]
    meta = json.loads((out / "merge.json").read_text())
    assert [i["name"] for i in meta["inputs"]] == ["a", "a-2", "a-3"]
    assert meta["plan_dir"] == "/plans/p" and meta["cells"] == 2
    assert done.warnings == (
        f"{out}/report.md and its plots describe the merge before this one: gpudoctor bench"
        f" report {out} writes them anew",
    )
    assert (out / "raw" / "k1.jsonl").read_text() == "a ok\n"


def test_an_earlier_merge_of_another_plan_is_refused_unless_asked(tmp_path: Path) -> None:
    out = tmp_path / "m"
    merge_runs([_run(tmp_path / "a", _record("k1"))], out)
    b = _run(tmp_path / "b", _record("k2"), plan="other = 1\n")
    with pytest.raises(MergeError, match="different plans"):
        merge_runs([b], out)
    done = merge_runs([b], out, allow_other_plan=True)
    assert done.cells == 2 and (out / "plan.toml").read_text() == "other = 1\n"


def test_a_later_crash_merged_into_an_earlier_merge_keeps_the_measurement(tmp_path: Path) -> None:
    out = tmp_path / "m"
    merge_runs([_run(tmp_path / "good", _record("k", "ok", "2026-01-01T00:00:00Z"))], out)
    bad = _run(tmp_path / "bad", _record("k", "crashed", "2026-01-02T00:00:00Z"))
    done = merge_runs([bad], out)
    assert _results(out)["k"]["status"] == "ok" and _results(out)["k"]["merged_from"] == "good"
    assert done.duplicates == (Duplicate("k", "c-k", 4, "good", ("bad",), ("ok", "crashed")),)
    again = merge_runs([bad], out)
    assert [d["merged_from"] for d in _duplicates(out)] == ["bad"]
    assert again.cells == 1 and again.earlier == 1


# what an input may not make a merge read (merge_inputs)


def test_only_plain_file_names_are_cell_keys() -> None:
    for good in ("a", "k.1_x-2", "A" * 128, "0"):
        assert safe_key(good) == good
    for bad in ("", ".", "..", "../x", "/etc/x", "a/b", "-a", "_a", ".a", "A" * 129, "a b", 5,
                None, b"a"):  # fmt: skip
        assert safe_key(bad) is None


def test_a_raw_file_is_read_only_as_raw_name_inside_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _record("k"))
    (tmp_path / "secret").write_text("secret\n")
    (run / "raw" / "link.jsonl").symlink_to(tmp_path / "secret")
    (run / "raw" / "sub").mkdir()
    (run / "raw" / "sub" / "x").write_text("x\n")
    assert read_raw(run, "raw/k.jsonl") == b"a ok\n"
    for raw in ("raw/link.jsonl", "raw/missing", "raw/..", "raw/.", "raw", "../secret",
                "raw/sub/x", "raw/sub", "/raw/k.jsonl", "logs/server.log", None, 3):  # fmt: skip
        assert read_raw(run, raw) is None, raw


def test_a_run_file_behind_a_link_is_refused_and_an_absent_one_is_none(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _record("k"))
    assert read_file(run / "plan.toml") == PLAN.encode()
    assert read_file(run / "run.json") is None
    (run / "linked").symlink_to(run / "plan.toml")
    with pytest.raises(InputError, match="linked"):
        read_file(run / "linked")


def test_logs_are_the_regular_files_under_logs_and_links_are_named(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _record("k"))
    (run / "logs" / "b").mkdir()
    (run / "logs" / "b" / "inner.log").write_text("inner\n")
    (run / "logs" / "a.log").write_text("a\n")
    (tmp_path / "elsewhere").mkdir()
    (run / "logs" / "linked-dir").symlink_to(tmp_path / "elsewhere")
    (run / "logs" / "linked.log").symlink_to(run / "plan.toml")
    os.mkfifo(run / "logs" / "fifo")
    found, skipped = log_files(run)
    assert found == [(Path("a.log"), b"a\n"), (Path("server.log"), b"log of a\n"),
                     (Path("b/inner.log"), b"inner\n")]  # fmt: skip
    assert len(skipped) == 3
    for name in ("linked-dir", "linked.log", "fifo"):
        assert sum(line.startswith(f"{run / 'logs' / name} not copied: ") for line in skipped) == 1


def test_no_logs_is_nothing_and_a_linked_or_plain_logs_is_named(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _record("k"), log=False)
    assert log_files(run) == ([], [])
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.log").write_text("x\n")
    (run / "logs").symlink_to(tmp_path / "elsewhere")
    why = f"{run / 'logs'} is not a directory (a link?): its logs were not copied"
    assert log_files(run) == ([], [why])
    (run / "logs").unlink()
    (run / "logs").write_text("not a directory\n")
    assert log_files(run) == ([], [why])
    done = merge_runs([run], tmp_path / "m")
    assert done.warnings == (why,) and not (tmp_path / "m" / "logs" / "a").exists()


def test_an_input_is_its_real_directory(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _record("k"))
    (tmp_path / "alias").symlink_to(run)
    assert check_input(tmp_path / "alias") == run


def test_an_input_that_is_missing_or_no_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        check_input(tmp_path / "missing")
    assert (
        str(err.value)
        == f"cannot read merge input {tmp_path / 'missing'}: No such file or directory"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError) as err:
        check_input(tmp_path / "file")
    assert str(err.value) == f"{tmp_path / 'file'} (a merge input) is not a directory"


def test_an_input_others_can_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    run = _run(tmp_path / "open", _record("k"))
    run.chmod(0o777)
    with pytest.raises(InputError) as err:
        check_input(run)
    assert str(run) in str(err.value)
    assert "merge only runs you or root own: run the merge as that user, or copy it first" in str(
        err.value
    )
    assert f"(cp -r {run} DIR-of-yours)" in str(err.value)
    with pytest.raises(MergeError, match="merge only runs you or root own"):
        merge_runs([run], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_an_input_under_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    run = _run(shared / "a", _record("k"))
    shared.chmod(0o777)
    with pytest.raises(InputError) as err:
        check_input(run)
    assert str(err.value).endswith(f"; choose another merge input or chmod o-w,+t {shared}")


def test_a_copy_without_a_time_is_older_than_one_with_a_time(tmp_path: Path) -> None:
    stamped = _run(tmp_path / "stamped", _record("k", "ok", "2026-01-01T00:00:00Z"))
    untimed = _record("k", "ok", value=2)
    del untimed["recorded_at"]
    bare = _run(tmp_path / "bare", untimed)
    for order in ([stamped, bare], [bare, stamped]):
        out = tmp_path / f"m-{order[0].name}"
        assert merge_runs(order, out).duplicates[0].kept == "stamped"


def test_a_duplicate_without_a_concurrency_reads_zero(tmp_path: Path) -> None:
    first = _record("k", "ok", "2026-01-02T00:00:00Z")
    del first["concurrency"]
    a = _run(tmp_path / "a", first)
    b = _run(tmp_path / "b", _record("k", "crashed", "2026-01-01T00:00:00Z"))
    done = merge_runs([a, b], tmp_path / "m")
    assert done.duplicates[0].concurrency == 0
    assert done.to_json()["duplicates"] == [{"key": "k", "config": "c-k", "concurrency": 0,
                                             "kept": "a", "dropped": ("b",),
                                             "statuses": ("ok", "crashed")}]  # fmt: skip


def test_an_earlier_merge_of_a_plan_that_is_not_utf8_merges_again(tmp_path: Path) -> None:
    plan = '[[configs]]\nname = "caf\xe9"\n'.encode("latin-1")
    a = _run(tmp_path / "a", _record("k1"))
    (a / "plan.toml").write_bytes(plan)
    out = tmp_path / "m"
    merge_runs([a], out)
    b = _run(tmp_path / "b", _record("k2"))
    (b / "plan.toml").write_bytes(plan)
    done = merge_runs([b], out)
    assert done.cells == 2 and (out / "plan.toml").read_bytes() == plan.decode(
        "utf-8", "replace").encode()  # fmt: skip


def test_an_input_merged_before_and_a_new_one_together(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1"))
    out = tmp_path / "m"
    merge_runs([a], out)
    b = _run(tmp_path / "b", _record("k2"))
    c = _run(tmp_path / "c", _record("k3"))
    done = merge_runs([a, b, c], out)
    assert done.by_input == {"a": 1, "b": 1, "c": 1} and done.earlier == 1


def test_merge_json_is_indented_with_its_keys_sorted(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k"))
    merge_runs([a], tmp_path / "m")
    lines = (tmp_path / "m" / "merge.json").read_text().splitlines()
    assert lines[:3] == ["{", '  "cells": 1,', '  "duplicates": [],']
    assert [line.split('"')[1] for line in lines if line.startswith('  "')] == [
        "cells", "duplicates", "inputs", "plan_dir"]  # fmt: skip
    assert "    {" in lines and '      "name": "a",' in lines


def test_records_after_one_without_a_key_or_a_repeated_one_are_kept(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1"))
    b = _run(tmp_path / "b", _record("k1"), _record("k2"))
    with (b / "results.jsonl").open("r+") as f:
        lines = f.read()
        f.seek(0)
        f.write(json.dumps({"status": "ok"}) + "\n" + lines + json.dumps(_record("k3")) + "\n")
    (b / "raw" / "k3.jsonl").write_text("b ok\n")
    assert sorted(_results(tmp_path / "m") if merge_runs([a, b], tmp_path / "m") else {}) == [
        "k1", "k2", "k3"]  # fmt: skip


def test_merged_raw_files_are_readable_by_all_like_the_run_s_other_files(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k"))
    (a / "raw" / "k.jsonl").chmod(0o600)
    merge_runs([a], tmp_path / "m")
    assert (tmp_path / "m" / "raw" / "k.jsonl").stat().st_mode & 0o777 == 0o644


def test_merged_files_are_sorted_json_lines_readable_by_all(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", _record("k1", "ok", zeta=1), _record("k2", "ok"))
    b = _run(tmp_path / "b", _record("k1", "crashed", "2026-01-02T00:00:00Z", zeta=2),
             _record("k2", "skipped", "2026-01-02T00:00:00Z"))  # fmt: skip
    out = tmp_path / "m"
    merge_runs([a, b], out)
    for name in ("results.jsonl", "duplicates.jsonl"):
        lines = (out / name).read_text().splitlines()
        assert len(lines) == 2
        for line in lines:
            keys = list(json.loads(line))
            assert keys == sorted(keys)
    assert [d["key"] for d in _duplicates(out)] == ["k1", "k2"]
    assert (out / "logs" / "a" / "server.log").stat().st_mode & 0o777 == 0o644


def test_a_raw_path_outside_raw_is_not_read_even_with_a_file_of_its_name(tmp_path: Path) -> None:
    run = _run(tmp_path / "a", _record("k"))
    assert read_raw(run, "other/k.jsonl") is None
    assert read_raw(run, "raw/k.jsonl") == b"a ok\n"


def test_the_refusals_name_the_input_and_its_mode(tmp_path: Path) -> None:
    run = _run(tmp_path / "open", _record("k"))
    run.chmod(0o777)
    with pytest.raises(InputError) as err:
        check_input(run)
    assert str(err.value).startswith(f"{run} (a merge input) is writable by others (mode 0777)")
    shared = tmp_path / "shared"
    inner = _run(shared / "a", _record("k"))
    shared.chmod(0o777)
    with pytest.raises(InputError) as err:
        check_input(inner)
    assert str(err.value).startswith(
        f"{shared} (above merge input) is writable by others and not sticky (mode 0777)"
    )
