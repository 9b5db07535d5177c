"""gpudoctor.weights.hub in this process against the loopback Hub: where the token comes
from and that it never shows, and every failure as one line that says what to do
(huggingface_hub in process: tests/weights/hf_inprocess.py)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gpudoctor.weights import hub
from gpudoctor.weights.errors import WeightsError
from tests.weights.hf_inprocess import error_of
from tests.weights.hub_server import HubServer

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


def test_an_unknown_repository_says_private_or_token(hf: HubServer) -> None:
    error = error_of(lambda: hub.fetch_snapshot("org/none", None))
    assert str(error) == (
        f"repository org/none not found on {hf.url} (private? set HF_TOKEN or `hf auth login`)"
    )


def test_a_gated_repository_says_accept_its_terms(hf: HubServer) -> None:
    hf.add_repo("org/gated").commit({"config.json": b"{}"})
    hf.gated.add("org/gated")
    error = error_of(lambda: hub.fetch_snapshot("org/gated", None))
    assert str(error) == (
        f"org/gated is gated on {hf.url}: accept its terms on the Hub and set HF_TOKEN"
    )


def test_an_unknown_revision_is_named(hf: HubServer) -> None:
    hf.add_repo("org/m").commit({"config.json": b"{}"})
    error = error_of(lambda: hub.fetch_snapshot("org/m", "v9"))
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
    error = error_of(lambda: hub.fetch_snapshot("org/m", None))
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
    error = error_of(lambda: hub.fetch_snapshot("org/m", None))
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
