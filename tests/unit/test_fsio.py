"""gpudoctor.fsio against the real file system: each test performs what its guard blocks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpudoctor import fsio, fsio_root
from gpudoctor.fsio import FsioError

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to nobody needs root")


def test_atomic_replace_writes_bytes_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.prom"
    fsio.atomic_replace(target, "one\n")
    fsio.atomic_replace(target, "two\n")
    assert target.read_text() == "two\n"
    assert sorted(os.listdir(tmp_path)) == ["out.prom"]


def test_atomic_replace_keeps_old_bytes_when_the_write_fails_midway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed (here: an error) half-way must not leave a half file at the path."""
    target = tmp_path / "run.json"
    target.write_text("old bytes\n")

    def half_then_fail(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsio, "_write_all", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        fsio.atomic_replace(target, "new bytes that will not fit\n")
    assert target.read_text() == "old bytes\n"
    assert sorted(os.listdir(tmp_path)) == ["run.json"]  # the temp file was removed


def test_atomic_replace_keeps_the_old_mode_or_sets_the_given_one(tmp_path: Path) -> None:
    kept, given = tmp_path / "kept", tmp_path / "given"
    kept.write_text("x")
    kept.chmod(0o640)
    fsio.atomic_replace(kept, "y")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    fsio.atomic_replace(given, "y", mode=0o751)
    assert stat.S_IMODE(given.stat().st_mode) == 0o751


def test_a_symlink_at_the_final_path_is_never_followed(tmp_path: Path) -> None:
    """Attack: a planted ``out -> /victim`` must not turn a write into one of /victim."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "out"
    link.symlink_to(victim)
    with pytest.raises(FsioError, match="is a symlink"):
        fsio.atomic_replace(link, "mine\n")
    assert link.is_symlink()
    with pytest.raises(FsioError, match="is a symlink"):
        fsio.durable_append(link, "mine\n")
    with pytest.raises(FsioError, match="is a symlink"):
        fsio.truncate_file(link, 0)
    with pytest.raises(FsioError, match="is a symlink"):
        os.close(fsio.open_lock(link))
    assert victim.read_text() == "precious\n"
    fsio.atomic_replace(link, "mine\n", refuse_non_regular=False)  # replaces the link itself
    assert not link.is_symlink() and link.read_text() == "mine\n"
    assert victim.read_text() == "precious\n"


def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "results.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(FsioError, match="is a FIFO"):
        fsio.durable_append(fifo, "line\n")
    with pytest.raises(FsioError, match="is a FIFO"):
        fsio.atomic_replace(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlinked_parent_directory_is_refused(tmp_path: Path) -> None:
    """Attack: ``run -> /etc`` as the directory makes every write land in /etc."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "run"
    link.symlink_to(real)
    for write in (
        lambda: fsio.atomic_replace(link / "plan.toml", "x"),
        lambda: fsio.durable_append(link / "results.jsonl", "x\n"),
        lambda: fsio.create_new(link / "done", ""),
    ):
        with pytest.raises(FsioError, match=r"run is a symlink .*never writes through one"):
            write()
    assert os.listdir(real) == []
    fsio.atomic_replace(link / "plan.toml", "x", follow_dir_link=True)  # a caller may allow it
    assert (real / "plan.toml").read_text() == "x"


@as_root
def test_a_directory_owned_by_nobody_is_refused(tmp_path: Path) -> None:
    """Attack: ``nobody`` made the directory and can swap files in it under root."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(FsioError, match=r"theirs .*belongs to nobody \(uid 65534\)"):
        fsio.atomic_replace(theirs / "plan.toml", "x", require_trusted_dir=True)
    with pytest.raises(FsioError, match="belongs to nobody"):
        fsio.durable_append(theirs / "results.jsonl", "x\n", require_trusted_dir=True)
    assert os.listdir(theirs) == []


def test_a_directory_others_can_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(FsioError, match=r"writable by others and not sticky \(mode 0777\)"):
        fsio.create_new(shared / "marker", "x", require_trusted_dir=True)
    assert os.listdir(shared) == []
    shared.chmod(0o1777)  # like /tmp: others cannot rename or remove our files
    fsio.create_new(shared / "marker", "x", require_trusted_dir=True)
    assert (shared / "marker").read_text() == "x"


@as_root
def test_weights_trust_uses_the_same_rule(tmp_path: Path) -> None:
    from gpudoctor.weights.trust import UntrustedError, check_ancestors

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedError, match="belongs to nobody"):
        check_ancestors(theirs / "model", "--to")


def test_durable_append_appends_and_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "results.jsonl"
    target.write_text('{"key": "a"}\n')
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        info = os.fstat(fd)
        synced.append((info.st_dev, info.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(fsio.os, "fsync", spy)
    assert fsio.durable_append(target, '{"key": "b"}\n') == 0
    assert target.read_text() == '{"key": "a"}\n{"key": "b"}\n'
    info = target.stat()
    assert (info.st_dev, info.st_ino) in synced


def test_durable_append_cuts_a_torn_tail_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "results.jsonl"
    target.write_bytes(b'{"key": "a"}\n{"ke')
    assert fsio.durable_append(target, b'{"key": "b"}\n', repair_torn_tail=True) == 4
    assert target.read_bytes() == b'{"key": "a"}\n{"key": "b"}\n'


def test_create_new_refuses_an_existing_path(tmp_path: Path) -> None:
    existing = tmp_path / "done"
    existing.write_text("theirs")
    with pytest.raises(FsioError, match="already exists"):
        fsio.create_new(existing, "ours")
    assert existing.read_text() == "theirs"
    dangling = tmp_path / "marker"
    dangling.symlink_to(tmp_path / "created-through-link")
    with pytest.raises(FsioError, match=r"already exists \(a symlink\)"):
        fsio.create_new(dangling, "ours")
    assert not (tmp_path / "created-through-link").exists()
    fsio.create_new(tmp_path / "fresh", "ours")
    assert (tmp_path / "fresh").read_text() == "ours"


def test_make_dirs_never_passes_through_a_symlink(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "sub").symlink_to(elsewhere)
    with pytest.raises(FsioError, match="exists and is not a directory"):
        fsio.make_dirs(root, "sub/deeper")
    assert os.listdir(elsewhere) == []
    assert fsio.make_dirs(root, "a/b", 0o700) == root / "a" / "b"
    assert stat.S_IMODE((root / "a").stat().st_mode) == 0o700 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_under_root_resolves_links_like_chroot(tmp_path: Path) -> None:
    """Absolute links restart at ROOT, `..` stops at ROOT, a link at the last part is
    kept (replaced by writers) unless follow_last, loops end with ELOOP."""
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.11").write_text("inside")
    (root / "bin").symlink_to("usr/bin")  # merged-/usr, relative
    (root / "abs").symlink_to(str(outside))  # absolute: means ROOT/<outside>
    (root / "up").symlink_to("../../../../../../../" + str(outside).lstrip("/"))
    (root / "usr/bin/python3").symlink_to("python3.11")
    (root / "loop").symlink_to("loop")
    assert fsio_root.read_under_root(root, "/bin/python3") == b"inside"
    for link in ("abs", "up"):
        with fsio_root.under_root(root, f"/{link}/x", make_parents=True) as (dir_fd, name, shown):
            fsio.atomic_replace(shown, b"w", dir_fd=dir_fd)
        assert shown == f"{root}{outside}/x"
    assert os.listdir(outside) == []
    assert (root / str(outside).lstrip("/") / "x").read_bytes() == b"w"
    with fsio_root.under_root(root, "/usr/bin/python3") as (dir_fd, name, shown):
        assert name == "python3" and shown == f"{root}/usr/bin/python3"
    seen: list = []
    with fsio_root.under_root(root, "/bin/python3", follow_last=True, seen=seen) as (
        _,
        name,
        shown,
    ):
        assert shown == f"{root}/usr/bin/python3.11"
    assert [s for s, _ in seen] == [str(root), f"{root}/usr", f"{root}/usr/bin", shown]
    with pytest.raises(FsioError, match="too many levels"):
        fsio_root.read_under_root(root, "/loop")
    with pytest.raises(FsioError, match="does not exist"):
        fsio_root.read_under_root(root, "/missing/file")


@pytest.mark.usefixtures("umask_0")
def test_make_missing_dirs_gives_every_missing_level_its_mode(tmp_path: Path) -> None:
    """``mkdir -p -m 0700``: each new level is 0700 under umask 0 (os.makedirs leaves the
    upper ones 0777), the existing ones are untouched, a link above is resolved, and a
    file in the way is an OSError (ENOTDIR)."""
    tmp_path.chmod(0o755)
    (tmp_path / "real").mkdir(mode=0o711)
    (tmp_path / "link").symlink_to("real")
    made = fsio.make_missing_dirs(tmp_path / "link" / "a" / "b", 0o700)
    assert made == tmp_path / "real" / "a" / "b"
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (made, made.parent, made.parent.parent)}
    assert modes == {made: 0o700, made.parent: 0o700, tmp_path / "real": 0o711}
    assert fsio.make_missing_dirs(made, 0o700) == made  # all there: nothing to do
    assert stat.S_IMODE(os.stat(fsio.make_missing_dirs(tmp_path / "c" / "d")).st_mode) == 0o755
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError) as caught:  # callers turn it into their one-line error
        fsio.make_missing_dirs(tmp_path / "file" / "e")
    assert caught.value.errno == 20  # ENOTDIR


def test_make_missing_dirs_makes_nothing_where_a_dangling_link_points(tmp_path: Path) -> None:
    """A link planted where the directory should be, pointing at a directory that does not
    exist yet: nothing is made there (os.path.realpath would have followed it)."""
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    fsio.make_missing_dirs(tmp_path / "run")  # the caller's lstat then refuses the link
    with pytest.raises(FsioError) as caught:
        fsio.make_missing_dirs(tmp_path / "run" / "a")
    assert caught.value.errno == 2  # ENOENT: the caller's one-line error names it
    assert str(caught.value) == (
        f"{tmp_path}/run/a: a symlink on the way points where nothing exists"
    )
    assert not (tmp_path / "elsewhere").exists()


@as_root
def test_make_missing_dirs_never_follows_another_users_link(tmp_path: Path) -> None:
    """A link that nobody planted among the existing levels is refused, named with what
    it is above, and nothing is made where it points."""
    tmp_path.chmod(0o755)
    (tmp_path / "target").mkdir()
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path / "target")
    os.lchown(planted, NOBODY, NOBODY)
    with pytest.raises(FsioError) as caught:
        fsio.make_missing_dirs(planted / "a" / "b")
    assert str(caught.value).startswith(
        f"{planted} (above the directory) is a symlink of nobody (uid 65534) (to"
        f" {tmp_path}/target): gpudoctor never follows another user's link; give the real"
        " directory, or choose a the directory whose parents belong to you or root"
    )
    assert os.listdir(tmp_path / "target") == []


def test_walk_path_follows_the_kernels_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``.`` stays, ``..`` goes up from the real directory reached, a relative path starts
    at the working directory, a link's target is walked name by name (its own ``..`` and
    missing names included), and a path that exists ends with nothing missing."""
    tmp_path.chmod(0o755)
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "up").symlink_to("../real/sub")
    (tmp_path / "links" / "half").symlink_to("../real/missing/deeper")
    walk = fsio.walk_path
    assert walk(tmp_path / "real" / "." / "sub", "--out") == fsio.Walk(
        tmp_path / "real" / "sub", (), False
    )
    assert walk(f"{tmp_path}/real/./../real/sub", "--out").existing == tmp_path / "real" / "sub"
    assert walk(f"{tmp_path}/real/sub/../new/x", "--out") == fsio.Walk(
        tmp_path / "real", ("new", "x"), False
    )
    assert walk(tmp_path / "links" / "up" / "a", "--out") == fsio.Walk(
        tmp_path / "real" / "sub", ("a",), False
    )
    assert walk(tmp_path / "links" / "half" / "a", "--out") == fsio.Walk(
        tmp_path / "real", ("a",), True
    )
    monkeypatch.chdir(tmp_path / "real")
    assert walk("sub/b", "--out") == fsio.Walk(tmp_path / "real" / "sub", ("b",), False)


def test_walk_path_follows_forty_links_and_refuses_the_forty_first(tmp_path: Path) -> None:
    """As the kernel's ELOOP limit: a chain of 40 links resolves, 41 is refused (errno 40)."""
    tmp_path.chmod(0o755)
    (tmp_path / "end").mkdir()
    target = "end"
    for i in range(41):
        (tmp_path / f"l{i}").symlink_to(target)
        target = f"l{i}"
    assert fsio.walk_path(tmp_path / "l39", "--to").existing == tmp_path / "end"
    with pytest.raises(FsioError) as caught:
        fsio.walk_path(tmp_path / "l40", "--to")
    assert caught.value.errno == 40
    assert str(caught.value) == f"{tmp_path / 'l40'}: too many levels of symbolic links"
