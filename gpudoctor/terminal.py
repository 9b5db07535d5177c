"""Terminal manners: no escape sequence at all when ``TERM=dumb`` or ``NO_COLOR`` is set,
and none ever from text another party wrote (:func:`printable`).

``NO_COLOR`` (https://no-color.org, any non-empty value) and ``TERM=dumb`` both mean: plain
text only, no colour, no cursor movement (``\\r\\033[K`` progress lines), no live display.
"""

from __future__ import annotations

import os
import unicodedata
from typing import TextIO


def plain_output() -> bool:
    """Return True when escape sequences are not wanted (``NO_COLOR`` set and non-empty,
    or ``TERM`` is ``dumb``)."""
    return os.environ.get("NO_COLOR", "") != "" or os.environ.get("TERM", "").lower() == "dumb"


def enforce_plain_output() -> None:
    """When :func:`plain_output`, set ``TERM=dumb`` for this process so every Rich console
    (ours and libraries') drops colour and live displays too. Returns nothing."""
    if plain_output():
        os.environ["TERM"] = "dumb"


def live(stream: TextIO) -> bool:
    """Return True when ``stream`` may get live (overwritten, coloured) output: it is a
    terminal and plain output was not asked for."""
    try:
        return stream.isatty() and not plain_output()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False


# A container, a server under test or a plan author chooses some strings gpudoctor prints
# (a crash reason, a log line, a configuration name): raw, an escape among them writes the
# clipboard (OSC 52), renames the terminal or clears it, and a newline adds a script line.
# C0, DEL, C1 (Cc); line/paragraph separators; bidi overrides and isolates that reorder text
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def _unsafe(char: str, keep: str) -> bool:
    if char in keep:
        return False
    return unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in _BIDI


def printable(text: object, keep: str = "") -> str:
    """Return ``text`` with every control character (C0, DEL, C1, U+2028/2029, bidi
    overrides) but those in ``keep`` written as a visible escape (``\\x1b``, ``\\u2028``):
    nothing of it can drive a terminal or start a new line (``cat -v``)."""
    text = str(text)
    if not any(_unsafe(c, keep) for c in text):
        return text
    out = []
    for char in text:
        if not _unsafe(char, keep):
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}")
    return "".join(out)
