"""Cold restore (page cache dropped): the copier's ways of copying a chunk, side by side
with the disk's limit, to choose the one `gpudoctor weights ensure` uses.

Usage (as root: it mounts a tmpfs and drops the page cache):

    python benchmarks/cold_restore_variants.py [--size-gb 10.45] [--shards 3]
        [--model-dir DIR] [--trials 3] [--json OUT]

Each trial drops the page cache before every run, runs are interleaved (A B C ... A B C),
medians printed, each beside the reference: 16 parallel ``dd ... of=/dev/null`` byte-range
reads (the disk's parallel read rate, benchmarks/weights_restore.py's cold limit). Variants
of ``gpudoctor.weights.copier.copy_files`` (the same threads and chunks; only the per-chunk
copy differs):

- ``sendfile``: the copier as it is (``sendfile(2)`` at the chunk's offset, 64 MiB a call);
- ``sendfile + WILLNEED``: ``posix_fadvise(WILLNEED)`` on the chunk first, so the kernel
  queues the chunk's whole read at once instead of growing its read-ahead window;
- ``pread/pwrite 8 MiB``: through a buffer, as ``dd bs=8M`` reads;
- ``sendfile + sha256``: what ``weights ensure --mirror`` does since issue 34.4, every
  file hashed while it is copied (``copy_files(..., expected=)``, the running hash of
  :mod:`gpudoctor.weights.copy_hash`) against digests computed before the trials.

Also ``dd`` ranges copied into the same tmpfs (the copy's own limit when cold).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from weights_restore import clear_workdir, dd_ranges_cmd, drop_caches, make_model, run_timed

from gpudoctor.weights import copier
from gpudoctor.weights.progress import Progress

STREAMS = 16
STEP = 8 << 20


def chunk_willneed(in_fd: int, out_fd: int, job: copier.CopyJob, on_bytes, stop=None) -> None:
    """sendfile after posix_fadvise(WILLNEED) of the chunk's range."""
    os.posix_fadvise(in_fd, job.offset, job.length, os.POSIX_FADV_WILLNEED)
    SENDFILE(in_fd, out_fd, job, on_bytes, stop)


def chunk_pread(in_fd: int, out_fd: int, job: copier.CopyJob, on_bytes, stop=None) -> None:
    """pread/pwrite through an 8 MiB buffer."""
    buf = bytearray(STEP)
    view = memoryview(buf)
    offset, end = job.offset, job.offset + job.length
    while offset < end:
        n = os.preadv(in_fd, [view[: min(STEP, end - offset)]], offset)
        if n == 0:
            raise OSError("short read")
        os.pwrite(out_fd, view[:n], offset)
        offset += n
        on_bytes(n)


SENDFILE = copier._copy_chunk
VARIANTS: dict[str, Callable] = {
    "sendfile, no hash": SENDFILE,
    "sendfile + WILLNEED": chunk_willneed,
    "pread/pwrite 8 MiB": chunk_pread,
}


def copy_with(chunk_copy: Callable, src: Path, dest: Path, sizes: dict[str, int]) -> float:
    """Return the seconds ``copy_files`` takes with ``chunk_copy`` as its per-chunk copy
    into ``dest`` (absent: the run loop removes it after every run)."""
    drop_caches()
    copier._copy_chunk = chunk_copy
    try:
        start = time.perf_counter()
        copier.copy_files(src, dest, sizes, Progress())
        return time.perf_counter() - start
    finally:
        copier._copy_chunk = SENDFILE


def copy_hashed(src: Path, dest: Path, sizes: dict[str, int], digests: dict[str, str],
                chunk: int | None = None) -> float:  # fmt: skip
    """Return the seconds ``copy_files`` takes hashing every file as it copies it (cold;
    ``chunk``: the largest chunk instead of the shipped ``HASH_MAX_CHUNK``); raise
    SystemExit when a digest does not match (the figure would be no restore)."""
    drop_caches()
    shipped = copier.HASH_MAX_CHUNK
    copier.HASH_MAX_CHUNK = chunk or shipped
    try:
        start = time.perf_counter()
        bad = copier.copy_files(src, dest, sizes, Progress(), expected=digests)
        seconds = time.perf_counter() - start
    finally:
        copier.HASH_MAX_CHUNK = shipped
    if bad:
        raise SystemExit(f"hashed copy disagrees with the source: {bad[0]}")
    return seconds


def source_digests(src: Path, sizes: dict[str, int]) -> dict[str, str]:
    """Return {path: sha256} of the source files (``sha256sum``, in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    from gpudoctor.weights.verify import sha256_of

    with ThreadPoolExecutor(16) as pool:
        found = pool.map(lambda rel: sha256_of(src / rel, Progress(), rel), sizes)
        return dict(zip(sizes, found, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=10.45)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/gpudoctor-cold-bench"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = args.workdir
    clear_workdir(work)
    src = args.model_dir or work / "model"
    if not args.model_dir:
        make_model(src, int(args.size_gb * 1e9), args.shards)
    sizes = {
        str(p.relative_to(src)): p.stat().st_size
        for p in src.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }
    total = sum(sizes.values())
    shm = work / "shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(total * 1.3)}", "tmpfs", str(shm)],
                   check=True)  # fmt: skip
    runs: dict[str, Callable[[], float]] = {
        "16 parallel dd reads (limit)": lambda: (
            drop_caches(),
            run_timed(dd_ranges_cmd(src, sizes, STREAMS, None)),
        )[-1],
        "16 parallel dd ranges into tmpfs": lambda: (
            (shm / "dd").mkdir(),
            drop_caches(),
            run_timed(dd_ranges_cmd(src, sizes, STREAMS, shm / "dd")),
        )[-1],
    }
    for name, chunk_copy in VARIANTS.items():
        runs[name] = lambda c=chunk_copy: copy_with(c, src, shm / "copy", sizes)
    digests = source_digests(src, sizes)
    block = bytes(1 << 30)
    start = time.perf_counter()
    hashlib.sha256(block).hexdigest()
    print(f"sha256 on one core: {len(block) / (time.perf_counter() - start) / 1e9:.2f} GB/s",
          file=sys.stderr)  # fmt: skip
    runs["sendfile + sha256 (as shipped)"] = lambda: copy_hashed(src, shm / "copy", sizes, digests)
    runs["sendfile + sha256, 16 MiB chunks"] = lambda: copy_hashed(
        src, shm / "copy", sizes, digests, 16 << 20
    )
    times: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for trial in range(args.trials):
            for name, run in runs.items():
                times[name].append(run())
                shutil.rmtree(shm / "copy", ignore_errors=True)
                shutil.rmtree(shm / "dd", ignore_errors=True)
            print(f"trial {trial + 1}/{args.trials} done", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["umount", str(shm)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    limit = statistics.median(times["16 parallel dd reads (limit)"])
    print(f"{len(sizes)} files, {total / 1e9:.2f} GB; {os.cpu_count()} CPUs; "
          f"medians of {args.trials} interleaved trials, page cache dropped before each run")  # fmt: skip
    print(f"{'run':<40} {'median s':>9} {'GB/s':>7} {'vs dd reads':>12}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<40} {med:>9.3f} {total / med / 1e9:>7.2f} {limit / med:>11.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"bytes": total, "files": len(sizes), "seconds": times},
                                        indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
