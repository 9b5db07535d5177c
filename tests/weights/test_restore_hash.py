"""A restore from a mirror proves the bytes it wrote (issue 34.4): every file is hashed
while it is copied, against the mirror's sealed manifest (``weights mirror`` gives every
file a sha256). Real processes, the loopback Hub, a real mirror with one flipped bit."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gpudoctor.weights.copier import copy_files
from gpudoctor.weights.progress import Progress
from tests.weights.conftest import WeightsCli, dir_files, make_model_files, model_part
from tests.weights.test_complete_agreement import check_verdict
from tests.weights.test_ensure_cli import REPO, assert_one_line_error, publish

SHARD = "model-00002-of-00003.safetensors"


def _mirror_with_a_flipped_bit(hub, cli: WeightsCli, tmp_path: Path) -> tuple[Path, dict]:
    files = make_model_files()
    publish(hub, files)
    mirror = tmp_path / "mirror"
    assert cli.run("mirror", REPO, "--to", str(mirror)).returncode == 0
    shard = mirror / "acme/tiny-27b" / SHARD
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, same size: the quick verify (sizes) passes it
    shard.write_bytes(bytes(data))
    return mirror, files


def test_a_flipped_bit_in_the_mirror_is_never_restored_as_good(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    """34.4: `ensure --mirror M --mirror-only` copied a shard with one flipped bit, said
    "restored from mirror", exit 0, and `check --model-dir` PASSed it. Now the restore
    fails naming the shard's sha256, the target is not published, check does not PASS."""
    mirror, _ = _mirror_with_a_flipped_bit(hub, cli, tmp_path)
    hub.stop()
    target = tmp_path / "model"
    run = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "--mirror-only")
    assert_one_line_error(run, f"--mirror-only: {SHARD} from the mirror failed verify")
    assert "copied bytes have sha256" in run.stderr
    assert not target.exists()
    partial = tmp_path / "model.partial"
    assert not (partial / SHARD).exists()  # the proven-bad copy was never renamed into place
    verdict = check_verdict(target, cli.env())
    assert verdict["status"] != "PASS", verdict


def test_a_flipped_bit_in_the_mirror_is_fetched_again_from_the_hub(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    """34.4: with the Hub reachable, the shard the mirror serves wrong is downloaded
    again (said in a warning) and the target holds the true bytes."""
    mirror, files = _mirror_with_a_flipped_bit(hub, cli, tmp_path)
    target = tmp_path / "model"
    run = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "--json")
    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert result["action"] == "restored"
    assert any(f"1 file(s) of the mirror {mirror} failed sha256 ({SHARD})" in w
               for w in result["warnings"]), result  # fmt: skip
    assert model_part(dir_files(target)) == files
    assert check_verdict(target, cli.env())["status"] == "PASS"


def test_copy_hashes_files_of_many_chunks_written_out_of_order(tmp_path: Path) -> None:
    """The running hash follows chunks finished in any order (16 threads, 5 chunks of
    one 80 MiB file, two other files): right digests pass, a wrong one is left out."""
    source = tmp_path / "src"
    source.mkdir()
    blobs = {"big.bin": bytes(range(256)) * (80 << 12), "small.bin": b"x" * 1000, "empty": b""}
    for name, blob in blobs.items():
        (source / name).write_bytes(blob)
    sizes = {name: len(blob) for name, blob in blobs.items()}
    right = {name: hashlib.sha256(blob).hexdigest() for name, blob in blobs.items()}
    dest = tmp_path / "dest"
    assert copy_files(source, dest, sizes, Progress(), workers=16, expected=right) == []
    assert dir_files(dest) == blobs
    wrong = {**right, "big.bin": "0" * 64}
    bad = copy_files(source, tmp_path / "dest2", sizes, Progress(), workers=16, expected=wrong)
    assert [(p.path, p.problem) for p in bad] == [("big.bin", "sha256")]
    assert sorted(dir_files(tmp_path / "dest2")) == ["empty", "small.bin"]
