"""Reading the run directories ``bench merge`` joins, as untrusted input.

Root often merges directories that other users' jobs wrote (Slurm tasks, copied shards).
What a merge reads from an input, and how (issue 33.1):

* the input directory itself must belong to the caller or root and be writable by nobody
  else, and so must its ancestors (a sticky one like /tmp is fine above it):
  :func:`check_input`;
* ``plan.toml``, ``results.jsonl``, ``raw/NAME`` and ``logs/...`` are opened without
  following a link (a planted ``raw/k.jsonl -> /etc/shadow`` is refused, never copied);
* a record's ``key`` names a file in the merged run (``raw/KEY.jsonl``): only a plain
  file name is accepted (:func:`safe_key`), never ``../x`` or ``/etc/cron.d/x``;
* a record's ``raw`` is read only as ``raw/NAME`` (``../../etc/shadow`` is not read).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.bench.results.run_dir import RunDirError, read_run_file

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class InputError(RuntimeError):
    """An input cannot be merged safely (one line for the CLI)."""


def safe_key(key: object) -> str | None:
    """Return ``key`` when it is a plain file name (letters, digits, ``._-``, no path
    separator, not ``.``/``..``); None otherwise (the record is left out)."""
    text = str(key) if isinstance(key, str) else ""
    return text if _KEY.fullmatch(text) else None


def check_input(path: Path) -> Path:
    """Return the real directory of the merge input ``path`` after checking that nobody
    but the caller or root controls it or its ancestors (``stat -c '%U %a' DIR``).

    Raises InputError naming the path, the owner or mode, and what to do."""
    real = Path(os.path.realpath(path))
    fix = (
        f"merge only runs you or root own: run the merge as that user, or copy it first"
        f" (cp -r {path} DIR-of-yours) and merge the copy"
    )
    try:
        fsio.check_ancestors(real.parent, "merge input")
        st = os.lstat(real)
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(f"{path} (a merge input) is not a directory")
        fsio.judge_owner(real, st, "a merge input", fix)
    except fsio.FsioError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"cannot read merge input {path}: {exc.strerror or exc}") from None
    return real


def read_file(path: Path) -> bytes | None:
    """Return the bytes of a run file (``cat DIR/NAME``), None when absent; never through
    a link (InputError for a link, FIFO or device)."""
    try:
        return read_run_file(path)
    except RunDirError as exc:
        raise InputError(str(exc)) from None


def read_raw(run: Path, raw: object) -> bytes | None:
    """Return the bytes of a record's raw per-request file when it is ``raw/NAME`` in
    ``run`` and a regular file reached without a link; None otherwise."""
    if not isinstance(raw, str):
        return None
    parts = Path(raw).parts
    if len(parts) != 2 or parts[0] != "raw" or parts[1] in ("..", "."):
        return None
    try:
        return fsio.read_regular(run / "raw" / parts[1])
    except OSError:
        return None


def log_files(run: Path) -> tuple[list[tuple[Path, bytes]], list[str]]:
    """Return the regular files under ``run/logs`` (relative path, bytes) and what was
    left out (a link, a FIFO, a linked ``logs/``); ``find DIR/logs -type f``."""
    logs = run / "logs"
    found: list[tuple[Path, bytes]] = []
    skipped: list[str] = []
    if not os.path.lexists(logs):
        return found, skipped
    if not os.path.isdir(logs) or os.path.islink(logs):
        return found, [f"{logs} is not a directory (a link?): its logs were not copied"]
    for top, dirs, files in os.walk(logs):  # never descends into a linked directory
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = Path(top) / name
            try:
                found.append((path.relative_to(logs), fsio.read_regular(path)))
            except OSError as exc:
                skipped.append(f"{path} not copied: {exc}")
    return found, skipped
