"""``gpudoctor weights mirror REPO --to M [--from DIR]`` and ``weights mirror --verify M``
(issue 26.3): real processes, the loopback Hub, real files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from gpudoctor.weights.manifest import MANIFEST_NAME, parse_manifest
from tests.weights.conftest import WeightsCli, dir_files, make_model_files, model_part
from tests.weights.test_ensure_cli import REPO, assert_one_line_error, publish

SHARD = "model-00001-of-00003.safetensors"


def assert_sealed(model: Path, files: dict[str, bytes], sha: str) -> None:
    """The mirror copy holds ``files`` and a manifest with every file's true sha256."""
    assert model_part(dir_files(model)) == files
    manifest = parse_manifest((model / MANIFEST_NAME).read_text())
    assert manifest.revision == sha
    assert {f.path: f.sha256 for f in manifest.files} == {
        p: hashlib.sha256(data).hexdigest() for p, data in files.items()
    }


def test_mirror_from_the_hub_then_restore_with_mirror_only(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    files = make_model_files()
    sha = publish(hub, files)
    mirror = tmp_path / "mirror"

    run = cli.run("mirror", REPO, "--to", str(mirror), "--json")

    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert (result["repo_id"], result["revision"], result["intact"]) == (REPO, sha, True)
    assert_sealed(mirror / "acme/tiny-27b", files, sha)
    assert len(hub.file_gets()) == len(files)
    hub.stop()
    target = tmp_path / "model"
    restore = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "--mirror-only")
    assert restore.returncode == 0, restore.output
    assert model_part(dir_files(target)) == files
    assert cli.run("mirror", "--verify", str(mirror)).returncode == 0


def test_mirror_from_a_complete_local_copy_needs_no_hub(
    hub, cli: WeightsCli, tmp_path: Path, tmpfs
) -> None:
    files = make_model_files()
    sha = publish(hub, files)
    local = tmpfs("32m") / "tiny"
    assert cli.run("ensure", REPO, "--to", str(local), "-q").returncode == 0
    hub.stop()
    mirror = tmp_path / "mirror"

    run = cli.run("mirror", REPO, "--to", str(mirror), "--from", str(local))

    assert run.returncode == 0, run.output
    assert run.stdout.startswith(f"mirrored: {REPO}@{sha[:12]} in {mirror / 'acme/tiny-27b'}")
    assert_sealed(mirror / "acme/tiny-27b", files, sha)
    assert not (mirror / "acme/tiny-27b.partial").exists()


def test_incomplete_or_unmanaged_source_is_refused(hub, cli: WeightsCli, tmp_path: Path) -> None:
    files = make_model_files()
    publish(hub, files)
    local, mirror = tmp_path / "local", tmp_path / "mirror"
    assert cli.run("ensure", REPO, "--to", str(local), "-q").returncode == 0
    with open(local / SHARD, "r+b") as handle:  # a bit flip: the size is still right
        handle.seek(10)
        handle.write(b"\xff")
    run = cli.run("mirror", REPO, "--to", str(mirror), "--from", str(local))
    assert_one_line_error(run, f"--from {local} is not complete: 1 file(s) wrong, e.g. {SHARD}")
    assert not mirror.exists()
    (local / MANIFEST_NAME).unlink()
    run = cli.run("mirror", REPO, "--to", str(mirror), "--from", str(local))
    assert_one_line_error(run, "has no gpudoctor .gpudoctor-manifest.json: make it complete first")
    usage = cli.run("mirror", REPO)
    assert usage.returncode == 2 and "give REPO_ID --to M" in usage.stderr


def test_verify_lists_every_bad_and_missing_file(hub, cli: WeightsCli, tmp_path: Path) -> None:
    files = make_model_files()
    publish(hub, files)
    mirror = tmp_path / "mirror"
    assert cli.run("mirror", REPO, "--to", str(mirror), "-q").returncode == 0
    model = mirror / "acme/tiny-27b"
    with open(model / SHARD, "r+b") as handle:
        handle.seek(1000)
        byte = handle.read(1)
        handle.seek(1000)
        handle.write(bytes([byte[0] ^ 1]))
    (model / "tokenizer/tokenizer_config.json").write_bytes(b'{"model_max_length": 4097}\n')
    (model / "config.json").unlink()

    run = cli.run("mirror", "--verify", str(mirror))
    as_json = cli.run("mirror", "--verify", str(mirror), "--json")

    assert run.returncode == 3, run.output
    assert run.stdout.startswith(f"NOT intact: {REPO}@")
    for line in (
        "  missing: config.json missing",
        f"  sha256: {SHARD} has sha256",
        "  sha256: tokenizer/tokenizer_config.json has sha256",  # a small file: hashed here
    ):
        assert line in run.stdout, run.stdout
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 3 and doc["intact"] is False
    problems = {(p["path"], p["problem"]) for p in doc["models"][0]["problems"]}
    assert problems == {
        ("config.json", "missing"),
        (SHARD, "sha256"),
        ("tokenizer/tokenizer_config.json", "sha256"),
    }
    empty = cli.run("mirror", "--verify", str(tmp_path))
    assert_one_line_error(empty, "holds no model with a gpudoctor manifest")


def test_mirror_directory_others_can_write_is_refused(hub, cli: WeightsCli, tmp_path: Path) -> None:
    publish(hub, make_model_files())
    mirror = tmp_path / "mirror"
    (mirror / "acme/tiny-27b").mkdir(parents=True)
    os.chmod(mirror / "acme/tiny-27b", 0o777)
    run = cli.run("mirror", REPO, "--to", str(mirror))
    assert_one_line_error(run, "is writable by others (mode 0777)")
    assert hub.file_gets() == []
