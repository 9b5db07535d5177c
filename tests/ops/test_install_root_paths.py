"""`service install --root` with the docs' example plan (relative model paths) and a
relative --out (issue 34.3). The real CLI in a subprocess, a real root directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ops.test_units import PLAN, add_interpreter


def _install(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "service", "install", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)  # fmt: skip


def _root(tmp_path: Path, relative_paths: bool = True) -> Path:
    root = tmp_path / "ct-rootfs"
    (root / "root").mkdir(parents=True)
    relative = (
        PLAN
        if not relative_paths
        else PLAN.replace('dir = "/dev/shm/tiny"', 'dir = "models/tiny"').replace(
            'mirror = "/var/lib/models"', 'mirror = "../var/lib/models"'
        )
    )
    (root / "root/plan.toml").write_text(relative)
    add_interpreter(root)
    return root


def test_relative_model_paths_resolve_inside_the_root(tmp_path: Path) -> None:
    """34.3: `AttributeError: 'PurePosixPath' object has no attribute 'resolve'` on any
    plan with a relative model path. They resolve against the plan's directory as the
    system under ROOT sees it, never this machine's."""
    root = _root(tmp_path)
    done = _install(
        "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    wrapper = (root / "usr/local/sbin/gpudoctor-campaign").read_text()
    assert "weights ensure org/tiny --to /root/models/tiny --mirror /var/lib/models" in wrapper


def test_relative_out_with_root_is_refused(tmp_path: Path) -> None:
    """34.3: `--out runs/q --root ROOT` wrote this machine's cwd (/home/me/runs/q) into
    the unit, a path meaningless inside the container. Refused, nothing written."""
    root = _root(tmp_path, relative_paths=False)
    done = _install("/root/plan.toml", "--out", "runs/q", "--root", str(root), cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert (
        "runs/q is relative: with --root give the run directory as the system under" in done.stderr
    )
    assert "(--out /var/lib/runs/q)" in done.stderr
    assert not os.path.lexists(root / "usr/local/sbin/gpudoctor-campaign")
    assert not os.path.lexists(root / "etc/systemd")
