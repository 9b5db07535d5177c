"""gpudoctor.fsio against the real file system: each test performs what its guard blocks."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor import fsio, fsio_root
from gpudoctor.fsio import FsioError
from tests.fakes import mkdir_race

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


# -- the I/O half as a caller sees it: modes, each refusal's text, fsync, no fd left open --

MIB = 1 << 20


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_fd_leak() -> Iterator[None]:
    """Fail the test when it ends with more fds open than it began with."""
    before = open_fds()
    yield
    assert open_fds() <= before | {"fd"}, "an fd was left open"


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (st_dev, st_ino) of every object fsync'ed (the real fsync still runs)."""
    calls: list[tuple[int, int]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        info = os.fstat(fd)
        calls.append((info.st_dev, info.st_ino))
        real(fd)

    monkeypatch.setattr(fsio.os, "fsync", spy)
    return calls


def ident(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return (info.st_dev, info.st_ino)


def write_refusal(path: Path, kind: str) -> str:
    return (
        f"{path} is {kind}: gpudoctor writes only to a regular file or a new path;"
        f" remove it (rm {path}) or choose another path"
    )


def read_refusal(path: Path, kind: str) -> str:
    return (
        f"{path} is {kind}: gpudoctor reads it only as a regular file and never follows a"
        f" link there; remove it (rm {path})"
    )


# -- atomic_replace / write_output -------------------------------------------------------


@pytest.mark.parametrize(
    ("old_mode", "kwargs", "expected"),
    [
        (None, {}, 0o644),  # a new file: 0666 less the umask
        (None, {"create_mode": 0o640}, 0o640),
        (None, {"mode": 0o604}, 0o604),  # exactly, whatever the umask
        (0o600, {}, 0o600),  # the old file's mode is kept
        (0o751, {}, 0o751),
        (0o600, {"keep_mode": False}, 0o644),
        (0o600, {"keep_mode": False, "create_mode": 0o660}, 0o640),
        (0o600, {"mode": 0o640}, 0o640),
    ],
)
def test_atomic_replace_leaves_the_mode_a_caller_asked_for(
    tmp_path: Path, umask_022: None, old_mode: int | None, kwargs: dict, expected: int
) -> None:
    target = tmp_path / "state.json"
    if old_mode is not None:
        target.write_text("old")
        target.chmod(old_mode)
    fsio.atomic_replace(target, "néw", **kwargs)
    assert target.read_bytes() == "néw".encode()
    assert mode_of(target) == expected
    assert os.listdir(tmp_path) == ["state.json"]


def test_write_output_sets_its_mode_and_follows_a_directory_link_only(
    tmp_path: Path, no_fd_leak: None
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "run").symlink_to(real)
    old = os.umask(0o077)
    try:
        fsio.write_output(tmp_path / "run" / "report.md", "# ok\n")
        fsio.write_output(real / "private.md", b"x", mode=0o600)
    finally:
        os.umask(old)
    assert (real / "report.md").read_text() == "# ok\n" and mode_of(real / "report.md") == 0o644
    assert mode_of(real / "private.md") == 0o600
    out = real / "out"
    out.symlink_to("/dev/null")
    with pytest.raises(FsioError) as caught:
        fsio.write_output(out, "x")
    assert str(caught.value) == write_refusal(out, "a symlink")
    assert out.is_symlink()


def test_atomic_replace_takes_the_longest_name_a_file_system_allows(tmp_path: Path) -> None:
    target = tmp_path / ("n" * 255)
    fsio.atomic_replace(target, b"x")
    fsio.atomic_replace(target, b"y")
    assert target.read_bytes() == b"y" and os.listdir(tmp_path) == [target.name]


def test_atomic_replace_in_a_directory_the_caller_opened_leaves_it_open(tmp_path: Path) -> None:
    dir_fd = fsio.open_dir(tmp_path)
    try:
        fsio.atomic_replace(Path("/elsewhere/state.json"), "x", dir_fd=dir_fd)
        fsio.create_new(Path("/elsewhere/marker"), "m", dir_fd=dir_fd)
        os.fstat(dir_fd)  # still open
    finally:
        os.close(dir_fd)
    assert (tmp_path / "state.json").read_text() == "x"
    assert (tmp_path / "marker").read_text() == "m"


@pytest.mark.parametrize("sync", [True, False])
def test_sync_flushes_the_file_and_its_directory_or_nothing(
    tmp_path: Path, fsynced: list, sync: bool
) -> None:
    """sync=True: the data and the name survive a power cut; sync=False (scratch files):
    no fsync at all."""
    replaced, created = tmp_path / "replaced", tmp_path / "created"
    fsio.atomic_replace(replaced, "r", sync=sync)
    fsio.create_new(created, "c", sync=sync)
    assert replaced.read_text() == "r" and created.read_text() == "c"
    expected = [ident(replaced), ident(tmp_path), ident(created), ident(tmp_path)]
    assert fsynced == (expected if sync else [])
    fsynced.clear()
    fsio.durable_append(replaced, "+", sync=sync)
    assert replaced.read_text() == "r+"
    assert fsynced == ([ident(replaced)] if sync else [])


# -- open_dir / fsync_dir ---------------------------------------------------------------


def test_open_dir_refuses_a_link_or_a_file_with_the_fix(tmp_path: Path, no_fd_leak: None) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "run"
    link.symlink_to(real)
    with pytest.raises(FsioError) as caught:
        fsio.open_dir(link)
    assert str(caught.value) == (
        f"{link} is a symlink (to {real}): gpudoctor never writes through one;"
        f" give the real directory ({real})"
    )
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(FsioError) as caught:
        fsio.open_dir(plain)
    assert str(caught.value) == f"{plain} is not a directory; choose another path"
    with pytest.raises(FileNotFoundError):
        fsio.open_dir(tmp_path / "missing")
    os.close(fsio.open_dir(link, follow_dir_link=True))
    fsio.fsync_dir(link, follow_dir_link=True)
    with pytest.raises(FsioError, match="is a symlink"):
        fsio.fsync_dir(link)


def test_open_dir_of_the_empty_path_is_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fd = fsio.open_dir("")
    try:
        assert os.fstat(fd).st_ino == os.stat(tmp_path).st_ino
    finally:
        os.close(fd)


def test_a_refused_untrusted_directory_leaves_no_fd_open(tmp_path: Path, no_fd_leak: None) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    for _ in range(3):
        with pytest.raises(FsioError, match="writable by others"):
            fsio.open_dir(shared, require_trusted_dir=True)
        with pytest.raises(FsioError, match="writable by others"):
            fsio.read_regular(shared / "x", require_trusted_dir=True)
        with pytest.raises(FsioError, match="writable by others"):
            fsio.truncate_file(shared / "x", 0, require_trusted_dir=True)
        with pytest.raises(FsioError, match="writable by others"):
            os.close(fsio.open_lock(shared / "x", require_trusted_dir=True))
    assert os.listdir(shared) == []


# -- fsync on what cannot be synced -------------------------------------------------------


def test_appending_to_a_fifo_a_caller_allows_ignores_that_a_pipe_cannot_be_synced(
    tmp_path: Path, no_fd_leak: None
) -> None:
    """fsync of a pipe is EINVAL: with ``refuse_non_regular=False`` (a log fed to a reader)
    the bytes go through and the call succeeds."""
    fifo = tmp_path / "feed"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert fsio.durable_append(fifo, "line\n", refuse_non_regular=False) == 0
        assert os.read(reader, 100) == b"line\n"
    finally:
        os.close(reader)


@pytest.mark.parametrize(("errno", "swallowed"), [(22, True), (38, True), (95, True), (5, False)])
def test_a_file_system_without_fsync_is_not_an_error_but_an_io_error_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno: int, swallowed: bool
) -> None:
    """Stands in for a file system whose fsync says EINVAL/ENOSYS/EOPNOTSUPP (none here):
    the write stands; EIO (a failing disk) must reach the caller."""

    def fsync(fd: int) -> None:
        raise OSError(errno, os.strerror(errno))

    monkeypatch.setattr(fsio.os, "fsync", fsync)
    target = tmp_path / "state"
    if swallowed:
        fsio.atomic_replace(target, "x")
        assert target.read_text() == "x"
    else:
        with pytest.raises(OSError) as caught:
            fsio.atomic_replace(target, "x")
        assert caught.value.errno == errno and not target.exists()


# -- open_append / durable_append --------------------------------------------------------


def test_open_append_refuses_links_and_fifos_unless_allowed(
    tmp_path: Path, no_fd_leak: None
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("v\n")
    link = tmp_path / "log"
    link.symlink_to(victim)
    with pytest.raises(FsioError) as caught:
        fsio.open_append(link)
    assert str(caught.value) == write_refusal(link, "a symlink")
    fd = fsio.open_append(link, follow_link=True)
    try:
        os.write(fd, b"w\n")
    finally:
        os.close(fd)
    assert victim.read_text() == "v\nw\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FsioError) as caught:
        fsio.open_append(fifo)  # no reader: must not hang
    assert str(caught.value) == write_refusal(fifo, "a FIFO")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(FsioError) as caught:
            fsio.open_append(fifo)  # a reader: opened, then refused as not regular
        assert str(caught.value) == write_refusal(fifo, "a FIFO")
        fd = fsio.open_append(fifo, refuse_non_regular=False)
        try:
            assert os.get_blocking(fd)
        finally:
            os.close(fd)
    finally:
        os.close(reader)


def test_open_append_makes_a_new_file_with_its_mode_and_can_read_it(
    tmp_path: Path, umask_022: None, no_fd_leak: None
) -> None:
    target = tmp_path / "results.jsonl"
    fd = fsio.open_append(target, create_mode=0o600)
    try:
        os.write(fd, b"a\n")
        assert os.get_blocking(fd)
        with pytest.raises(OSError):
            os.pread(fd, 10, 0)  # write-only
    finally:
        os.close(fd)
    assert mode_of(target) == 0o600
    fd = fsio.open_append(target, readable=True)
    try:
        os.write(fd, b"b\n")
        assert os.pread(fd, 10, 0) == b"a\nb\n"
    finally:
        os.close(fd)
    fsio.durable_append(tmp_path / "new.jsonl", "c\n")
    assert mode_of(tmp_path / "new.jsonl") == 0o644


@pytest.mark.parametrize(
    ("before", "cut"),
    [
        (b"", 0),
        (b"a\n", 0),
        (b"a\nb", 1),
        (b"a\nb\nto", 2),  # back to the LAST newline
        (b"torn", 4),
        (b"a\n" + b"x" * (MIB + 5), MIB + 5),  # a tail longer than one read
        (b"x" * (2 * MIB + 7), 2 * MIB + 7),  # no newline at all: everything goes
        (b"a\n" + b"y" * (MIB - 2), MIB - 2),
        (b"a\n" + b"z" * (MIB - 1), MIB - 1),  # the newline is the first byte of the read
        (b"a" * 7 + b"\n" + b"q" * MIB, MIB),
    ],
)
def test_a_torn_tail_is_cut_back_to_the_last_whole_line(
    tmp_path: Path, before: bytes, cut: int
) -> None:
    target = tmp_path / "results.jsonl"
    target.write_bytes(before)
    assert fsio.durable_append(target, "new\n", repair_torn_tail=True) == cut
    assert target.read_bytes() == before[: len(before) - cut] + b"new\n"


def test_a_torn_tail_of_a_big_file_is_found_reading_only_its_end(tmp_path: Path) -> None:
    """results.jsonl grows to many MiB: repairing its tail reads one MiB window from the end
    (``tail -c 1M``), never the whole file into memory."""
    import tracemalloc

    target = tmp_path / "results.jsonl"
    target.write_bytes(b'{"cell": 1}\n' * (8 * MIB // 12) + b'{"ce')
    tracemalloc.start()
    try:
        assert fsio.durable_append(target, "new\n", repair_torn_tail=True) == 4
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MIB + MIB // 2, peak
    assert target.read_bytes().endswith(b'{"cell": 1}\nnew\n')


def test_a_torn_tail_is_kept_unless_repair_is_asked(tmp_path: Path) -> None:
    target = tmp_path / "results.jsonl"
    target.write_bytes(b"a\ntor")
    assert fsio.durable_append(target, b"n\n") == 0
    assert target.read_bytes() == b"a\ntorn\n"


def _blocked_on_lock() -> bool:
    """True when some process waits on an flock (/proc/locks lists waiters with ``->``)."""
    return any(
        "->" in line and "FLOCK" in line for line in Path("/proc/locks").read_text().splitlines()
    )


@pytest.mark.parametrize("lock", [True, False])
def test_durable_append_with_lock_waits_for_the_holder(tmp_path: Path, lock: bool) -> None:
    """``lock=True`` appends only once another writer's flock is released (its lines are not
    interleaved); without it the append does not wait."""
    target = tmp_path / "results.jsonl"
    target.write_text("")
    holder = os.open(target, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    worker = threading.Thread(target=fsio.durable_append, args=(target, "mine\n"),
                              kwargs={"lock": lock})  # fmt: skip
    try:
        worker.start()
        if lock:
            while not _blocked_on_lock():
                worker.join(0.01)
                assert worker.is_alive(), "appended while the lock was held"
            assert target.read_text() == ""
        else:
            worker.join()
            assert target.read_text() == "mine\n"
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
        worker.join()
    assert target.read_text() == "mine\n"


# -- truncate_file / create_new / open_lock ---------------------------------------------


def test_truncate_file_cuts_a_regular_file_only(tmp_path: Path, no_fd_leak: None) -> None:
    target = tmp_path / "results.jsonl"
    target.write_bytes(b"keep\ncut\n")
    fsio.truncate_file(target, 5)
    assert target.read_bytes() == b"keep\n"
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(FsioError) as caught:
        fsio.truncate_file(link, 0)
    assert str(caught.value) == write_refusal(link, "a symlink")
    assert target.read_bytes() == b"keep\n"
    fsio.truncate_file(link, 2, follow_link=True)
    assert target.read_bytes() == b"ke"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(FsioError) as caught:
            fsio.truncate_file(fifo, 0)
        assert str(caught.value) == write_refusal(fifo, "a FIFO")
    finally:
        os.close(reader)
    with pytest.raises(FileNotFoundError):
        fsio.truncate_file(tmp_path / "missing", 0)


def test_create_new_writes_the_bytes_with_its_mode_or_names_what_is_there(
    tmp_path: Path, umask_022: None, no_fd_leak: None
) -> None:
    fsio.create_new(tmp_path / "a", "é")
    fsio.create_new(tmp_path / "b", b"\x00\xff", create_mode=0o600)
    assert (tmp_path / "a").read_bytes() == "é".encode() and mode_of(tmp_path / "a") == 0o644
    assert (tmp_path / "b").read_bytes() == b"\x00\xff" and mode_of(tmp_path / "b") == 0o600
    (tmp_path / "dir").mkdir()
    for name, what in (("a", "a file"), ("dir", "a directory")):
        with pytest.raises(FsioError) as caught:
            fsio.create_new(tmp_path / name, "x")
        assert str(caught.value) == (
            f"{tmp_path / name} already exists ({what}): gpudoctor creates it only as a new"
            f" file; remove it (rm {tmp_path / name}) or choose another path"
        )
    assert (tmp_path / "a").read_bytes() == "é".encode()


def test_open_lock_creates_a_read_write_lock_file_and_refuses_a_link(
    tmp_path: Path, umask_022: None, no_fd_leak: None
) -> None:
    lock = tmp_path / "run.lock"
    fd = fsio.open_lock(lock, mode=0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b"pid\n")
        assert os.pread(fd, 10, 0) == b"pid\n" and os.get_blocking(fd)
    finally:
        os.close(fd)
    assert mode_of(lock) == 0o600
    os.close(fsio.open_lock(tmp_path / "default.lock"))
    assert mode_of(tmp_path / "default.lock") == 0o644
    link = tmp_path / "planted.lock"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FsioError) as caught:
        fsio.open_lock(link)
    assert str(caught.value) == write_refusal(link, "a symlink")
    assert not (tmp_path / "elsewhere").exists()


# -- open_regular / read_regular ---------------------------------------------------------


def test_read_regular_refuses_every_other_kind_with_the_fix(
    tmp_path: Path, no_fd_leak: None
) -> None:
    (tmp_path / "real").write_text("secret")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    null = Path("/dev/null")
    for path, kind in ((link, "a symlink"), (fifo, "a FIFO"), (tmp_path / "dir", "a directory"),
                       (null, "a character device")):  # fmt: skip
        with pytest.raises(FsioError) as caught:
            fsio.read_regular(path)
        assert str(caught.value) == read_refusal(path, kind)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with a writer side open
    writer = os.open(fifo, os.O_WRONLY)
    try:
        with pytest.raises(FsioError) as caught:
            fsio.read_regular(fifo)
        assert str(caught.value) == read_refusal(fifo, "a FIFO")
    finally:
        os.close(writer)
        os.close(reader)
    with pytest.raises(FileNotFoundError):
        fsio.read_regular(tmp_path / "missing")


@pytest.mark.parametrize(
    ("size", "limit", "expected"),
    [
        (0, None, 0),
        (10, None, 10),
        (10, 0, 0),
        (10, 4, 4),
        (10, 10, 10),
        (10, 11, 10),
        (3 * MIB + 3, None, 3 * MIB + 3),  # more than one read
        (3 * MIB + 3, MIB + 1, MIB + 1),
        (3 * MIB + 3, 2 * MIB, 2 * MIB),
    ],
)
def test_read_regular_returns_the_bytes_up_to_the_limit(
    tmp_path: Path, no_fd_leak: None, size: int, limit: int | None, expected: int
) -> None:
    data = os.urandom(size)
    target = tmp_path / "data"
    target.write_bytes(data)
    assert fsio.read_regular(target, limit=limit) == data[:expected]
    fd = fsio.open_regular(target)
    try:
        assert os.get_blocking(fd) and os.read(fd, 4) == data[:4]
    finally:
        os.close(fd)


# -- make_dirs ---------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_make_dirs_gives_each_new_level_exactly_its_mode(
    tmp_path: Path, umask: int, no_fd_leak: None
) -> None:
    """Each level is made with its mode, and the descriptor used to set it is closed."""
    (tmp_path / "have").mkdir(mode=0o700)
    old = os.umask(umask)
    try:
        made = fsio.make_dirs(tmp_path, "have/a/b", 0o751)
        again = fsio.make_dirs(tmp_path, Path("have/a/b"))
        default = fsio.make_dirs(tmp_path, "d")
    finally:
        os.umask(old)
    assert made == again == tmp_path / "have" / "a" / "b"
    assert [mode_of(tmp_path / p) for p in ("have", "have/a", "have/a/b")] == [0o700, 0o751, 0o751]
    assert default == tmp_path / "d" and mode_of(default) == 0o755


def test_make_dirs_refuses_a_file_on_the_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(FsioError) as caught:
        fsio.make_dirs(tmp_path, "file/sub")
    assert caught.value.errno == 20
    assert str(caught.value) == f"{tmp_path / 'file'} exists and is not a directory"


# -- defaults, directory links, private-until-set modes, close-on-exec --------------------


def test_every_call_by_default_accepts_a_shared_directory_and_refuses_a_directory_link(
    tmp_path: Path, fsynced: list
) -> None:
    """The defaults: no ownership check of the directory (callers that need it ask for
    ``require_trusted_dir``), a symlinked directory refused, everything fsync'ed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    fsio.create_new(shared / "new")  # no data given: an empty file
    assert (shared / "new").read_bytes() == b""
    assert fsynced == [ident(shared / "new"), ident(shared)]
    fsio.atomic_replace(shared / "state", "s")
    fsio.durable_append(shared / "log", "l\n")
    fsio.truncate_file(shared / "log", 1)
    os.close(fsio.open_lock(shared / "lock"))
    os.close(fsio.open_dir(shared))
    assert fsio.read_regular(shared / "state") == b"s"
    os.close(fsio.open_regular(shared / "log"))
    link = tmp_path / "run"
    link.symlink_to(shared)
    calls = {
        "truncate_file": lambda **kw: fsio.truncate_file(link / "log", 0, **kw),
        "open_lock": lambda **kw: os.close(fsio.open_lock(link / "lock", **kw)),
        "open_regular": lambda **kw: os.close(fsio.open_regular(link / "log", **kw)),
        "read_regular": lambda **kw: fsio.read_regular(link / "state", **kw),
        "durable_append": lambda **kw: fsio.durable_append(link / "log", "m\n", **kw),
        "create_new": lambda **kw: fsio.create_new(link / f"new{len(kw)}", **kw),
        "atomic_replace": lambda **kw: fsio.atomic_replace(link / "state", "s", **kw),
    }
    for call in calls.values():
        with pytest.raises(FsioError, match=r"run is a symlink"):
            call()
        call(follow_dir_link=True)  # the caller may allow it
    assert (shared / "log").read_bytes() == b"m\n" and (shared / "new1").exists()


def test_open_dir_names_the_option_of_an_untrusted_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(FsioError) as caught:
        fsio.open_dir(shared, require_trusted_dir=True)
    assert str(caught.value) == (
        f"{shared} (above path) is writable by others and not sticky (mode 0777); choose"
        f" another path or chmod o-w,+t {shared}"
    )


def test_durable_append_by_default_does_not_wait_for_a_lock(tmp_path: Path) -> None:
    target = tmp_path / "results.jsonl"
    target.write_text("")
    holder = os.open(target, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        worker = threading.Thread(target=fsio.durable_append, args=(target, "mine\n"))
        worker.start()
        worker.join()
        assert target.read_text() == "mine\n"
    finally:
        os.close(holder)


def test_a_directory_where_a_file_belongs_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    target = tmp_path / "d"
    for call in (
        lambda: fsio.durable_append(target, "x\n"),
        lambda: os.close(fsio.open_lock(target)),
        lambda: fsio.truncate_file(target, 0),
        lambda: fsio.atomic_replace(target, "x"),
    ):
        with pytest.raises(FsioError) as caught:
            call()
        assert str(caught.value) == write_refusal(target, "a directory")
    with pytest.raises(IsADirectoryError):  # not refused: the caller takes what is there
        fsio.durable_append(target, "x\n", refuse_non_regular=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FsioError) as caught:
        fsio.truncate_file(fifo, 0)  # no reader: refused, never a hang
    assert str(caught.value) == write_refusal(fifo, "a FIFO")


def test_append_through_a_link_the_caller_allows_can_repair_the_tail(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    real.write_bytes(b"a\ntor")
    link = tmp_path / "results.jsonl"
    link.symlink_to(real)
    assert fsio.durable_append(link, "b\n", repair_torn_tail=True, follow_link=True) == 3
    assert real.read_bytes() == b"a\nb\n" and link.is_symlink()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(FsioError) as caught:
        fsio.durable_append(loop, "x\n", follow_link=True)
    assert str(caught.value) == write_refusal(loop, "a symlink")


@pytest.fixture
def mode_before_chmod(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the mode of each file or directory at the moment fsio sets its final mode."""
    seen: list[int] = []
    real = os.fchmod

    def spy(fd: int, mode: int) -> None:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real(fd, mode)

    monkeypatch.setattr(fsio.os, "fchmod", spy)
    return seen


def test_new_files_and_directories_stay_private_until_their_mode_is_set(
    tmp_path: Path, umask_0: None, mode_before_chmod: list[int]
) -> None:
    """Under umask 0 nobody else may open a new file or enter a new directory in the
    moment before gpudoctor gives it its final mode."""
    fsio.atomic_replace(tmp_path / "report.md", "x", mode=0o644)
    fsio.make_dirs(tmp_path, "a/b", 0o755)
    assert mode_before_chmod == [0o600, 0o700, 0o700]
    assert mode_of(tmp_path / "report.md") == 0o644 and mode_of(tmp_path / "a/b") == 0o755


def test_a_new_directory_swapped_for_a_link_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: between mkdir and chmod another user renames the new directory away and
    puts a link to /etc-like in its place; the chmod must not reach the link's target."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    real_mkdir = os.mkdir

    def mkdir_then_swap(path: Path, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        os.rename(path, tmp_path / "moved", src_dir_fd=dir_fd)
        os.symlink(victim, path, dir_fd=dir_fd)

    monkeypatch.setattr(fsio.os, "mkdir", mkdir_then_swap)
    with pytest.raises(OSError):
        fsio.make_dirs(tmp_path, "new", 0o777)
    assert mode_of(victim) == 0o700


def test_a_temp_name_planted_as_a_link_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: another user who guessed the temp name put a link there first."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr(fsio.secrets, "token_hex", lambda n: "guessed")
    (tmp_path / ".state.guessed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        fsio.atomic_replace(tmp_path / "state", "mine")
    assert victim.read_text() == "precious" and not (tmp_path / "state").exists()


def test_a_failed_replace_reports_its_own_error_when_the_temp_file_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temp file removed by someone else (a tmp cleaner) before the write failed: the
    caller still gets the write's error, not the cleanup's."""
    target = tmp_path / "state"

    def vanish_then_fail(fd: int, data: bytes) -> None:
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsio, "_write_all", vanish_then_fail)
    with pytest.raises(OSError, match="No space left"):
        fsio.atomic_replace(target, "x")
    assert os.listdir(tmp_path) == []


def _cloexec(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)


def test_no_fd_fsio_opens_is_inherited_by_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fd is close-on-exec: a hook or server started meanwhile never holds one."""
    written: list[bool] = []
    real = fsio._write_all

    def spy(fd: int, data: bytes) -> None:
        written.append(_cloexec(fd))
        real(fd, data)

    monkeypatch.setattr(fsio, "_write_all", spy)
    fsio.atomic_replace(tmp_path / "state", "x")
    fsio.create_new(tmp_path / "new", "x")
    fsio.durable_append(tmp_path / "log", "x\n")
    assert written == [True, True, True]
    for fd in (fsio.open_lock(tmp_path / "lock"), fsio.open_regular(tmp_path / "state"),
               fsio.open_append(tmp_path / "log"), fsio.open_dir(tmp_path)):  # fmt: skip
        try:
            assert _cloexec(fd)
        finally:
            os.close(fd)


# -- issue 46.4: the level another user makes between the check and the mkdir -------------


@pytest.fixture
def sticky(public_tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real 1777 directory (as /dev/shm), reachable by nobody; ``os.mkdir`` restored after."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as a second user")
    shm = public_tmp_path / "shm"
    shm.mkdir()
    os.chmod(shm, 0o1777)
    monkeypatch.setattr(os, "mkdir", os.mkdir)
    return shm


@as_root
def test_a_level_another_user_makes_before_the_mkdir_is_refused(sticky: Path) -> None:
    """Issue 46.4: root judged ``/dev/shm`` and is about to make ``models`` for
    ``/dev/shm/models/x``; nobody's real ``mkdir models`` lands first (forced at that
    moment by tests/fakes/mkdir_race.py). The level is judged on the fd held after
    ``EEXIST``: refused, and nothing is made in it. On the code before, ``make_dirs``
    accepted any existing directory and made ``x`` in nobody's ``models``."""
    won = mkdir_race.install("models")
    with pytest.raises(FsioError) as caught:
        fsio.make_missing_dirs(sticky / "models" / "x", option="--to")
    assert won == [str(sticky / "models")]
    assert str(caught.value) == (
        f"{sticky}/models (above --to) belongs to nobody (uid 65534): that user could swap"
        " files under gpudoctor; choose a --to whose parents belong to you or root"
    )
    assert os.listdir(sticky / "models") == []


@as_root
def test_without_an_option_an_existing_level_is_not_judged(sticky: Path) -> None:
    """Callers that judge the last level themselves (``make_dirs`` inside a trusted tree)
    keep ``mkdir -p``'s meaning: an existing directory is used whoever made it; each level
    made by gpudoctor gets its mode."""
    won = mkdir_race.install("theirs")
    made = fsio.make_missing_dirs(sticky / "theirs" / "mine", 0o750)
    assert won == [str(sticky / "theirs")] and made == sticky / "theirs" / "mine"
    assert (os.stat(made.parent).st_uid, mode_of(made)) == (NOBODY, 0o750)


@as_root
def test_each_level_is_judged_with_the_option_named(sticky: Path) -> None:
    """An existing level another user owns is refused by the walk, with the option in the
    message; without an option it is used; a sticky level that others may write passes,
    and the levels gpudoctor makes pass too (its own, exactly their mode)."""
    mkdir_race.nobody_mkdir(str(sticky / "n"))
    with pytest.raises(FsioError, match=r"/n \(above --out\) belongs to nobody"):
        fsio.make_missing_dirs(sticky / "n" / "run", option="--out")
    assert fsio.make_missing_dirs(sticky / "n" / "run") == sticky / "n" / "run"
    made = fsio.make_missing_dirs(sticky / "a" / "b", 0o700, option="--out")
    assert made == sticky / "a" / "b" and mode_of(made) == mode_of(made.parent) == 0o700
    (sticky / "open").mkdir()
    os.chmod(sticky / "open", 0o777)
    with pytest.raises(FsioError, match=r"/open \(above --out\) is writable by others"):
        fsio.make_dirs(sticky, "open/run", option="--out")
    assert not (sticky / "open" / "run").exists()


@as_root
def test_write_output_judges_the_directories_above_as_out_is_judged(
    sticky: Path, no_fd_leak: None
) -> None:
    """Issue 46.10: nobody plants ``/tmp/x -> ROOT_ONLY_DIR`` (or makes ``/tmp/x``) before
    root runs ``bundle -o /tmp/x/b.tar.gz``: refused, naming the option, nothing written
    there; root's own link is followed; a missing directory is ENOENT."""
    chosen = sticky.parent / "root-only"
    chosen.mkdir(mode=0o700)
    os.symlink(chosen, sticky / "x")
    os.lchown(sticky / "x", NOBODY, NOBODY)
    with pytest.raises(FsioError, match=rf"^{sticky}/x \(above --output\) is a symlink of nobody"):
        fsio.write_output(sticky / "x" / "b.tar.gz", b"x", option="--output")
    mkdir_race.nobody_mkdir(str(sticky / "n"))
    with pytest.raises(FsioError, match=rf"^{sticky}/n \(above -o\) belongs to nobody"):
        fsio.write_output(sticky / "n" / "b.tar.gz", b"x")
    assert os.listdir(chosen) == [] and os.listdir(sticky / "n") == []
    os.symlink(chosen, sticky / "mine")
    fsio.write_output(sticky / "mine" / "b.tar.gz", b"ok", mode=0o600)
    assert (chosen / "b.tar.gz").read_bytes() == b"ok" and mode_of(chosen / "b.tar.gz") == 0o600
    with pytest.raises(FileNotFoundError) as caught:
        fsio.write_output(sticky / "missing" / "b", b"x")
    assert (caught.value.errno, caught.value.strerror, caught.value.filename) == (
        2,
        "No such file or directory",
        str(sticky / "missing"),
    )
