"""``weights ensure`` in this process (gpudoctor.weights.ensure.ensure) against the loopback
Hub (tests/weights/hub_server.py, huggingface_hub in process: tests/weights/hf_inprocess.py):
a download, the no-op, a repair, a restore from the mirror and the refusals, each stated
as what the user sees (the result, the one-line error, the files left on disk)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.weights import localfs
from gpudoctor.weights.ensure import EnsureRequest, EnsureResult, ensure
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import MANIFEST_NAME
from tests.weights.conftest import dir_files, model_part
from tests.weights.hf_inprocess import Recorder, error_of
from tests.weights.hub_server import HubServer

MODEL = {
    "model.safetensors": b"W" * 5000,
    "config.json": b'{"a": 1}\n',
    "tok/t.json": b"[1, 2]\n",
}


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gpudoctor's record of targets in the test's own folder, not /var/lib/gpudoctor."""
    state = tmp_path / "state"
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(state))
    return state


def _commit(hf: HubServer, files: dict[str, bytes] = MODEL, repo: str = "org/m") -> str:
    existing = hf.repos.get(repo) or hf.add_repo(repo)
    return existing.commit(files)


def _ensure(target: Path, **kwargs: object) -> EnsureResult:
    kwargs.setdefault("repo_id", "org/m")
    return ensure(EnsureRequest(target=target, **kwargs), Recorder())  # type: ignore[arg-type]


def _refusal(target: Path, **kwargs: object) -> str:
    """Return the one-line message of the WeightsError ensure raises before touching anything."""
    with pytest.raises(WeightsError) as err:
        _ensure(target, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def _serve_bad_bytes(hf: HubServer, repo: str, sha: str, path: str) -> None:
    """Make the Hub send other bytes of the same size for ``path`` (its listing unchanged)."""
    source = hf.repos[repo].commits[sha][path].source
    source.write_bytes(b"X" * source.stat().st_size)


# --- a download, then the no-op ------------------------------------------------------------


def test_a_first_run_downloads_the_model_and_seals_it(hf: HubServer, tmp_path: Path) -> None:
    sha = _commit(hf)
    target = tmp_path / "shm" / "m"
    target.parent.mkdir()
    result = _ensure(target)
    assert model_part(dir_files(target)) == MODEL
    manifest = localfs.read_manifest(target)
    assert manifest is not None and manifest.revision == sha and manifest.repo_id == "org/m"
    assert result.action == "downloaded" and result.source == "hub"
    assert result.revision == sha and result.target == str(target)
    assert (result.files_total, result.bytes_total) == (3, sum(map(len, MODEL.values())))
    assert (result.files_fetched, result.bytes_fetched) == (3, result.bytes_total)
    assert result.warnings == () and result.mirror_problem is None
    assert not result.mirror_updated and result.verify == "quick"
    assert not localfs.partial_dir(target).exists()
    assert result.to_dict()["warnings"] == [] and json.dumps(result.to_dict())


def test_a_complete_target_is_left_alone_without_asking_the_hub(
    hf: HubServer, tmp_path: Path
) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    hf.clear_log()
    again = _ensure(target)
    assert hf.requests == []
    assert (again.action, again.source, again.revision) == ("none", "local", sha)
    assert (again.files_total, again.files_fetched, again.bytes_fetched) == (3, 0, 0)
    assert again.bytes_total == sum(map(len, MODEL.values()))
    pinned = _ensure(target, revision=sha[:8])  # the same revision, named by a short sha
    assert pinned.action == "none" and hf.requests == []


def test_full_verify_of_a_complete_target_hashes_it_and_fetches_nothing(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    hf.clear_log()
    result = _ensure(target, verify="full")
    assert (result.action, result.verify, result.files_fetched) == ("none", "full", 0)
    assert hf.file_gets() == []


def test_a_target_of_another_repository_is_refused(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    _commit(hf, {"config.json": b"{}"}, repo="org/other")
    target = tmp_path / "m"
    _ensure(target)
    err = error_of(lambda: _ensure(target, repo_id="org/other"))
    assert str(err).startswith(f"{target} holds org/m, not org/other: choose another --to")
    assert model_part(dir_files(target)) == MODEL


# --- the request checked before anything is touched ------------------------------------------


@pytest.mark.parametrize("repo_id", ["org/../x", "-org/m", "org/m/extra", "org m", ""])
def test_an_invalid_repository_id_is_refused(tmp_path: Path, repo_id: str) -> None:
    assert (
        _refusal(tmp_path / "m", repo_id=repo_id)
        == f"invalid repository id {repo_id!r} (expected ORG/NAME)"
    )
    assert not (tmp_path / "m").exists()


def test_a_repository_without_an_org_is_accepted(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf, repo="gpt2")
    assert _ensure(tmp_path / "m", repo_id="gpt2").action == "downloaded"


def test_an_unknown_verify_mode_is_refused(tmp_path: Path) -> None:
    assert _refusal(tmp_path / "m", verify="fast") == "invalid verify mode 'fast' (quick or full)"


def test_a_mount_point_is_refused_as_target() -> None:
    err = _refusal(Path("/proc"))
    assert err.startswith("/proc is a mount point: it cannot be replaced atomically;")
    assert err.endswith("(--to /proc/MODEL)")


def test_a_file_named_like_gpudoctor_s_bookkeeping_is_not_fetched(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf, {"config.json": b"{}", MANIFEST_NAME: b"{}"})
    err = error_of(lambda: _ensure(tmp_path / "m"))
    assert str(err).startswith(f"org/m has a file named {MANIFEST_NAME!r}, which collides")
    assert not (tmp_path / "m").exists() and not localfs.partial_dir(tmp_path / "m").exists()
