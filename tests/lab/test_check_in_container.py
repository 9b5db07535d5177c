"""Issue 2, lab scenarios 1-3: ``gpudoctor check`` run INSIDE real LXC containers on pure
cgroup v2, with a real char device (the stand-in GPU, misc 10:232) bind-mounted in.

The package is not installed in the container: the host's Python and the repo are
bind-mounted read-only (see tests/lab/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab, LabContainer
from tests.lab.sshd import LabSSHD

pytestmark = pytest.mark.lab

DEVICE_ARG = f"{FAKE_GPU_INSIDE}:misc"


def check_json(ct: LabContainer, *args: str) -> tuple[int, dict[str, Any]]:
    """Run ``gpudoctor check --json ARGS`` inside ``ct``; return (exit code, report)."""
    result = ct.gpudoctor("check", "--json", *args)
    assert result.stdout.strip(), f"no report (rc {result.returncode}): {result.stderr[-800:]}"
    return result.returncode, json.loads(result.stdout)


def findings(report: dict[str, Any], check: str, subject: str) -> list[dict[str, Any]]:
    """Return the findings of ``check`` about ``subject``."""
    return [f for f in report["findings"] if f["check"] == check and f["subject"] == subject]


def test_denied_device_fails_device_open_with_eperm(denied_container: LabContainer) -> None:
    """Scenario 1: the node exists, its mode allows access, the rules lack major 10."""
    code, report = check_json(denied_container, "--device", DEVICE_ARG)
    assert code == 3
    assert report["schema"] == "gpudoctor.check/1"
    assert report["status"] == "FAIL"
    (opened,) = findings(report, "device.open", FAKE_GPU_INSIDE)
    assert opened["status"] == "FAIL"
    assert "EPERM" in opened["message"]
    assert "major 10" in opened["message"]
    assert "lxc.cgroup2.devices.allow: c 10:* rwm" in opened["remediation"]
    assert any("EPERM" in line for line in opened["evidence"])
    assert opened["fix_hint"].startswith("gpudoctor fix")
    # The node itself is fine: the verdict is about the policy, not the node.
    (node,) = findings(report, "device.nodes", FAKE_GPU_INSIDE)
    assert node["status"] == "PASS"


def test_allowed_device_passes(allowed_container: LabContainer) -> None:
    """Scenario 2: with ``lxc.cgroup2.devices.allow = c 10:* rwm`` the same check passes."""
    code, report = check_json(allowed_container, "--device", DEVICE_ARG, "--only", "device")
    assert code == 0, report
    (opened,) = findings(report, "device.open", FAKE_GPU_INSIDE)
    assert opened["status"] == "PASS"
    assert all(f["status"] in ("PASS", "SKIP", "WARN") for f in report["findings"])


def test_same_container_passes_after_rule_added_and_restart(
    denied_container: LabContainer, lab: Lab
) -> None:
    """The incident's fix, by hand: add the rule, restart, the check turns green."""
    code, _ = check_json(denied_container, "--device", DEVICE_ARG, "--only", "device")
    assert code == 3
    before = denied_container.init_pid()
    denied_container.set_device_rules([f"c {lab.fake_gpu_major}:* rwm"])
    denied_container.restart()
    assert denied_container.init_pid() != before
    code, report = check_json(denied_container, "--device", DEVICE_ARG, "--only", "device")
    assert code == 0, report


def test_missing_and_stale_nodes_are_diagnosed_distinctly(
    lab_container: Callable[..., LabContainer], lab: Lab
) -> None:
    """Scenario 3: a missing node and a node with a wrong (stale) major."""
    stale = lab.make_node("stalegpu", 11, 0)  # misc is 10 in /proc/devices
    ct = lab_container(
        devices={FAKE_GPU_INSIDE: str(lab.fake_gpu), "/dev/stalegpu": str(stale)},
        allow=[f"c {lab.fake_gpu_major}:* rwm"],
    )
    code, report = check_json(
        ct,
        "--device",
        DEVICE_ARG,
        "--device",
        "/dev/stalegpu:misc",
        "--device",
        "/dev/missinggpu:misc",
        "--only",
        "device",
    )
    assert code == 3
    (missing,) = findings(report, "device.nodes", "/dev/missinggpu")
    (stale_node,) = findings(report, "device.nodes", "/dev/stalegpu")
    (good,) = findings(report, "device.nodes", FAKE_GPU_INSIDE)
    assert missing["status"] == "FAIL"
    assert "does not exist" in missing["message"] or "missing" in missing["message"]
    assert stale_node["status"] == "FAIL"
    assert "stale" in stale_node["message"]
    assert "11:0" in stale_node["message"]
    assert "major 10" in stale_node["message"]
    assert good["status"] == "PASS"
    assert missing["message"] != stale_node["message"]
    # The stand-in itself still opens: only the two broken nodes fail.
    (opened,) = findings(report, "device.open", FAKE_GPU_INSIDE)
    assert opened["status"] == "PASS"


def test_human_report_names_the_remedy(denied_container: LabContainer) -> None:
    """The default (human) output carries the verdict and the config line too."""
    result = denied_container.gpudoctor("check", "--device", DEVICE_ARG, "--only", "device")
    assert result.returncode == 3
    assert "FAIL" in result.stdout
    assert "EPERM" in result.stdout
    assert "c 10:* rwm" in result.stdout


def test_check_from_outside_over_ssh_and_lxc_attach(
    lab_sshd: LabSSHD, denied_container: LabContainer, tmp_path: Path
) -> None:
    """``gpudoctor check --host <pve-like host> --ct NAME --flavor lxc``: the catalogue runs
    INSIDE the container through SSH + lxc-attach (no gpudoctor installed there: the
    agent is sent over stdin), with the user's ~/.ssh/config and known_hosts."""
    home = lab_sshd.client_home(tmp_path / "home")
    argv = [
        sys.executable,
        "-m",
        "gpudoctor",
        "check",
        "--host",
        "labpve",
        "--ct",
        denied_container.name,
        "--flavor",
        "lxc",
        "--device",
        DEVICE_ARG,
        "--only",
        "device",
        "--json",
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(home)}
    )
    assert done.returncode == 3, done.stderr[-800:]
    report = json.loads(done.stdout)
    assert report["target"] == f"labpve/{denied_container.name}"
    (opened,) = findings(report, "device.open", FAKE_GPU_INSIDE)
    assert opened["status"] == "FAIL"
    assert "EPERM" in opened["message"]
    assert "c 10:* rwm" in opened["remediation"]
