"""The one way gpudoctor writes a file: atomic replace, durable append, safe creation.

Every write opens its directory first (``O_DIRECTORY|O_NOFOLLOW``, checked) and then
works relative to that directory fd (``openat``), so a symlink planted at a temp name,
at the final name (``O_NOFOLLOW``) or as the directory itself is never followed.
Policies a caller may loosen or tighten, each a keyword argument:

- ``follow_dir_link``: accept a directory that is itself a symlink (default: refuse);
- ``require_trusted_dir``: refuse a directory (or an ancestor) another user owns or can
  write without the sticky bit (default: off);
- ``refuse_non_regular``: refuse a symlink, FIFO or device at the final path (default);
- ``follow_link`` (append only): append through a symlink at the final path.

Every refusal is one :class:`FsioError` (an ``OSError``): one line with path, owner, fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_KINDS = {stat.S_IFLNK: "a symlink", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}  # fmt: skip


class FsioError(OSError):
    """A write gpudoctor refuses (or cannot do): one line naming the path and the fix."""

    def __str__(self) -> str:
        return self.strerror or (str(self.args[0]) if self.args else "file system error")


def trusted_uids() -> frozenset[int]:
    """Return the owners whose files and directories we trust: the caller and root."""
    return frozenset({os.geteuid(), 0})


def user_name(uid: int) -> str:
    """Return the login name of ``uid`` as ``name (uid N)``, or ``uid N`` when unknown."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def kind_of(mode: int) -> str:
    """Return what a non-regular file is, in words (``a symlink``, ``a FIFO``...)."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def judge_owner(
    path: Path | str, st: os.stat_result, what: str, fix: str,
    trusted: frozenset[int] | None = None, allow_sticky: bool = False,
) -> None:  # fmt: skip
    """Raise FsioError when ``st`` (of ``path``) belongs to a user outside ``trusted``
    (default: the caller and root) or others can write it (group/other write; a sticky
    directory is accepted with ``allow_sticky``); return None when it is trusted."""
    trusted = trusted_uids() if trusted is None else trusted
    if st.st_uid not in trusted:
        owners = " or ".join(user_name(uid) for uid in sorted(trusted))
        raise FsioError(
            f"{path} ({what}) belongs to {user_name(st.st_uid)}, not to"
            f" {owners}: another user may have planted it; {fix}"
        )
    if allow_sticky and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return
    if st.st_mode & 0o022:
        raise FsioError(
            f"{path} ({what}) is writable by others (mode {stat.S_IMODE(st.st_mode):04o}):"
            f" another user may have changed it; {fix}"
        )


_MAX_LINKS = 40  # as the kernel's path walk (ELOOP)


def _judge_ancestor(path: str, st: os.stat_result, option: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in trusted_uids():
            raise FsioError(
                f"{path} (above {option}) is a symlink of {user_name(st.st_uid)} (to"
                f" {os.readlink(path)}): gpudoctor never follows another user's link; give the"
                f" real directory, or choose a {option} whose parents belong to you or root"
            )
        return  # a link's own mode means nothing; the directory holding it was judged
    if st.st_uid not in trusted_uids():
        raise FsioError(
            f"{path} (above {option}) belongs to {user_name(st.st_uid)}: that user could"
            f" swap files under gpudoctor; choose a {option} whose parents belong to you or root"
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise FsioError(
            f"{path} (above {option}) is writable by others and not sticky (mode"
            f" {stat.S_IMODE(st.st_mode):04o}); choose another {option} or chmod o-w,+t {path}"
        )


@dataclasses.dataclass(frozen=True)
class Walk:
    """Where a path leads, walked one level at a time (:func:`walk_path`).

    existing: the real path of the longest part that exists.
    missing: the names of ``path`` still missing (below ``existing`` unless ``dangling``).
    dangling: True when a symlink on the way points where nothing exists; ``missing`` are
        then the names of ``path`` below that link (never those of the link's target)."""

    existing: Path
    missing: tuple[str, ...]
    dangling: bool


def walk_path(path: Path | str, option: str, judge: bool = True) -> Walk:
    """Walk ``path`` one level at a time as the kernel does and return where it leads.

    Every symlink met on the way is judged before it is followed: one another user owns
    (planted in ``/tmp`` or ``/dev/shm``) raises FsioError and is never followed. With
    ``judge`` every directory walked must also belong to the caller or root and be sticky
    when others may write it. ``..`` goes up from the real directory reached."""
    pending = [(p, False) for p in reversed(os.path.join(os.getcwd(), path).split("/")) if p]
    current, links = "/", 0
    if judge:
        _judge_ancestor(current, os.lstat(current), option)
    while pending:
        part, from_link = pending.pop()
        if part in (".", ".."):
            current = os.path.dirname(current) if part == ".." else current
            continue
        candidate = os.path.join(current, part)
        try:
            st = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            pending.append((part, from_link))  # the names of the link's target come first
            names = tuple(p for p, linked in reversed(pending) if not linked)
            return Walk(Path(current), names, from_link)
        if stat.S_ISLNK(st.st_mode):
            _judge_ancestor(candidate, st, option)  # whoever owns the link chooses its target
            links += 1
            if links > _MAX_LINKS:
                raise FsioError(40, f"{path}: too many levels of symbolic links")
            target = os.readlink(candidate)
            current = "/" if target.startswith("/") else current
            pending.extend((p, True) for p in reversed(target.split("/")) if p)
            continue
        if judge:
            _judge_ancestor(candidate, st, option)
        current = candidate
    return Walk(Path(current), (), False)


def check_ancestors(directory: Path | str, option: str) -> Path:
    """Check ``directory`` and its ancestors, level by level as the kernel walks it; return
    the real path of the nearest one that exists.

    Each directory must belong to the caller or root and, when others may write it, be
    sticky (like /tmp); a symlink on the way is followed only when the caller or root owns
    it (another user's link in /tmp chooses where root writes: refused, never followed).
    Raise FsioError naming the directory or link, its owner or mode, and the fix.
    """
    return walk_path(directory, option).existing


def open_dir(
    directory: Path | str, *, follow_dir_link: bool = False, require_trusted_dir: bool = False
) -> int:
    """Return an fd of ``directory`` (``O_DIRECTORY``, ``O_NOFOLLOW`` unless
    ``follow_dir_link``); the caller closes it. Raise FsioError for a symlink, a
    non-directory, or (``require_trusted_dir``) a directory chain another user controls."""
    directory = Path(directory or ".")
    flags = _DIR_FLAGS | (0 if follow_dir_link else os.O_NOFOLLOW)
    try:
        fd = os.open(directory, flags)
    except OSError as exc:
        if os.path.islink(directory):
            raise FsioError(
                f"{directory} is a symlink (to {os.readlink(directory)}): gpudoctor never"
                f" writes through one; give the real directory ({os.path.realpath(directory)})"
            ) from None
        if exc.errno == 20:  # ENOTDIR
            raise FsioError(f"{directory} is not a directory; choose another path") from None
        raise
    if require_trusted_dir:
        try:
            check_ancestors(directory, "path")
        except BaseException:
            os.close(fd)
            raise
    return fd


@contextlib.contextmanager
def _parent(
    path: Path, follow_dir_link: bool, require_trusted_dir: bool, dir_fd: int | None = None
) -> Iterator[int]:
    if dir_fd is not None:  # already opened by the caller (e.g. under_root): kept open
        yield dir_fd
        return
    fd = open_dir(
        path.parent, follow_dir_link=follow_dir_link, require_trusted_dir=require_trusted_dir
    )
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(directory: Path | str, *, follow_dir_link: bool = False) -> None:
    """Flush ``directory``'s entries to disk (a rename or a create survives a power cut);
    return None."""
    fd = open_dir(directory, follow_dir_link=follow_dir_link)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:  # a filesystem without fsync (EINVAL/ENOSYS/EOPNOTSUPP)
        if exc.errno not in (22, 38, 95):
            raise


def _refuse(path: Path, st: os.stat_result) -> None:
    raise FsioError(
        f"{path} is {kind_of(st.st_mode)}: gpudoctor writes only to a regular file or a new"
        f" path; remove it (rm {path}) or choose another path"
    )


def atomic_replace(
    path: Path | str,
    data: bytes | str,
    *,
    mode: int | None = None,
    create_mode: int = 0o666,
    keep_mode: bool = True,
    refuse_non_regular: bool = True,
    follow_dir_link: bool = False,
    require_trusted_dir: bool = False,
    sync: bool = True,
    dir_fd: int | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically; return None (``dir_fd``: ``path``'s
    directory, already opened by the caller, e.g. with :func:`under_root`).

    A temp file is created ``O_EXCL|O_NOFOLLOW`` next to it, written, fsync'ed and
    renamed over ``path``; then the directory is fsync'ed. A reader sees the old bytes
    or the new ones, never half; on any failure the old file is untouched and the temp
    file removed. Mode: ``mode`` exactly when given, else the old file's when
    ``keep_mode``, else ``create_mode`` less the umask. Text is written as UTF-8.
    """
    path = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    with _parent(path, follow_dir_link, require_trusted_dir, dir_fd) as dir_fd:
        old = _lstat_at(dir_fd, path.name)
        if old is not None and refuse_non_regular and not stat.S_ISREG(old.st_mode):
            _refuse(path, old)
        tmp = f".{path.name[:200]}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        if mode is None and keep_mode and old is not None and stat.S_ISREG(old.st_mode):
            mode = stat.S_IMODE(old.st_mode)
        fd = os.open(tmp, flags, create_mode if mode is None else 0o600, dir_fd=dir_fd)
        try:
            try:
                if mode is not None:
                    os.fchmod(fd, mode)
                _write_all(fd, blob)
                if sync:
                    _fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        if sync:
            _fsync(dir_fd)


def write_output(
    path: Path | str, data: bytes | str, *, mode: int = 0o644, option: str = "-o"
) -> None:
    """Write an output file the user named (``-o``, ``--markdown``, a report); return None.

    Only a regular file or a new path is written, atomically (:func:`atomic_replace`): a
    symlink, FIFO, socket or device at ``path`` is refused (``gpudoctor check -o /dev/null``
    must never replace ``/dev/null``) and never followed. Its directory is reached as
    ``--out``'s is (:func:`walk_path`, judged): a link the caller or root owns is followed
    (``/var/run``), another user's link or directory above ``path`` (``/tmp/x -> /etc``,
    planted before root runs ``bundle -o /tmp/x/b.tar.gz``) is refused, naming ``option``.
    The file gets ``mode`` (``install -m 0644``)."""
    path = Path(path)
    walk = walk_path(path.parent, option)
    if walk.missing:
        raise FileNotFoundError(2, "No such file or directory", str(path.parent))
    fd = open_dir(walk.existing)
    try:
        atomic_replace(path, data, mode=mode, dir_fd=fd)
    finally:
        os.close(fd)


def open_append(
    path: Path | str,
    *,
    create_mode: int = 0o644,
    follow_link: bool = False,
    refuse_non_regular: bool = True,
    follow_dir_link: bool = False,
    require_trusted_dir: bool = False,
    readable: bool = False,
) -> int:
    """Return a write (``readable``: read-write) fd of ``path`` opened ``O_APPEND|O_CREAT`` (``O_NOFOLLOW`` unless
    ``follow_link``) relative to its checked directory; the caller closes it. Raise
    FsioError for a symlink (or, ``refuse_non_regular``, a FIFO or device) there."""
    path = Path(path)
    flags = (os.O_RDWR if readable else os.O_WRONLY) | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    flags |= 0 if follow_link else os.O_NOFOLLOW
    if refuse_non_regular:
        flags |= os.O_NONBLOCK  # a FIFO without a reader must not hang the open
    with _parent(path, follow_dir_link, require_trusted_dir) as dir_fd:
        try:
            fd = os.open(path.name, flags, create_mode, dir_fd=dir_fd)
        except OSError:  # ELOOP: a symlink; ENXIO: a FIFO; EISDIR: a directory
            st = _lstat_at(dir_fd, path.name)
            if st is not None and (
                stat.S_ISLNK(st.st_mode) or (refuse_non_regular and not stat.S_ISREG(st.st_mode))
            ):
                _refuse(path, st)
            raise
    st = os.fstat(fd)
    if refuse_non_regular and not stat.S_ISREG(st.st_mode):
        os.close(fd)
        _refuse(path, st)
    if flags & os.O_NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def _cut_torn_tail(fd: int) -> int:
    size = os.fstat(fd).st_size
    if not size:
        return 0
    start = max(0, size - (1 << 20))
    while True:
        chunk = os.pread(fd, size - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0 or start == 0:
            keep = start + cut + 1
            break
        start = max(0, start - (1 << 20))
    if keep < size:
        os.ftruncate(fd, keep)
    return size - keep


def durable_append(
    path: Path | str,
    data: bytes | str,
    *,
    lock: bool = False,
    repair_torn_tail: bool = False,
    sync: bool = True,
    **policy: bool | int,
) -> int:
    """Append ``data`` to ``path`` in one ``O_APPEND`` write loop, then fsync; return how
    many bytes of a torn last line were cut first (``repair_torn_tail``: the bytes after
    the last newline, left by a writer killed mid-line), else 0.

    ``lock`` holds an exclusive ``flock`` while writing; ``policy`` is
    :func:`open_append`'s keywords (symlinks at the final path are refused by default).
    """
    fd = open_append(path, readable=repair_torn_tail, **policy)  # type: ignore[arg-type]
    try:
        if lock:
            fcntl.flock(fd, fcntl.LOCK_EX)
        cut = _cut_torn_tail(fd) if repair_torn_tail else 0
        _write_all(fd, (data.encode("utf-8") if isinstance(data, str) else data))
        if sync:
            _fsync(fd)
    finally:
        os.close(fd)
    return cut


def truncate_file(
    path: Path | str, length: int, *, follow_link: bool = False, follow_dir_link: bool = False,
    require_trusted_dir: bool = False,
) -> None:  # fmt: skip
    """Cut the regular file ``path`` to ``length`` bytes and fsync it (never through a
    symlink unless ``follow_link``); return None. Raise FsioError for a non-regular file."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_link else os.O_NOFOLLOW)
    with _parent(path, follow_dir_link, require_trusted_dir) as dir_fd:
        try:
            fd = os.open(path.name, flags, dir_fd=dir_fd)
        except OSError:  # ELOOP: a symlink; ENXIO: a FIFO; EISDIR: a directory
            st = _lstat_at(dir_fd, path.name)
            if st is not None and not stat.S_ISREG(st.st_mode):
                _refuse(path, st)
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse(path, st)
        os.ftruncate(fd, length)
        _fsync(fd)
    finally:
        os.close(fd)


def create_new(
    path: Path | str,
    data: bytes | str = b"",
    *,
    create_mode: int = 0o644,
    follow_dir_link: bool = False,
    require_trusted_dir: bool = False,
    sync: bool = True,
    dir_fd: int | None = None,
) -> None:
    """Create ``path`` (``O_CREAT|O_EXCL|O_NOFOLLOW``: never an existing file or link)
    holding ``data``; return None. Raise FsioError when anything is already there."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with _parent(path, follow_dir_link, require_trusted_dir, dir_fd) as dir_fd:
        try:
            fd = os.open(path.name, flags, create_mode, dir_fd=dir_fd)
        except FileExistsError:
            st = _lstat_at(dir_fd, path.name)
            what = "a file" if st is None or stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
            raise FsioError(
                f"{path} already exists ({what}): gpudoctor creates it only as a new file;"
                f" remove it (rm {path}) or choose another path"
            ) from None
        try:
            _write_all(fd, (data.encode("utf-8") if isinstance(data, str) else data))
            if sync:
                _fsync(fd)
        finally:
            os.close(fd)
        if sync:
            _fsync(dir_fd)


def _open_regular_at(
    path: Path, flags: int, mode: int, follow_dir_link: bool, require_trusted_dir: bool,
    refuse: Callable[[Path, os.stat_result], None],
) -> int:  # fmt: skip
    """Open ``path`` with ``flags|O_NOFOLLOW|O_NONBLOCK`` relative to its checked directory
    and return the fd (blocking again) when it is a regular file; else ``refuse`` it."""
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with _parent(path, follow_dir_link, require_trusted_dir) as dir_fd:
        try:
            fd = os.open(path.name, flags, mode, dir_fd=dir_fd)
        except OSError:  # ELOOP: a symlink; ENXIO: a FIFO; EISDIR: a directory
            st = _lstat_at(dir_fd, path.name)
            if st is not None and not stat.S_ISREG(st.st_mode):
                refuse(path, st)
            raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        refuse(path, st)
    os.set_blocking(fd, True)
    return fd


def open_lock(
    path: Path | str, *, mode: int = 0o644, follow_dir_link: bool = False,
    require_trusted_dir: bool = False,
) -> int:  # fmt: skip
    """Return a read-write fd of the lock file ``path`` (created, ``O_NOFOLLOW``: a planted
    symlink is refused, never followed); the caller flocks and closes it."""
    return _open_regular_at(Path(path), os.O_RDWR | os.O_CREAT, mode, follow_dir_link,
                            require_trusted_dir, _refuse)  # fmt: skip


def open_regular(
    path: Path | str, *, follow_dir_link: bool = False, require_trusted_dir: bool = False
) -> int:
    """Return a read-only fd of the regular file ``path``, opened ``O_NOFOLLOW|O_NONBLOCK``
    relative to its checked directory (a symlink there is refused, never followed); the
    caller closes it. Raise FileNotFoundError when absent, FsioError for a symlink, FIFO,
    device or directory."""
    return _open_regular_at(Path(path), os.O_RDONLY, 0, follow_dir_link, require_trusted_dir,
                            _refuse_read)  # fmt: skip


def _refuse_read(path: Path, st: os.stat_result) -> None:
    raise FsioError(
        f"{path} is {kind_of(st.st_mode)}: gpudoctor reads it only as a regular file and never"
        f" follows a link there; remove it (rm {path})"
    )


def read_regular(
    path: Path | str, *, limit: int | None = None, follow_dir_link: bool = False,
    require_trusted_dir: bool = False,
) -> bytes:  # fmt: skip
    """Return the bytes (at most ``limit``) of the regular file ``path`` without following a
    link (:func:`open_regular`; ``cat PATH``). Raise FileNotFoundError when absent,
    FsioError for anything but a regular file."""
    fd = open_regular(
        path, follow_dir_link=follow_dir_link, require_trusted_dir=require_trusted_dir
    )
    try:
        chunks = []
        left = -1 if limit is None else limit
        while left:
            chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left = left - len(chunk) if left > 0 else left
        return b"".join(chunks)
    finally:
        os.close(fd)


def make_dirs(
    root: Path | str, rel_dir: str | Path, mode: int = 0o755, option: str | None = None
) -> Path:
    """``mkdir -p root/rel_dir`` without passing through a symlink; return the directory.

    Each level is made (``mkdirat``) in the directory held open before it, so no level is
    looked up again by name. A new level gets exactly ``mode`` (``fchmod`` after ``mkdir``:
    neither umask 0 nor 077 changes it); one that exists (made by another program in the
    meantime: ``EEXIST``) must be a real directory, and with ``option`` it is judged on its
    ``fstat`` as an ancestor of ``option`` is (the caller's or root's, writable by others
    only when sticky): a directory another user made between a check and the ``mkdir`` is
    refused, never used. Raise FsioError (a NotADirectoryError's errno) for a level that is
    not a directory, FsioError naming the owner or mode for one that is not trusted."""
    fd = os.open(root, _DIR_FLAGS | os.O_PATH)
    current = Path(root)
    try:
        for part in Path(rel_dir).parts:
            current = current / part
            try:
                os.mkdir(part, mode & 0o700, dir_fd=fd)  # nobody else may enter it yet
            except FileExistsError:
                made = False
            else:
                made = True
            try:
                child = os.open(
                    part, _DIR_FLAGS | os.O_NOFOLLOW | (0 if made else os.O_PATH), dir_fd=fd
                )
            except OSError as exc:
                if exc.errno in (20, 40):  # ENOTDIR, ELOOP: a file or a link there
                    raise FsioError(20, f"{current} exists and is not a directory") from None
                raise
            os.close(fd)
            fd = child
            if option is not None:
                _judge_ancestor(str(current), os.fstat(fd), option)
            if made:
                os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return current


def make_missing_dirs(path: Path | str, mode: int = 0o755, option: str | None = None) -> Path:
    """``mkdir -p -m MODE path`` where every missing level gets ``mode`` (``os.makedirs``
    gives it to the last one only, the others ``0777 & ~umask``: world-writable under umask
    0); return the directory (its existing part resolved). A link among the missing
    levels, dangling ones included, is never followed (nothing is made where it points);
    raise OSError (ENOTDIR, ENOENT) when a level is not a directory. With ``option``
    every level, existing or made, is judged as an ancestor of ``option`` (:func:`make_dirs`):
    the one that another user makes first, between the check and the ``mkdir``, is refused."""
    judged = option is not None
    walk = walk_path(path, option or "the directory", judge=judged)
    if walk.dangling:
        if walk.missing:  # nothing is made where a link points, nor below it
            raise FsioError(2, f"{path}: a symlink on the way points where nothing exists")
        return Path(os.path.realpath(path))  # the dangling link itself: not a directory
    return make_dirs(walk.existing, Path(*walk.missing) if walk.missing else Path(), mode, option)
