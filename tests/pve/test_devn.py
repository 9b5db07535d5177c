"""The durable cure: ``auto`` picks devN entries on Proxmox VE >= 8.1, and the migration
replaces NVIDIA rule + bind-mount pairs with devN entries, removing NOTHING else.

Checked on the real community configs and pve-container's own test configs
(tests/data/recorded), with the real H200 capture (uvm 238, caps 241) as host facts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.pve.config import LXC, Kind, classify, parse
from gpudoctor.pve.devn import AUTO, DEVN, RULES, ModeError, resolve_mode
from gpudoctor.pve.entries import parse_mount, parse_rule
from gpudoctor.pve.planner import FixPlanError, PlanOptions, plan
from tests.pve.captures import DATA, h200_facts

COMMUNITY = sorted((DATA / "community").glob("*.conf"))
PVE_CONTAINER = sorted((DATA / "pve-container").rglob("config")) + sorted(
    (DATA / "pve-container").rglob("*.conf")
)
NVIDIA_MAJORS = {195, 238, 239, 240, 241, 242}  # /proc/devices of the H200 capture


def added(p) -> list[str]:
    return [e.line for e in p.edits if e.action == "add"]


def removed(p) -> list[str]:
    return [e.line for e in p.edits if e.action == "remove"]


@pytest.mark.parametrize(
    ("version", "flavor", "expected"),
    [("8.1.3", "pve", DEVN), ("8.2.4", "pve", DEVN), ("9.0.6", "pve", DEVN),
     ("8.0.4", "pve", RULES), ("7.4.17", "pve", RULES), (None, "pve", RULES),
     ("8.2.4", LXC, RULES)],
)  # fmt: skip
def test_auto_is_devn_from_proxmox_8_1_only(version, flavor, expected) -> None:
    cfg = parse("arch: amd64\n" if flavor == "pve" else "lxc.uts.name = a\n", flavor)
    assert resolve_mode(AUTO, cfg, version) == expected
    assert resolve_mode("rules", cfg, version) == RULES
    assert resolve_mode("raw", cfg, version) == RULES  # the old name still works


def test_default_plan_on_pve_8_1_migrates_the_incident_config() -> None:
    cfg = parse((DATA / "community/jammsen-231.conf").read_text())
    p = plan(cfg, h200_facts("8.1.3"), PlanOptions())
    assert p.mode == DEVN
    assert added(p) == [
        "dev0: /dev/nvidia0,gid=0,mode=0666",
        "dev1: /dev/nvidiactl,gid=0,mode=0666",
        "dev2: /dev/nvidia-uvm,gid=0,mode=0666",
        "dev3: /dev/nvidia-uvm-tools,gid=0,mode=0666",
        "dev4: /dev/nvidia-caps/nvidia-cap1,gid=0,mode=0400",
        "dev5: /dev/nvidia-caps/nvidia-cap2,gid=0,mode=0444",
    ]
    assert sorted(removed(p)) == sorted([
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 238:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap1 dev/nvidia-caps/nvidia-cap1 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap2 dev/nvidia-caps/nvidia-cap2 none bind,optional,create=file",
    ])  # fmt: skip
    text = p.new_text
    # kept: dri (226), the nvswitch/nvlink rules no devN entry stands in for, the stale
    # majors (flagged only), nvidia-modeset (not on this host: its mount is no devN's),
    # the DRI by-path mounts, every description line
    for line in (
        "lxc.cgroup2.devices.allow: c 226:* rwm",
        "lxc.cgroup2.devices.allow: c 239:* rwm",
        "lxc.cgroup2.devices.allow: c 234:* rwm",
        "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file",
        "# Mount NVIDIA devices",
        "lxc.cap.drop:",
    ):
        assert line in text.splitlines()
    again = plan(parse(text), h200_facts("8.1.3"), PlanOptions())
    assert not again.changed, again.diff


def test_rules_mode_keeps_the_old_style_on_a_new_proxmox() -> None:
    cfg = parse((DATA / "community/jammsen-231.conf").read_text())
    p = plan(cfg, h200_facts("8.2.4"), PlanOptions(mode="rules"))
    assert p.mode == RULES
    assert added(p) == ["lxc.cgroup2.devices.allow: c 241:* rwm"]
    assert removed(p) == []


def test_older_proxmox_keeps_rules_and_refuses_an_explicit_devn() -> None:
    cfg = parse((DATA / "community/loeeeee-lxc-gpu-passthrough.conf").read_text())
    p = plan(cfg, h200_facts("8.0.4"), PlanOptions())
    assert p.mode == RULES and not any(a.startswith("dev") for a in added(p))
    with pytest.raises(FixPlanError, match=r"8\.1"):
        plan(cfg, h200_facts("8.0.4"), PlanOptions(mode=DEVN))


def test_a_ct_already_on_devn_entries_needs_nothing_more() -> None:
    cfg = parse((DATA / "community/wolf-quickstart-nvidia-devN.conf").read_text())
    p = plan(cfg, h200_facts("8.2.4"), PlanOptions())
    assert not p.changed, p.diff
    assert set(p.dev_paths) >= {"/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"}


@pytest.mark.parametrize("path", COMMUNITY + PVE_CONTAINER, ids=lambda p: str(p.relative_to(DATA)))
def test_migration_removes_only_nvidia_mounts_and_nvidia_rules(path: Path) -> None:
    """On every real config: the lines the migration removes are NVIDIA bind mounts whose
    node got a devN entry and allow rules of NVIDIA majors; every other line stays, in
    order; sections and descriptions are byte-identical; a second plan changes nothing."""
    cfg = parse(path.read_text())
    facts = h200_facts("8.2.4")
    p = plan(cfg, facts, PlanOptions())
    new = parse(p.new_text)
    assert p.mode == DEVN
    for edit in p.edits:
        if edit.action != "remove":
            continue
        line = classify(edit.line, "\n")
        key, value = line.key, line.value
        if key == "lxc.mount.entry":
            mount = parse_mount(value)
            assert mount is not None and mount.source.startswith("/dev/nvidia")
            assert mount.source.rstrip("/") in p.dev_paths or any(
                d.startswith(mount.source.rstrip("/") + "/") for d in p.dev_paths
            )
        else:
            assert key == "lxc.cgroup2.devices.allow", edit.line
            rule = parse_rule(value)
            assert rule is not None and rule.major in NVIDIA_MAJORS
    kept = [ln.text for ln in cfg.lines if ln.text not in {e.line for e in p.edits}]
    new_texts = [ln.text for ln in new.lines]
    it = iter(new_texts)
    assert all(line in it for line in kept), "a line that was not planned changed or moved"
    assert new.lines[new.main_end :] == cfg.lines[cfg.main_end :]
    commented = {"#" + e.line for e in p.edits if e.action == "comment"}  # legacy keys
    assert [ln for ln in new.lines if ln.kind is Kind.DESCRIPTION and ln.text not in commented] == [
        ln for ln in cfg.lines if ln.kind is Kind.DESCRIPTION
    ]
    again = plan(new, facts, PlanOptions())
    assert not again.changed, again.diff


def test_devn_asked_for_explicitly_works_from_8_1_and_says_why_it_cannot_before() -> None:
    cfg = parse("arch: amd64\n")
    assert resolve_mode(DEVN, cfg, "8.1.0") == DEVN  # the first release with devN entries
    assert resolve_mode(DEVN, cfg, "8.1") == DEVN
    assert resolve_mode(DEVN, cfg, "9.0") == DEVN
    assert resolve_mode(DEVN, cfg, None) == DEVN  # unknown version: the user's word stands
    with pytest.raises(ModeError) as old:
        resolve_mode(DEVN, cfg, "8.0.9")
    assert str(old.value) == "--mode devn needs Proxmox VE >= 8.1 (this host runs 8.0.9)"
    with pytest.raises(ModeError) as lxc:
        resolve_mode(DEVN, parse("lxc.uts.name = a\n", LXC), "8.2.4")
    assert str(lxc.value) == "--mode devn is a Proxmox feature; plain LXC needs --mode rules"
    with pytest.raises(ModeError) as unknown:
        resolve_mode("cgroup", cfg, "8.2.4")
    assert str(unknown.value) == "unknown mode 'cgroup' (expected auto, devn or rules)"
    assert resolve_mode(AUTO, cfg, "8.1") == DEVN and resolve_mode(AUTO, cfg, "8.0") == RULES
    assert resolve_mode(AUTO, cfg, "8.x") == RULES  # an unreadable version: the safe mode
