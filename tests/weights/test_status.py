"""``gpudoctor weights status`` in-process on real directories in tmp_path: each state a
user reads (missing, untrusted, unmanaged, incomplete, complete), the leftover ``.partial``
of an interrupted run, ``--verify full`` catching a flipped bit, and the ``--json`` shape."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.localfs import write_manifest
from gpudoctor.weights.manifest import Manifest, ManifestFile
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.status import StatusResult, status

SHARD = b"s" * 4096
SHA = "0123456789abcdef0123456789abcdef01234567"


def manifest() -> Manifest:
    files = (
        ManifestFile("config.json", 2, None),
        ManifestFile("model.safetensors", len(SHARD), hashlib.sha256(SHARD).hexdigest()),
    )
    return Manifest("acme/tiny", SHA, files, "2026-12-04T10:00:00Z")


def model_dir(path: Path, with_manifest: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_bytes(b"{}")
    (path / "model.safetensors").write_bytes(SHARD)
    if with_manifest:
        write_manifest(path, manifest())
    return path


def test_a_complete_directory(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m")
    result = status(target, Progress())
    assert result == StatusResult(
        target=str(target),
        state="complete",
        repo_id="acme/tiny",
        revision=SHA,
        created_at="2026-12-04T10:00:00Z",
        files_total=2,
        bytes_total=4098,
        verify="quick",
        problems=(),
        partial="",
    )
    assert result.complete


def test_a_relative_target_is_reported_absolute(tmp_path: Path, monkeypatch) -> None:
    model_dir(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    assert status(Path("m"), Progress()).target == str(tmp_path / "m")


def test_a_missing_directory_names_the_partial_left_by_an_interrupted_run(tmp_path: Path) -> None:
    target = tmp_path / "m"
    (tmp_path / "m.partial").mkdir()
    result = status(target, Progress(), verify="full")
    assert result == StatusResult(
        str(target), "missing", verify="full", partial=f"{target}.partial"
    )
    assert not result.complete
    assert status(tmp_path / "other", Progress()).partial == ""


def test_a_directory_without_a_manifest_is_unmanaged(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m", with_manifest=False)
    (tmp_path / "m.partial").mkdir()
    result = status(target, Progress(), verify="full")
    assert result == StatusResult(
        str(target), "unmanaged", verify="full", partial=f"{target}.partial"
    )


def test_a_directory_others_can_write_is_untrusted(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m")
    os.chmod(target, 0o777)
    result = status(target, Progress(), verify="full")
    assert (result.state, result.verify, result.repo_id) == ("untrusted", "full", "")
    assert result.target == str(target)
    (problem,) = result.problems
    assert (problem.path, problem.problem) == (".", "untrusted")
    assert f"{target} (the model directory) is writable by others" in problem.detail


def test_a_manifest_others_can_write_is_untrusted(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m")
    os.chmod(target / ".gpudoctor-manifest.json", 0o666)
    assert status(target, Progress()).state == "untrusted"


def test_a_missing_shard_and_a_leftover_download_make_it_incomplete(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m")
    (target / "config.json").unlink()
    (target / "x.incomplete").write_bytes(b"")
    result = status(target, Progress())
    assert result.state == "incomplete" and not result.complete
    assert result.problems == (
        FileProblem("config.json", "missing", "missing"),
        FileProblem("x.incomplete", "unfinished", "is an unfinished download"),
    )
    assert (result.repo_id, result.files_total, result.bytes_total) == ("acme/tiny", 2, 4098)


def test_a_flipped_bit_is_seen_by_full_verify_only(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m")
    (target / "model.safetensors").write_bytes(b"S" + SHARD[1:])
    assert status(target, Progress()).state == "complete"  # sizes are right
    full = status(target, Progress(), verify="full")
    assert (full.state, full.verify) == ("incomplete", "full")
    assert [(p.path, p.problem) for p in full.problems] == [("model.safetensors", "sha256")]
    (target / "y.lock").write_bytes(b"")
    full = status(target, Progress(), verify="full")  # the whole directory, as quick does
    assert [p.path for p in full.problems] == ["y.lock", "model.safetensors"]


def test_the_json_shape(tmp_path: Path) -> None:
    target = model_dir(tmp_path / "m")
    (target / "config.json").unlink()
    data = status(target, Progress()).to_dict()
    assert data["problems"] == [{"path": "config.json", "problem": "missing", "detail": "missing"}]
    assert data["state"] == "incomplete" and data["target"] == str(target)
    assert set(data) == {
        "target", "state", "repo_id", "revision", "created_at", "files_total",
        "bytes_total", "verify", "problems", "partial",
    }  # fmt: skip


@pytest.mark.parametrize("verify", ["quick", "full"])
def test_the_verify_asked_is_reported(tmp_path: Path, verify: str) -> None:
    assert status(model_dir(tmp_path / "m"), Progress(), verify=verify).verify == verify


def test_a_complete_directory_still_names_a_leftover_partial(tmp_path: Path) -> None:
    """A finished model beside the ``.partial`` of a later, interrupted refresh: complete,
    and the leftover is named so the user can remove it (it may hold gigabytes)."""
    target = model_dir(tmp_path / "m")
    (tmp_path / "m.partial").mkdir()
    result = status(target, Progress())
    assert (result.state, result.partial) == ("complete", f"{target}.partial")
