"""Parallel file copy at line rate (the mirror restore).

Big files are cut into chunks; a pool of threads copies chunks of all files at once
with ``sendfile(2)``/``copy_file_range(2)`` (the kernel moves the bytes; Python only
schedules), so a disk mirror -> tmpfs restore is limited by the disk, not by one
``read``/``write`` loop. Equivalent shell: ``cp -r SRC/. DST/`` (single-threaded).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.weights.progress import Progress

CHUNK_BYTES = 64 << 20
SENDFILE_STEP = 8 << 20


@dataclass(frozen=True)
class CopyJob:
    """One chunk to copy.

    Attributes:
        rel: the file's path relative to both roots.
        offset: first byte of the chunk.
        length: bytes in the chunk.
    """

    rel: str
    offset: int
    length: int


def plan_chunks(sizes: dict[str, int], chunk_bytes: int = CHUNK_BYTES) -> list[CopyJob]:
    """Return the chunks for ``sizes`` ({path: bytes}), biggest files first (better packing)."""
    jobs: list[CopyJob] = []
    for rel, size in sorted(sizes.items(), key=lambda item: -item[1]):
        if size == 0:
            jobs.append(CopyJob(rel, 0, 0))
        for offset in range(0, size, chunk_bytes):
            jobs.append(CopyJob(rel, offset, min(chunk_bytes, size - offset)))
    return jobs


def _copy_range(src: Path, dst: Path, job: CopyJob, on_bytes: Callable[[int], None]) -> None:
    """Copy one chunk with sendfile into a dst fd positioned at the chunk (own fd per chunk)."""
    if job.length == 0:
        return
    with open(src, "rb", buffering=0) as fin, open(dst, "r+b", buffering=0) as fout:
        in_fd, out_fd = fin.fileno(), fout.fileno()
        os.lseek(out_fd, job.offset, os.SEEK_SET)
        offset, end = job.offset, job.offset + job.length
        while offset < end:
            sent = os.sendfile(out_fd, in_fd, offset, min(SENDFILE_STEP, end - offset))
            if sent == 0:
                raise OSError(f"{src} ended early at byte {offset} (expected {end})")
            offset += sent
            on_bytes(sent)


def copy_files(
    source: Path,
    dest: Path,
    sizes: dict[str, int],
    progress: Progress,
    workers: int | None = None,
    sync: bool = False,
) -> None:
    """Copy ``sizes``' files (relative paths) from ``source`` to ``dest`` in parallel.

    ``sync``: flush each file to disk (``fsync``) once written. Returns None; raises
    OSError on the first failure (the destination is a ``.partial`` directory, so a
    half copy is never mistaken for a complete model).
    """
    workers = workers or min(16, max(4, (os.cpu_count() or 2) * 2))
    for rel, size in sizes.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as handle:
            handle.truncate(size)
    remaining = dict(sizes)
    jobs = plan_chunks(sizes)

    def run(job: CopyJob) -> None:
        _copy_range(source / job.rel, dest / job.rel, job, lambda n: progress.advance(job.rel, n))

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="copy") as pool:
        for job, _ in zip(jobs, pool.map(run, jobs), strict=True):
            remaining[job.rel] -= job.length
            if remaining[job.rel] == 0:
                if sync:
                    _fsync(dest / job.rel)
                progress.file_done(job.rel)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_tree_files(source: Path, dest: Path, paths: Iterable[str], progress: Progress) -> None:
    """Copy ``paths`` (sizes read with ``stat``) from ``source`` to ``dest``; see copy_files."""
    copy_files(source, dest, {rel: (source / rel).stat().st_size for rel in paths}, progress)
