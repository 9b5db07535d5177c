"""model.present and shm.capacity against a REAL tmpfs mount (lab scenario 4).

A tmpfs is mounted for the test (root, like CI), model directories are written into it
with real safetensors files, and `gpudoctor check --model-dir` judges them through the
real CLI: complete, truncated shard, missing shard, and the manifest path.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, ManifestFile
from tests.conftest import lab_unavailable

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


def write_safetensors(path: Path, n_floats: int) -> int:
    """Write a valid one-tensor safetensors file; return its size in bytes."""
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}
    )
    header += " " * (-len(header) % 8)
    data = struct.pack("<Q", len(header)) + header.encode() + os.urandom(4 * n_floats)
    path.write_bytes(data)
    return len(data)


def make_model(directory: Path, shards: int = 3, n_floats: int = 50_000) -> dict[str, int]:
    """Create a sharded model (config.json, index, shards); return {file: size}."""
    directory.mkdir(parents=True)
    sizes = {}
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        sizes[name] = write_safetensors(directory / name, n_floats)
        weight_map[f"layer{i}.w"] = name
    index = {"metadata": {"total_size": shards * 4 * n_floats}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text('{"model_type": "llama"}')
    return sizes


@pytest.fixture
def tmpfs(tmp_path: Path):
    mnt = tmp_path / "shm"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        lab_unavailable(f"cannot mount a tmpfs (needs root): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def check(*dirs: Path) -> tuple[int, dict[str, dict]]:
    args = [a for d in dirs for a in ("--model-dir", str(d))]
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--only", "model.present", "--json", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    doc = json.loads(done.stdout)
    return done.returncode, {f["subject"]: f for f in doc["findings"]}


def test_complete_truncated_and_missing_shard_models(tmpfs: Path):
    assert "tmpfs" in Path("/proc/self/mounts").read_text().split(str(tmpfs))[1].split()[0]
    complete, truncated, missing = tmpfs / "complete", tmpfs / "truncated", tmpfs / "missing"
    make_model(complete)
    full = make_model(truncated)["model-00002-of-00003.safetensors"]
    shard = truncated / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1000])  # a download cut short
    make_model(missing)
    (missing / "model-00003-of-00003.safetensors").unlink()
    rc, by_dir = check(complete, truncated, missing, tmpfs / "gone")
    assert rc == 3
    assert by_dir[str(complete)]["status"] == "PASS"
    assert "3 weight file(s)" in by_dir[str(complete)]["message"]
    assert by_dir[str(truncated)]["status"] == "FAIL"
    expected = f"model-00002-of-00003.safetensors is {full - 1000} bytes but its header says {full}"
    assert expected + " (truncated)" in (by_dir[str(truncated)]["message"])
    assert by_dir[str(missing)]["status"] == "FAIL"
    assert "model-00003-of-00003.safetensors missing" in by_dir[str(missing)]["message"]
    assert "does not exist" in by_dir[str(tmpfs / "gone")]["message"]
    assert by_dir[str(tmpfs / "gone")]["remediation"].startswith("gpudoctor weights ensure")


def test_manifest_is_authoritative_and_names_the_repo(tmpfs: Path):
    model = tmpfs / "qwen"
    sizes = make_model(model, shards=2)
    files = tuple(ManifestFile(n, s, None) for n, s in sorted(sizes.items()))
    manifest = Manifest("Qwen/Qwen3-0.6B", "a" * 40, files, "2026-12-02T10:00:00Z")
    (model / MANIFEST_NAME).write_text(manifest.to_json())
    rc, by_dir = check(model)
    assert (
        rc == 0 and "per manifest (Qwen/Qwen3-0.6B@aaaaaaaaaaaa)" in by_dir[str(model)]["message"]
    )
    (model / files[0].path).write_bytes(b"x" * 10)
    rc, by_dir = check(model)
    assert rc == 3
    finding = by_dir[str(model)]
    assert f"{files[0].path} is 10 bytes, manifest says {files[0].size}" in finding["message"]
    assert finding["remediation"] == (
        f"gpudoctor weights ensure Qwen/Qwen3-0.6B --to {model} --revision {'a' * 40}"
    )


def test_unfinished_hf_download_is_flagged(tmpfs: Path):
    model = tmpfs / "partial"
    make_model(model, shards=1)
    cache = model / ".cache" / "huggingface" / "download"
    cache.mkdir(parents=True)
    (cache / "abc.incomplete").write_bytes(b"half")
    rc, by_dir = check(model)
    assert rc == 3 and "unfinished download files" in by_dir[str(model)]["message"]
