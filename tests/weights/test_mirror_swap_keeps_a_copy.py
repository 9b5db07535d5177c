"""Refreshing a model in a mirror never leaves the mirror without a complete copy: the new
copy is built aside (``NAME.partial``) and renamed in, the old one removed only after;
when renaming the new copy in fails (EIO, a full or read-only filesystem), the old copy
is still there, complete (under its name, or ``NAME.old`` beside it).

`gpudoctor weights mirror` as a real process against the loopback Hub and real files; the
rename failure is a real one, injected into that process by strace (``-e inject``, only
for rename(2) of the new copy's ``NAME.partial`` directory: the files inside it are
written with renameat(2), which is left alone)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.weights.conftest import WeightsCli, make_model_files
from tests.weights.test_ensure_cli import REPO, publish
from tests.weights.test_mirror_command import assert_sealed


def test_a_failed_swap_leaves_the_complete_old_copy(hub, cli: WeightsCli, tmp_path: Path) -> None:
    strace = shutil.which("strace")
    if strace is None:
        if os.environ.get("GPUDOCTOR_REQUIRE_LAB"):
            pytest.fail("strace is not installed (tests/run.sh installs it)")
        pytest.skip("strace is not installed (apt-get install strace; tests/run.sh does)")
    files = make_model_files()
    sha = publish(hub, files)
    mirror = tmp_path / "mirror"
    model = mirror / "acme/tiny-27b"
    assert cli.run("mirror", REPO, "--to", str(mirror), "-q").returncode == 0
    local = tmp_path / "local"
    assert cli.run("ensure", REPO, "--to", str(local), "-q").returncode == 0
    hub.stop()
    argv = [strace, "-f", "-qq", "-e", "signal=none", "-o", str(tmp_path / "strace.log"),
            "-P", f"{model}.partial", "-e", "trace=rename",
            "-e", "inject=rename:error=EIO",
            *cli.command("mirror", REPO, "--to", str(mirror), "--from", str(local))]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, env=cli.env(), timeout=120)
    assert "(INJECTED)" in (tmp_path / "strace.log").read_text()  # the swap really failed
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    kept = [p for p in (model, model.with_name(model.name + ".old")) if p.is_dir()]
    assert kept, sorted(p.name for p in model.parent.iterdir())
    assert_sealed(kept[0], files, sha)  # the old copy, complete


def test_a_refresh_after_an_interrupted_one_leaves_one_clean_copy(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    """An earlier refresh killed midway left ``NAME.partial`` and ``NAME.old`` behind: the
    next refresh starts from a clean staging copy and, once swapped, removes the old one
    (a model of 140 GB is not kept twice)."""
    files = make_model_files()
    sha = publish(hub, files)
    mirror = tmp_path / "mirror"
    model = mirror / "acme/tiny-27b"
    assert cli.run("mirror", REPO, "--to", str(mirror), "-q").returncode == 0
    local = tmp_path / "local"
    assert cli.run("ensure", REPO, "--to", str(local), "-q").returncode == 0
    hub.stop()
    for leftover in ("tiny-27b.partial", "tiny-27b.old"):
        (mirror / "acme" / leftover).mkdir()
        (mirror / "acme" / leftover / "junk.bin").write_bytes(b"half a shard")
    done = cli.run("mirror", REPO, "--to", str(mirror), "--from", str(local))
    assert done.returncode == 0, done.output
    assert sorted(p.name for p in model.parent.iterdir()) == ["tiny-27b"]
    assert not (model / "junk.bin").exists()
    assert_sealed(model, files, sha)
