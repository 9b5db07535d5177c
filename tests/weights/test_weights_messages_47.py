"""Weights messages that sent users the wrong way (issue 47's table), through the real CLI
(``python -m gpudoctor.commands.weights``), the loopback Hub and real files."""

from __future__ import annotations

from pathlib import Path

from tests.weights.conftest import WeightsCli, dir_files, make_model_files, model_part
from tests.weights.test_ensure_cli import REPO, publish

SHARD = "model-00001-of-00003.safetensors"


def flip_a_bit(path: Path) -> None:
    """Flip one bit in the middle of ``path`` (its size stays: a quick verify passes)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_mirror_shard_with_a_flipped_bit_is_named_as_the_mirrors_damage(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    """`weights ensure --mirror` from a mirror whose shard had a flipped bit said "failed
    quick verify and were re-fetched": it failed sha256, and the MIRROR is damaged and stays
    so. The warning says that and how to re-make it; that command works."""
    files = make_model_files()
    publish(hub, files)
    mirror = tmp_path / "mirror"
    assert cli.run("mirror", REPO, "--to", str(mirror), "-q").returncode == 0
    flip_a_bit(mirror / REPO / SHARD)
    target = tmp_path / "model"
    done = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror))
    assert done.returncode == 0, done.output
    assert model_part(dir_files(target)) == files
    remake = f"gpudoctor weights mirror {REPO} --to {mirror} --from {target}"
    assert (
        f"1 file(s) of the mirror {mirror} failed sha256 ({SHARD}) and were fetched from the Hub"
        f" instead; the mirror stays damaged: re-make it with {remake}"
    ) in done.output
    assert "failed quick verify" not in done.output
    assert cli.run("mirror", "--verify", str(mirror)).returncode == 3  # damaged, as said
    hub.stop()  # the command it names needs no Hub
    assert cli.run(*remake.split()[2:]).returncode == 0
    assert cli.run("mirror", "--verify", str(mirror)).returncode == 0


def test_mirror_verify_of_a_model_directory_names_weights_status(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    """`weights mirror --verify DIR` on a model dir said "holds no model with a gpudoctor
    manifest"; it is a model dir, and `weights status --verify full` is the command."""
    publish(hub, make_model_files())
    model = tmp_path / "model"
    assert cli.run("ensure", REPO, "--to", str(model), "-q").returncode == 0
    done = cli.run("mirror", "--verify", str(model))
    assert done.returncode == 1, done.output
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpudoctor: error: {model} is a model directory, not a mirror root (M with ORG/NAME"
        f" under it); check it with: gpudoctor weights status {model} --verify full"
    )
    assert cli.run("status", str(model), "--verify", "full").returncode == 0
