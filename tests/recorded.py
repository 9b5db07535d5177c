"""Where the recorded real-world captures live: ``tests/data/recorded`` (copied into the repo).

The repository stands alone: every capture its tests, benchmarks and docs use is a file
under :data:`RECORDED` (see ``tests/data/recorded/SOURCES.md`` for where each came from).
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RECORDED = REPO_ROOT / "tests" / "data" / "recorded"


def recorded_file(relative: str) -> str:
    """Return the text of ``tests/data/recorded/<relative>`` (a recorded real-world capture)."""
    return (RECORDED / relative).read_text()
