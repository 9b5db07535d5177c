"""gpudoctor.weights.hub in this process against the loopback Hub (tests/weights/hub_server.py):
where the token comes from and that it never shows, every failure as one line that says
what to do, the file list of a revision, and the downloads (ranged for big files, through
huggingface_hub for small ones, behind a proxy or from a server without ranges).

huggingface_hub reads its HF_* variables once, at import (recipe pitfall 1), so the
fixture ``hf`` points the module constants it reads at call time (endpoint, home, token
file, offline) at this test's Hub and folders instead of setting the environment.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from gpudoctor.weights import fetch, hub
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import ManifestFile
from gpudoctor.weights.progress import Progress
from tests.weights.conftest import HF_VARS_TO_DROP
from tests.weights.hub_server import HubServer

TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME")
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class Recorder(Progress):
    """A Progress that remembers what it was told (the base class is silent)."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.done: list[str] = []
        self.lock = threading.Lock()

    def advance(self, path: str, nbytes: int) -> None:
        with self.lock:
            self.bytes[path] = self.bytes.get(path, 0) + nbytes

    def file_done(self, path: str) -> None:
        with self.lock:
            self.done.append(path)


@pytest.fixture
def no_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No token anywhere: every place looked at unset, HOME an empty folder; return HOME."""
    for name in TOKEN_VARS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def hf(hub: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_token: Path):
    """huggingface_hub pointed at ``hub``, with its own home, no token and no proxy."""
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    for name in HF_VARS_TO_DROP + PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    return hub


# --- the token ---------------------------------------------------------------------------


def test_the_token_comes_from_hf_token_first(no_token: Path, monkeypatch, tmp_path) -> None:
    token_file = tmp_path / "file-token"
    token_file.write_text("hf_fromfile\n")
    monkeypatch.setenv("HF_TOKEN_PATH", str(token_file))
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_legacyname")
    monkeypatch.setenv("HF_TOKEN", " hf_envtoken \n")
    assert hub.current_token() == "hf_envtoken"
    monkeypatch.setenv("HF_TOKEN", "")
    assert hub.current_token() == "hf_legacyname"
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN")
    assert hub.current_token() == "hf_fromfile"


def test_the_token_file_is_looked_for_where_hf_auth_login_writes_it(
    no_token: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert hub.current_token() is None
    default = no_token / ".cache" / "huggingface" / "token"
    default.parent.mkdir(parents=True)
    default.write_text("hf_inhome\n")
    assert hub.current_token() == "hf_inhome"
    xdg = tmp_path / "xdg"
    (xdg / "huggingface").mkdir(parents=True)
    (xdg / "huggingface" / "token").write_text("hf_inxdg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert hub.current_token() == "hf_inxdg"
    hf_home = tmp_path / "hfhome"
    hf_home.mkdir()
    (hf_home / "token").write_text("hf_inhfhome")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    assert hub.current_token() == "hf_inhfhome"
    (hf_home / "token").write_text(" \n")
    assert hub.current_token() is None  # an empty file is no token
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "missing"))
    assert hub.current_token() is None  # the file named, even if missing, is the one read


def test_scrub_hides_the_token_and_anything_that_looks_like_one(
    no_token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hub.scrub("sent secret-123 to x", token="secret-123") == "sent *** to x"
    assert hub.scrub("hf_abcdefgh and hf_abcdefg", token="") == "hf_*** and hf_abcdefg"
    assert hub.scrub("[hf_AbCdEfGh12]", token="") == "[hf_***]"
    monkeypatch.setenv("HF_TOKEN", "plain-secret")
    assert hub.scrub("a plain-secret b") == "a *** b"  # the token in use, when none is given
    assert hub.scrub("a plain-secret b", token="other") == "a plain-secret b"


# --- one-line errors ---------------------------------------------------------------------


def _error_of(call) -> WeightsError:
    with pytest.raises(WeightsError) as err:
        call()
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert "\n" not in str(err.value)
    return err.value


def test_an_unknown_repository_says_private_or_token(hf: HubServer) -> None:
    error = _error_of(lambda: hub.fetch_snapshot("org/none", None))
    assert str(error) == (
        f"repository org/none not found on {hf.url} (private? set HF_TOKEN or `hf auth login`)"
    )


def test_a_gated_repository_says_accept_its_terms(hf: HubServer) -> None:
    hf.add_repo("org/gated").commit({"config.json": b"{}"})
    hf.gated.add("org/gated")
    error = _error_of(lambda: hub.fetch_snapshot("org/gated", None))
    assert str(error) == (
        f"org/gated is gated on {hf.url}: accept its terms on the Hub and set HF_TOKEN"
    )


def test_an_unknown_revision_is_named(hf: HubServer) -> None:
    hf.add_repo("org/m").commit({"config.json": b"{}"})
    error = _error_of(lambda: hub.fetch_snapshot("org/m", "v9"))
    assert str(error) == f"revision 'v9' not found in org/m on {hf.url}"
    error = hub.translate_error(_revision_error(hf), "org/m", None)
    assert str(error) == f"revision 'main' not found in org/m on {hf.url}"


def _revision_error(hf: HubServer) -> BaseException:
    from huggingface_hub import HfApi

    try:
        HfApi().repo_info("org/m", revision="nope")
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def test_a_server_error_gives_its_status(hf: HubServer) -> None:
    hf.add_repo("org/m").commit({"config.json": b"{}"})
    hf.api_status = 500
    error = _error_of(lambda: hub.fetch_snapshot("org/m", None))
    assert str(error) == (
        f"the Hub ({hf.url}) answered HTTP 500 for org/m: Server error '500 Internal Server"
        f" Error' for url '{hf.url}/api/models/org/m/revision/main'"
    )


def _download_error(hf: HubServer, tmp_path: Path, path: str, revision: str = "main"):
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download("org/m", path, revision=revision, local_dir=tmp_path / "dl")
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def test_a_missing_file_and_an_unreachable_hub(
    hf: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf.add_repo("org/m").commit({"config.json": b"{}"})
    error = hub.translate_error(_download_error(hf, tmp_path, "gone.json"), "org/m", None)
    assert str(error) == f"a file of org/m@main is missing on {hf.url}: 404 Client Error."
    down = _point_at_a_closed_port(monkeypatch)
    error = _error_of(lambda: hub.fetch_snapshot("org/m", None))
    assert (
        str(error)
        == f"cannot reach the Hub at {down} (ConnectError: [Errno 111] Connection refused)"
    )
    # hf_hub_download wraps that error (after 23 s of retries) in LocalEntryNotFoundError
    from huggingface_hub import HfApi, errors

    try:
        HfApi().repo_info("org/m")
    except Exception as exc:
        cause = exc
    wrapped = errors.LocalEntryNotFoundError("An error happened while trying to locate the file")
    wrapped.__cause__ = cause
    error = hub.translate_error(wrapped, "org/m", "v1")
    assert str(error) == (
        f"cannot reach the Hub at {down} to fetch a file of org/m@v1"
        " (ConnectError: [Errno 111] Connection refused)"
    )


def _point_at_a_closed_port(monkeypatch: pytest.MonkeyPatch) -> str:
    """Point huggingface_hub at a loopback port nobody listens on; return its URL."""
    import socket

    from huggingface_hub import constants

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", url)
    template = url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    return url


def test_offline_without_a_local_copy(hf: HubServer, tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants, errors

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    said = "offline (HF_HUB_OFFLINE is set) and no complete local copy or mirror of org/m"
    error = hub.translate_error(_download_error(hf, tmp_path, "config.json"), "org/m", None)
    assert str(error) == said
    assert str(hub.translate_error(errors.OfflineModeIsEnabled("x"), "org/m", None)) == said
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    error = hub.translate_error(errors.LocalEntryNotFoundError("not cached\nmore"), "org/m", None)
    assert str(error) == (
        f"cannot reach the Hub at {hf.url} to fetch a file of org/m@main (not cached)"
    )


def test_local_failures_are_one_line(hf: HubServer) -> None:
    def said(exc: BaseException) -> str:
        return str(hub.translate_error(exc, "org/m", None))

    assert said(PermissionError(13, "Permission denied", "/dev/shm/m")) == (
        "permission denied: /dev/shm/m"
    )
    assert said(PermissionError("no entry\nmore")) == "permission denied: no entry"
    full = OSError(errno.ENOSPC, "No space left on device", "/dev/shm/m/a.bin")
    assert said(full) == "no space left on device while writing /dev/shm/m/a.bin"
    assert said(OSError(errno.ENOSPC, "full")) == "no space left on device while writing"
    assert said(OSError(errno.EIO, "Input/output error")) == "OSError: [Errno 5] Input/output error"
    assert said(ConnectionRefusedError(111, "refused")) == (
        f"cannot reach the Hub at {hf.url} (ConnectionRefusedError: [Errno 111] refused)"
    )
    assert said(TimeoutError()) == "TimeoutError: TimeoutError"
    assert said(ValueError("bad\nsecond")) == "ValueError: bad"
    assert said(RuntimeError("token hf_abcdefghij leaked")) == "RuntimeError: token hf_*** leaked"
    already = WeightsError("kept as it is")
    assert hub.translate_error(already, "org/m", None) is already


def test_network_errors_are_known_by_their_class_names(hf: HubServer) -> None:
    for name in ("ConnectError", "TimeoutException", "NetworkError", "ConnectionError"):
        error = type(name, (Exception,), {})("down")
        assert str(hub.translate_error(error, "org/m", None)) == (
            f"cannot reach the Hub at {hf.url} ({name}: down)"
        )


def test_the_endpoint_is_huggingface_hubs(hf: HubServer) -> None:
    assert hub.endpoint() == hf.url


# --- the file list -------------------------------------------------------------------------


def test_a_branch_is_resolved_then_its_tree_listed(hf: HubServer) -> None:
    big = os.urandom(1000)
    sha = hf.add_repo("org/m").commit(
        {"b.safetensors": big, "a/config.json": b"{}", "tok/t.json": b"[1]"}
    )
    snapshot = hub.fetch_snapshot("org/m", None)
    import hashlib

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
    error = _error_of(lambda: hub.download_files(missing_big, gone, tmp_path / "a", Recorder()))
    assert str(error).startswith("the Hub answered HTTP 404 for gone.safetensors: ")
    gone = [ManifestFile("gone.json", 20, None)]
    (tmp_path / "b").mkdir()
    error = _error_of(lambda: hub.download_files(missing_big, gone, tmp_path / "b", Recorder()))
    assert str(error).startswith(f"a file of org/m@{snapshot.revision} is missing on {hf.url}")
    both = [ManifestFile("big.safetensors", 300_000, None), ManifestFile("gone.json", 20, None)]
    (tmp_path / "c").mkdir()
    error = _error_of(lambda: hub.download_files(snapshot, both, tmp_path / "c", Recorder()))
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
