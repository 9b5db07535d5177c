"""The parsers of the config values the fixer reads (gpudoctor/pve/entries.py), value by
value: device rules as LXC reads them, fstab mount entries, Proxmox devN entries, and the
paths the planner asks the host about."""

from __future__ import annotations

import pytest

from gpudoctor.pve.config import LXC, parse
from gpudoctor.pve.entries import (
    DevEntry,
    DeviceRule,
    MountEntry,
    allow_rule,
    bind_mount_value,
    ct_path,
    host_path,
    parse_dev,
    parse_mount,
    parse_rule,
    paths_of_interest,
    read_entries,
)
from gpudoctor.pve.planner import PlanOptions


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("a", DeviceRule("a")),
        ("a # everything", DeviceRule("a", trailing="# everything")),
        ("a\t# tab", DeviceRule("a", trailing="# tab")),
        ("  a  ", DeviceRule("a")),
        ("c 195:* rwm", DeviceRule("c", 195, None, "rwm")),
        ("c *:* m", DeviceRule("c", None, None, "m")),
        ("c 195:3", DeviceRule("c", 195, 3, "rwm")),  # no access letters: LXC means rwm
        ("b 8:0 r # disk", DeviceRule("b", 8, 0, "r", "# disk")),
        ("c 10:200 rw", DeviceRule("c", 10, 200, "rw")),
    ],
)
def test_device_rules_parse_as_lxc_reads_them(value: str, rule: DeviceRule) -> None:
    assert parse_rule(value) == rule


@pytest.mark.parametrize("value", ["A", "A 1:2", "aa", "x 1:2 rwm", "c 195", "c a:b rwm", ""])
def test_values_that_are_not_device_rules(value: str) -> None:
    assert parse_rule(value) is None


def test_rule_text_and_the_rule_the_fixer_writes() -> None:
    assert allow_rule(238) == DeviceRule("c", 238, None, "rwm")
    assert allow_rule(238).text == "c 238:* rwm"
    assert DeviceRule("c", None, 5, "r").text == "c *:5 r"
    assert DeviceRule("a", trailing="# x").text == "a"


def test_what_a_rule_covers() -> None:
    one = DeviceRule("c", 195, 0, "rw")
    assert one.covers(195, 0)
    assert not one.covers(195, 1)
    assert not one.covers(195)  # every minor of 195: one minor is not enough
    assert not one.covers(196, 0)
    whole = DeviceRule("c", 195, None, "rwm")
    assert whole.covers(195, 7) and whole.covers(195)
    assert DeviceRule("c", None, None, "rw").covers(511, 3)
    assert not DeviceRule("b", 195, None, "rwm").covers(195, 0)  # a block rule
    assert not DeviceRule("c", 195, None, "r").covers(195, 0)  # read-only
    assert DeviceRule("a").covers(1, 1)


@pytest.mark.parametrize(
    ("value", "entry"),
    [
        (
            "/dev/dri dev/dri none bind,optional,create=dir",
            MountEntry("/dev/dri", "/dev/dri", "none", ("bind", "optional", "create=dir")),
        ),
        ("/dev/dri/ /dev/dri/ none rbind", MountEntry("/dev/dri/", "/dev/dri", "none", ("rbind",))),
        ("/x //dev/x none bind", MountEntry("/x", "/dev/x", "none", ("bind",))),
        ("/ / none bind", MountEntry("/", "/", "none", ("bind",))),
        (
            "proc proc proc nodev,noexec 0 0",
            MountEntry("proc", "/proc", "proc", ("nodev", "noexec")),
        ),
    ],
)
def test_mount_entries_parse_as_fstab_lines(value: str, entry: MountEntry) -> None:
    assert parse_mount(value) == entry


def test_a_mount_entry_needs_four_fields_and_bind_is_an_option() -> None:
    assert parse_mount("/dev/x dev/x none") is None
    assert parse_mount("proc proc proc nodev").is_bind is False  # type: ignore[union-attr]
    assert parse_mount("/a a none rbind").is_bind is True  # type: ignore[union-attr]


def test_the_mount_value_the_fixer_writes() -> None:
    assert bind_mount_value("/dev/nvidia0", False) == (
        "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"
    )
    assert bind_mount_value("/dev/nvidia-caps", True) == (
        "/dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"
    )


@pytest.mark.parametrize(
    ("key", "value", "entry"),
    [
        ("dev0", "/dev/nvidia0,gid=44,mode=0666",
         DevEntry(0, "/dev/nvidia0", (("gid", "44"), ("mode", "0666")))),
        ("dev12", "path=/dev/dri/card0,uid=0", DevEntry(12, "/dev/dri/card0", (("uid", "0"),))),
        ("dev4", "mode=0600,path=/dev/y", DevEntry(4, "/dev/y", (("mode", "0600"),))),
    ],
)  # fmt: skip
def test_devn_entries(key: str, value: str, entry: DevEntry) -> None:
    assert parse_dev(key, value) == entry


def test_devn_values_proxmox_rejects_carry_the_reason() -> None:
    bad = parse_dev("dev3", "/dev/x,opt=a=b")
    assert bad is not None and bad.path == "/dev/x"
    assert bad.problems == ("invalid key in comma-separated list property: opt",)


@pytest.mark.parametrize(("key", "value"), [("devx", "/dev/x"), ("mp0", "/dev/x"), ("dev0", " ")])
def test_keys_and_values_that_are_not_devn_entries(key: str, value: str) -> None:
    assert parse_dev(key, value) is None


CONF = (
    "lxc.cgroup2.devices.allow: c 195:* rwm\n"
    "lxc.cgroup2.devices.allow: not a rule\n"
    "lxc.idmap: u 0 100000 65536\n"  # four fields, but not a mount entry
    "lxc.mount.entry: /dev/kvm dev/fakegpu none bind,optional,create=file\n"
    "lxc.mount.entry: /dev/dri/ dev/gpu none bind,optional,create=dir\n"
    "lxc.mount.entry: proc proc proc nodev 0 0\n"
    "lxc.mount.entry: dev/rel dev/rel none bind\n"
    "dev0: /dev/nvidia0,mode=0666\n"
    "dev1: /dev/nvidia0\n"
)


def test_read_entries_sorts_each_line_into_its_kind() -> None:
    entries = read_entries(parse(CONF))
    assert entries.allows == ((0, DeviceRule("c", 195, None, "rwm")),)
    assert entries.unparsed_allows == ((1, "not a rule"),)
    assert [i for i, _ in entries.mounts] == [3, 4, 5, 6]
    assert [i for i, _ in entries.devs] == [7, 8]
    assert entries.legacy == ()


def test_paths_between_host_and_ct() -> None:
    entries = read_entries(parse(CONF))
    assert host_path(entries, "/dev/fakegpu") == "/dev/kvm"
    assert host_path(entries, "/dev/fakegpu/") == "/dev/kvm"
    assert host_path(entries, "/dev/gpu") == "/dev/dri"  # the source without its slash
    assert host_path(entries, "/dev/other") == "/dev/other"
    assert ct_path(entries, "/dev/dri/card0") == "/dev/gpu/card0"
    assert ct_path(entries, "/dev/dri") == "/dev/gpu"
    assert ct_path(entries, "/dev/drix") == "/dev/drix"
    assert ct_path(entries, "/dev/kvm") == "/dev/fakegpu"
    assert entries.mount_for("/dev/dri") is not None  # by source, trailing slash ignored
    assert entries.mount_for("/dev/gpu") is not None  # by target
    assert entries.mount_for("/proc") is None  # not a bind mount
    assert entries.dev_for("/dev/nvidia0") == DevEntry(0, "/dev/nvidia0", (("mode", "0666"),))


def test_paths_of_interest_are_bind_sources_devn_paths_and_requested_devices() -> None:
    cfg = parse(CONF)
    asked = PlanOptions(devices=("/dev/fakegpu", "/dev/extra", "/dev/kvm"))
    assert paths_of_interest(cfg, asked) == [
        "/dev/kvm",
        "/dev/dri",
        "/dev/nvidia0",
        "/dev/extra",
    ]
    assert paths_of_interest(cfg, object()) == ["/dev/kvm", "/dev/dri", "/dev/nvidia0"]
    lxc = parse("lxc.mount.entry = /dev/a dev/a none bind\n", LXC)
    assert paths_of_interest(lxc, PlanOptions()) == ["/dev/a"]


def test_a_devn_value_without_a_path_is_kept_with_the_reason() -> None:
    assert parse_dev("dev7", "mode=0600") == DevEntry(
        7, "", (("mode", "0600"),), ("Path has to be defined",)
    )


def test_the_last_devn_line_of_a_key_is_in_effect() -> None:
    """parse_pct_config assigns ``$conf->{$key}`` line by line: a later ``dev0`` replaces
    the earlier one, even an empty (tab-only) one; repeated ``delete`` lines are not
    overrides; entries come in line order."""
    cfg = parse("dev0: /dev/a\ndev0: \t\ndelete: dev1\ndelete: dev2\ndev2: /dev/b\ndev1: /dev/c\n")
    entries = read_entries(cfg)
    assert entries.devs == ((4, DevEntry(2, "/dev/b")), (5, DevEntry(1, "/dev/c")))
    assert entries.overridden == ((0, 1, "dev0"),)
    assert read_entries(parse("dev0: /dev/a\ndev0: /dev/b\n")).devs == ((1, DevEntry(0, "/dev/b")),)


def test_paths_ending_or_starting_with_x_keep_their_x() -> None:
    """Only slashes are stripped from paths (a node may be called /dev/gpuX)."""
    conf = "lxc.mount.entry: /dev/gpuX Xdev/gpuX/ none bind,optional,create=file\n"
    entries = read_entries(parse(conf))
    assert entries.mounts[0][1] == MountEntry(
        "/dev/gpuX", "/Xdev/gpuX", "none", ("bind", "optional", "create=file")
    )
    assert host_path(entries, "/Xdev/gpuX") == "/dev/gpuX"
    assert host_path(entries, "/Xdev/gpuX/") == "/dev/gpuX"
    assert ct_path(entries, "/dev/gpuX") == "/Xdev/gpuX"
    assert entries.mount_for("/dev/gpuX") is not None
    assert paths_of_interest(parse(conf), PlanOptions()) == ["/dev/gpuX"]
    assert bind_mount_value("/Xdev/a", False) == "/Xdev/a Xdev/a none bind,optional,create=file"
    slash = read_entries(parse("lxc.mount.entry: /dev/dX/ dev/dX none bind\n"))
    assert host_path(slash, "/dev/dX") == "/dev/dX" and ct_path(slash, "/dev/dX/n") == "/dev/dX/n"


@pytest.mark.parametrize(
    ("text", "flavor", "opens_everything"),
    [
        ("lxc.rootfs.path = dir:/var/lib/lxc/a/rootfs\n", LXC, True),  # LXC: no rule, all open
        ("lxc.rootfs.path = x\nlxc.cgroup2.devices.allow = c 1:3 rwm\n", LXC, False),
        ("lxc.rootfs.path = x\nlxc.cgroup2.devices.deny = a\n", LXC, False),
        ("lxc.include = /usr/share/lxc/config/common.conf\n", LXC, False),  # it may set rules
        ("arch: amd64\n", "pve", False),  # Proxmox always writes its own deny-all + allows
    ],
)
def test_a_plain_lxc_config_without_device_rules_lets_every_device_through(
    text: str, flavor: str, opens_everything: bool
) -> None:
    """LXC with no ``lxc.cgroup2.devices.*`` line (and no include that could add one) allows
    every device, so every node is covered; the first allow line makes it an allow list."""
    entries = read_entries(parse(text, flavor))
    assert entries.open_policy is opens_everything
    assert entries.covered(10, 232) is opens_everything
