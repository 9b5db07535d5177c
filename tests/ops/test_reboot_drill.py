"""Issue 15 items 2 and 4: a campaign survives a host reboot without a human, in real LXC.

A lab CT (real LXC on pure cgroup v2, tests/lab) gets its boot unit from `gpudoctor service
install` run inside it. Its init stands in for systemd and starts the unit's ExecStart at
each boot (tests/ops/campaign_ct.py says how). The campaign is real: `gpudoctor bench` with
the ``command`` engine running stream_server.py (a real streaming server reading the tiny
model's tokenizer from the tmpfs the unit restored).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.lab.lxc import Lab
from tests.lab.sshd import LabSSHD
from tests.ops.campaign_ct import (
    PLAN,
    SHM_DIR,
    UNIT,
    CampaignCt,
    install_unit,
    make_campaign_ct,
    prepare_campaign_ct,
)

pytestmark = pytest.mark.lab

STANDIN_MOVED = (203, 0)  # /dev/cpu/0/cpuid's numbers: another real char driver (cpu/cpuid)


def assert_every_cell_exactly_once(campaign: CampaignCt) -> None:
    """Every cell of the plan is in results.jsonl exactly once, all ok."""
    plan = load_plan(campaign.host_path(PLAN))
    records, _ = read_records(campaign.results)
    counts = collections.Counter(r["key"] for r in records)
    assert all(n == 1 for n in counts.values()), counts.most_common(3)
    assert set(counts) == {c.key for c in plan.cells()}
    assert all(r["status"] == "ok" for r in records), [r["reason"] for r in records]


def run_until_partway(campaign: CampaignCt, total: int) -> int:
    """Start the CT and let its unit run the campaign until some but not all cells are
    recorded; then stop the CT like a power cut (PID 1 exits, the kernel kills the rest).
    Return the cells recorded before the stop."""
    campaign.ct.start()
    campaign.wait(lambda: campaign.records() >= 2, 120, "the unit's campaign records 2 cells")
    campaign.ct.stop(kill=True)
    done = campaign.records()
    assert 2 <= done < total, f"{done} of {total}: the stop must fall mid-campaign"
    return done


def test_ct_restart_wipes_tmpfs_and_the_unit_resumes_the_campaign_exactly_once(
    lab: Lab, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Item 2 + the drill without a major move: start, stop mid-campaign (tmpfs wiped),
    start: the unit restores the weights from the mirror and resumes; no cell twice; once
    done, a further boot runs nothing. The test types no gpudoctor command after install."""
    campaign = make_campaign_ct(lab, tiny_model_dir, tmp_path, allow=["c 10:232 rwm"])
    total = len(load_plan(campaign.host_path(PLAN)).cells())
    first = run_until_partway(campaign, total)
    assert campaign.unit_log().count("GPU ready: gpudoctor check passed") == 1

    campaign.ct.start()  # the "host is back": a fresh tmpfs on /dev/shm
    campaign.wait(
        campaign.done,
        180,
        "the campaign finishes after the restart",
    )
    log = campaign.unit_log()
    assert log.count("GPU ready: gpudoctor check passed") == 2
    # weights ensure restored the tmpfs from the mirror at each boot (not "none": it was empty)
    restores = [line for line in log.splitlines() if "restored" in line and "mirror" in line]
    assert len(restores) == 2, log[-3000:]
    assert "campaign done" in log
    assert_every_cell_exactly_once(campaign)
    assert campaign.records() == total > first

    # the unit stops once the campaign is done: the next boot skips it
    campaign.ct.stop()
    campaign.ct.start()
    campaign.wait(lambda: "skipped" in campaign.boot_log(), 30, "the done unit is skipped")
    assert f"{UNIT} skipped: ConditionPathExists=!" in campaign.boot_log()
    assert campaign.unit_log() == log
    assert campaign.ct.shell(f"test -e {SHM_DIR}").returncode == 1  # not even restored


def test_reboot_drill_with_the_stand_in_major_moved(
    lab: Lab, lab_sshd: LabSSHD, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Item 4: mid-campaign "host reboot" (stop, tmpfs wiped) during which the stand-in GPU
    node moves from misc 10:232 to another driver's major (cpu/cpuid 203:0, re-created
    with mknod: a real driver's major cannot be moved). At start the unit waits for the
    GPU, one log line per try naming the EPERM; `check --ct` on the host names the new major;
    `gpudoctor fix` (the rules mode: plain LXC has no devN) allows it and restarts the CT;
    the unit then restores the weights and finishes the campaign, every cell once."""
    campaign = make_campaign_ct(lab, tiny_model_dir, tmp_path, allow=["c 10:232 rwm"])
    total = len(load_plan(campaign.host_path(PLAN)).cells())
    run_until_partway(campaign, total)

    campaign.node.unlink()  # the reboot: the driver comes back under another major
    os.mknod(campaign.node, 0o020666, os.makedev(*STANDIN_MOVED))
    campaign.node.chmod(0o666)
    campaign.ct.start()
    campaign.wait(lambda: campaign.unit_log().count("waiting for the GPU") >= 2, 60,
                  "the unit waits for the GPU")  # fmt: skip
    waiting = [ln for ln in campaign.unit_log().splitlines() if "waiting for the GPU" in ln]
    assert "device.open" in waiting[-1] and "EPERM" in waiting[-1], waiting[-1]
    assert campaign.records() < total

    home = lab_sshd.client_home(tmp_path / "home")
    env = {**os.environ, "HOME": str(home),
           "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "host-backups"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "client-backups"),
           "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks")}  # fmt: skip
    target = ["--host", "labpve", "--ct", campaign.ct.name, "--flavor", "lxc",
              "--device", "/dev/fakegpu"]  # fmt: skip
    check = subprocess.run([sys.executable, "-m", "gpudoctor", "check", *target,
                            "--only", "ct.device_rules", "--json"],
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert check.returncode == 3, check.stderr[-800:]
    rules = [f for f in json.loads(check.stdout)["findings"] if f["check"] == "ct.device_rules"]
    assert any(f["status"] == "FAIL" and "major 203" in f["message"] for f in rules), rules

    fix = subprocess.run([sys.executable, "-m", "gpudoctor", "fix", *target, "--lxcpath",
                          campaign.ct.lxcpath, "--yes"],
                         capture_output=True, text=True, env=env, timeout=180)  # fmt: skip
    assert fix.returncode == 0, fix.stdout[-1500:] + fix.stderr[-1500:]
    assert "c 203:0 rwm" in campaign.ct.config_path.read_text()

    campaign.wait(
        campaign.done,
        180,
        "the campaign finishes after the fix's restart",
    )
    log = campaign.unit_log()
    assert log.count("GPU ready: gpudoctor check passed") == 2
    assert len([ln for ln in log.splitlines() if "restored" in ln and "mirror" in ln]) == 2
    assert_every_cell_exactly_once(campaign)


@pytest.fixture
def host_dev_node() -> Iterator[Path]:
    """A real char node in the host's /dev (misc 10:232, like /dev/kvm) standing for
    /dev/nvidia-uvm (a devN path is the same inside and outside); removed after."""
    path = Path(f"/dev/gpudoctor-ops-{os.getpid()}")
    path.unlink(missing_ok=True)
    os.mknod(path, 0o020666, os.makedev(10, 232))
    path.chmod(0o666)
    yield path
    path.unlink(missing_ok=True)


def test_never_again_on_proxmox_devn_the_major_moves_and_no_command_is_typed(
    lab: Lab, lab_sshd: LabSSHD, tiny_model_dir: Path, tmp_path: Path, host_dev_node: Path
) -> None:
    """The whole "never again" set-up, then a host reboot during which the stand-in's
    major moves (10:232 -> 203:0): Proxmox flavor through the pct stand-in
    (tests/fakes/pct.py re-stats each devN entry at `pct start`, as pve-container does).

    Set-up: `gpudoctor fix` (PVE 8.2 -> devN by default) and `gpudoctor service install`.
    Reboot: the CT is killed mid-campaign (tmpfs gone), the node is re-created with
    another major, and the CT is started by `pct start` (what PVE's onboot start does at
    host boot). With no other command, the unit finds the GPU on its first try, restores
    the weights from the mirror and finishes the campaign, every cell once."""
    from tests.lab.pvelab import make_pve_ct, unique_vmid

    device = str(host_dev_node)
    campaign = prepare_campaign_ct(lab, tiny_model_dir, tmp_path, host_dev_node, unique_vmid())
    pve = make_pve_ct(lab, campaign.ct, tmp_path / "pve")  # `pct start`: no rule, no unit yet
    install_unit(campaign, device)
    total = len(load_plan(campaign.host_path(PLAN)).cells())

    env = {**os.environ, **pve.env(), "GPUDOCTOR_PVEVERSION": pve.tree.pveversion("8.2.4")}
    fix = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "fix", "--host", lab_sshd.spec, "-i",
         str(lab_sshd.client_key), "--known-hosts", str(lab_sshd.known_hosts), "--ct",
         pve.vmid, "--device", device, "--yes", "--json"],
        capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    assert fix.returncode == 0, fix.stdout[-1500:] + fix.stderr[-1500:]
    assert json.loads(fix.stdout)["mode"] == "devn"
    assert f"dev0: {device}," in pve.conf.read_text()
    # the fix's restart is the unit's first boot: the campaign runs
    campaign.wait(lambda: campaign.records() >= 2, 120, "the unit's campaign records 2 cells")

    campaign.ct.stop(kill=True)  # power cut mid-campaign
    assert 2 <= campaign.records() < total
    host_dev_node.unlink()  # the driver comes back under another major
    os.mknod(host_dev_node, 0o020666, os.makedev(*STANDIN_MOVED))
    host_dev_node.chmod(0o666)
    assert pve.pct_run("start", pve.vmid).ok  # the host's boot starts its onboot CTs
    campaign.wait(
        campaign.done,
        180,
        "the campaign finishes after the reboot",
    )
    log = campaign.unit_log()
    assert "waiting for the GPU" not in log, log[-2000:]
    assert log.count("GPU ready: gpudoctor check passed (try 1)") == 2
    assert len([ln for ln in log.splitlines() if "restored" in ln and "mirror" in ln]) == 2
    assert "lxc.cgroup2.devices.allow = c 203:0 rw" in campaign.ct.config_path.read_text()
    assert_every_cell_exactly_once(campaign)
