"""The suite sets what it relies on, whoever started it (issue 49; tests/support/runner_env.py
and tests/conftest.py ``pytest_configure``)."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from tests.support.runner_env import HARNESS, UMASK, pinned

HOSTILE = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/root",
    "LANG": "de_DE.UTF-8",
    "LC_ALL": "POSIX",
    "LC_MESSAGES": "fr_FR",
    "LANGUAGE": "fr",
    "COLUMNS": "40",
    "TERM": "xterm-256color",
    "FORCE_COLOR": "1",
    "NO_COLOR": "1",
    "XDG_CONFIG_HOME": "/odd/config",
    "XDG_RUNTIME_DIR": "/odd/run",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "GPUDOCTOR_DEBUG": "1",
    "GPUDOCTOR_BENCH_QUIRKS": "/root/quirks.toml",
    "GPUDOCTOR_REQUIRE_LAB": "1",
    "GPUDOCTOR_OLAH_CLI": "/opt/olah-cli",
}


def test_pinned_sets_what_the_suite_relies_on_and_drops_the_runners_values() -> None:
    home = Path("/tmp/session/home0")
    env = pinned(HOSTILE, home)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "GPUDOCTOR_REQUIRE_LAB": "1",
        "GPUDOCTOR_OLAH_CLI": "/opt/olah-cli",
        "HOME": "/tmp/session/home0",
        "XDG_CONFIG_HOME": "/tmp/session/home0/.config",
        "XDG_CACHE_HOME": "/tmp/session/home0/.cache",
        "XDG_STATE_HOME": "/tmp/session/home0/.local/state",
        "XDG_DATA_HOME": "/tmp/session/home0/.local/share",
        "LANG": "C.UTF-8",
        "COLUMNS": "80",
        "LINES": "24",
        "TERM": "dumb",
    }
    assert HOSTILE["HOME"] == "/root"  # the runner's mapping is left as it was


def test_the_harness_variables_are_only_the_suites() -> None:
    assert all(name.startswith("GPUDOCTOR_") for name in HARNESS)
    product = (Path(__file__).parents[2] / "gpudoctor").rglob("*.py")
    read = "".join(path.read_text() for path in product)
    assert [name for name in sorted(HARNESS) if f'"{name}"' in read] == []


def test_this_session_runs_in_the_pinned_environment(runner_environment: Path) -> None:
    """In this process and in a child: HOME an empty folder of the session, not the
    user's; umask 022; the locale, width and terminal pinned."""
    assert os.environ["HOME"] == str(runner_environment)
    assert runner_environment != Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert not (runner_environment / ".config" / "gpudoctor").exists()
    assert not (runner_environment / ".ssh").exists()
    code = (
        "import os; m = os.umask(0); "
        "print(oct(m), *(os.environ.get(k) for k in "
        "('HOME', 'XDG_CONFIG_HOME', 'LANG', 'LC_ALL', 'COLUMNS', 'TERM', 'GPUDOCTOR_DEBUG')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        oct(UMASK), str(runner_environment), f"{runner_environment}/.config", "C.UTF-8",
        "None", "80", "dumb", "None",
    ]  # fmt: skip
