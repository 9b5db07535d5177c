"""``--verify quick`` and ``--verify full`` on real files in tmp_path: what counts as missing,
which files get hashed, how a wrong hash reads, and that Ctrl-C or a read error stops the
hashing at once instead of after the last shard."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from gpudoctor.weights import verify
from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.manifest import ManifestFile
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.verify import directory_problems, full_verify, quick_verify, sha256_of
from tests.weights.progress_recorder import Recorder

GOOD = b"g" * 5000
OTHER = b"o" * 5000


class Recording(Recorder):
    """Collects what a verify reports: the phase, bytes per file, files done (thread-safe)."""

    def __init__(self) -> None:
        super().__init__()
        self.phases: list[tuple[str, dict[str, int]]] = []
        self.closed = 0

    def phase(self, name: str, files: dict[str, int]) -> Progress:
        self.phases.append((name, dict(files)))
        return self

    def close(self) -> None:
        self.closed += 1


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_quick_verify_counts_a_symlink_as_missing_unless_asked_to_follow(tmp_path: Path) -> None:
    (tmp_path / "real.bin").write_bytes(GOOD)
    (tmp_path / "link.bin").symlink_to(tmp_path / "real.bin")
    files = [ManifestFile("link.bin", len(GOOD))]
    assert quick_verify(tmp_path, files) == [FileProblem("link.bin", "missing", "missing")]
    assert quick_verify(tmp_path, iter(files), follow_symlinks=True) == []


def test_directory_problems_adds_unfinished_downloads(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(GOOD)
    (tmp_path / "b.bin.incomplete").write_bytes(b"half")
    hf = tmp_path / ".cache" / "huggingface" / "download"
    hf.mkdir(parents=True)
    (hf / "c.bin.incomplete").write_bytes(b"")
    problems = directory_problems(tmp_path, iter([ManifestFile("a.bin", len(GOOD))]))
    assert [(p.path, p.problem) for p in problems] == [
        (".cache/huggingface/download/c.bin.incomplete", "unfinished"),
        ("b.bin.incomplete", "unfinished"),
    ]


def test_sha256_of_reports_every_byte_and_the_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(verify, "READ_BYTES", 1024)  # several reads per file
    (tmp_path / "a.bin").write_bytes(GOOD)
    progress = Recording()
    assert sha256_of(tmp_path / "a.bin", progress, "a.bin") == sha(GOOD)
    assert progress.bytes == {"a.bin": len(GOOD)} and progress.done == ["a.bin"]


def test_full_verify_names_a_wrong_hash_in_twelve_digits(tmp_path: Path) -> None:
    (tmp_path / "good.bin").write_bytes(GOOD)
    (tmp_path / "bad.bin").write_bytes(OTHER)
    (tmp_path / "config.json").write_bytes(b"{}")
    files = [
        ManifestFile("bad.bin", len(OTHER), sha(GOOD)),
        ManifestFile("config.json", 2, None),
        ManifestFile("good.bin", len(GOOD), sha(GOOD)),
    ]
    progress = Recording()
    problems = full_verify(tmp_path, iter(files), progress, workers=2)
    assert problems == [
        FileProblem(
            "bad.bin", "sha256", f"has sha256 {sha(OTHER)[:12]}…, expected {sha(GOOD)[:12]}…"
        )
    ]
    # only the files with a known hash are read, each once, whole
    assert progress.phases == [("verify sha256", {"bad.bin": 5000, "good.bin": 5000})]
    assert progress.bytes == {"bad.bin": 5000, "good.bin": 5000}
    assert (
        sorted(progress.done) == ["bad.bin", "good.bin"] and progress.closed == 1
    )  # the phase ended


def test_full_verify_does_not_hash_a_file_already_wrong_by_size(tmp_path: Path) -> None:
    (tmp_path / "short.bin").write_bytes(GOOD[:10])
    files = [
        ManifestFile("short.bin", len(GOOD), sha(GOOD)),
        ManifestFile("gone.bin", 1, sha(b"x")),
    ]
    progress = Recording()
    problems = full_verify(tmp_path, files, progress)
    assert [(p.path, p.problem) for p in problems] == [
        ("short.bin", "size"),
        ("gone.bin", "missing"),
    ]
    assert progress.bytes == {} and progress.phases == [("verify sha256", {})]


def test_full_verify_of_the_whole_directory_counts_unfinished_downloads(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(GOOD)
    (tmp_path / "x.lock").write_bytes(b"")
    files = [ManifestFile("a.bin", len(GOOD), sha(GOOD))]
    assert full_verify(tmp_path, files, Progress()) == []
    whole = full_verify(tmp_path, files, Progress(), whole_directory=True)
    assert whole == [FileProblem("x.lock", "unfinished", "is an unfinished download")]


def test_full_verify_uses_every_core_by_default(tmp_path: Path, monkeypatch) -> None:
    from gpudoctor.weights import pool as pools

    seen: list[int] = []
    real = pools.new_pool

    def counting(workers: int, name: str):
        seen.append(workers)
        return real(workers, name)

    monkeypatch.setattr(pools, "new_pool", counting)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    full_verify(tmp_path, [], Progress())
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    full_verify(tmp_path, [], Progress())
    full_verify(tmp_path, [], Progress(), workers=5)
    assert seen == [3, 1, 5]


def test_ctrl_c_stops_the_verify_at_once(tmp_path: Path) -> None:
    """Ctrl-C seen while one shard is hashed: full_verify raises KeyboardInterrupt at once,
    without waiting for the other shard's thread (``weights ensure`` exits 130 then)."""
    (tmp_path / "a.bin").write_bytes(GOOD)
    (tmp_path / "b.bin").write_bytes(OTHER)
    b_reading = threading.Event()
    release = threading.Event()
    b_finished = threading.Event()

    class CtrlC(Progress):
        def advance(self, path: str, nbytes: int) -> None:
            if path == "b.bin":
                b_reading.set()
                release.wait(30)
                b_finished.set()
            else:
                b_reading.wait(30)
                raise KeyboardInterrupt

    files = [ManifestFile("a.bin", 5000, sha(GOOD)), ManifestFile("b.bin", 5000, sha(OTHER))]
    try:
        with pytest.raises(KeyboardInterrupt):
            full_verify(tmp_path, files, CtrlC(), workers=2)
        assert not b_finished.is_set()
    finally:
        release.set()


def test_the_hashing_threads_are_gone_when_the_verify_returns(tmp_path: Path) -> None:
    """``weights status --verify full`` over a mirror of many models verifies one after
    another: each verify ends its threads instead of leaving a pool behind per model."""
    (tmp_path / "a.bin").write_bytes(GOOD)
    files = [ManifestFile("a.bin", len(GOOD), sha(GOOD))]
    before = set(threading.enumerate())  # another test's pool left after Ctrl-C is not ours
    assert full_verify(tmp_path, files, Progress(), workers=4) == []
    assert [t.name for t in set(threading.enumerate()) - before] == []


def test_hashing_runs_on_threads_named_sha256(tmp_path: Path) -> None:
    """A stuck verify's thread dump (py-spy, faulthandler) names what each thread does."""
    names: set[str] = set()

    class Names(Progress):
        def advance(self, path: str, nbytes: int) -> None:
            names.add(threading.current_thread().name.rstrip("0123456789"))

    (tmp_path / "a.bin").write_bytes(GOOD)
    full_verify(tmp_path, [ManifestFile("a.bin", len(GOOD), sha(GOOD))], Names(), workers=2)
    assert names == {"sha256_"}
