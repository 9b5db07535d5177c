"""What ``weights ensure`` run by an ordinary user trusts (gpudoctor/weights/trust.py): its
private lock directory under XDG_RUNTIME_DIR (or /tmp/gpudoctor-UID) and the refusal of a
--to it cannot write. The suite runs as root, so each check runs in-process as the real user
``nobody`` (real and effective uid and gid switched, root kept only as the saved uid to come
back), in a public directory that user can reach; the owners and modes are real."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpudoctor import fsio
from gpudoctor.weights import space as _space  # noqa: F401  (imported now: nobody cannot read the clone)
from gpudoctor.weights import trust
from gpudoctor.weights.errors import WeightsError

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


@contextmanager
def as_nobody() -> Iterator[None]:
    """Run the block as uid and gid 65534 with no supplementary groups: os.geteuid() and
    os.access() (which checks the real uid) see that user, as a user's own run would."""
    groups = os.getgroups()
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, 0)
    os.setresuid(NOBODY, NOBODY, 0)
    try:
        yield
    finally:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)
        os.setgroups(groups)


def _owned_dir(path: Path, uid: int, mode: int) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


@pytest.fixture
def runtime(public_tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nobody's XDG_RUNTIME_DIR (0700, like /run/user/UID), set in the environment."""
    run = _owned_dir(public_tmp_path / "run-user", NOBODY, 0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


def test_a_users_lock_dir_is_a_new_private_one_under_xdg_runtime_dir(runtime: Path) -> None:
    target = Path("/dev/shm/model")
    with as_nobody():
        base = trust.lock_dir()
        lock = trust.lock_path(target)
    assert base == runtime / "gpudoctor" and lock.parent == base
    st = os.lstat(base)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == NOBODY
    assert stat.S_IMODE(st.st_mode) == 0o700  # made private, not just "not writable by others"


def test_an_existing_0755_lock_dir_of_the_user_is_accepted(runtime: Path) -> None:
    made = _owned_dir(runtime / "gpudoctor", NOBODY, 0o755)
    with as_nobody():
        assert trust.lock_dir() == made
    assert stat.S_IMODE(os.lstat(made).st_mode) == 0o755  # left as it was


@pytest.mark.parametrize("how", ["root's 0700", "group-writable", "a symlink"])
def test_a_lock_dir_the_user_does_not_own_alone_is_refused(runtime: Path, how: str) -> None:
    base = runtime / "gpudoctor"
    if how == "root's 0700":
        _owned_dir(base, 0, 0o700)
        owner, mode = 0, 0o700
    elif how == "group-writable":
        _owned_dir(base, NOBODY, 0o770)
        owner, mode = NOBODY, 0o770
    else:
        real = _owned_dir(runtime / "elsewhere", NOBODY, 0o700)
        base.symlink_to(real)
        os.lchown(base, NOBODY, NOBODY)
        owner, mode = NOBODY, 0o777
    with as_nobody(), pytest.raises(trust.UntrustedError) as info:
        trust.lock_dir()
    assert str(info.value) == (
        f"lock directory {base} is not a private directory of {fsio.user_name(NOBODY)}"
        f" (owner {fsio.user_name(owner)}, mode {mode:04o}); remove it and run again"
    )


def test_a_lock_dir_that_cannot_be_created_is_one_line(
    public_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots = _owned_dir(public_tmp_path / "roots", 0, 0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(roots))
    with as_nobody(), pytest.raises(WeightsError) as info:
        trust.lock_dir()
    assert str(info.value) == (
        f"cannot create the lock directory {roots / 'gpudoctor'}: Permission denied"
    )


@pytest.mark.parametrize("xdg", [None, ""])
def test_without_xdg_runtime_dir_the_lock_dir_is_tmp_gpudoctor_uid(
    monkeypatch: pytest.MonkeyPatch, xdg: str | None
) -> None:
    """Unset or empty (an empty value is no directory): /tmp/gpudoctor-UID itself, 0700."""
    if xdg is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    expected = Path(f"/tmp/gpudoctor-{NOBODY}")
    existed = os.path.lexists(expected)
    try:
        with as_nobody():
            assert trust.lock_dir() == expected
        st = os.lstat(expected)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == NOBODY and not st.st_mode & 0o022
    finally:
        if not existed:
            shutil.rmtree(expected, ignore_errors=True)


def test_a_to_the_user_cannot_write_in_is_refused_before_any_work(public_tmp_path: Path) -> None:
    roots = _owned_dir(public_tmp_path / "roots", 0, 0o755)  # trusted (root's), not writable
    with as_nobody(), pytest.raises(WeightsError) as info:
        trust.safe_location(roots / "model")
    assert str(info.value) == f"permission denied: cannot write in {roots}; choose another --to"
    mine = _owned_dir(public_tmp_path / "mine", NOBODY, 0o755)
    with as_nobody():
        assert trust.safe_location(mine / "model") == mine / "model"
