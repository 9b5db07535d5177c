"""Is a directory what the manifest says? Quick (sizes) and full (sha256) checks.

quick: every file present with the right size (``stat``, metadata only).
full: additionally the sha256 of every file whose hash is known (the Hub's LFS
``oid``), hashed in parallel across cores (``sha256sum FILE`` each).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.weights.localfs import file_sizes
from gpudoctor.weights.manifest import ManifestFile
from gpudoctor.weights.progress import Progress

READ_BYTES = 8 << 20


@dataclass(frozen=True)
class FileProblem:
    """One file that is not right.

    Attributes:
        path: relative path.
        problem: ``missing``, ``size`` or ``sha256``.
        detail: a short human explanation (``size 10 != 12``).
    """

    path: str
    problem: str
    detail: str


def quick_verify(
    directory: Path, files: Iterable[ManifestFile], follow_symlinks: bool = False
) -> list[FileProblem]:
    """Return the files that are missing or have the wrong size (empty list: all good).

    A symlink counts as missing unless ``follow_symlinks`` (a mirror's files may be links).
    """
    files = list(files)
    sizes = file_sizes(directory, [f.path for f in files], follow_symlinks)
    problems: list[FileProblem] = []
    for f in files:
        actual = sizes[f.path]
        if actual is None:
            problems.append(FileProblem(f.path, "missing", "not a regular file"))
        elif actual != f.size:
            problems.append(FileProblem(f.path, "size", f"size {actual} != {f.size}"))
    return problems


def sha256_of(path: Path, progress: Progress, rel: str) -> str:
    """Return the hex sha256 of ``path`` (``sha256sum PATH``), reporting bytes as it reads."""
    digest = hashlib.sha256()
    buffer = bytearray(READ_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            progress.advance(rel, n)
    progress.file_done(rel)
    return digest.hexdigest()


def full_verify(
    directory: Path, files: Iterable[ManifestFile], progress: Progress, workers: int | None = None
) -> list[FileProblem]:
    """Return quick problems plus the files whose sha256 differs from the known one.

    Files with no known sha256 are checked by size only.
    """
    from concurrent.futures import ThreadPoolExecutor

    files = list(files)
    problems = quick_verify(directory, files)
    bad = {p.path for p in problems}
    hashed = [f for f in files if f.sha256 and f.path not in bad]
    workers = workers or max(1, os.cpu_count() or 1)
    with (
        progress.phase("verify sha256", {f.path: f.size for f in hashed}),
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sha256") as pool,
    ):
        digests = list(pool.map(lambda f: sha256_of(directory / f.path, progress, f.path), hashed))
    for f, digest in zip(hashed, digests, strict=True):
        if digest != f.sha256:
            problems.append(
                FileProblem(f.path, "sha256", f"sha256 {digest[:12]}… != {f.sha256[:12]}…")
            )
    return problems
