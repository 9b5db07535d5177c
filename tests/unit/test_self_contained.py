"""The repository stands alone: no test, benchmark or module reads a path outside it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.recorded import RECORDED, REPO_ROOT

# Paths that leave the repository: the steering repo's shared folder beside the checkout, an
# absolute path under the workplace's root, or a parent of the repo root computed from
# __file__. The words are assembled from parts so that this file does not itself contain
# the forms it looks for (a scanner of the whole tree would flag it).
_SHARED, _ROOT = "sha" + "red", "/wo" + "rk"
OUTSIDE = re.compile(
    rf"\.\./{_SHARED}\b|{_ROOT}/{_SHARED}|{_ROOT}/main|parents\[\d\]\.parent\b"
    rf'|"{_SHARED}" / "data"'
)
SCANNED = ("tests", "benchmarks", "gpudoctor", "checks", ".ci")


def scanned_files() -> list[Path]:
    """Return every source file of the scanned folders (Python, shell, TOML)."""
    files: list[Path] = []
    for folder in SCANNED:
        for path in (REPO_ROOT / folder).rglob("*"):
            if path.is_file() and (path.suffix in {".py", ".sh", ".toml"} or path.name == "run"):
                files.append(path)
    return files


def test_no_source_file_references_a_path_outside_the_repository() -> None:
    """A clone alone must pass: a reference to the shared folder beside the checkout, or to
    an absolute path of the workplace, is a defect."""
    here = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in scanned_files()
        if path.resolve() != here
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert offenders == []


def test_the_scan_would_catch_an_outside_reference() -> None:
    """The pattern is not vacuous: it flags the forms that existed before the copy."""
    for line in (
        f'DATA = Path("{_ROOT}/{_SHARED}/data")',
        f"see ../{_SHARED}/recipes/x.md",
        f'Path(__file__).resolve().parents[2].parent / "{_SHARED}" / "data"',
    ):
        assert OUTSIDE.search(line), line


def test_the_recorded_captures_are_in_the_repository() -> None:
    """The captures the unit tests use exist inside the repo, each folder with its sources."""
    assert (RECORDED / "SOURCES.md").is_file()
    assert (RECORDED / "proc_devices" / "h200-lab_580.159.04_proc-devices.txt").is_file()
    for folder in ("community", "outputs", "proc_devices"):
        assert (RECORDED / folder / "SOURCES.md").is_file(), folder
