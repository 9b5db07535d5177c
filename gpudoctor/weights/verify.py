"""Is a directory what the manifest says? Quick (sizes) and full (sha256) checks.

quick: every file present with the right size (``stat``, metadata only).
full: additionally the sha256 of every file whose hash is known (the Hub's LFS
``oid``), hashed in parallel across cores (``sha256sum FILE`` each).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from gpudoctor.weights.complete import (
    HF_DOWNLOAD_DIR,
    FileProblem,
    completeness_problems,
    size_problems,
)
from gpudoctor.weights.localfs import file_sizes, list_names
from gpudoctor.weights.manifest import ManifestFile
from gpudoctor.weights.progress import Progress

READ_BYTES = 8 << 20


def quick_verify(
    directory: Path, files: Iterable[ManifestFile], follow_symlinks: bool = False
) -> list[FileProblem]:
    """Return the files that are missing or have the wrong size (empty list: all good).

    A symlink counts as missing unless ``follow_symlinks`` (a mirror's files may be links).
    """
    files = list(files)
    return size_problems(files, file_sizes(directory, [f.path for f in files], follow_symlinks))


def directory_problems(directory: Path, files: Iterable[ManifestFile]) -> list[FileProblem]:
    """Return why ``directory`` is not complete by :func:`completeness_problems` (the rule
    ``check``'s model.present applies too): sizes, then unfinished downloads left in it."""
    files = list(files)
    return completeness_problems(
        files,
        file_sizes(directory, [f.path for f in files]),
        list_names(directory),
        list_names(directory / HF_DOWNLOAD_DIR),
    )


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
    directory: Path,
    files: Iterable[ManifestFile],
    progress: Progress,
    workers: int | None = None,
    whole_directory: bool = False,
) -> list[FileProblem]:
    """Return quick problems plus the files whose sha256 differs from the known one.

    Files with no known sha256 are checked by size only. ``whole_directory``: the
    quick part is :func:`directory_problems` (unfinished downloads count too).
    """
    from gpudoctor.weights import pool as pools

    files = list(files)
    problems = (directory_problems if whole_directory else quick_verify)(directory, files)
    bad = {p.path for p in problems}
    hashed = [f for f in files if f.sha256 and f.path not in bad]
    workers = workers or max(1, os.cpu_count() or 1)
    with progress.phase("verify sha256", {f.path: f.size for f in hashed}):
        pool = pools.new_pool(workers, "sha256")
        error: BaseException | None = None
        try:
            futures = [pool.submit(sha256_of, directory / f.path, progress, f.path) for f in hashed]
            pools.wait_all(futures)  # Ctrl-C is seen at once, not after the last file
        except BaseException as exc:
            error = exc
            raise
        finally:
            pools.shutdown(pool, error)
        digests = [future.result() for future in futures]
    for f, digest in zip(hashed, digests, strict=True):
        if digest != f.sha256:
            problems.append(
                FileProblem(
                    f.path, "sha256", f"has sha256 {digest[:12]}…, expected {f.sha256[:12]}…"
                )
            )
    return problems
