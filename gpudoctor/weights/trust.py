"""What ``weights ensure`` may trust on disk: owner, mode and no symlinks.

/dev/shm is world-writable (mode 1777): any local user can create ``--to``, its
``.partial`` directory or a lock there before gpudoctor runs. So a directory, a partial
directory, a manifest or a mirror is trusted only when it is not a symlink, belongs to
the invoking user or root, and is not writable by group or others. Every ancestor of
the target must belong to the user or root and, when others may write it, be sticky
(like /tmp and /dev/shm), or another user could swap the directory under us.
Locks live in a directory of our own (``/run/gpudoctor``, 0700), never next to the target.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.fsio import trusted_uids as trusted_uids  # re-exported
from gpudoctor.fsio import user_name as user_name
from gpudoctor.weights.errors import WeightsError

RESERVED_PREFIXES = (".gpudoctor-", ".gpudoctor.")
NOT_A_MODEL_FS = frozenset(
    {"proc", "sysfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
     "configfs", "pstore", "bpf", "mqueue", "fusectl", "binfmt_misc", "efivarfs", "autofs"}
)  # fmt: skip


class UntrustedError(WeightsError):
    """A path another user could have written (or planted) is in the way."""


def reserved_name(path: str) -> bool:
    """Return True when a repository path collides with gpudoctor's or hf's bookkeeping."""
    return path.startswith((*RESERVED_PREFIXES, ".cache/huggingface/"))  # top level only


def _judge(path: Path, st: os.stat_result, what: str, fix: str) -> None:
    try:
        fsio.judge_owner(path, st, what, fix)
    except fsio.FsioError as exc:
        raise UntrustedError(str(exc)) from None


def check_dir(path: Path, what: str) -> bool:
    """Return False when ``path`` does not exist, True when it is a directory we can trust.

    Raises UntrustedError (one line naming the owner and the fix) for a symlink,
    another user's directory or one that others can write; WeightsError for a file.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    fix = f"remove it (rm -rf --one-file-system {path}) and run again, or choose another --to"
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedError(
            f"{path} ({what}) is a symlink (to {os.readlink(path)}): gpudoctor never follows"
            f" one there; remove it (rm {path}) and run again"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise WeightsError(
            f"{path} exists and is not a directory; remove it or choose another --to"
        )
    _judge(path, st, what, fix)
    return True


def open_trusted(path: Path, what: str) -> int | None:
    """Return a read-only fd of the regular file ``path`` (``O_NOFOLLOW``), None when absent.

    Raises UntrustedError when it is a symlink, another user's file, or writable by others.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: a symlink
            raise UntrustedError(
                f"{path} ({what}) is a symlink: gpudoctor never follows one; remove it"
            ) from None
        raise
    st = os.fstat(fd)
    try:
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedError(f"{path} ({what}) is not a regular file; remove it")
        _judge(path, st, what, f"remove it (rm {path}) and run again")
    except BaseException:
        os.close(fd)
        raise
    return fd


def safe_location(target: Path) -> Path:
    """Return ``target`` with its parent resolved, after checking every ancestor.

    Each existing ancestor must belong to the user or root, and be sticky when others
    may write it. The parent is created (0755, each missing level, never through a link)
    when missing. Checked before any work:
    a filesystem that cannot hold files (``/proc``) or a read-only one is refused here.
    """
    target = target.absolute()
    existing = check_ancestors(target.parent, "--to")  # links judged, not followed blindly
    _check_filesystem(existing, target)
    try:
        # never through a link among the missing levels (a planted dangling one included);
        # each level made on the one held before it, and judged: a level another user makes
        # between the check above and the mkdir is refused (issue 46.4)
        parent = fsio.make_missing_dirs(target.parent, option="--to")
    except OSError as exc:
        if exc.errno is None:  # judged: another user's, or writable by others
            raise UntrustedError(str(exc)) from None
        reason = exc.strerror
    else:
        if parent.is_dir():
            return parent / target.name
        reason = "a link to a directory that does not exist"
    raise WeightsError(
        f"cannot create {target.parent} for --to {target}: {reason}; choose another --to"
    )


def check_ancestors(directory: Path, option: str) -> Path:
    """Check ``directory`` (resolved) and its ancestors; return the nearest one that exists.

    Each must belong to the user or root, and be sticky when others may write it.
    """
    try:
        return fsio.check_ancestors(directory, option)
    except fsio.FsioError as exc:
        raise UntrustedError(str(exc)) from None


def _check_filesystem(existing: Path, target: Path) -> None:
    from gpudoctor.weights.space import _mount_of

    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mountinfo = ""
    mount_point, fs_type = _mount_of(existing, mountinfo)
    if fs_type in NOT_A_MODEL_FS:
        raise WeightsError(
            f"--to {target} is on {mount_point} ({fs_type}), which cannot hold files;"
            " choose a directory on tmpfs (/dev/shm/NAME) or on disk"
        )
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise WeightsError(
            f"--to {target} is on a read-only filesystem ({mount_point}); choose a writable one"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise WeightsError(f"permission denied: cannot write in {existing}; choose another --to")


def lock_dir() -> Path:
    """Return our private lock directory: ``/run/gpudoctor`` (root) or ``$XDG_RUNTIME_DIR/gpudoctor``.

    Without an XDG_RUNTIME_DIR (unset or empty) a user's is ``/tmp/gpudoctor-UID``.
    Created 0700; it must be a real directory of ours that nobody else can write
    (an existing 0755 one is accepted: others may read the names, not plant a lock).
    """
    if os.geteuid() == 0:
        base = Path("/run/gpudoctor")
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR")  # set but empty counts as unset
        base = Path(runtime) / "gpudoctor" if runtime else Path(f"/tmp/gpudoctor-{os.geteuid()}")
    try:
        fsio.make_missing_dirs(base, 0o700)
    except OSError as exc:
        raise WeightsError(f"cannot create the lock directory {base}: {exc.strerror}") from None
    st = os.lstat(base)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UntrustedError(
            f"lock directory {base} is not a private directory of {user_name(os.geteuid())}"
            f" (owner {user_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o});"
            f" remove it and run again"
        )
    return base


def lock_path(target: Path) -> Path:
    """Return the lock file for ``target``: ``LOCKDIR/weights-NAME-HASH.lock``."""
    digest = hashlib.sha256(str(target.absolute()).encode()).hexdigest()[:16]
    return lock_dir() / f"weights-{target.name[:40]}-{digest}.lock"
