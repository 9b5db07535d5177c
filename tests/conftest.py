"""Shared pytest configuration: lab fixtures, the tiny LLM, and the lab-required switch.

``GPUDOCTOR_REQUIRE_LAB=1`` (set by .ci/run) turns every "lab cannot start" skip into a
failure, so CI can never go green with the real-system tests silently skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

try:  # property tests: never a wall-time limit per example (these machines are shared)
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("gpudoctor", deadline=None)
    _hypothesis_settings.load_profile("gpudoctor")
except ImportError:  # hypothesis is in the [test] extra
    pass

pytest_plugins = ["tests.lab.fixtures"]

REQUIRE_LAB = os.environ.get("GPUDOCTOR_REQUIRE_LAB") == "1"


def lab_unavailable(reason: str) -> None:
    """Skip the calling test with ``reason``, or fail it when the lab is required (CI)."""
    if REQUIRE_LAB:
        pytest.fail(f"lab required (GPUDOCTOR_REQUIRE_LAB=1) but unavailable: {reason}")
    pytest.skip(reason)


REAL_WEIGHTS_RECORD = Path("/var/lib/gpudoctor/weights-targets.json")
"""gpudoctor's system state on this machine: the suite must never write it (issue 26.12)."""


def _targets_under(record: Path, root: Path) -> list[str]:
    """Return the targets in the weights ``record`` that lie under ``root`` ([] when absent)."""
    try:
        doc = json.loads(record.read_text())
    except (OSError, ValueError):
        return []
    targets = doc.get("targets") if isinstance(doc, dict) else None
    return sorted(t for t in targets or () if t.startswith(f"{root}/"))


_RUNNER = pytest.StashKey[tuple[dict[str, str], int, Path]]()


def pytest_configure(config: pytest.Config) -> None:
    """Set, before collection (module-level code reads HOME too) and until the end, what
    the suite relies on instead of what its runner had (tests/support/runner_env.py:
    HOME and XDG_* in an empty folder, umask 022, the locale, an 80-column no-colour
    terminal, no GPUDOCTOR_* setting); :func:`pytest_unconfigure` puts it all back."""
    import tempfile

    from tests.support.runner_env import UMASK, pinned

    home = Path(tempfile.mkdtemp(prefix="gpudoctor-test-home-"))
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(pinned(saved, home))
    config.stash[_RUNNER] = (saved, os.umask(UMASK), home)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put back the runner's environment and umask; remove the session's HOME."""
    import shutil

    saved, umask, home = config.stash[_RUNNER]
    os.umask(umask)
    os.environ.clear()
    os.environ.update(saved)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def runner_environment(pytestconfig: pytest.Config) -> Path:
    """Return the session's HOME (an empty folder of its own; see :func:`pytest_configure`)."""
    return pytestconfig.stash[_RUNNER][2]


@pytest.fixture(scope="session", autouse=True)
def private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``GPUDOCTOR_STATE_DIR`` (gpudoctor's ``/var/lib/gpudoctor``) at a temporary
    directory for the whole session, in this process and every child it starts; at the
    end, fail when the machine's real weights record names a directory of this session.

    (The record's content, not its mtime, is compared: on a shared machine another
    checkout's suite may write it at the same time.)"""
    root = tmp_path_factory.getbasetemp()
    before = _targets_under(REAL_WEIGHTS_RECORD, root)
    state = tmp_path_factory.mktemp("gpudoctor-state")
    saved = os.environ.get("GPUDOCTOR_STATE_DIR")
    os.environ["GPUDOCTOR_STATE_DIR"] = str(state)
    try:
        yield state
    finally:
        if saved is None:
            os.environ.pop("GPUDOCTOR_STATE_DIR", None)
        else:
            os.environ["GPUDOCTOR_STATE_DIR"] = saved
    leaked = [t for t in _targets_under(REAL_WEIGHTS_RECORD, root) if t not in before]
    assert not leaked, (
        f"the test suite wrote the machine's real {REAL_WEIGHTS_RECORD} ({leaked[0]}, ...):"
        " a test ran gpudoctor without the temporary GPUDOCTOR_STATE_DIR"
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a directory holding the tiny Llama model (built once per test session)."""
    from tests.support.tiny_llm import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llm")


@pytest.fixture
def umask_0() -> Iterator[None]:
    """Run the test under ``umask 0`` (a boot unit or a careless shell), then restore it."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def public_tmp_path() -> Iterator[Path]:
    """A fresh ``/tmp/gpudoctor-test-*`` directory (mode 0711) for tests in which a second
    user (``nobody`` through ``setpriv``) plants files: pytest's own ``tmp_path`` lies under
    ``/tmp/pytest-of-root``, which pytest resets to 0700 whenever another pytest session
    starts on the machine. Removed after the test."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpudoctor-test-", dir="/tmp"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take ansible-core's process-wide patches off once collection imported it (the
    Ansible tests apply them around themselves: tests/ansible/patches.py)."""
    from tests.ansible import patches

    patches.undo()
