"""The run directory's refusals, each one line naming the path and the fix (issue 22.1):
a run directory that is a link, a file, writable by others or under a directory others
can write; a planted lock; a link or a file where ``logs/`` goes; and every write of a
run file into a directory another user could change."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from gpudoctor.bench.results import run_dir
from gpudoctor.bench.results.run_dir import (
    RunDir,
    RunDirError,
    check_run_dir,
    read_run_file,
    scan_records,
    write_atomic,
)
from tests.fakes import mkdir_race

FIX = "choose another --out (a directory of your own) or remove it (rm -rf --one-file-system {})"


@pytest.fixture
def open_to_all(tmp_path: Path) -> Path:
    """A root-owned directory others can write, without the sticky bit (``chmod 0777``)."""
    path = tmp_path / "open"
    path.mkdir()
    os.chmod(path, 0o777)
    return path


def test_an_existing_run_directory_is_reported_and_a_missing_one_is_not_made(
    tmp_path: Path,
) -> None:
    assert check_run_dir(tmp_path) is True
    assert check_run_dir(tmp_path / "new") is False
    assert not (tmp_path / "new").exists()  # checking alone creates nothing
    assert check_run_dir(tmp_path / "made", create=True) is True
    assert (tmp_path / "made").is_dir()


def test_a_run_directory_others_can_write_is_refused_with_the_fix(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o777)
    with pytest.raises(RunDirError) as caught:
        check_run_dir(run)
    assert str(caught.value) == (
        f"{run} (the --out run directory) is writable by others (mode 0777): another user"
        f" may have changed it; {FIX.format(run)}"
    )


def test_a_run_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    os.chown(run, 65534, 65534)
    with pytest.raises(RunDirError, match=r"belongs to nobody \(uid 65534\)") as caught:
        check_run_dir(run, "--into")
    assert str(caught.value).startswith(f"{run} (the --into run directory) belongs to")
    assert "choose another --into (a directory of your own)" in str(caught.value)


def test_a_run_directory_that_is_a_symlink_is_refused_naming_both_ends(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "run"
    link.symlink_to("real")
    with pytest.raises(RunDirError) as caught:
        check_run_dir(link)
    assert str(caught.value) == (
        f"{link} (--out) is a symlink (to real): gpudoctor never follows one there;"
        f" give the real directory ({real})"
    )


def test_a_run_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.write_text("not a directory\n")
    with pytest.raises(RunDirError) as caught:
        check_run_dir(path, "--into")
    assert str(caught.value) == f"{path} (--into) is not a directory; choose another --into"


def test_a_run_directory_under_a_directory_others_can_write_is_refused(open_to_all: Path) -> None:
    run = open_to_all / "run"
    with pytest.raises(RunDirError) as caught:
        check_run_dir(run, "--into", create=True)
    assert str(caught.value) == (
        f"{open_to_all} (above --into) is writable by others and not sticky (mode 0777);"
        f" choose another --into or chmod o-w,+t {open_to_all}"
    )
    assert not run.exists()  # refused before anything is made there


def test_a_run_directory_under_a_file_says_why_it_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x\n")
    run = tmp_path / "file" / "run"
    with pytest.raises(RunDirError) as caught:
        check_run_dir(run, create=True)
    assert str(caught.value) == f"cannot use --out {run}: Not a directory"


@pytest.mark.usefixtures("umask_0")
def test_a_new_run_directory_is_0755_whatever_the_umask(tmp_path: Path) -> None:
    """``mkdir -p -m 0755``: under umask 0 a plain mkdir would make it writable by all."""
    run = tmp_path / "run"
    with RunDir(run) as rd:
        rd.append({"key": "k"})
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o755
    assert (run / "results.jsonl").read_text() == '{"key": "k"}\n'


@pytest.mark.usefixtures("umask_0")
def test_every_missing_level_above_a_new_run_directory_is_0755(tmp_path: Path) -> None:
    """``--out campaigns/a/run`` under umask 0: ``a`` too is 0755 (os.makedirs left it 0777,
    and the next check refused the run directory above which it stood)."""
    run = tmp_path / "campaigns" / "a" / "run"
    with RunDir(run) as rd:
        rd.append({"key": "k"})
    modes = {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in (run, run.parent, run.parent.parent)}
    assert modes == {"run": 0o755, "a": 0o755, "campaigns": 0o755}
    with RunDir(run):  # the next launch accepts it
        pass


def test_a_planted_lock_link_is_refused_and_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    with pytest.raises(RunDirError) as caught, RunDir(run):
        pass
    assert str(caught.value).startswith(f"{run / '.lock'} is a symlink: gpudoctor writes only")
    assert victim.read_text() == "root's file\n"


def test_the_lock_is_refused_when_the_directory_turns_untrusted_after_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock file is opened in a directory checked again at the open: a directory
    made writable by others between check_run_dir and the open (a race, played here by
    a chmod right after the real check) gets no lock file."""
    run = tmp_path / "run"
    real_check = run_dir.check_run_dir

    def check_then_loosen(path: Path, option: str = "--out", create: bool = False) -> bool:
        found = real_check(path, option, create)
        os.chmod(path, 0o777)
        return found

    monkeypatch.setattr(run_dir, "check_run_dir", check_then_loosen)
    with pytest.raises(RunDirError, match="is writable by others and not sticky"), RunDir(run):
        pass
    assert not (run / ".lock").exists()


def test_a_run_directory_can_be_released_twice_and_locked_again(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    rd.__exit__(None, None, None)  # never entered: nothing to release
    with rd:
        pass
    rd.__exit__(None, None, None)  # released already: nothing happens
    with RunDir(tmp_path) as other:
        assert other.path == tmp_path  # the lock is free for the next launcher


def test_run_files_are_never_written_in_a_directory_others_can_write(open_to_all: Path) -> None:
    """Each write of a run file (plan, records, a torn tail's cut) checks its directory,
    even without the lock (``bench report``, ``merge`` and tests call these directly)."""
    refused = f"{open_to_all} (above path) is writable by others and not sticky"
    with pytest.raises(RunDirError) as caught:
        write_atomic(open_to_all / "plan.toml", "x = 1\n")
    assert str(caught.value).startswith(refused)
    with pytest.raises(RunDirError) as caught:
        RunDir(open_to_all).append({"key": "k"})
    assert str(caught.value).startswith(refused)
    torn = b'{"key": "a"}\n{"key": "b'
    (open_to_all / "results.jsonl").write_bytes(torn)
    assert scan_records(open_to_all / "results.jsonl").dropped_bytes == 10  # reading is fine
    with pytest.raises(RunDirError) as caught:
        scan_records(open_to_all / "results.jsonl", repair=True)
    assert str(caught.value).startswith(refused)
    assert sorted(p.name for p in open_to_all.iterdir()) == ["results.jsonl"]
    assert (open_to_all / "results.jsonl").read_bytes() == torn


def test_a_run_file_that_is_a_link_is_refused_when_read(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("x = 1\n")
    (tmp_path / "plan.toml").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(RunDirError) as caught:
        read_run_file(tmp_path / "plan.toml")
    assert str(caught.value) == (
        f"{tmp_path / 'plan.toml'} is a symlink: gpudoctor reads it only as a regular file"
        f" and never follows a link there; remove it (rm {tmp_path / 'plan.toml'})"
    )
    assert read_run_file(tmp_path / "missing.toml") is None


def test_a_link_or_a_file_where_logs_go_is_refused_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "logs").symlink_to("elsewhere")
    rd = RunDir(tmp_path)
    with pytest.raises(RunDirError) as caught:
        rd.log_path("a@tp1")
    logs = tmp_path / "logs"
    assert str(caught.value) == (
        f"{logs} is a symlink (to elsewhere): gpudoctor never writes through one in a run"
        f" directory; remove it (rm {logs}) and run again"
    )
    (tmp_path / "raw").write_text("a file\n")
    with pytest.raises(RunDirError) as caught:
        rd.raw_path("k")
    raw = tmp_path / "raw"
    assert str(caught.value) == (
        f"{raw} exists and is not a directory; remove it (rm {raw}) and run again"
    )


def test_a_dangling_link_planted_as_the_run_directory_creates_nothing(tmp_path: Path) -> None:
    """Another user plants ``--out`` as a link to a directory that does not exist (say
    /etc/cron.d/x): the launcher, often root, refuses it and makes nothing there."""
    target = tmp_path / "victim" / "made-by-root"
    (tmp_path / "victim").mkdir()
    (tmp_path / "run").symlink_to(target)
    with pytest.raises(RunDirError, match="is a symlink"):
        RunDir(tmp_path / "run").__enter__()
    assert not target.exists()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="nobody's mkdir needs root and setpriv")  # fmt: skip
@pytest.mark.parametrize(("out", "level"), [("runs/r1", "runs"), ("r1", "r1")])
def test_a_level_nobody_makes_before_roots_mkdir_is_refused(
    public_tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, level: str
) -> None:
    """Issue 46.4: ``--out /tmp/runs/r1`` with ``runs`` missing; root judged ``/tmp`` and
    is about to make ``runs``; nobody's real ``mkdir runs`` lands first (forced at that
    moment: tests/fakes/mkdir_race.py). Refused: on the code before, nobody's ``runs`` was
    used (only ``r1`` was judged), and nobody could rename ``r1`` away and put a run
    directory of its own there. The run directory itself (``--out /tmp/r1``) made by
    nobody at that moment is refused too."""
    tmp = public_tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    monkeypatch.setattr(os, "mkdir", os.mkdir)
    won = mkdir_race.install(level)
    with pytest.raises(RunDirError) as caught:
        check_run_dir(tmp / out, "--out", create=True)
    assert won == [str(tmp / level)]
    assert "belongs to nobody (uid 65534)" in str(caught.value)
    what = "(above --out)" if out != level else "(the --out run directory)"
    assert str(caught.value).startswith(f"{tmp / level} {what}")
