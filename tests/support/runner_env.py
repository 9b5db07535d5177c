"""What the suite sets for itself instead of taking it from whoever started it (issue 49).

The runner's environment is not the tests': a background job, a CI agent, a hardened
root shell, a person's terminal. Each of these once changed a result, so the suite pins
them for its whole session (tests/conftest.py ``pytest_configure``), in its own process
and every child:

- ``HOME`` (an empty folder of the session) and ``XDG_CONFIG_HOME``/``XDG_CACHE_HOME``/
  ``XDG_STATE_HOME``/``XDG_DATA_HOME`` under it; ``XDG_RUNTIME_DIR`` unset: a user's
  ``~/.ssh/config`` (a ``ConnectTimeout``) or ``~/.config/gpudoctor/bench-quirks.toml``
  (a quirk that skips every cell) or Hub token is never read, nor written to;
- the umask, 022 (under 077 a folder made ``mkdir(mode=0o755)`` is 0700, and the probe
  that drops root to ``nobody`` cannot load the stand-in driver in it);
- ``COLUMNS``/``LINES`` 80x24 and ``TERM=dumb``, with the colour switches unset: help
  text is wrapped the same way with or without a terminal, whatever its width;
- the locale ``C.UTF-8`` (``LANG``; ``LC_*`` and ``LANGUAGE`` unset) for every child;
- none of gpudoctor's own ``GPUDOCTOR_*`` settings (``GPUDOCTOR_DEBUG=1`` prints
  tracebacks, ``GPUDOCTOR_BENCH_QUIRKS`` names a quirks table), only the suite's
  (:data:`HARNESS`).

Signals are per child (tests/support/signals.py); the current directory is each test's
own business (started from ``/``, the systemd CT of tests/ops/test_follow_driver_drill.py
once bind-mounted "/"). Stdin (closed or ``/dev/null``), no controlling terminal and an
open-file limit of 256 were tried, and nothing in the suite depended on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

UMASK = 0o022

HARNESS = frozenset(
    {
        "GPUDOCTOR_REQUIRE_LAB",
        "GPUDOCTOR_OLAH_CLI",
        "GPUDOCTOR_TEST_CACHE",
        "GPUDOCTOR_TEST_WITHOUT_ENGINES",
        "GPUDOCTOR_REPORT_SCREENSHOT",
        "GPUDOCTOR_TIMELINE_SCREENSHOT",
        "GPUDOCTOR_BENCH_KILLS",
        "GPUDOCTOR_BENCH_KILL_SEED",
    }
)
"""The ``GPUDOCTOR_*`` variables the suite itself reads (tests/run.sh, .ci/run, a person):
kept. Every other one is one of gpudoctor's settings, and dropped."""

DROPPED_PREFIXES = ("LC_", "XDG_")
DROPPED = frozenset(
    {"LANGUAGE", "FORCE_COLOR", "NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE",
     "TTY_INTERACTIVE", "SSH_AUTH_SOCK", "SSH_AGENT_PID"}
)  # fmt: skip


def pinned(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """Return ``environ`` with what the suite relies on set, for the session's empty ``home``
    (see the module docstring), and the runner's values of those dropped."""
    kept = {
        name: value
        for name, value in environ.items()
        if not name.startswith(DROPPED_PREFIXES)
        and name not in DROPPED
        and (not name.startswith("GPUDOCTOR_") or name in HARNESS)
    }
    return {
        **kept,
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "LANG": "C.UTF-8",
        "COLUMNS": "80",
        "LINES": "24",
        "TERM": "dumb",
    }
