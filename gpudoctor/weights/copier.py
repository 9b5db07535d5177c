"""Parallel file copy at line rate (the mirror restore).

The files are cut into chunks and a pool of threads, sized to the CPU count, copies
chunks of all files at once, so a disk mirror -> tmpfs restore keeps many reads in
flight (cold page cache) and many memory copies running (warm page cache).

- Chunks are handed out round-robin across files: threads work on different files
  whenever there are enough of them. A write into one file takes that file's inode
  lock (Linux ``i_rwsem``; gVisor's per-file data lock), so threads writing the same
  file with ``write``/``sendfile`` would take turns.
- Each chunk is copied with ``sendfile(2)`` at its offset, 64 MiB per call: the
  kernel moves the bytes and Python only schedules. Measured on a 16-CPU H200 box
  (gVisor), page cache -> tmpfs: 18-21 GB/s over 11 shards and 8 GB/s over 4 shards,
  where 16 parallel ``cp`` reached 9-18 and 4-7 GB/s. ``pread``/``pwrite`` through a
  buffer was 10-15% slower, ``copy_file_range`` fails across filesystems (EXDEV), and
  filling a mapped destination (mmap + preadv, no inode lock) was 2-4x slower.

Each file is built in ``DEST/.gpudoctor-incomplete/`` (created ``O_NOFOLLOW``: a symlink
planted in the destination is never followed) and renamed to its path only once every
chunk is in, so the unit of resume is a finished file: an interrupted copy leaves whole
files and temp files, never a file of the right size with a hole in it.

Ctrl-C stops at once (:mod:`gpudoctor.weights.pool`): the signal reaches the main thread
in its wait, which sets a stop flag that every thread checks between two ``sendfile``
calls, cancels the chunks not started and re-raises without joining the threads
(``weights ensure`` then exits 130). Equivalent shell: ``cp -r SRC/. DST/``,
run as N parallel ``cp`` streams.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from gpudoctor import fsio
from gpudoctor.weights import pool as pools
from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.copy_hash import FrontierHash
from gpudoctor.weights.localfs import INCOMPLETE_DIR, move_into, private_subdir
from gpudoctor.weights.progress import Progress

MIN_CHUNK = 16 << 20
MAX_CHUNK = 256 << 20
STEP_BYTES = 64 << 20
# A hashed copy uses small chunks: a file's hash trails its copy by the chunks in flight
# (one core hashes it, about 1 GB/s), and that lag is what the restore waits for at the
# end. 10.45 GB cold on the H200 box: 164 MiB chunks hashed at 0.81 of the disk's limit.
HASH_MAX_CHUNK = 32 << 20
ALIGN = 2 << 20


class CopyStopped(Exception):
    """A chunk gave up because the copy is being stopped (another chunk failed, or Ctrl-C)."""


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


def default_workers() -> int:
    """Return the copy threads for this machine: the usable CPUs, 8 to 64.

    On the 16-CPU H200 box, 16 threads copying 64 MiB per ``sendfile`` read a cold
    mirror at 1.8-2.0 GB/s (16 parallel ``dd``: 1.8) and a warm one at 20-21 GB/s;
    32 threads were as fast cold (2.0-2.1) but 15% slower warm.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 2
    return max(8, min(64, cpus))


def chunk_size(total_bytes: int, workers: int, largest: int = MAX_CHUNK) -> int:
    """Return the chunk size in bytes: about 4 chunks per thread, 16 MiB to ``largest``
    (256 MiB), 2 MiB aligned."""
    want = total_bytes // max(1, workers * 4)
    want = max(MIN_CHUNK, min(largest, want))
    return (want + ALIGN - 1) // ALIGN * ALIGN


def plan_chunks(sizes: dict[str, int], chunk_bytes: int) -> list[CopyJob]:
    """Return the chunks of ``sizes`` ({path: bytes}), round-robin across files.

    The first chunk of every file (biggest file first), then every file's second
    chunk, and so on: threads taking jobs in order work on different files.
    """
    per_file: list[list[CopyJob]] = []
    for rel, size in sorted(sizes.items(), key=lambda item: -item[1]):
        if size == 0:
            per_file.append([CopyJob(rel, 0, 0)])
            continue
        per_file.append(
            [
                CopyJob(rel, offset, min(chunk_bytes, size - offset))
                for offset in range(0, size, chunk_bytes)
            ]
        )
    jobs: list[CopyJob] = []
    depth = max((len(chunks) for chunks in per_file), default=0)
    for i in range(depth):
        jobs.extend(chunks[i] for chunks in per_file if i < len(chunks))
    return jobs


def _copy_chunk(
    in_fd: int,
    out_fd: int,
    job: CopyJob,
    on_bytes: Callable[[int], None],
    stop: threading.Event | None = None,
) -> None:
    """Copy one chunk with sendfile(2) into ``out_fd`` at the chunk's offset, ``STEP_BYTES``
    a call; raise CopyStopped between two calls once ``stop`` is set."""
    offset, end = job.offset, job.offset + job.length
    os.lseek(out_fd, offset, os.SEEK_SET)  # own fd per chunk: the file position is ours
    while offset < end:
        if stop is not None and stop.is_set():
            raise CopyStopped(job.rel)
        sent = os.sendfile(out_fd, in_fd, offset, min(STEP_BYTES, end - offset))
        if sent == 0:
            raise OSError(f"source ended early at byte {offset} (expected {end})")
        offset += sent
        on_bytes(sent)


_OPEN_DEST = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_path(dest: Path, rel: str) -> Path:
    """Return where ``rel`` is built before it is renamed into ``dest``:
    ``DEST/.gpudoctor-incomplete/<rel, quoted>.incomplete``."""
    return dest / INCOMPLETE_DIR / (quote(rel, safe="") + ".incomplete")


def prepare_destination(dest: Path, rel: str, size: int) -> Path:
    """Create the temp file of ``rel`` (``O_NOFOLLOW``, 0644), ``size`` bytes long; return it."""
    target = temp_path(dest, rel)
    fd = os.open(target, _OPEN_DEST, 0o644)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return target


def copy_files(
    source: Path,
    dest: Path,
    sizes: dict[str, int],
    progress: Progress,
    workers: int | None = None,
    sync: bool = False,
    expected: dict[str, str | None] | None = None,
) -> list[FileProblem]:
    """Copy ``sizes``' files (relative paths) from ``source`` to ``dest`` in parallel.

    ``workers``: threads (default: :func:`default_workers`). ``sync``: flush each
    file to disk (``fsync``) before it is renamed into place. ``expected``: the sha256
    of files ({path: hex}): each such file is hashed as it is written
    (:class:`~gpudoctor.weights.copy_hash.FrontierHash`) and renamed into place only
    when it matches; a file that does not is left out (its temp file removed).
    Returns the files left out that way (empty: every byte proven or nothing to prove);
    raises OSError on the first failure and KeyboardInterrupt at once on Ctrl-C. Either
    way every file already renamed into ``dest`` is complete, and the rest are temp
    files in ``DEST/.gpudoctor-incomplete`` (deleted by the next run).
    """
    workers = workers or default_workers()
    wanted = {rel: sha for rel, sha in (expected or {}).items() if sha and rel in sizes}
    chunk = chunk_size(sum(sizes.values()), workers, HASH_MAX_CHUNK if wanted else MAX_CHUNK)
    fsio.make_missing_dirs(dest)  # 0755 whatever the umask (an existing one is kept)
    private_subdir(dest, INCOMPLETE_DIR)
    temps = {rel: prepare_destination(dest, rel, size) for rel, size in sizes.items()}
    jobs = plan_chunks(sizes, chunk)
    remaining = dict(sizes)
    lock = threading.Lock()
    stop = threading.Event()
    src_flags = os.O_RDONLY | os.O_CLOEXEC
    dst_flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    hashes = {rel: FrontierHash(temps[rel], sizes[rel]) for rel in wanted}
    mismatched: list[FileProblem] = []

    def finish(rel: str) -> None:
        got = hashes[rel].hexdigest() if rel in hashes else None
        if got is not None and got != wanted[rel]:
            os.unlink(temps[rel])
            detail = f"copied bytes have sha256 {got[:12]}…, the manifest says {wanted[rel][:12]}…"
            with lock:
                mismatched.append(FileProblem(rel, "sha256", detail))
            return
        if sync:
            _fsync(temps[rel])
        move_into(temps[rel], dest, rel)
        progress.file_done(rel)

    def run(job: CopyJob) -> None:
        if stop.is_set():
            raise CopyStopped(job.rel)
        if job.length:
            in_fd = os.open(source / job.rel, src_flags)
            try:
                out_fd = os.open(temps[job.rel], dst_flags)
                try:
                    _copy_chunk(in_fd, out_fd, job, lambda n: progress.advance(job.rel, n), stop)
                finally:
                    os.close(out_fd)
            finally:
                os.close(in_fd)
        if job.rel in hashes:
            if hashes[job.rel].chunk_done(job.offset, job.length):
                with lock:
                    drains.append(hash_pool.submit(drain, job.rel))
            return
        with lock:
            remaining[job.rel] -= job.length
            finished = remaining[job.rel] == 0
            if finished:
                remaining[job.rel] = -1  # report once
        if finished:
            finish(job.rel)

    def drain(rel: str) -> None:
        if not stop.is_set() and hashes[rel].drain():
            finish(rel)

    pool = pools.new_pool(workers, "copy")
    hash_pool = pools.new_pool(max(1, min(len(hashes), workers)), "sha256")
    drains: list[Future] = []
    error: BaseException | None = None
    try:
        pools.wait_all([pool.submit(run, job) for job in jobs], stop)
        pools.wait_all(list(drains), stop)  # no drain starts once every chunk is in
    except BaseException as exc:
        error = exc
        raise
    finally:
        pools.shutdown(pool, error)
        pools.shutdown(hash_pool, error)
    with contextlib.suppress(OSError):
        os.rmdir(dest / INCOMPLETE_DIR)
    return mismatched


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_tree_files(source: Path, dest: Path, paths: Iterable[str], progress: Progress) -> None:
    """Copy ``paths`` (sizes read with ``stat``) from ``source`` to ``dest``; see copy_files."""
    copy_files(source, dest, {rel: (source / rel).stat().st_size for rel in paths}, progress)
