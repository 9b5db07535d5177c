"""The devN migration's parts, one decision at a time, with the real H200 capture as host
facts (``/dev/nvidia0`` 195:0, ``nvidia-uvm`` 238, ``nvidia-caps`` 241 with two caps):
which nodes get which devN index, which bind mounts and NVIDIA rules the entries make
redundant (and which they do not), and where the new lines go (``test_devn.py`` runs the
whole migration over every recorded real config)."""

from __future__ import annotations

import pytest

from gpudoctor.pve.config import parse
from gpudoctor.pve.devn import (
    ModeError,
    dev_anchor,
    first_option_index,
    is_nvidia_major,
    parse_version,
    plan_devn,
)
from gpudoctor.pve.entries import read_entries
from tests.pve.captures import h200_facts

FACTS = h200_facts("8.2.4")
UVM_WHY = "(major 238, re-read by Proxmox at every start; cures ct.device_rules)"


def node(path: str):
    """The host node at ``path``: a node of /dev, or a char node of a node directory."""
    found = FACTS.node(path) or next(
        (c for n in FACTS.nodes for c in n.children if c.path == path), None
    )
    assert found is not None
    return found


def devn(text: str, wanted: list[str], passed: list[str] = (), dev_gid: int | None = None):
    entries = read_entries(parse(text))
    return plan_devn(entries, FACTS, [node(p) for p in wanted], [node(p) for p in passed], dev_gid)


def test_new_entries_take_the_free_indexes_in_order_and_skip_what_has_one() -> None:
    text = "arch: amd64\ndev0: /dev/nvidia0,gid=0,mode=0666\ndev2: /dev/dri/card0\n"
    p = devn(text, ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-caps"])
    assert p.adds == (
        ("dev1", "/dev/nvidiactl,gid=0,mode=0666", "/dev/nvidiactl (major 195, re-read by Proxmox at every start; cures ct.device_rules)"),
        ("dev3", "/dev/nvidia-uvm,gid=0,mode=0666", f"/dev/nvidia-uvm {UVM_WHY}"),
        ("dev4", "/dev/nvidia-caps/nvidia-cap1,gid=0,mode=0400",
         "/dev/nvidia-caps/nvidia-cap1 (major 241, re-read by Proxmox at every start; cures ct.device_rules)"),
        ("dev5", "/dev/nvidia-caps/nvidia-cap2,gid=0,mode=0444",
         "/dev/nvidia-caps/nvidia-cap2 (major 241, re-read by Proxmox at every start; cures ct.device_rules)"),
    )  # fmt: skip
    assert p.dev_paths == ("/dev/nvidia0", "/dev/dri/card0", "/dev/nvidiactl", "/dev/nvidia-uvm",
                           "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2")  # fmt: skip
    assert p.warnings == () and p.fallback == ()
    again = devn(text, ["/dev/nvidia0", "/dev/nvidia0"])
    assert again.adds == () and again.dev_paths == ("/dev/nvidia0", "/dev/dri/card0")
    twice = devn("arch: amd64\n", ["/dev/nvidia-uvm", "/dev/nvidia-uvm"])
    assert [a[1] for a in twice.adds] == ["/dev/nvidia-uvm,gid=0,mode=0666"]  # one entry
    first_cap = devn("dev0: /dev/nvidia-caps/nvidia-cap1\n", ["/dev/nvidia-caps"])
    assert [a[:2] for a in first_cap.adds] == [
        ("dev1", "/dev/nvidia-caps/nvidia-cap2,gid=0,mode=0444")]  # fmt: skip  # the next cap too


def test_the_group_asked_for_is_written_into_every_new_entry() -> None:
    p = devn("arch: amd64\n", ["/dev/nvidia-uvm"], dev_gid=44)
    assert p.adds == (("dev0", "/dev/nvidia-uvm,gid=44,mode=0666", f"/dev/nvidia-uvm {UVM_WHY}"),)
    assert (
        devn("arch: amd64\n", ["/dev/nvidia-uvm"], dev_gid=0)
        .adds[0][1]
        .endswith(",gid=0,mode=0666")
    )


def test_a_node_bind_mounted_elsewhere_in_the_ct_keeps_its_rule() -> None:
    text = "lxc.mount.entry: /dev/nvidia-caps dev/caps none bind,optional,create=dir\n"
    p = devn(text, ["/dev/nvidia-caps", "/dev/nvidia-uvm"])
    assert p.warnings == (
        "/dev/nvidia-caps is bind-mounted elsewhere in the CT (/dev/caps/nvidia-cap1); a devN "
        "entry would put it at its host path: kept with a cgroup rule",
    )
    assert p.fallback == (node("/dev/nvidia-caps"),)
    assert [a[0] for a in p.adds] == ["dev0"] and p.drop_mounts == ()


def test_the_index_after_dev255_is_refused() -> None:
    text = "".join(f"dev{i}: /dev/dri/renderD{i}\n" for i in range(255))
    assert devn(text, ["/dev/nvidia0"]).adds[0][0] == "dev255"  # the last one Proxmox knows
    with pytest.raises(ModeError) as info:
        devn(text, ["/dev/nvidia0", "/dev/nvidiactl"])
    assert str(info.value) == (
        "/dev/nvidiactl would need dev256: Proxmox knows dev0 to dev255 only ($MAX_DEVICES in "
        "pve-container's src/PVE/LXC/Config.pm); pass fewer nodes (--device) or use --mode rules"
    )


def test_bind_mounts_the_entries_replace_and_the_ones_they_do_not() -> None:
    text = (
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"  # 0: dropped
        "lxc.mount.entry: /dev/nvidia-caps/ dev/nvidia-caps none bind,optional,create=dir\n"  # 1
        "lxc.mount.entry: tmpfs dev/nvidiactl tmpfs defaults 0 0\n"  # 2: not a bind
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n"  # 3
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file\n"
    )  # fmt: skip
    p = devn(text, ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1",
                    "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-uvm"])  # fmt: skip
    assert p.drop_mounts == (
        (0, "replaced by devN entries for /dev/nvidia0"),
        (1, "replaced by devN entries for /dev/nvidia-caps"),  # every cap of it has one
        (3, "replaced by devN entries for /dev/nvidia-uvm"),
    )  # uvm-tools has no entry: its mount stays
    elsewhere = (
        "dev0: /dev/nvidia0\n"
        "lxc.mount.entry: /dev/nvidia0 dev/gpu0 none bind,optional,create=file\n"  # 1: kept
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none ro,optional,create=file\n"  # 2
    )  # a bind to another CT path, and an entry that binds nothing: neither is the node's
    assert devn(elsewhere, ["/dev/nvidia-uvm"]).drop_mounts == ()
    half = devn(text, ["/dev/nvidia-caps/nvidia-cap1"])
    assert 1 not in [i for i, _ in half.drop_mounts]  # cap2 still needs the directory's mount


def test_nvidia_rules_go_only_when_devn_entries_allow_every_node_still_needed() -> None:
    text = (
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"  # 0: nvidia0 + ctl both have entries
        "lxc.cgroup2.devices.allow: c 238:* rwm\n"  # 1: uvm-tools is passed another way
        "lxc.cgroup2.devices.allow: b 195:* rwm\n"  # 2: a block rule
        "lxc.cgroup2.devices.allow: c *:* rwm\n"  # 3: every major
        "lxc.cgroup2.devices.allow: c 226:* rwm\n"  # 4: DRI, not NVIDIA
        "lxc.cgroup2.devices.allow: c 239:* rwm\n"  # 5: nvswitch: no entry stands in for it
        "lxc.cgroup2.devices.allow: c 195:255 rwm # ctl\n"  # 6: a trailing comment
        "lxc.cgroup2.devices.allow: c 195:0 rw\n"  # 7: nvidia0 only
    )
    p = devn(text, ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"],
             passed=["/dev/nvidia-uvm-tools"])  # fmt: skip
    why = "its nvidia/nvidiactl nodes are passed as devN entries, which allow them"
    assert p.drop_rules == ((0, why), (7, why))
    assert devn(text, ["/dev/nvidia-uvm"], passed=[]).drop_rules == (
        (1, "its nvidia-uvm nodes are passed as devN entries, which allow them"),)  # fmt: skip


def test_nvidia_majors_are_the_ones_proc_devices_names_nvidia() -> None:
    assert [is_nvidia_major(FACTS, m) for m in (195, 238, 239, 241, 226, 1, 999)] == [
        True, True, True, True, False, False, False]  # fmt: skip


def test_versions_are_read_as_numbers_or_not_at_all() -> None:
    assert parse_version("8.2.4") == (8, 2, 4) and parse_version("9") == (9,)
    assert parse_version("8.x") is None and parse_version("") is None
    assert parse_version(None) is None


def test_new_devn_lines_go_after_the_last_one_or_where_proxmox_sorts_them() -> None:
    with_devs = parse("arch: amd64\ndev1: /dev/a\ncores: 2\ndev0: /dev/b\nmemory: 512\n")
    assert dev_anchor(with_devs, read_entries(with_devs)) == 3  # after the last devN line
    sorted_keys = parse("# my CT\narch: amd64\ncores: 2\nhostname: gpu\n[snap]\narch: amd64\n")
    assert first_option_index(sorted_keys) == 1
    assert dev_anchor(sorted_keys, read_entries(sorted_keys)) == 2  # after cores, before hostname
    late = parse("lxc.apparmor.profile: unconfined\nhostname: gpu\nmemory: 512\n")
    assert first_option_index(late) == 1
    assert dev_anchor(late, read_entries(late)) == 0  # before the first option
    no_options = parse("lxc.apparmor.profile: unconfined\nlxc.cap.drop:\n[snap]\narch: amd64\n")
    assert first_option_index(no_options) == 2  # the live section's end
    assert dev_anchor(no_options, read_entries(no_options)) == 1
