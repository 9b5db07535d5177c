"""Terminal manners: no escape sequence at all when ``TERM=dumb`` or ``NO_COLOR`` is set.

``NO_COLOR`` (https://no-color.org, any non-empty value) and ``TERM=dumb`` both mean: plain
text only, no colour, no cursor movement (``\\r\\033[K`` progress lines), no live display.
"""

from __future__ import annotations

import os
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
