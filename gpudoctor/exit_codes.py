"""gpudoctor's exit codes: one ``IntEnum`` that every command returns.

The README's "Exit codes" table lists, per command, what each number means there;
``tests/cli/test_exit_code_table.py`` holds that table, each command's ``--help`` and
:data:`BY_COMMAND` against this enum. Stdlib only (``enum`` is imported by click anyway):
``gpudoctor --help`` imports this module.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The process exit status of every gpudoctor command."""

    OK = 0
    """check: healthy (warnings allowed); fix: applied, or nothing to change; weights:
    complete; bench: every cell ran, report written; list: listed."""

    ERROR = 1
    """gpudoctor could not do its job: host unreachable, file unreadable or unwritable,
    API login failed, plug-in failed to load (one line on stderr, never a traceback)."""

    USAGE = 2
    """The invocation is wrong: bad option value, exclusive flags, missing argument."""

    FAILED = 3
    """The job ran and the answer is no. check: at least one FAIL or ERROR; fix: not
    applied, failed, rolled back, or nothing to pass through; weights status: the directory
    is not complete; weights mirror --verify: a file is missing or wrong; bench run: a preflight check FAILed, a cell FAILED (its requests failed), crashed its server in this
    run or was client-bound, or every cell was skipped."""

    NOTHING_DONE = 4
    """The run proved or changed nothing, and must not read as success. check: nothing
    was checked (every finding SKIP); fix: changes pending, nothing written (``--dry-run``,
    declined, or no ``--yes`` and no terminal), like ``terraform plan -detailed-exitcode``."""

    INTERRUPTED = 130
    """Interrupted (Ctrl-C, 128 + SIGINT); running it again resumes where that applies."""

    def __str__(self) -> str:
        """Return the number (``"3"``), as ``int`` does, on every Python version."""
        return str(self.value)


E = ExitCode
BY_COMMAND: dict[str, tuple[ExitCode, ...]] = {
    "check": (E.OK, E.ERROR, E.USAGE, E.FAILED, E.NOTHING_DONE, E.INTERRUPTED),
    "fix": (E.OK, E.ERROR, E.USAGE, E.FAILED, E.NOTHING_DONE, E.INTERRUPTED),
    "weights ensure": (E.OK, E.ERROR, E.USAGE, E.INTERRUPTED),
    "weights status": (E.OK, E.ERROR, E.USAGE, E.FAILED),
    "weights mirror": (E.OK, E.ERROR, E.USAGE, E.FAILED),
    "bench run": (E.OK, E.ERROR, E.USAGE, E.FAILED, E.INTERRUPTED),
    "bench report": (E.OK, E.ERROR, E.USAGE),
    "bench merge": (E.OK, E.ERROR, E.USAGE),  # and bench submit --slurm, bench status
    "list": (E.OK, E.ERROR, E.USAGE),
    "--version": (E.OK,),
}
"""The codes each command documents (the README's table, one row per key)."""
del E
