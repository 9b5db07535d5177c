"""Check a bench output directory before any work starts (``--out``).

Uses the shared helper of ``gpudoctor/commands/options.py`` when it exists; until then
a local one with the same behaviour (nearest existing ancestor must take a new file).
"""

from __future__ import annotations

import os
import tempfile

import click

try:
    from gpudoctor.commands.options import require_writable_dir  # type: ignore[attr-defined]
except ImportError:  # the shared helper has not landed on this branch yet

    def require_writable_dir(path: str | os.PathLike[str] | None, option: str) -> None:
        """Raise click.UsageError (one line) unless ``path`` is, or can be created as, a
        directory that takes new files (``mkdir -p DIR && touch DIR/.x``); returns nothing."""
        if path is None:
            return
        text = os.fspath(path)
        existing = os.path.abspath(text)
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        why = None
        if not os.path.isdir(existing):
            why = f"{existing} is not a directory"
        else:
            try:
                fd, name = tempfile.mkstemp(dir=existing, prefix=".gpudoctor-probe-")
                os.close(fd)
                os.unlink(name)
            except OSError as exc:
                why = exc.strerror or str(exc)
        if why is not None:
            raise click.UsageError(
                f"cannot write {option} {text}: {why}; pick a writable directory (nothing was done)"
            )


__all__ = ["require_writable_dir"]
