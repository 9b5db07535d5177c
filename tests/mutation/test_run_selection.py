"""The mutation harness's bookkeeping beyond the core (tests/mutation/run.py): which files a
glob module mutates, how a glob run's score is split per file, what `--changed-only` skips,
and the ratchet that holds a file recorded below 90 % to its recorded score."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.mutation import run


def make_tree(root: Path) -> None:
    pkg = root / "gpudoctor" / "pkg"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", "alpha.py", "beta.py", "core.py"):
        (pkg / name).write_text(f"# {name}\n")


def test_a_glob_module_mutates_its_files_less_the_excluded_ones(tmp_path: Path) -> None:
    make_tree(tmp_path)
    module = run.Module(
        "pkg",
        "gpudoctor/pkg/*.py",
        ("tests/pkg",),
        exclude=("gpudoctor/pkg/__init__.py", "gpudoctor/pkg/core.py"),
    )
    assert module.files(tmp_path) == ["gpudoctor/pkg/alpha.py", "gpudoctor/pkg/beta.py"]
    single = run.Module("one", "gpudoctor/pkg/core.py", ("tests/pkg",))
    assert single.files(tmp_path) == ["gpudoctor/pkg/core.py"]


def test_the_mutmut_section_names_every_file_and_the_tests(tmp_path: Path) -> None:
    module = run.Module("pkg", "gpudoctor/pkg/*.py", ("tests/a.py", "tests/b"))
    text = run.setup_cfg(module, ["gpudoctor/pkg/alpha.py", "gpudoctor/pkg/beta.py"])
    assert "only_mutate =\n    gpudoctor/pkg/alpha.py\n    gpudoctor/pkg/beta.py\n" in text
    assert "pytest_add_cli_args_test_selection =\n    tests/a.py\n    tests/b\n" in text
    assert "not lab and not slow and not gpu" in text


def test_a_glob_run_is_scored_per_file_by_the_mutant_names_module() -> None:
    whole = run.Score("pkg", seconds=12.0)
    whole.statuses = {
        "gpudoctor.pkg.alpha.x_f__mutmut_1": "killed",
        "gpudoctor.pkg.alpha.xǁKǁm__mutmut_2": "survived",
        "gpudoctor.pkg.alphabet.x_g__mutmut_1": "survived",  # another module, same prefix
        "gpudoctor.pkg.beta.x_h__mutmut_1": "killed",
    }
    whole.equivalent = {"gpudoctor.pkg.alpha.xǁKǁm__mutmut_2": "a reason"}
    alpha = run.split(whole, "pkg", "gpudoctor/pkg/alpha.py")
    assert alpha.name == "pkg/alpha.py"
    assert set(alpha.statuses) == {
        "gpudoctor.pkg.alpha.x_f__mutmut_1",
        "gpudoctor.pkg.alpha.xǁKǁm__mutmut_2",
    }
    assert (alpha.killed, len(alpha.counted), alpha.percent) == (1, 1, 100.0)
    alphabet = run.split(whole, "pkg", "gpudoctor/pkg/alphabet.py")
    assert (alphabet.killed, len(alphabet.counted)) == (0, 1)


def test_the_goal_is_90_or_a_lower_recorded_score_never_less() -> None:
    measured = {
        "a.py": {"killed": 80, "total": 100},
        "b.py": {"killed": 99, "total": 100},
        "own:a.py": {"killed": 1, "total": 4},
        "c.py": {"killed": 0, "total": 0},
    }
    assert run.goal_of("a.py", measured, 90.0) == 80.0  # recorded below 90: the ratchet
    assert run.goal_of("b.py", measured, 90.0) == 90.0  # recorded above: the goal
    assert run.goal_of("own:a.py", measured, 90.0) == 25.0
    assert run.goal_of("new.py", measured, 90.0) == 90.0  # never measured: the goal
    assert run.goal_of("c.py", measured, 90.0) == 90.0  # nothing to mutate there


def test_recorded_scores_round_trip_with_the_files_sha256(tmp_path: Path) -> None:
    source = tmp_path / "alpha.py"
    source.write_bytes(b"x = 1\n")
    score = run.Score("pkg/alpha.py")
    score.statuses = {"gpudoctor.pkg.alpha.x_f__mutmut_1": "killed", "m2": "survived"}
    score.equivalent = {"m2": "why"}
    entry = run.record_entry(score, source, "mutmut")
    path = tmp_path / "measured.toml"
    run.write_measured(path, {"gpudoctor/pkg/alpha.py": entry})
    back = run.load_measured(path)["gpudoctor/pkg/alpha.py"]
    assert back == entry
    assert back["sha256"] == hashlib.sha256(b"x = 1\n").hexdigest()
    assert (back["killed"], back["total"], back["equivalent"]) == (1, 1, 1)
    source.write_bytes(b"x = 2\n")  # the file changes: --changed-only measures it again
    assert run.fingerprint(source) != back["sha256"]


def test_changed_only_skips_unchanged_files_and_reports_their_recorded_score(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    make_tree(tmp_path)
    listing = tmp_path / "modules.toml"
    listing.write_text(
        '[[module]]\nname = "pkg"\nsource = "gpudoctor/pkg/*.py"\n'
        'exclude = ["gpudoctor/pkg/__init__.py"]\ntests = ["tests/pkg"]\n'
    )
    measured = {
        f"gpudoctor/pkg/{n}.py": {
            "sha256": run.fingerprint(tmp_path / f"gpudoctor/pkg/{n}.py"),
            "killed": 9,
            "total": 10,
            "equivalent": 0,
            "engine": "mutmut",
            "measured": "2026-12-04",
        }
        for n in ("alpha", "beta")  # core.py: never measured
    }
    monkeypatch.setattr(run, "load_measured", lambda path: measured)
    ran: list[list[str]] = []

    def fake_run_module(module, clone, mutmut, equivalent, log, files=None, children=1):
        ran.append(list(files))
        return [run.Score(f"pkg/{Path(f).name}") for f in files]

    monkeypatch.setattr(run, "run_module", fake_run_module)
    argv = ["--clone", str(tmp_path), "--modules-file", str(listing), "--changed-only"]
    assert run.main(argv) == 0
    assert ran == []  # nothing changed: nothing mutated; core.py is not measured yet
    out = capsys.readouterr().out
    assert "pkg/alpha.py: unchanged since measured (killed 9 of 10, 2026-12-04)" in out
    assert "pkg/core.py: not measured yet" in out
    assert "1 file(s) not measured yet" in out
    (tmp_path / "gpudoctor/pkg/beta.py").write_text("# beta, edited\n")
    assert run.main(argv) == 0
    assert ran == [["gpudoctor/pkg/beta.py"]]  # only the edited file


def test_only_narrows_a_glob_module_to_the_matching_files(tmp_path: Path, monkeypatch) -> None:
    make_tree(tmp_path)
    listing = tmp_path / "modules.toml"
    listing.write_text('[[module]]\nname = "pkg"\nsource = "gpudoctor/pkg/*.py"\ntests = ["t"]\n')
    ran: list[list[str]] = []

    def fake_run_module(module, clone, mutmut, equivalent, log, files=None, children=1):
        ran.append(list(files))
        return [run.Score(f"pkg/{Path(f).name}") for f in files]

    monkeypatch.setattr(run, "run_module", fake_run_module)
    argv = ["--clone", str(tmp_path), "--modules-file", str(listing), "--only", "*/beta.py"]
    assert run.main(argv) == 0
    assert ran == [["gpudoctor/pkg/beta.py"]]


def test_mutants_no_test_reached_are_survivors_unless_the_time_cap_stopped_the_run() -> None:
    # mutmut stops early, every mutant "not checked", when no selected test covers the file
    statuses = {"gpudoctor.pkg.models.x_f__mutmut_1": "not checked", "m2": "killed"}
    score = run.Score("pkg/models.py")
    score.statuses = run.unchecked_as_untested(statuses, capped=False)
    assert (score.killed, len(score.counted), score.percent) == (1, 2, 50.0)
    capped = run.Score("pkg/models.py", capped=True)
    capped.statuses = run.unchecked_as_untested(statuses, capped=True)
    assert (capped.killed, len(capped.counted)) == (1, 1)  # reported as unchecked, not counted
    assert "not checked (time cap)" in capped.line()


def test_a_run_budget_leaves_the_modules_it_cannot_reach_listed_not_failed(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    make_tree(tmp_path)
    listing = tmp_path / "modules.toml"
    listing.write_text(
        '[[module]]\nname = "a"\nsource = "gpudoctor/pkg/alpha.py"\ntests = ["t"]\ncap_s = 5400\n'
        '[[module]]\nname = "b"\nsource = "gpudoctor/pkg/beta.py"\ntests = ["t"]\ncap_s = 5400\n'
        '[[module]]\nname = "c"\nsource = "gpudoctor/pkg/core.py"\ntests = ["t"]\ncap_s = 5400\n'
    )
    clock = iter([0.0, 10.0, 100.0, 400.0])  # the deadline's start, then one look per module
    monkeypatch.setattr(run.time, "monotonic", lambda: next(clock))
    caps: list[int] = []

    def fake_run_module(module, clone, mutmut, equivalent, log, files=None, children=1):
        caps.append(module.cap_s)
        capped = module.name == "b"  # b ran out of the little time it was given
        score = run.Score(module.name, capped=capped)
        score.statuses = {} if capped else {f"gpudoctor.pkg.{module.name}.x_f__mutmut_1": "killed"}
        return [score]

    monkeypatch.setattr(run, "run_module", fake_run_module)
    argv = ["--clone", str(tmp_path), "--modules-file", str(listing), "--budget-s", "300"]
    assert run.main(argv) == 0  # b and c were not scored: listed, not failed
    assert caps == [290, 200]  # a: what was left of 300 s; b: the rest; c: never started
    out = capsys.readouterr().out
    for name in ("beta.py", "core.py"):
        assert (
            f"gpudoctor/pkg/{name}: changed, not re-measured: the run's budget (300 s) is spent"
            in out
        )
    assert "alpha.py: changed, not re-measured" not in out


def test_a_module_capped_by_its_own_cap_still_fails_under_a_budget(
    tmp_path: Path, monkeypatch
) -> None:
    make_tree(tmp_path)
    listing = tmp_path / "modules.toml"
    listing.write_text(
        '[[module]]\nname = "a"\nsource = "gpudoctor/pkg/alpha.py"\ntests = ["t"]\ncap_s = 60\n'
    )

    def fake_run_module(module, clone, mutmut, equivalent, log, files=None, children=1):
        return [run.Score(module.name, capped=True)]

    monkeypatch.setattr(run, "run_module", fake_run_module)
    argv = ["--clone", str(tmp_path), "--modules-file", str(listing), "--budget-s", "3600"]
    assert run.main(argv) == 1
