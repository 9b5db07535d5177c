"""The audit of a CT config's device lines (gpudoctor/pve/audit.py): every warning's exact
text, which rules are stale or pinned, the dynamic-major ranges, and --device refusals."""

from __future__ import annotations

import pytest

from gpudoctor.facts.procfs import parse_proc_devices
from gpudoctor.pve.audit import (
    config_warnings,
    device_refusal,
    is_dynamic_major,
    pinned_dynamic,
    stale_rules,
)
from gpudoctor.pve.config import parse
from gpudoctor.pve.entries import read_entries
from gpudoctor.pve.facts import HostFacts, HostNode

CONF = (
    "arch: amd64\n"
    "lxc.cgroup.devices.allow: c 195:* rwm\n"
    "lxc.cgroup2.devices.allow: nonsense\n"
    "lxc.cgroup2.devices.allow: c 238:* rwm # uvm\n"
    "!!not config\n"
    "lock: backup\n"
    "memory: 1\n"
    "memory: 2\n"
    "dev0: /dev/x,foo=1\n"
    "[pve:pending]\n"
    "memory: 3\n"
)


def test_every_warning_of_a_config_exactly() -> None:
    cfg = parse(CONF)
    assert config_warnings(cfg, read_entries(cfg)) == [
        "legacy `lxc.cgroup.devices.allow: c 195:* rwm` is ignored on cgroup v2 hosts "
        "(PVE >= 7) and rejected by PVE 9: use lxc.cgroup2.devices.allow",
        "allow rule `nonsense` is not a device rule LXC understands",
        "allow rule `c 238:* rwm` carries `# uvm`: Proxmox passes it to LXC",
        "line 5 is not valid config: `!!not config`",
        "the CT has pending changes: a restart applies them too",
        "the CT is locked (backup)",
        "line 7: `memory: 1` has no effect: memory is given again on line 8, and Proxmox "
        "keeps the last one",
        "line 9: `dev0: /dev/x,foo=1` is a devN value Proxmox rejects (invalid key in "
        "comma-separated list property: foo): the CT does not start until it is corrected",
    ]


def test_a_devn_key_proxmox_does_not_know_and_a_clean_config() -> None:
    cfg = parse("dev256: /dev/x\n")
    assert config_warnings(cfg, read_entries(cfg)) == [
        "line 1: `dev256: /dev/x`: unknown setting 'dev256': Proxmox knows dev0 to dev255 only "
        "(it warns at every read of the config; pct set refuses it)"
    ]
    clean = parse("arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n[pending]\n")
    assert config_warnings(clean, read_entries(clean)) == []
    upper = parse("arch: amd64\n[PVE:pending]\n")
    assert config_warnings(upper, read_entries(upper)) == [
        "the CT has pending changes: a restart applies them too"
    ]


@pytest.mark.parametrize(
    ("major", "dynamic"),
    [(233, False), (234, True), (254, True), (255, False), (383, False), (384, True),
     (511, True), (512, False), (195, False)],
)  # fmt: skip
def test_dynamic_majors(major: int, dynamic: bool) -> None:
    assert is_dynamic_major(major) is dynamic


DEVICES = parse_proc_devices(
    "Character devices:\n195 nvidia\n240 nvidia-uvm\n243 hidraw\n250 nvidia-caps\n\n"
    "Block devices:\n  8 sd\n"
)
RULES = parse(
    "lxc.cgroup2.devices.allow: c 240:* rwm\n"  # nvidia-uvm now: kept, pinned
    "lxc.cgroup2.devices.allow: c 243:* rwm\n"  # hidraw now
    "lxc.cgroup2.devices.allow: c 245:* rwm\n"  # nobody's
    "lxc.cgroup2.devices.allow: b 245:* rwm\n"  # block rule: not judged
    "lxc.cgroup2.devices.allow: c *:* rwm\n"  # every major
    "lxc.cgroup2.devices.allow: c 195:* rwm\n"  # static
    "lxc.cgroup2.devices.allow: c 250:0 rw\n"  # nvidia-caps, one minor
)


def test_stale_rules_name_the_new_owner_or_none() -> None:
    facts = HostFacts(DEVICES)
    entries = read_entries(RULES)
    assert stale_rules(entries, facts, [], gpu_ct=True) == [
        (1, "c 243:* rwm", "major 243 now belongs to hidraw, not to an NVIDIA driver"),
        (2, "c 245:* rwm", "major 245 is not registered in /proc/devices (an old NVIDIA major?)"),
    ]
    assert stale_rules(entries, facts, [], gpu_ct=False) == []  # only a GPU CT is judged
    passed = [HostNode("/dev/hidraw0", "char", 243, 0, 0o600)]
    assert [r for _, r, _ in stale_rules(entries, facts, passed, gpu_ct=True)] == ["c 245:* rwm"]


def test_pinned_dynamic_rules_of_nvidia_drivers() -> None:
    assert pinned_dynamic(read_entries(RULES), HostFacts(DEVICES)) == [
        ("c 240:* rwm", 240, "nvidia-uvm"),
        ("c 250:0 rw", 250, "nvidia-caps"),
    ]


CHAR = HostNode("/dev/nvidia0", "char", 195, 0, 0o666)
CAPS = HostNode(
    "/dev/nvidia-caps", "dir", children=(HostNode("/dev/nvidia-caps/c1", "char", 250, 1),)
)


@pytest.mark.parametrize(
    ("asked", "path", "node", "refusal"),
    [
        ("/dev/nvidia0", "/dev/nvidia0", CHAR, None),
        ("/dev/nvidia-caps", "/dev/nvidia-caps", CAPS, None),
        ("/dev/nope", "/dev/nope", None,
         "--device /dev/nope does not exist on the host: check the path (ls -l /dev/nope on the"
         " host); a device node appears once its driver is loaded"),
        ("/dev/gpu", "/dev/nope", HostNode("/dev/nope", "missing"),
         "--device /dev/gpu (host /dev/nope) does not exist on the host: check the path (ls -l"
         " /dev/nope on the host); a device node appears once its driver is loaded"),
        ("/dev/empty", "/dev/empty", HostNode("/dev/empty", "dir"),
         "--device /dev/empty is a directory that holds no character device: only character "
         "devices, or directories under /dev that hold them, can be passed into a CT"),
        ("/root", "/root", HostNode("/root", "dir", children=CAPS.children),
         "--device /root is a directory outside /dev: only character devices, or directories "
         "under /dev that hold them, can be passed into a CT"),
        ("/dev/../root", "/dev/../root", HostNode("/dev/../root", "dir", children=CAPS.children),
         "--device /dev/../root is a directory outside /dev: only character devices, or "
         "directories under /dev that hold them, can be passed into a CT"),
        ("/dev/fake", "/dev/sda", HostNode("/dev/sda", "block", 8, 0),
         "--device /dev/fake (host /dev/sda) is a block device, not a character device: only "
         "character devices, or directories under /dev that hold them, can be passed into a CT"),
    ],
)  # fmt: skip
def test_device_refusals(asked: str, path: str, node: HostNode | None, refusal: str | None) -> None:
    assert device_refusal(asked, path, node) == refusal


def test_a_path_no_config_line_can_carry_is_refused_first() -> None:
    why = device_refusal("/dev/a,b", "/dev/a,b", CHAR)
    assert why is not None and why.startswith("--device /dev/a,b: ")


def test_several_owners_and_problems_are_all_named() -> None:
    devices = parse_proc_devices(
        "Character devices:\n243 hidraw\n243 usbmisc\n244 nvidia-uvm\n244 nvidia-x\n"
    )
    entries = read_entries(
        parse("lxc.cgroup2.devices.allow: c 243:* rwm\nlxc.cgroup2.devices.allow: c 244:* rwm\n")
    )
    assert stale_rules(entries, HostFacts(devices), [], gpu_ct=True) == [
        (0, "c 243:* rwm", "major 243 now belongs to hidraw/usbmisc, not to an NVIDIA driver")
    ]
    assert pinned_dynamic(entries, HostFacts(devices)) == [
        ("c 244:* rwm", 244, "nvidia-uvm/nvidia-x")
    ]
    cfg = parse("dev0: /dev/x,foo=1,bar=2\n")
    (warning,) = config_warnings(cfg, read_entries(cfg))
    assert "(invalid key in comma-separated list property: foo; invalid key in " in warning
