"""Parallel copy and the verifiers, on real files."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
from pathlib import Path

import pytest

from gpudoctor.weights import copier
from gpudoctor.weights.manifest import ManifestFile
from gpudoctor.weights.progress import PlainProgress, Progress
from gpudoctor.weights.verify import full_verify, quick_verify


class Counting(Progress):
    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.done: list[str] = []

    def advance(self, path: str, nbytes: int) -> None:
        self.bytes[path] = self.bytes.get(path, 0) + nbytes

    def file_done(self, path: str) -> None:
        self.done.append(path)


def test_plan_chunks_covers_every_byte_once() -> None:
    jobs = copier.plan_chunks({"a": 10, "b": 0, "c": 25}, chunk_bytes=8)
    for name, size in (("a", 10), ("c", 25)):
        spans = sorted((j.offset, j.length) for j in jobs if j.rel == name)
        assert sum(n for _, n in spans) == size
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))
    assert [j for j in jobs if j.rel == "b"] == [copier.CopyJob("b", 0, 0)]


def test_plan_chunks_spreads_threads_over_files() -> None:
    """The first jobs handed out are one chunk of each file (one inode lock each)."""
    jobs = copier.plan_chunks({"a": 40, "c": 30, "d": 8}, chunk_bytes=8)
    assert [j.rel for j in jobs[:3]] == ["a", "c", "d"]
    assert [j.rel for j in jobs[3:5]] == ["a", "c"]


def test_chunk_size_scales_with_threads() -> None:
    assert copier.chunk_size(100 << 30, 16) == copier.MAX_CHUNK
    assert copier.chunk_size(1 << 20, 16) == copier.MIN_CHUNK
    assert copier.chunk_size(20 << 30, 16) % copier.ALIGN == 0


def test_copy_files_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copier, "MIN_CHUNK", 1 << 20)
    monkeypatch.setattr(copier, "ALIGN", 1 << 20)
    src, dst = tmp_path / "src", tmp_path / "dst"
    sizes = {"big.safetensors": 5 * (1 << 20) + 17, "sub/dir/x.json": 3, "empty": 0}
    for rel, size in sizes.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(os.urandom(size))
    progress = Counting()
    copier.copy_files(src, dst, sizes, progress, workers=4)
    for rel in sizes:
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
    assert progress.bytes == {k: v for k, v in sizes.items() if v}
    assert sorted(progress.done) == sorted(sizes)


def test_copy_of_a_shrunk_source_fails(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"x" * 10)
    with pytest.raises(OSError, match="ended early"):
        copier.copy_files(tmp_path / "src", tmp_path / "dst", {"a": 20}, Progress())


def test_quick_and_full_verify(tmp_path: Path) -> None:
    good, flipped = os.urandom(1000), bytearray(os.urandom(1000))
    (tmp_path / "good.bin").write_bytes(good)
    (tmp_path / "flipped.bin").write_bytes(flipped)
    (tmp_path / "short.bin").write_bytes(b"12")
    files = [
        ManifestFile("good.bin", 1000, hashlib.sha256(good).hexdigest()),
        ManifestFile("flipped.bin", 1000, hashlib.sha256(bytes(flipped[:-1]) + b"?").hexdigest()),
        ManifestFile("short.bin", 3, None),
        ManifestFile("gone.bin", 1, None),
    ]
    quick = {(p.path, p.problem) for p in quick_verify(tmp_path, files)}
    assert quick == {("short.bin", "size"), ("gone.bin", "missing")}
    stream = io.StringIO()
    full = {(p.path, p.problem) for p in full_verify(tmp_path, files, PlainProgress(stream))}
    assert full == quick | {("flipped.bin", "sha256")}
    assert "verify sha256: 2 files" in stream.getvalue()
