"""gpudoctor.weights.hub in this process against the loopback Hub: the file list of a
revision, and the downloads (ranged for big files, through huggingface_hub for small
ones, behind a proxy or from a server without ranges; huggingface_hub in process:
tests/weights/hf_inprocess.py)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from gpudoctor.weights import fetch, hub
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import ManifestFile
from tests.weights.hf_inprocess import error_of
from tests.weights.hub_server import HubServer
from tests.weights.progress_recorder import Recorder

# --- the file list -------------------------------------------------------------------------


def test_a_branch_is_resolved_then_its_tree_listed(hf: HubServer) -> None:
    big = os.urandom(1000)
    sha = hf.add_repo("org/m").commit(
        {"b.safetensors": big, "a/config.json": b"{}", "tok/t.json": b"[1]"}
    )
    snapshot = hub.fetch_snapshot("org/m", None)
    assert snapshot == hub.RemoteSnapshot(
        "org/m",
        sha,
        (
            ManifestFile("a/config.json", 2, None),
            ManifestFile("b.safetensors", 1000, hashlib.sha256(big).hexdigest()),
            ManifestFile("tok/t.json", 3, None),
        ),
    )
    assert [r.path.split("&")[0] for r in hf.requests] == [
        "/api/models/org/m/revision/main",
        f"/api/models/org/m/tree/{sha}?recursive=true",
    ]


def test_the_files_are_in_path_order_whatever_the_listing_s(hf: HubServer) -> None:
    hf.add_repo("org/m").commit({"a.json": b"1", "b/c.json": b"22", "d.json": b"333"})
    hf.tree_reversed = True
    files = hub.fetch_snapshot("org/m", "main").files
    assert [f.path for f in files] == ["a.json", "b/c.json", "d.json"]


def test_a_full_sha_is_listed_without_resolving(hf: HubServer) -> None:
    repo = hf.add_repo("org/m")
    first = repo.commit({"config.json": b"{}"})
    repo.commit({"config.json": b"{ }"})
    assert hub.fetch_snapshot("org/m", first).files == (ManifestFile("config.json", 2, None),)
    assert [r.path.split("&")[0] for r in hf.requests] == [
        f"/api/models/org/m/tree/{first}?recursive=true"
    ]
    hf.clear_log()
    assert hub.fetch_snapshot("org/m", first[:7]).revision == first  # a short sha: resolved
    assert hf.requests[0].path == f"/api/models/org/m/revision/{first[:7]}"
    hf.clear_log()
    with pytest.raises(WeightsError):  # upper case is no sha the Hub knows: resolved too
        hub.fetch_snapshot("org/m", first.upper())
    assert hf.requests[0].path == f"/api/models/org/m/revision/{first.upper()}"


def test_a_tree_with_a_path_out_of_the_model_is_refused(hf: HubServer) -> None:
    hf.add_repo("org/m").commit({"../evil.json": b"{}"})
    with pytest.raises(ValueError, match=r"'\.\./evil\.json' must not contain"):
        hub.fetch_snapshot("org/m", None)


# --- downloads -------------------------------------------------------------------------------


def _model(hf: HubServer) -> tuple[hub.RemoteSnapshot, dict[str, bytes]]:
    files = {
        "big.safetensors": os.urandom(300_000),
        "mid.safetensors": os.urandom(100_000),  # exactly the size from which files are ranged
        "config.json": b'{"a": 1}',
        "sub/tok.json": b"[1, 2]",
    }
    hf.add_repo("org/m").commit(files)
    return hub.fetch_snapshot("org/m", None), files


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of 100 kB or more are ranged, in ranges of 64 kB."""
    monkeypatch.setattr(fetch, "RANGED_MIN_BYTES", 100_000)
    monkeypatch.setattr(fetch, "RANGE_BYTES", 64_000)
    monkeypatch.setattr(fetch, "BUFFER_BYTES", 16_000)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".cache" not in p.parts and ".gpudoctor-incomplete" not in p.parts
    }


def test_big_files_by_ranges_small_ones_through_huggingface_hub(
    hf: HubServer, tmp_path: Path, small_ranges: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot, files = _model(hf)
    monkeypatch.setenv("HF_TOKEN", "hf_tokenvalue123")
    hf.clear_log()
    progress = Recorder()
    (tmp_path / "m").mkdir()
    hub.download_files(snapshot, snapshot.files, tmp_path / "m", progress, workers=1)
    assert [t.name for t in threading.enumerate() if t.name.startswith("download")] == []
    assert _tree(tmp_path / "m") == files
    assert sorted(progress.done) == sorted(files)
    assert progress.bytes == {p: len(b) for p, b in files.items()}
    gets = hf.file_gets()
    ranged = [r for r in gets if r.path.endswith(".safetensors")]
    assert len(ranged) == 5 + 2 and {r.status for r in ranged} == {206}
    assert len({r.port for r in ranged}) == 1  # workers=1: one connection for the ranges
    assert {r.authorization for r in ranged} == {"Bearer hf_tokenvalue123"}
    assert all(r.range is None for r in gets if not r.path.endswith(".safetensors"))
    assert sorted(os.listdir(tmp_path / "m" / ".gpudoctor-incomplete")) == []


def test_ctrl_c_returns_without_waiting_for_small_downloads(
    hf: HubServer, tmp_path: Path, small_ranges: None
) -> None:
    """Ctrl-C (KeyboardInterrupt) while a small file is being fetched: download_files
    raises at once and leaves that thread to the exiting process."""
    snapshot, _ = _model(hf)
    small_started, checked = threading.Event(), threading.Event()

    class CtrlC(Recorder):
        def advance(self, path: str, nbytes: int) -> None:
            if path.endswith(".safetensors"):
                small_started.wait(10)
                raise KeyboardInterrupt
            small_started.set()
            checked.wait(10)

    before = set(threading.enumerate())
    (tmp_path / "m").mkdir()
    try:
        with pytest.raises(KeyboardInterrupt):
            hub.download_files(snapshot, snapshot.files, tmp_path / "m", CtrlC(), workers=1)
        running = [t for t in threading.enumerate() if t not in before]
        assert any(t.name.startswith("download") for t in running)
    finally:
        checked.set()
        for thread in set(threading.enumerate()) - before:
            if thread.name.startswith(("download", "range")):
                thread.join(10)


@pytest.mark.parametrize(("workers", "threads"), [(0, 1), (1, 1), (16, 8)])
def test_small_files_are_fetched_up_to_eight_at_a_time(
    hf: HubServer, tmp_path: Path, small_ranges: None, workers: int, threads: int
) -> None:
    """As ``hf download``: at most 8 small files at once (fewer when fewer workers are
    asked for, at least one). The Hub holds the small files' answers until the big
    file's ranges flow, so each small download has its own thread by then."""
    files = {f"f{i}.json": b"{}" for i in range(10)} | {"big.safetensors": os.urandom(200_000)}
    hf.add_repo("org/m").commit(files)
    snapshot = hub.fetch_snapshot("org/m", None)
    hf.hold_small = threading.Event()
    counted: list[int] = []

    class Counting(Recorder):
        def advance(self, path: str, nbytes: int) -> None:
            if path == "big.safetensors" and not counted:
                names = [t.name for t in threading.enumerate()]
                counted.append(sum(name.startswith("download") for name in names))
                hf.hold_small.set()
            super().advance(path, nbytes)

    (tmp_path / "m").mkdir()
    hub.download_files(snapshot, snapshot.files, tmp_path / "m", Counting(), workers=workers)
    assert counted == [threads]
    assert _tree(tmp_path / "m") == files


def test_the_files_come_from_the_snapshot_s_commit_biggest_first(
    hf: HubServer, tmp_path: Path
) -> None:
    """The branch moved after the file list was taken: the files still come from the
    listed commit; one worker fetches them one by one, the biggest first."""
    repo = hf.add_repo("org/m")
    repo.commit({"a.json": b"old", "z.json": b"old-and-bigger"})
    snapshot = hub.fetch_snapshot("org/m", "main")
    repo.commit({"a.json": b"new", "z.json": b"new-and-bigger"})
    hf.clear_log()
    (tmp_path / "m").mkdir()
    hub.download_files(snapshot, snapshot.files, tmp_path / "m", Recorder(), workers=1)
    assert _tree(tmp_path / "m") == {"a.json": b"old", "z.json": b"old-and-bigger"}
    assert [r.path.rsplit("/", 1)[1] for r in hf.file_gets()] == ["z.json", "a.json"]


def test_workers_is_the_number_of_range_connections(
    hf: HubServer, tmp_path: Path, small_ranges: None
) -> None:
    snapshot, files = _model(hf)
    big = [f for f in snapshot.files if f.path == "big.safetensors"]
    hf.clear_log()
    (tmp_path / "m").mkdir()
    hub.download_files(snapshot, big, tmp_path / "m", Recorder(), workers=0)  # at least one
    assert _tree(tmp_path / "m") == {"big.safetensors": files["big.safetensors"]}
    assert len({r.port for r in hf.file_gets()}) == 1


def test_behind_a_proxy_every_file_goes_through_huggingface_hub(
    hf: HubServer, tmp_path: Path, small_ranges: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranged downloader does not speak to proxies: with one configured, every file
    is fetched by huggingface_hub (its client, made once per process, was made here
    without the proxy: the requests still reach the Hub directly)."""
    snapshot, files = _model(hf)
    monkeypatch.setenv("http_proxy", hf.url)
    hf.clear_log()
    (tmp_path / "m").mkdir()
    hub.download_files(snapshot, snapshot.files, tmp_path / "m", Recorder())
    assert _tree(tmp_path / "m") == files
    gets = hf.file_gets()
    assert len(gets) == 4 and all(r.range is None for r in gets)


def test_a_server_without_ranges_gets_huggingface_hub_s_download(
    hf: HubServer, tmp_path: Path, small_ranges: None
) -> None:
    snapshot, files = _model(hf)
    hf.ignore_range = True
    hf.clear_log()
    progress = Recorder()
    (tmp_path / "m").mkdir()
    hub.download_files(snapshot, snapshot.files, tmp_path / "m", progress)
    assert _tree(tmp_path / "m") == files
    assert sorted(progress.done) == sorted(files)


def test_a_failed_download_is_one_line(hf: HubServer, tmp_path: Path, small_ranges: None) -> None:
    snapshot, _ = _model(hf)
    missing_big = hub.RemoteSnapshot("org/m", snapshot.revision, ())
    gone = [ManifestFile("gone.safetensors", 200_000, None)]
    (tmp_path / "a").mkdir()
    error = error_of(lambda: hub.download_files(missing_big, gone, tmp_path / "a", Recorder()))
    assert str(error).startswith("the Hub answered HTTP 404 for gone.safetensors: ")
    gone = [ManifestFile("gone.json", 20, None)]
    (tmp_path / "b").mkdir()
    error = error_of(lambda: hub.download_files(missing_big, gone, tmp_path / "b", Recorder()))
    assert str(error).startswith(f"a file of org/m@{snapshot.revision} is missing on {hf.url}")
    both = [ManifestFile("big.safetensors", 300_000, None), ManifestFile("gone.json", 20, None)]
    (tmp_path / "c").mkdir()
    error = error_of(lambda: hub.download_files(snapshot, both, tmp_path / "c", Recorder()))
    assert str(error).startswith(f"a file of org/m@{snapshot.revision} is missing on {hf.url}")


def test_the_file_bar_counts_bytes_for_its_file() -> None:
    progress = Recorder()
    bar_class = hub._bar_for(progress, "a.bin")
    with bar_class(total=10, initial=4, desc="a.bin") as bar:
        bar.update(3)
        bar.update(None)
        bar.update()
        bar.update_transfer(100)
        bar.set_description("ignored")
        assert bar.format_dict == {}
    bar_class(total=10)
    assert progress.bytes == {"a.bin": 8}
