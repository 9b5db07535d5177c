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


def test_a_second_campaign_never_takes_the_first_ones_unit(tmp_path: Path) -> None:
    """47.2: a second `service install` with another --out (same default --name) replaced
    the first campaign's boot unit without a word. Now it is refused (exit 1, nothing
    written) naming the campaign it serves; --name installs beside it, --force replaces."""
    root = _root(tmp_path, relative_paths=False)
    unit = root / "etc/systemd/system/gpudoctor-campaign.service"
    first = _install(
        "/root/plan.toml", "--out", "/var/lib/runs/a", "--root", str(root), cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr
    before = unit.read_text()
    again = _install(
        "/root/plan.toml", "--out", "/var/lib/runs/a", "--root", str(root), cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr  # the same campaign: "unchanged"

    second = _install(
        "/root/plan.toml", "--out", "/var/lib/runs/b", "--root", str(root), cwd=tmp_path
    )
    assert second.returncode == 1, second.stderr
    assert second.stderr.strip().splitlines()[-1] == (
        "gpudoctor: error: gpudoctor-campaign.service serves another campaign (--out"
        " /var/lib/runs/a); give --name NAME to install this campaign beside it, or --force"
        " to replace it (nothing was written)"
    )
    assert unit.read_text() == before
    assert "--out /var/lib/runs/a" in (root / "usr/local/sbin/gpudoctor-campaign").read_text()

    beside = _install("/root/plan.toml", "--out", "/var/lib/runs/b", "--name", "b",
                      "--root", str(root), cwd=tmp_path)  # fmt: skip
    assert beside.returncode == 0, beside.stderr
    assert unit.read_text() == before
    forced = _install("/root/plan.toml", "--out", "/var/lib/runs/b", "--force",
                      "--root", str(root), cwd=tmp_path)  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert "!/var/lib/runs/b/.gpudoctor-service-done" in unit.read_text()


def test_a_unit_gpudoctor_did_not_write_is_never_replaced(tmp_path: Path) -> None:
    """47.2 (and 47.1's rule): a gpudoctor-campaign.service someone wrote by hand stays."""
    root = _root(tmp_path, relative_paths=False)
    unit = root / "etc/systemd/system/gpudoctor-campaign.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/local/bin/mine\n")
    done = _install(
        "/root/plan.toml", "--out", "/var/lib/runs/a", "--root", str(root), cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert "gpudoctor-campaign.service was not written by gpudoctor service install" in done.stderr
    assert unit.read_text() == "[Service]\nExecStart=/usr/local/bin/mine\n"


def test_campaign_of_reads_the_run_directory_of_its_own_units_only() -> None:
    from gpudoctor.service.campaign import UNIT_FIRST_LINE, campaign_of

    head = UNIT_FIRST_LINE + "\n[Unit]\n"
    marker = "/.gpudoctor-service-done"
    assert campaign_of(head + f"ConditionPathExists=!/runs/100%%{marker}\n") == "/runs/100%"
    assert campaign_of(head + f"ConditionPathExists=/runs/a{marker}\n") is None  # no "!"
    assert campaign_of(head + "ConditionPathExists=!/runs/a/other\n") is None
    assert campaign_of(head) is None
    assert campaign_of(f"[Unit]\nConditionPathExists=!/runs/a{marker}\n") is None
    assert campaign_of(UNIT_FIRST_LINE + f"ConditionPathExists=!/a{marker}") is None
