"""gpudoctor.fsio's reads and writes as a caller sees them, on real files, FIFOs, links,
devices and locks: the bytes and mode a write leaves, the exact one-line refusal for each
kind of file, what is fsync'ed, and that a refused or finished call leaves no fd open."""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor import fsio
from gpudoctor.fsio import FsioError

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
def test_make_dirs_gives_each_new_level_exactly_its_mode(tmp_path: Path, umask: int) -> None:
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
