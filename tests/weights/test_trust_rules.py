"""What gpudoctor trusts on disk, rule by rule (gpudoctor/fsio.py's owner/mode/ancestor
checks and gpudoctor/weights/trust.py): real files, real owners (chown to nobody, as
root), real modes; every refusal's text pinned (it names the path, the owner or mode, and
the fix)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from gpudoctor import fsio
from gpudoctor.weights import trust
from gpudoctor.weights.errors import WeightsError

NOBODY = 65534
ME = fsio.user_name(os.geteuid())
OWNERS = " or ".join(fsio.user_name(u) for u in sorted(fsio.trusted_uids()))

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def test_trusted_owners_and_names() -> None:
    assert fsio.trusted_uids() == frozenset({os.geteuid(), 0})
    assert fsio.user_name(0) == "root (uid 0)"
    assert fsio.user_name(4_242_424) == "uid 4242424"


@pytest.mark.parametrize(
    ("mode", "text"),
    [(stat.S_IFLNK, "a symlink"), (stat.S_IFIFO, "a FIFO"), (stat.S_IFCHR, "a character device"),
     (stat.S_IFBLK, "a block device"), (stat.S_IFSOCK, "a socket"), (stat.S_IFDIR, "a directory"),
     (stat.S_IFREG, "not a regular file")],
)  # fmt: skip
def test_kind_of(mode: int, text: str) -> None:
    assert fsio.kind_of(mode | 0o644) == text


@needs_root
def test_judge_owner_refuses_another_users_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(fsio.FsioError) as info:
        fsio.judge_owner(path, os.lstat(path), "the manifest", "remove it")
    assert str(info.value) == (
        f"{path} (the manifest) belongs to {fsio.user_name(NOBODY)}, not to {OWNERS}: "
        "another user may have planted it; remove it"
    )
    fsio.judge_owner(path, os.lstat(path), "w", "f", trusted=frozenset({NOBODY}))  # trusted


@needs_root
def test_a_refusal_names_every_trusted_owner(tmp_path: Path) -> None:
    """Run by a user other than root, the trusted owners are that user and root: the
    refusal names both (`not to alice (uid 1000) or root (uid 0)`), sorted by uid."""
    path = tmp_path / "f"
    path.write_text("x")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(fsio.FsioError) as info:
        fsio.judge_owner(path, os.lstat(path), "the hook", "chown it", trusted=frozenset({1, 0}))
    assert str(info.value) == (
        f"{path} (the hook) belongs to {fsio.user_name(NOBODY)}, not to"
        f" {fsio.user_name(0)} or {fsio.user_name(1)}: another user may have planted it; chown it"
    )


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o1777, 0o620])
def test_judge_owner_refuses_what_others_can_write(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "d"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(fsio.FsioError) as info:
        fsio.judge_owner(path, os.lstat(path), "--to", "chmod go-w it")
    assert str(info.value) == (
        f"{path} (--to) is writable by others (mode {mode:04o}): another user may have "
        "changed it; chmod go-w it"
    )


def test_a_sticky_directory_is_accepted_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.mkdir()
    path.chmod(0o1777)
    fsio.judge_owner(path, os.lstat(path), "w", "f", allow_sticky=True)
    for mode in (0o777, 0o775, 0o757):  # writable by others and not sticky: refused anyway
        path.chmod(mode)
        with pytest.raises(fsio.FsioError, match=f"writable by others \\(mode {mode:04o}\\)"):
            fsio.judge_owner(path, os.lstat(path), "w", "f", allow_sticky=True)
    (tmp_path / "f").write_text("x")
    (tmp_path / "f").chmod(0o1666)  # sticky means nothing on a file
    with pytest.raises(fsio.FsioError, match="writable by others"):
        fsio.judge_owner(tmp_path / "f", os.lstat(tmp_path / "f"), "w", "f", allow_sticky=True)
    for mode in (0o755, 0o700, 0o644, 0o4755):
        path.chmod(mode)
        fsio.judge_owner(path, os.lstat(path), "w", "f")


def test_check_ancestors_returns_the_nearest_existing_one(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    assert fsio.check_ancestors(tmp_path / "a" / "b", "--to") == tmp_path
    (tmp_path / "a").mkdir()
    assert fsio.check_ancestors(tmp_path / "a" / "b", "--to") == tmp_path / "a"
    (tmp_path / "a").chmod(0o777)
    with pytest.raises(fsio.FsioError) as info:
        fsio.check_ancestors(tmp_path / "a" / "b", "--to")
    assert str(info.value) == (
        f"{tmp_path / 'a'} (above --to) is writable by others and not sticky (mode 0777); "
        f"choose another --to or chmod o-w,+t {tmp_path / 'a'}"
    )
    (tmp_path / "a").chmod(0o1777)  # like /tmp
    assert fsio.check_ancestors(tmp_path / "a" / "b", "--to") == tmp_path / "a"


@needs_root
def test_check_ancestors_refuses_another_users_parent(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(mode=0o755)
    os.chown(tmp_path / "a", NOBODY, NOBODY)
    with pytest.raises(fsio.FsioError) as info:
        fsio.check_ancestors(tmp_path / "a" / "m", "--to")
    assert str(info.value) == (
        f"{tmp_path / 'a'} (above --to) belongs to {fsio.user_name(NOBODY)}: that user could "
        "swap files under gpudoctor; choose a --to whose parents belong to you or root"
    )
    with pytest.raises(trust.UntrustedError) as info2:
        trust.check_ancestors(tmp_path / "a" / "m", "--mirror")
    assert str(info2.value) == (
        f"{tmp_path / 'a'} (above --mirror) belongs to {fsio.user_name(NOBODY)}: that user could "
        "swap files under gpudoctor; choose a --mirror whose parents belong to you or root"
    )


@pytest.mark.parametrize(
    ("path", "reserved"),
    [(".gpudoctor-manifest.json", True), (".gpudoctor.lock", True), (".gpudoctor-x/y", True),
     (".cache/huggingface/download/a", True), ("sub/.gpudoctor-x", False),
     ("gpudoctor-x", False), (".cache/other", False), ("model.safetensors", False)],
)  # fmt: skip
def test_reserved_names(path: str, reserved: bool) -> None:
    assert trust.reserved_name(path) is reserved


def test_check_dir(tmp_path: Path) -> None:
    assert trust.check_dir(tmp_path / "missing", "--to") is False
    good = tmp_path / "good"
    good.mkdir(mode=0o755)
    assert trust.check_dir(good, "--to") is True
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(trust.UntrustedError) as info:
        trust.check_dir(link, "--to")
    assert str(info.value) == (
        f"{link} (--to) is a symlink (to {good}): gpudoctor never follows one there; "
        f"remove it (rm {link}) and run again"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(WeightsError) as info2:
        trust.check_dir(tmp_path / "file", "--to")
    assert not isinstance(info2.value, trust.UntrustedError)
    assert str(info2.value) == (
        f"{tmp_path / 'file'} exists and is not a directory; remove it or choose another --to"
    )
    good.chmod(0o775)  # group-writable is refused like 0777
    with pytest.raises(trust.UntrustedError) as info3:
        trust.check_dir(good, "--to")
    assert str(info3.value) == (
        f"{good} (--to) is writable by others (mode 0775): another user may have changed it; "
        f"remove it (rm -rf --one-file-system {good}) and run again, or choose another --to"
    )


def test_open_trusted(tmp_path: Path) -> None:
    assert trust.open_trusted(tmp_path / "missing", "manifest") is None
    good = tmp_path / "m.json"
    good.write_text("{}")
    good.chmod(0o644)
    fd = trust.open_trusted(good, "manifest")
    assert fd is not None
    try:
        assert os.read(fd, 10) == b"{}"
    finally:
        os.close(fd)
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(trust.UntrustedError) as info:
        trust.open_trusted(link, "manifest")
    assert (
        str(info.value) == f"{link} (manifest) is a symlink: gpudoctor never follows one; remove it"
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o644)
    with pytest.raises(trust.UntrustedError) as info:
        trust.open_trusted(fifo, "manifest")
    assert str(info.value) == f"{fifo} (manifest) is not a regular file; remove it"
    good.chmod(0o664)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(trust.UntrustedError) as info:
        trust.open_trusted(good, "manifest")
    assert str(info.value) == (
        f"{good} (manifest) is writable by others (mode 0664): another user may have changed "
        f"it; remove it (rm {good}) and run again"
    )
    assert len(os.listdir("/proc/self/fd")) == before  # the refused file's fd was closed


def test_safe_location_creates_the_parent_and_refuses_proc(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    target = tmp_path / "new" / "model"
    assert trust.safe_location(target) == tmp_path / "new" / "model"
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o755
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert trust.safe_location(tmp_path / "alias" / "m") == tmp_path / "real" / "m"
    with pytest.raises(WeightsError) as info:
        trust.safe_location(Path("/proc/gpudoctor-model"))
    assert str(info.value) == (
        "--to /proc/gpudoctor-model is on /proc (proc), which cannot hold files; choose a "
        "directory on tmpfs (/dev/shm/NAME) or on disk"
    )


def test_safe_location_refuses_an_ancestor_others_can_write(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(trust.UntrustedError) as info:
        trust.safe_location(tmp_path / "open" / "new" / "model")
    assert str(info.value) == (
        f"{tmp_path / 'open'} (above --to) is writable by others and not sticky (mode 0777); "
        f"choose another --to or chmod o-w,+t {tmp_path / 'open'}"
    )
    assert not (tmp_path / "open" / "new").exists()  # refused before anything was made


@pytest.mark.usefixtures("umask_0")
def test_missing_parents_are_made_0755_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 0 every missing level is 0755 (os.makedirs would make the upper ones
    0777), so the next run still trusts the parents it made."""
    tmp_path.chmod(0o755)
    target = tmp_path / "a" / "b" / "c" / "model"
    assert trust.safe_location(target) == target
    for level in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(os.stat(level).st_mode) == 0o755
    assert trust.safe_location(target) == target  # the next run


def test_a_parent_made_meanwhile_by_another_run_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs racing to the same new --to: the other one makes the parents between this
    run's check and its mkdir. A real race cannot be timed here; it is stood in for by
    making them right after the (real) ancestor check."""
    tmp_path.chmod(0o755)
    checked = trust.check_ancestors

    def check_then_race(directory: Path, option: str) -> Path:
        nearest = checked(directory, option)
        os.makedirs(directory, 0o755)
        return nearest

    monkeypatch.setattr(trust, "check_ancestors", check_then_race)
    target = tmp_path / "a" / "b" / "model"
    assert trust.safe_location(target) == target


def test_a_to_below_a_regular_file_is_one_line(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    archive = tmp_path / "models.tar"
    archive.write_text("x")
    with pytest.raises(WeightsError) as info:
        trust.safe_location(archive / "sub" / "model")
    assert str(info.value) == f"permission denied: cannot write in {archive}; choose another --to"
    archive.chmod(0o755)  # searchable, so the mkdir below it is what fails
    with pytest.raises(WeightsError) as info:
        trust.safe_location(archive / "sub" / "model")
    assert str(info.value) == (
        f"cannot create {archive / 'sub'} for --to {archive / 'sub' / 'model'}: Not a directory;"
        " choose another --to"
    )


def test_a_read_only_filesystem_is_refused_before_any_work(tmpfs) -> None:
    shm = tmpfs("1m")
    subprocess.run(["mount", "-o", "remount,ro", str(shm)], check=True)
    with pytest.raises(WeightsError) as info:
        trust.safe_location(shm / "model")
    assert str(info.value) == (
        f"--to {shm / 'model'} is on a read-only filesystem ({shm}); choose a writable one"
    )


def test_an_unreadable_mountinfo_leaves_the_filesystem_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc/self/mountinfo cannot be read (a sandbox that hides it; stood in for by
    a read that raises PermissionError, as it would), the filesystem type is unknown and a
    writable --to still passes."""
    read_text = Path.read_text

    def hidden_mountinfo(self: Path, *args: object, **kwargs: object) -> str:
        if str(self) == "/proc/self/mountinfo":
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)  # type: ignore[arg-type]

    tmp_path.chmod(0o755)
    monkeypatch.setattr(Path, "read_text", hidden_mountinfo)
    assert trust.safe_location(tmp_path / "model") == tmp_path / "model"


def test_lock_path_is_private_and_named_after_the_target() -> None:
    import hashlib

    target = Path("/dev/shm/" + "m" * 50)
    path = trust.lock_path(target)
    digest = hashlib.sha256(str(target).encode()).hexdigest()[:16]
    assert path.name == f"weights-{'m' * 40}-{digest}.lock"
    assert path.parent == trust.lock_dir()
    st = os.lstat(path.parent)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    if os.geteuid() == 0:
        assert path.parent == Path("/run/gpudoctor")


def test_a_dangling_link_planted_as_the_parent_of_to_creates_nothing(tmp_path: Path) -> None:
    """``--to /tmp/models/m`` where another user planted ``/tmp/models`` as a link to a
    directory that does not exist: refused, and nothing is made where the link points."""
    tmp_path.chmod(0o755)
    (tmp_path / "victim").mkdir()
    (tmp_path / "models").symlink_to(tmp_path / "victim" / "made")
    with pytest.raises(WeightsError) as caught:
        trust.safe_location(tmp_path / "models" / "m")
    assert str(caught.value) == (
        f"cannot create {tmp_path / 'models'} for --to {tmp_path / 'models' / 'm'}: a link to"
        " a directory that does not exist; choose another --to"
    )
    assert not (tmp_path / "victim" / "made").exists()


@needs_root
def test_check_ancestors_judges_each_link_on_the_way(tmp_path: Path) -> None:
    """Issue 33.3: the path is walked level by level; a link another user owns is refused
    (never followed), one of root's is followed and its target judged; ``..`` goes up from
    where the link led; a loop is ELOOP."""
    tmp_path.chmod(0o755)
    (tmp_path / "real").mkdir()
    (tmp_path / "theirs").symlink_to(tmp_path / "real")
    os.lchown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(fsio.FsioError, match=r"theirs \(above --to\) is a symlink of nobody"):
        fsio.check_ancestors(tmp_path / "theirs" / "m", "--to")
    with pytest.raises(fsio.FsioError, match="is a symlink of nobody"):
        fsio.make_missing_dirs(tmp_path / "theirs" / "m")
    assert not (tmp_path / "real" / "m").exists()
    (tmp_path / "mine").symlink_to("real")
    assert fsio.check_ancestors(tmp_path / "mine" / "m", "--to") == tmp_path / "real"
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "up").symlink_to(tmp_path / "real" / "sub")
    assert fsio.check_ancestors(tmp_path / "up" / ".." / "x", "--to") == tmp_path / "real"
    (tmp_path / "real" / "open").mkdir(mode=0o777)
    (tmp_path / "real" / "open").chmod(0o777)
    with pytest.raises(fsio.FsioError, match="writable by others and not sticky"):
        fsio.check_ancestors(tmp_path / "mine" / "open" / "m", "--to")
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(fsio.FsioError, match="too many levels"):
        fsio.check_ancestors(tmp_path / "loop" / "m", "--to")
