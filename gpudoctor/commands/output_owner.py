"""Whether a file at an output path is one gpudoctor wrote (issue 47.1).

``check -o``, ``bundle -o`` and ``service rules -o`` replace the file at their path only
when it is gpudoctor's own output (or ``--force`` is given), as ``bench report --out`` and
``list --markdown`` do: a user's notes, a config or a report of another tool at that name
is never replaced without a word. Each writer recognises what it writes by its shape:

- ``check``: a JSON report (``"schema": "gpudoctor.``), a Prometheus textfile
  (``# HELP gpudoctor_``) or a human report (its closing line ``PASS  local: 3 PASS in
  0.12 s``);
- ``bundle``: a gzip'd tar whose first member is ``gpudoctor-bundle/``;
- ``service rules``: the rules file's first line.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Callable

Recogniser = Callable[[bytes, bytes], bool]
HEAD = 4096  # bytes read from each end of the file

_HUMAN_SUMMARY = re.compile(rb"^(PASS|SKIP|WARN|FAIL|ERROR)  .*: .* in \d+\.\d\d s$")
RULES_FIRST_LINE = b"# Prometheus alerting rules for gpudoctor"
BUNDLE_TOP = b"gpudoctor-bundle"


def check_report(head: bytes, tail: bytes) -> bool:
    """Return True when ``head``/``tail`` (a file's first and last bytes) are those of a
    ``gpudoctor check`` report in any format: JSON, Prometheus textfile or human."""
    if head.startswith(b"# HELP gpudoctor_"):
        return True
    if head.startswith(b"{") and b'"schema": "gpudoctor.' in head:
        return True
    return bool(_HUMAN_SUMMARY.match(tail.rstrip(b"\n").rpartition(b"\n")[2]))


def bundle_archive(head: bytes, tail: bytes) -> bool:
    """Return True when ``head`` is the start of a gzip'd tar whose first member is
    gpudoctor-bundle/ (what ``gpudoctor bundle`` writes)."""
    top = BUNDLE_TOP + b"/"  # the first member's name: the directory, or a file in it
    try:
        return gzip.GzipFile(fileobj=io.BytesIO(head)).read(len(top)) == top
    except (OSError, EOFError, zlib.error):
        return False


def alert_rules(head: bytes, tail: bytes) -> bool:
    """Return True when ``head`` starts with the first line of ``service rules``' file."""
    return head.startswith(RULES_FIRST_LINE)


def ends_of(path: str) -> tuple[bytes, bytes] | None:
    """Return the first and last :data:`HEAD` bytes of the regular file ``path`` (read
    without following a link), or None when there is no file there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # no link, no wait
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(HEAD)
        size = os.fstat(fd).st_size
        fh.seek(max(0, size - HEAD))
        return head, fh.read()


def foreign(path: str, recognise: Recogniser) -> str | None:
    """Return why ``path`` must not be replaced (it holds something gpudoctor did not
    write), or None when it is absent, empty or gpudoctor's own output."""
    try:
        ends = ends_of(path)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return f"it exists and cannot be read to tell whether gpudoctor wrote it ({why})"
    if ends is None or not any(ends) or recognise(*ends):
        return None
    return "it exists and gpudoctor did not write it"
