"""The engine's own last error line, read from the tail of its server log.

A server that dies at start says why in its log, in its own words: a Python traceback ending
in the exception line (vLLM 0.32.0's ``vllm/config/model.py`` raises ``ValueError:
User-specified max_model_len (4096) is greater than the derived max_model_len ...``, which
pydantic wraps as ``pydantic_core._pydantic_core.ValidationError: 1 validation error for
ModelConfig`` with the ``Value error, ...`` on the next line; transformers 5's
``modeling_utils.py`` raises ``ImportError: FlashAttention2 has been toggled on, but it
cannot be used ...``), or a log line at level ERROR / CRITICAL / FATAL, or an exception
line printed without its traceback (``OSError: [Errno 98] Address already in use``). :func:`engine_error`
finds that line, so a crashed start's one-line reason names the engine's cause instead of
only "exited with code 1".
"""

from __future__ import annotations

import re

MAX_CHARS = 300  # a reason is one line of a table; the log keeps the rest

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# a child's line prefixed by its parent (vLLM: "(EngineCore_DP0 pid=1234) ", "(APIServer pid=9) ")
_PROC_PREFIX = re.compile(r"^\((?:\w|[ -])+ pid=\d+\)\s?")
_TRACEBACK = "Traceback (most recent call last):"
# an exception line: a (dotted) class name, then ": message" or nothing
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(?::\s?(.*))?$")
_ERROR_WORDS = re.compile(
    r"(?:^|[\s\[(])(?:ERROR|CRITICAL|FATAL|[Ff]atal(?: error)?:|[Ee]rror:"
    r"|(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): )"  # an exception line printed alone
)
# a logger's head before the message: "ERROR 12-07 05:00:00 [core.py:700] " (vLLM),
# "[2026-12-07 05:00:00] ERROR " and "2026-12-07 05:00:00,123 - x - ERROR - " (others)
_LOG_HEAD = re.compile(
    r"^(?:\[[^\]]*\]\s*)?(?:[\d:.,-]+\s+)*(?:- \S+ - )?(ERROR|CRITICAL|FATAL)"
    r"(?:\s+[\d:.,-]+)*(?:\s*\[[^\]]*\])?(?:\s*-)?\s*"
)
_WRAPPER = re.compile(r"see (?:the )?root cause above", re.IGNORECASE)
_PYDANTIC_TRAILER = re.compile(r"\s*\[type=\w+.*$")


def _clean(line: str) -> str:
    """Return ``line`` without colour codes and a parent's process prefix, trailing blanks cut."""
    return _PROC_PREFIX.sub("", _ANSI.sub("", line)).rstrip()


def _exception_after(lines: list[str], start: int) -> tuple[str, int] | None:
    """Return the exception line closing the traceback whose header is ``lines[start]``
    (the first unindented line after its frames) and its index; None when the tail ends
    inside the frames. A logger's head before the header (vLLM's formatter repeats
    ``ERROR 12-07 05:00:00 [core.py:708]`` on every line of one record) is taken off each
    line that carries it."""
    head = lines[start][: lines[start].index(_TRACEBACK)]
    if head:
        for i in range(start + 1, len(lines)):
            if lines[i].startswith(head):
                lines[i] = lines[i][len(head) :]
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if not line.strip() or line[:1].isspace():
            continue  # a frame, its source line, a ^^^ marker
        named = _EXCEPTION.match(line)
        if named and not line.startswith(_TRACEBACK):  # the class without its module path
            return line[named.start(1) :], i
        return None
    return None


def _with_detail(line: str, lines: list[str], index: int) -> str:
    """Return the exception line, joined to its first indented detail line when the line
    itself only counts (pydantic: ``1 validation error for ModelConfig`` then the error)."""
    if not re.search(r"\d+ validation errors? for \w+$", line):
        return line
    for nxt in lines[index + 1 : index + 3]:
        detail = _PYDANTIC_TRAILER.sub("", nxt.strip())
        if detail:
            return f"{line}: {detail}"
    return line


def _from_tracebacks(lines: list[str]) -> str | None:
    """Return the exception line of the last traceback of ``lines`` (of the one before when
    the last only points at it: "see root cause above"); None without a traceback."""
    found: list[str] = []
    lines = list(lines)  # heads are taken off in place
    for i, line in enumerate(lines):
        if line.rstrip().endswith(_TRACEBACK):
            closing = _exception_after(lines, i)
            if closing is not None:
                found.append(_with_detail(closing[0], lines, closing[1]))
    while len(found) > 1 and _WRAPPER.search(found[-1]):
        found.pop()
    return found[-1] if found else None


def _from_log_levels(lines: list[str]) -> str | None:
    """Return the message of the last line logged at an error level, or None."""
    for line in reversed(lines):
        if _ERROR_WORDS.search(line) and not line.lstrip().endswith(_TRACEBACK):
            message = _LOG_HEAD.sub("", line.strip()).strip()
            return message or line.strip()
    return None


def engine_error(tail: list[str]) -> str | None:
    """Return the engine's own last error line in ``tail`` (the last lines of its log): the
    exception line of its last Python traceback, else its last ERROR / CRITICAL / FATAL
    line; one line of at most :data:`MAX_CHARS` characters, or None when it names none."""
    lines = [_clean(line) for line in tail]
    found = _from_tracebacks(lines) or _from_log_levels(lines)
    if not found:
        return None
    found = " ".join(found.split())
    return found if len(found) <= MAX_CHARS else found[: MAX_CHARS - 3] + "..."


def with_engine_error(reason: str, tail: list[str]) -> str:
    """Return ``reason`` followed by the engine's own last error line of ``tail``
    (``reason: ValueError: ...``), or ``reason`` alone when the log names none."""
    found = engine_error(tail)
    return f"{reason}: {found}" if found else reason
