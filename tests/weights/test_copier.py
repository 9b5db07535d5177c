"""The parallel copy behind a mirror restore, in-process on real files (fast): every byte
lands, a file appears under its name only once whole (and, when its sha256 is known, only
once the bytes written are proven: a flipped bit is never restored as good), each file is
flushed when asked, a failure or Ctrl-C stops the copy at once and leaves only temp files.
Chunk sizes are made small so that a few kB of data take many chunks and many threads."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path

import pytest

from gpudoctor.weights import copier
from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.copier import CopyJob, CopyStopped, copy_files
from gpudoctor.weights.localfs import INCOMPLETE_DIR
from gpudoctor.weights.progress import Progress
from tests.weights.progress_recorder import Recorder

RNG = random.Random(11)
BLOBS = {
    "big.safetensors": RNG.randbytes(40_000),
    "sub/dir/mid.bin": RNG.randbytes(9_000),
    "config.json": b'{"a": 1}\n',
    "empty": b"",
}
SIZES = {rel: len(b) for rel, b in BLOBS.items()}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 kB chunks (2 kB aligned), 1 kB per sendfile call: kB of data, many chunks."""
    monkeypatch.setattr(copier, "MIN_CHUNK", 4096)
    monkeypatch.setattr(copier, "ALIGN", 2048)
    monkeypatch.setattr(copier, "STEP_BYTES", 1024)
    monkeypatch.setattr(copier, "MAX_CHUNK", 8192)
    monkeypatch.setattr(copier, "HASH_MAX_CHUNK", 4096)


def source_dir(tmp_path: Path, blobs: dict[str, bytes] = BLOBS) -> Path:
    root = tmp_path / "src"
    for rel, data in blobs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


Recording = Recorder  # the bytes per file and the files done, thread-safe


@pytest.mark.parametrize(("cpus", "threads"), [(1, 8), (8, 8), (16, 16), (64, 64), (200, 64)])
def test_default_workers_are_the_usable_cpus_from_8_to_64(monkeypatch, cpus, threads) -> None:
    """``os.sched_getaffinity`` stands in for a machine with ``cpus`` usable CPUs."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert copier.default_workers() == threads


def test_chunk_size_is_a_quarter_thread_share_clamped_and_aligned() -> None:
    assert copier.chunk_size(4 * 4 * 6000, 4) == 6144  # 6000 rounded up to 2048
    assert copier.chunk_size(4 * 4 * 6144, 4) == 6144  # aligned already
    assert copier.chunk_size(100, 4) == 4096  # never below MIN_CHUNK
    assert copier.chunk_size(10**9, 4, largest=8192) == 8192  # never above ``largest``
    assert copier.chunk_size(10**9, 4, largest=6144) == 6144
    assert copier.chunk_size(6000, 0, largest=8192) == 6144  # no workers: one share, no crash
    assert copier.chunk_size(4 * 4 * 6145, 4, largest=16384) == 8192  # 1 byte over: next step
    assert copier.chunk_size(4 * 4 * 12000, 4, largest=16384) == 12288  # a quarter share each


def test_chunks_go_biggest_file_first_round_robin() -> None:
    jobs = copier.plan_chunks({"s": 4, "b": 20, "m": 8}, chunk_bytes=8)
    assert jobs == [
        CopyJob("b", 0, 8), CopyJob("m", 0, 8), CopyJob("s", 0, 4),
        CopyJob("b", 8, 8),
        CopyJob("b", 16, 4),
    ]  # fmt: skip
    assert copier.plan_chunks({}, 8) == []


def test_a_chunk_is_sent_in_steps_at_its_offset(tmp_path: Path) -> None:
    data = RNG.randbytes(5000)
    (tmp_path / "in").write_bytes(data)
    (tmp_path / "out").write_bytes(b"\0" * 5000)
    sent: list[int] = []
    with open(tmp_path / "in", "rb") as src, open(tmp_path / "out", "r+b") as dst:
        copier._copy_chunk(src.fileno(), dst.fileno(), CopyJob("in", 1000, 3500), sent.append)
    assert sent == [1024, 1024, 1024, 428]
    assert (tmp_path / "out").read_bytes() == b"\0" * 1000 + data[1000:4500] + b"\0" * 500


def test_a_chunk_stops_before_a_step_once_told(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"x" * 100)
    (tmp_path / "out").write_bytes(b"")
    stop = threading.Event()
    stop.set()
    with (
        open(tmp_path / "in", "rb") as src,
        open(tmp_path / "out", "r+b") as dst,
        pytest.raises(CopyStopped, match="in"),
    ):
        copier._copy_chunk(src.fileno(), dst.fileno(), CopyJob("in", 0, 100), print, stop)
    assert (tmp_path / "out").read_bytes() == b""


def test_a_source_shorter_than_its_chunk_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"x" * 100)
    (tmp_path / "out").write_bytes(b"")
    with (
        open(tmp_path / "in", "rb") as src,
        open(tmp_path / "out", "r+b") as dst,
        pytest.raises(OSError, match=r"source ended early at byte 100 \(expected 150\)"),
    ):
        copier._copy_chunk(src.fileno(), dst.fileno(), CopyJob("in", 0, 150), print)


def test_every_byte_of_every_file_lands_and_is_reported(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    progress = Recording()
    umask = os.umask(0)  # a boot unit's umask: still no file others can write
    try:
        assert copy_files(source_dir(tmp_path), dest, SIZES, progress, workers=4) == []
    finally:
        os.umask(umask)
    assert tree(dest) == BLOBS
    assert progress.bytes == {rel: n for rel, n in SIZES.items() if n}
    assert sorted(progress.done) == sorted(BLOBS)  # each file once
    assert not (dest / INCOMPLETE_DIR).exists()
    assert dest.stat().st_mode & 0o777 == 0o755
    assert (dest / "big.safetensors").stat().st_mode & 0o777 == 0o644


def test_the_default_thread_count_is_used_when_none_is_given(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(copier, "default_workers", lambda: 3)
    made: list[int] = []
    real = copier.pools.new_pool
    monkeypatch.setattr(copier.pools, "new_pool", lambda n, name: made.append(n) or real(n, name))
    copy_files(source_dir(tmp_path), tmp_path / "dest", SIZES, Progress())
    assert made[0] == 3
    assert tree(tmp_path / "dest") == BLOBS


def test_proven_files_land_and_a_flipped_bit_is_left_out(tmp_path: Path) -> None:
    """The restore knows each shard's sha256: a copy whose bytes differ (a bit flipped in
    the mirror) is never put in place as good, and says which file and both hashes."""
    blobs = dict(BLOBS)
    flipped = bytearray(blobs["big.safetensors"])
    flipped[12345] ^= 0x04
    source = source_dir(tmp_path, {**blobs, "big.safetensors": bytes(flipped)})
    expected = {rel: sha(b) for rel, b in blobs.items()}
    expected["config.json"] = None  # a small git file: no hash to prove
    expected["not-copied.bin"] = sha(b"x")
    progress = Recording()
    dest = tmp_path / "dest"
    bad = copy_files(source, dest, SIZES, progress, workers=4, expected=expected)
    got = sha(bytes(flipped))
    assert bad == [
        FileProblem(
            "big.safetensors",
            "sha256",
            f"copied bytes have sha256 {got[:12]}…, the manifest says"
            f" {expected['big.safetensors'][:12]}…",
        )
    ]
    assert tree(dest) == {rel: b for rel, b in blobs.items() if rel != "big.safetensors"}
    assert "big.safetensors" not in progress.done
    assert not (dest / INCOMPLETE_DIR).exists()  # the bad temp file removed too


def test_hashed_copy_of_many_chunks_is_proven(tmp_path: Path) -> None:
    expected = {rel: sha(b) for rel, b in BLOBS.items()}
    dest = tmp_path / "dest"
    progress = Recording()
    assert copy_files(source_dir(tmp_path), dest, SIZES, progress, 8, expected=expected) == []
    assert tree(dest) == BLOBS
    assert sorted(progress.done) == sorted(BLOBS)


@pytest.mark.parametrize("hashed", [False, True])
def test_sync_flushes_each_file_before_it_is_renamed_in(
    tmp_path: Path, monkeypatch, hashed: bool
) -> None:
    flushed: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    expected = {rel: sha(b) for rel, b in BLOBS.items()} if hashed else None
    source, dest = source_dir(tmp_path), tmp_path / "dest"
    copy_files(source, dest, SIZES, Progress(), 4, sync=True, expected=expected)
    temps = [p for p in flushed if f"/{INCOMPLETE_DIR}/" in p]
    assert len(temps) == len(BLOBS)
    flushed.clear()
    copy_files(source, tmp_path / "dest2", SIZES, Progress(), 4, expected=expected)
    assert not [p for p in flushed if f"/{INCOMPLETE_DIR}/" in p]


def test_a_failure_stops_the_copy_and_leaves_no_partial_file_in_place(tmp_path: Path) -> None:
    source = source_dir(tmp_path)
    (source / "sub/dir/mid.bin").unlink()  # vanished from the source
    dest = tmp_path / "dest"
    with pytest.raises(FileNotFoundError):
        copy_files(source, dest, SIZES, Progress(), workers=2)
    for rel, data in tree(dest).items():  # whatever is in place is whole
        if not rel.startswith(INCOMPLETE_DIR):
            assert data == BLOBS[rel]
    assert "sub/dir/mid.bin" not in tree(dest)


def test_ctrl_c_stops_at_once_without_waiting_for_the_threads(tmp_path: Path) -> None:
    release = threading.Event()
    blocked = threading.Event()

    class CtrlC(Progress):
        def advance(self, path: str, nbytes: int) -> None:
            if path == "sub/dir/mid.bin":
                blocked.set()
                release.wait(30)
            else:
                blocked.wait(30)
                raise KeyboardInterrupt

    sizes = {"big.safetensors": SIZES["big.safetensors"], "sub/dir/mid.bin": 9000}
    try:
        with pytest.raises(KeyboardInterrupt):
            copy_files(source_dir(tmp_path), tmp_path / "dest", sizes, CtrlC(), workers=2)
        assert not release.is_set()
        assert not (tmp_path / "dest" / "big.safetensors").exists()
    finally:
        release.set()


def test_copy_tree_files_reads_the_sizes_itself(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copier.copy_tree_files(source_dir(tmp_path), dest, list(BLOBS), Progress())
    assert tree(dest) == BLOBS


@pytest.mark.parametrize("hashed", [False, True])
def test_threads_and_descriptors_are_given_back(tmp_path: Path, hashed: bool) -> None:
    """A restore of many models copies one after another: each copy ends its threads and
    closes every file it opened."""
    expected = {rel: sha(b) for rel, b in BLOBS.items()} if hashed else None
    source = source_dir(tmp_path)
    threads, fds = set(threading.enumerate()), set(os.listdir("/proc/self/fd"))
    copy_files(source, tmp_path / "dest", SIZES, Progress(), 4, sync=True, expected=expected)
    assert [t.name for t in set(threading.enumerate()) - threads] == []
    assert set(os.listdir("/proc/self/fd")) == fds
    (source / "sub/dir/mid.bin").unlink()
    with pytest.raises(FileNotFoundError):
        copy_files(source, tmp_path / "d2", SIZES, Progress(), workers=4, expected=expected)
    assert [t.name for t in set(threading.enumerate()) - threads] == []
    assert set(os.listdir("/proc/self/fd")) == fds


def test_copy_and_hash_threads_are_named_for_a_thread_dump(tmp_path: Path) -> None:
    """A stuck restore's thread dump (py-spy, faulthandler) says which threads copy and
    which hash: bytes move on ``copy_N`` threads, a proven file is put in place by ``sha256_N``."""
    seen: dict[str, set[str]] = {"advance": set(), "done": set()}

    class Names(Progress):
        def advance(self, path: str, nbytes: int) -> None:
            seen["advance"].add(threading.current_thread().name.rstrip("0123456789"))

        def file_done(self, path: str) -> None:
            seen["done"].add(threading.current_thread().name.rstrip("0123456789"))

    expected = {"big.safetensors": sha(BLOBS["big.safetensors"])}
    sizes = {"big.safetensors": SIZES["big.safetensors"]}
    copy_files(source_dir(tmp_path), tmp_path / "dest", sizes, Names(), 4, expected=expected)
    assert seen == {"advance": {"copy_"}, "done": {"sha256_"}}


def test_a_leftover_of_an_earlier_run_does_not_fail_the_copy(tmp_path: Path) -> None:
    """An interrupted run left a temp file in ``.gpudoctor-incomplete``: the copy succeeds
    and leaves it there (the next run's clean-up deletes it), instead of failing at the end."""
    dest = tmp_path / "dest"
    (dest / INCOMPLETE_DIR).mkdir(parents=True, mode=0o700)
    (dest / INCOMPLETE_DIR / "old.bin.incomplete").write_bytes(b"half")
    assert copy_files(source_dir(tmp_path), dest, SIZES, Progress(), workers=2) == []
    assert {k: v for k, v in tree(dest).items() if not k.startswith(INCOMPLETE_DIR)} == BLOBS
    assert os.listdir(dest / INCOMPLETE_DIR) == ["old.bin.incomplete"]
