"""``ansible-test sanity`` on the gpudoctor.gpu collection, run locally (no container).

ansible-test needs the collection at ``ansible_collections/gpudoctor/gpu`` (:func:`stage`
copies it there) and runs most sanity tests in virtual environments of its own, made once
under ``~/.ansible/test/venv`` with pip from the package index. ``prepare`` (set-up, run by
tests/run.sh; the only downloads) makes them: ansible-test would first fetch a pip bootstrap
script from Ansible's own file host, out of reach here, so :mod:`tests.ansible.get_pip_offline`
is put in its cache in that script's place. The tests then reuse the environments, and only
run where ``prepare`` left its marker for this ansible-core version (no network in tests).

    .venv/bin/python -m tests.ansible.sanity prepare

Tests not run: ``pslint`` (PowerShell) and ``shellcheck``: the collection has no PowerShell
or shell file, and neither tool is installed here.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

from tests.ansible.playbook import BIN, COLLECTION_SRC

SKIPPED = ("pslint", "shellcheck")
# ansible-test keeps its environments under ~/.ansible/test: the user's own home from the
# password database, whatever HOME the test runner has (tests/conftest.py pins HOME to an
# empty folder), so set-up and tests find the same ones
ACCOUNT_HOME = Path(pwd.getpwuid(os.getuid()).pw_dir)
HOME_TEST = ACCOUNT_HOME / ".ansible" / "test"
LOG = HOME_TEST / "gpudoctor-sanity-prepare.log"  # the output of the last ``prepare``


def ansible_core_version() -> str:
    """Return the installed ansible-core version (``2.19.14``)."""
    from ansible.release import __version__

    return __version__


def marker() -> Path:
    """Return the file ``prepare`` writes once the environments of this version exist."""
    return HOME_TEST / f"gpudoctor-sanity-prepared-{ansible_core_version()}"


def stage(dest: Path) -> Path:
    """Copy the collection to ``dest/ansible_collections/gpudoctor/gpu``; return that path."""
    target = dest / "ansible_collections" / "gpudoctor" / "gpu"
    shutil.copytree(COLLECTION_SRC, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def sanity(
    collection: Path, only: tuple[str, ...] = (), timeout: float = 600.0
) -> subprocess.CompletedProcess[str]:
    """Run ``ansible-test sanity --local --python X.Y`` in ``collection`` (every test but
    :data:`SKIPPED`, or ``only`` these); return the run."""
    argv = [str(BIN / "ansible-test"), "sanity", "--local", "--python", python_version()]
    for name in only:
        argv += ["--test", name]
    for name in () if only else SKIPPED:
        argv += ["--skip-test", name]
    return subprocess.run(argv, cwd=collection, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HOME": str(ACCOUNT_HOME)})  # fmt: skip


def prepare(work: Path) -> int:
    """Make ansible-test's sanity environments (a first run); return its exit status."""
    script = HOME_TEST / "cache" / f"get_pip_{pip_version().replace('.', '_')}.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("get_pip_offline.py"), script)
    done = sanity(stage(work), timeout=1800.0)
    LOG.write_text(done.stdout + done.stderr)
    if done.returncode == 0:
        marker().write_text("ok\n")
    return done.returncode


def pip_version() -> str:
    """Return the pip version ansible-test bootstraps in its environments (``24.2``)."""
    from types import SimpleNamespace

    from ansible_test._internal.python_requirements import get_venv_packages

    return get_venv_packages(SimpleNamespace(version=python_version()))["pip"]  # type: ignore[arg-type]


def python_version() -> str:
    """Return this Python's ``X.Y``."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python -m tests.ansible.sanity prepare")
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(prepare(Path(tmp)))
