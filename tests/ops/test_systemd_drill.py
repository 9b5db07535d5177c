"""Issue 26.13: the boot unit under a REAL systemd as PID 1 (Debian 12, systemd 252).

The CT's rootfs comes from Debian's ``debootstrap`` (tests/ops/systemd_ct.py); its init is
systemd itself, which reads the unit `gpudoctor service install` wrote inside the CT, honours
its ``ConditionPathExists=!``, orders it and restarts it. The CT has no network but ``lo``
and ``systemd-networkd-wait-online`` is enabled, so ``network-online.target`` is not
reached for 120 s: the campaign (weights from a disk mirror, a loopback engine) must not
wait for it. The campaign is the one of tests/ops/campaign_ct.py: ``gpudoctor bench`` with
the ``command`` engine running stream_server.py against the tiny model restored to tmpfs.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.lab.lxc import Lab
from tests.ops.campaign_ct import MIRROR, OUT, PLAN, SHM_DIR, plan_text, seed_mirror
from tests.ops.systemd_ct import SystemdCampaign, make_systemd_ct

pytestmark = pytest.mark.lab

UNIT = "gpudoctor-campaign.service"


def wait_online_enabled(rootfs: Path) -> None:
    """Enable systemd-networkd and its wait-online service in the rootfs (what
    `systemctl enable systemd-networkd` does): with only ``lo``, network-online.target
    then waits for wait-online's 120 s timeout at every boot."""
    wants = rootfs / "etc/systemd/system/network-online.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "systemd-networkd-wait-online.service").symlink_to(
        "/lib/systemd/system/systemd-networkd-wait-online.service"
    )
    multi = rootfs / "etc/systemd/system/multi-user.target.wants"
    (multi / "systemd-networkd.service").symlink_to("/lib/systemd/system/systemd-networkd.service")


def test_real_systemd_runs_the_unit_resumes_after_a_power_cut_and_skips_once_done(
    lab: Lab, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The drill under systemd 252 as PID 1: install inside the CT, boot (the campaign
    starts without waiting for the network), power cut mid-campaign (``lxc-stop -k``),
    boot again (weights restored from the mirror, the campaign resumes), every cell
    exactly once, and later boots skip the unit (ConditionPathExists)."""
    name = lab.unique_name("sd")
    node = lab.make_node(f"{name}-gpu", lab.fake_gpu_major, lab.fake_gpu_minor)
    ct = make_systemd_ct(lab, name, node, ("c 10:232 rwm",))
    campaign = SystemdCampaign(ct, node)
    wait_online_enabled(ct.rootfs)
    plan = campaign.host_path(PLAN)
    plan.parent.mkdir(parents=True)
    plan.write_text(plan_text())
    seed_mirror(campaign.host_path(MIRROR), tiny_model_dir, tmp_path)
    total = len(load_plan(plan).cells())

    ct.start(timeout=60)
    campaign.wait(ct.booted, 60, "systemd finishes booting")  # no unit yet: nothing runs
    assert ct.systemctl("is-active", "network-online.target") != "active"
    installed = ct.gpudoctor("service", "install", PLAN, "--out", OUT, "--device",
                             "/dev/fakegpu", "--only", "device", "--backoff", "1:4")  # fmt: skip
    assert installed.returncode == 0, installed.stderr + installed.stdout
    assert ct.systemctl("is-enabled", UNIT) == "enabled"  # systemd reads the enable link
    again = ct.gpudoctor("service", "install", PLAN, "--out", OUT, "--device",
                         "/dev/fakegpu", "--only", "device", "--backoff", "1:4")  # fmt: skip
    assert again.returncode == 0 and again.stdout.count("unchanged ") == 3, again.stdout
    ct.stop()  # a clean shutdown (SIGRTMIN+3: systemd halts)

    # boot 1: the campaign starts while network-online.target still waits (120 s)
    ct.start(timeout=60)
    campaign.wait(lambda: campaign.records() >= 2, 120, "the unit's campaign records 2 cells")
    assert ct.systemctl("is-active", "network-online.target") != "active"
    assert "network-online" not in ct.systemctl("show", "-p", "After", "--value", UNIT)
    ct.stop(kill=True)  # power cut: SIGKILL to systemd, the tmpfs gone
    first = campaign.records()
    assert 2 <= first < total, f"{first} of {total}: the cut must fall mid-campaign"

    # boot 2: restored from the mirror, resumed, done
    ct.start(timeout=60)
    campaign.wait(campaign.done, 240, "the campaign finishes after the power cut")
    campaign.wait(lambda: ct.systemctl("is-active", UNIT) == "inactive", 30, "the unit ends")
    assert ct.systemctl("show", "-p", "Result", "--value", UNIT) == "success"
    log = campaign.unit_log()
    assert "campaign done" in log, log[-3000:]
    assert len([ln for ln in log.splitlines() if "restored" in ln and "mirror" in ln]) >= 1
    records, _ = read_records(campaign.results)
    counts = collections.Counter(r["key"] for r in records)
    assert set(counts) == {c.key for c in load_plan(plan).cells()}
    assert all(n == 1 for n in counts.values()), counts.most_common(3)
    assert all(r["status"] == "ok" for r in records), [r["reason"] for r in records]

    # boot 3: the done unit is skipped by systemd's condition; nothing restored
    ct.stop()
    ct.start(timeout=60)
    campaign.wait(ct.booted, 180, "systemd finishes booting")
    assert ct.systemctl("show", "-p", "ConditionResult", "--value", UNIT) == "no"
    assert ct.systemctl("show", "-p", "ExecMainStartTimestampMonotonic", "--value", UNIT) == "0"
    assert ct.attach(["/bin/sh", "-c", f"test -e {SHM_DIR}"]).returncode == 1
    assert campaign.records() == total
