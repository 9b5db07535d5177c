"""Ctrl-C during a mirror restore of a multi-GB file stops at once and leaves a partial
directory the next ``ensure`` resumes (issue 26.2). A real process copies a real 2 GiB
shard (random bytes, not a sparse file: a hole preallocated in the destination would read
as the right bytes) from a disk mirror into a real tmpfs; the test interrupts it once the
copy is under way. No wall time is asserted: the test checks what was on disk when the
process was gone (benchmarks/interrupt_latency.py measures the latency)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from gpudoctor.weights.copier import temp_path
from gpudoctor.weights.localfs import write_manifest
from gpudoctor.weights.manifest import Manifest, ManifestFile
from tests.weights.conftest import WeightsCli

REPO = "acme/big"
REVISION = "b" * 40
SHARD = "model-00001-of-00001.safetensors"
BLOCK = 64 << 20


def mem_available() -> int:
    """Return MemAvailable from /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def shard_size(where: Path) -> int:
    """Return the shard's size for this machine: 2 GiB, or skip when RAM or disk is short."""
    size = 2 << 30
    st = os.statvfs(where)
    if mem_available() < 3 * size or st.f_bavail * st.f_frsize < 2 * size:
        pytest.skip(f"needs {3 * size >> 30} GiB of free RAM and {2 * size >> 30} GiB of disk")
    return size


def make_mirror(root: Path, size: int) -> dict[str, bytes | None]:
    """Write a mirror ``root/acme/big`` (one ``size``-byte shard of random blocks, a config)
    with its manifest; return {path: small file's bytes, or None for the shard}."""
    model = root / "acme" / "big"
    model.mkdir(parents=True)
    block = os.urandom(BLOCK)
    digest = hashlib.sha256()
    with open(model / SHARD, "wb") as handle:
        for i in range(size // BLOCK):
            piece = block[i:] + block[:i]  # no two blocks alike
            handle.write(piece)
            digest.update(piece)
    config = b'{"architectures": ["LlamaForCausalLM"]}\n'
    (model / "config.json").write_bytes(config)
    files = (
        ManifestFile("config.json", len(config)),
        ManifestFile(SHARD, size, digest.hexdigest()),
    )
    write_manifest(model, Manifest(REPO, REVISION, files, "2026-12-02T10:00:00Z"))
    return {"config.json": config, SHARD: None}


def allocated(path: Path) -> int:
    """Return the bytes allocated to ``path`` (``du --block-size=1``), 0 when absent."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


@pytest.mark.signals
def test_ctrl_c_mid_restore_stops_at_once_and_the_rerun_resumes(
    hub, cli: WeightsCli, tmp_path: Path, tmpfs
) -> None:
    size = shard_size(tmp_path)
    mirror = tmp_path / "mirror"
    make_mirror(mirror, size)
    target = tmpfs(f"{(size >> 20) + 256}m") / "big"
    partial = target.with_name("big.partial")
    temp = temp_path(partial, SHARD)
    proc = cli.popen("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "-q")
    deadline = time.monotonic() + 120
    while allocated(temp) < 2 * BLOCK and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    at_signal = allocated(temp)
    assert 0 < at_signal < size

    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    _, stderr = proc.communicate(timeout=60)
    at_exit = allocated(temp)

    assert proc.returncode == 130, stderr
    assert "interrupted; run the same command again to resume" in stderr
    assert "Traceback" not in stderr
    # Gone long before the copy could have finished: most of the shard was never written,
    # and nothing writes to it any more (no thread outlived the process).
    assert at_exit < size // 2, (at_signal, at_exit, size)
    time.sleep(0.3)
    assert allocated(temp) == at_exit
    # Resumable: the shard is a temp file, never a file of the right size at its path.
    assert not target.exists() and partial.is_dir()
    assert not (partial / SHARD).exists()
    config_done = (partial / "config.json").exists()
    assert hub.requests == []

    rerun = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "--json")

    assert rerun.returncode == 0, rerun.output
    result = json.loads(rerun.stdout)
    assert (result["action"], result["source"], result["revision"]) == (
        "restored",
        "mirror",
        REVISION,
    )
    assert result["files_fetched"] == (1 if config_done else 2)
    assert not partial.exists() and sorted(os.listdir(target)) == [
        ".gpudoctor-manifest.json",
        "config.json",
        SHARD,
    ]
    full = cli.run("status", str(target), "--verify", "full", "--json")
    assert full.returncode == 0, full.output
    assert json.loads(full.stdout)["state"] == "complete"
    assert hub.requests == []
