"""The sha256 a restore computes while it writes (issue 34.4): chunks finish in any order,
the hash follows the contiguous front, reports the file finished exactly once, and equals
``sha256sum`` of the bytes on disk. Real files in tmp_path; real threads for the race."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path

import pytest

from gpudoctor.weights import copy_hash
from gpudoctor.weights.copy_hash import FrontierHash

DATA = random.Random(7).randbytes(10_000)


def written(tmp_path: Path, data: bytes = DATA) -> Path:
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    return path


def test_chunks_in_reverse_order_hash_the_whole_file_once(tmp_path: Path) -> None:
    h = FrontierHash(written(tmp_path), len(DATA))
    assert h.chunk_done(6000, 4000) is True  # no drain running: the caller starts one
    assert h.drain() is False  # nothing contiguous from byte 0 yet
    assert h.chunk_done(2000, 4000) is True
    assert h.drain() is False
    assert h.chunk_done(0, 2000) is True
    assert h.drain() is True  # the drain that hashed the last byte says so
    assert h.drain() is False  # exactly once
    assert h.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_chunk_finished_during_a_drain_is_left_to_that_drain(tmp_path: Path) -> None:
    h = FrontierHash(written(tmp_path), len(DATA))
    assert h.chunk_done(0, 5000) is True
    assert h.chunk_done(5000, 5000) is False  # a drain is due already: do not start another
    assert h.drain() is True
    assert h.hexdigest() == hashlib.sha256(DATA).hexdigest()
    assert h.chunk_done(0, 0) is True  # the drain let go: the next chunk starts one again


def test_the_hash_is_of_the_bytes_on_disk(tmp_path: Path) -> None:
    """A bit flipped in the destination (a bad disk, a bad copy) shows in the digest."""
    path = written(tmp_path)
    flipped = bytearray(DATA)
    flipped[4321] ^= 0x10
    path.write_bytes(bytes(flipped))
    h = FrontierHash(path, len(DATA))
    h.chunk_done(0, len(DATA))
    assert h.drain() is True
    assert h.hexdigest() == hashlib.sha256(flipped).hexdigest() != hashlib.sha256(DATA).hexdigest()


def test_reads_in_slices_smaller_than_the_range(tmp_path: Path, monkeypatch) -> None:
    """Slices of 999 bytes: the last slice of a range stops at the range's end, not at
    the file's (the bytes after it are not proven written yet)."""
    monkeypatch.setattr(copy_hash, "READ_BYTES", 999)
    h = FrontierHash(written(tmp_path), len(DATA))
    h.chunk_done(0, 5000)
    assert h.drain() is False
    h.chunk_done(5000, len(DATA) - 5000)
    assert h.drain() is True
    assert h.hexdigest() == hashlib.sha256(DATA).hexdigest()


def test_a_file_shorter_than_its_chunks_is_an_error_not_a_hash(tmp_path: Path) -> None:
    path = written(tmp_path, DATA[:3000])
    h = FrontierHash(path, len(DATA))
    h.chunk_done(0, len(DATA))
    with pytest.raises(OSError, match=f"{path} ended at byte 3000 while hashing"):
        h.drain()


def test_a_symlink_in_place_of_the_file_is_not_followed(tmp_path: Path) -> None:
    real = written(tmp_path)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    h = FrontierHash(link, len(DATA))
    h.chunk_done(0, len(DATA))
    with pytest.raises(OSError):
        h.drain()


def test_many_threads_finishing_chunks_in_any_order(tmp_path: Path) -> None:
    path = written(tmp_path)
    h = FrontierHash(path, len(DATA))
    chunks = [(o, min(100, len(DATA) - o)) for o in range(0, len(DATA), 100)]
    random.Random(3).shuffle(chunks)
    finished: list[bool] = []
    lock = threading.Lock()

    def worker(mine: list[tuple[int, int]]) -> None:
        for offset, length in mine:
            if h.chunk_done(offset, length):
                done = h.drain()
                with lock:
                    finished.append(done)

    threads = [threading.Thread(target=worker, args=(chunks[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert finished.count(True) == 1
    assert h.hexdigest() == hashlib.sha256(DATA).hexdigest()
    assert os.path.getsize(path) == len(DATA)


def test_hashing_gives_its_file_descriptor_back(tmp_path: Path) -> None:
    """A restore of hundreds of shards hashes each one: a descriptor left open per file
    would run the process out of them (EMFILE) on a big model."""
    before = set(os.listdir("/proc/self/fd"))
    h = FrontierHash(written(tmp_path), len(DATA))
    h.chunk_done(0, len(DATA))
    assert h.drain() is True
    (tmp_path / "x").mkdir()
    short = FrontierHash(written(tmp_path / "x", DATA[:10]), 20)
    short.chunk_done(0, 20)
    with pytest.raises(OSError):
        short.drain()
    assert set(os.listdir("/proc/self/fd")) == before
