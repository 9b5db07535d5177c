"""Small helpers to write systemd unit files safely (pure, no I/O)."""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Iterable, Sequence

UNIT_DIR = "/etc/systemd/system"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_UNSAFE_PATH = re.compile(r"[\s\\\"']")


class ServiceError(ValueError):
    """A value that cannot go into a unit file; its message says which and why."""


def check_words(words: Iterable[str], what: str) -> tuple[str, ...]:
    """Return ``words`` as a tuple when none holds a control character (newline, tab, CR,
    ESC, DEL, C1) or a Unicode line/paragraph separator; raise ServiceError naming the word.

    A newline in a word that reaches a unit file starts a new directive
    (``ExecStartPost=...``); nothing that goes into a unit or its wrapper may hold one."""
    checked = tuple(words)
    for word in checked:
        bad = next((c for c in word if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
        if bad is not None:
            raise ServiceError(
                f"{what} {word!r} holds a control character ({bad!a}): it would break"
                " out of its line in the unit file; remove it"
            )
    return checked


def check_name(name: str) -> str:
    """Return ``name`` when it is a valid unit name part (letters, digits, ``_.-``)."""
    if not _NAME.match(name):
        raise ServiceError(
            f"service name {name!r} is not usable in a unit name: use letters, digits, '_', '.', '-'"
        )
    return name


def check_path(path: str, what: str) -> str:
    """Return ``path`` when it is absolute and holds no whitespace, quote or backslash
    (systemd's ``Condition*=`` and ``ExecStart=`` would split or unescape it)."""
    check_words([path], what)
    if not path.startswith("/"):
        raise ServiceError(f"{what} must be an absolute path, got {path!r}")
    if _UNSAFE_PATH.search(path):
        raise ServiceError(f"{what} {path!r} holds whitespace, a quote or a backslash")
    return path


def escape(value: str) -> str:
    """Return ``value`` with systemd specifiers and variable references escaped
    (``%`` -> ``%%``, ``$`` -> ``$$``)."""
    return value.replace("%", "%%").replace("$", "$$")


def exec_line(argv: Sequence[str]) -> str:
    """Return ``argv`` as an ``ExecStart=`` value: each word quoted when needed, specifiers
    escaped (systemd's command-line quoting accepts shell-style double quotes); raise
    ServiceError for a word holding a control character."""
    check_words(argv, "a word of ExecStart=")
    words = []
    for word in argv:
        if re.search(r"[\s\"'\\;]", word) or word == "":
            word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
        words.append(escape(word))
    return " ".join(words)


def sh_words(argv: Sequence[str]) -> str:
    """Return ``argv`` quoted for a POSIX shell script (``shlex.join``); raise ServiceError
    for a word holding a control character."""
    return shlex.join(check_words(argv, "a word of the wrapper"))
