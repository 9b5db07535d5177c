"""gpudoctor's error policy: every failure a user meets is one line, never a traceback.

The documented form, always the last line on stderr::

    gpudoctor: error: <what failed>; <what to do>

Exit codes (:class:`gpudoctor.exit_codes.ExitCode`): 1 gpudoctor could not do its job (a host unreachable, a file unreadable),
2 the invocation is wrong (usage), 130 interrupted (Ctrl-C). A traceback is printed only
with the root ``--debug`` flag or ``GPUDOCTOR_DEBUG=1``. Only the standard library and
click are imported here: ``gpudoctor --help`` stays fast.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
from collections.abc import Sequence

import click

PREFIX = "gpudoctor: error: "
# What the line says to do when the message itself does not say it (it has no "; ").
USAGE_HINT = "see '{command} --help'"
ERROR_HINT = "run it again with --debug for the details"
INTERNAL_HINT = "this is a gpudoctor bug: run it again with --debug and report the traceback"

_debug = [False]


def set_debug(enabled: bool) -> None:
    """Turn tracebacks on (the root ``--debug`` flag). Returns nothing."""
    _debug[0] = enabled or _debug[0]


def debug_enabled() -> bool:
    """Return True when tracebacks are wanted (``--debug`` or ``GPUDOCTOR_DEBUG=1``)."""
    return _debug[0] or os.environ.get("GPUDOCTOR_DEBUG", "") not in ("", "0")


def quiet_library_loggers() -> None:
    """Keep libraries' own log records (paramiko's "Exception (client): Error reading SSH
    protocol banner" and its traceback) off stderr unless ``--debug``: gpudoctor reports
    the failure itself, in one line. Returns nothing."""
    if debug_enabled():
        return
    for name in ("paramiko", "urllib3", "httpx", "httpcore", "filelock", "huggingface_hub"):
        logger = logging.getLogger(name)
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def quiet_thread_tracebacks() -> None:
    """Make an exception that escapes a worker thread one line on stderr (the thread's name
    and the error), not a traceback, unless ``--debug``. Returns nothing."""
    import threading

    default = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if debug_enabled() or args.exc_type is SystemExit:
            default(args)
            return
        name = args.thread.name if args.thread is not None else "a thread"
        what = f"{name} failed: {args.exc_type.__name__}: {args.exc_value}"
        sys.stderr.write(f"gpudoctor: warning: {one_line(what)}\n")

    threading.excepthook = hook


def one_line(text: str) -> str:
    """Return ``text`` folded onto one line (newlines become ``; ``, blanks collapsed)."""
    parts = [" ".join(line.split()) for line in str(text).splitlines()]
    return "; ".join(p for p in parts if p) or "unknown error"


def error_line(what: str, todo: str = "") -> str:
    """Return the documented one-line form ``gpudoctor: error: <what>; <what to do>``.

    ``what`` that already says what to do (it holds ``; ``) is kept as it is."""
    has_advice = any("; " in line for line in str(what).splitlines())
    what = one_line(what)
    for prefix in ("gpudoctor: error: ", "gpudoctor: ", "error: ", "Error: "):
        what = what.removeprefix(prefix)
    if has_advice or not todo:
        return PREFIX + what
    return f"{PREFIX}{what.rstrip('.')}; {todo}"


def describe(exc: BaseException) -> tuple[str, str]:
    """Return (what failed, what to do) for an exception that escaped a command."""
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc) or type(exc).__name__
        if exc.filename:
            what = f"{exc.filename}: {what}"
        return what, "check the path and its permissions, then run it again"
    name = type(exc).__name__
    if name == "HostError":
        return (
            str(exc),
            "check the host named above (reachable over SSH, the container exists and runs), then run it again",
        )
    if isinstance(exc, ValueError):
        return str(exc), ERROR_HINT
    return f"{name}: {exc}", INTERNAL_HINT


def wants_json(argv: Sequence[str]) -> bool:
    """Return True when the command line asks for JSON (``--json`` or ``--format json``)."""
    args = list(argv[: argv.index("--")] if "--" in argv else argv)
    pairs = itertools.pairwise(args)
    return "--json" in args or "--format=json" in args or ("--format", "json") in pairs


def report(what: str, todo: str, code: int, argv: Sequence[str]) -> int:
    """Print the error (one line on stderr; a JSON object on stdout when the command line
    asked for ``--json``); return ``code``."""
    line = error_line(what, todo)
    try:
        if wants_json(argv):
            message = line.removeprefix(PREFIX)
            click.echo(json.dumps({"ok": False, "error": message, "exit_code": code}))
        sys.stdout.flush()
    except OSError:  # stdout itself is what failed (``--json > /dev/full``): stderr says it
        silence_stdout()
    click.echo(line, err=True)
    return code


def silence_stdout() -> None:
    """Point fd 1 at /dev/null and drop what is buffered for it, so that nothing more is
    written to a stdout that failed (no "Exception ignored" at exit); returns None."""
    import contextlib
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()  # the buffer now drains into /dev/null


def stdout_failure(exc: BaseException) -> bool:
    """Return True when ``exc`` is a failed write to stdout (ENOSPC on ``> /dev/full``, EIO,
    EBADF on a closed stdout), as opposed to any other OSError."""
    import errno

    if not (isinstance(exc, OSError) and getattr(exc, "filename", None) is None and exc.errno in (
            errno.ENOSPC, errno.EIO, errno.EBADF, errno.EDQUOT)):  # fmt: skip
        return False
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # another file's full disk is not stdout's
        return not _stdout_has_room()
    return True


def _stdout_has_room() -> bool:
    """Return True when stdout is a pipe, socket or terminal (no ENOSPC there) or a file on
    a file system with free space (``df`` of stdout's file); False for /dev/full, a full
    file system or a closed stdout."""
    import stat

    try:
        fd = sys.stdout.fileno()
        st = os.fstat(fd)
        if stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode) or os.isatty(fd):
            return True
        if stat.S_ISREG(st.st_mode):
            vfs = os.fstatvfs(fd)
            return vfs.f_bavail * vfs.f_frsize > 1 << 20
    except (OSError, ValueError, AttributeError):
        return False
    return False
