"""Strings of a run directory (names its author chose, a server's words) as literal
Markdown: shared by report.md's tables and its "Server signals" section."""

from __future__ import annotations

import re

from gpudoctor.terminal import printable

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&|~#])")  # what gives inline text a meaning


def md_text(text: object) -> str:
    """Return ``text`` (a config name, a GPU id, a status, a directory name: strings the run
    directory's author chose) as literal Markdown inline text: every character CommonMark
    or GFM gives a meaning inside a line (``<`` of raw HTML, ``|`` of a table, ``[`` of a
    link, ``&`` of an entity, ``*``/``_`` of emphasis...) backslash-escaped, control characters shown
    escaped (:func:`gpudoctor.terminal.printable`), so no renderer makes HTML of it.
    ``-``, ``+``, ``.`` and ``!`` need nothing: they mean something only at a line's start
    or before ``[``, and these strings never start a line."""
    return _MD_SPECIAL.sub(r"\\\1", printable(text))
