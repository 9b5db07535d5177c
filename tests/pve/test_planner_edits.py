"""The planner's answer in detail: every edit's reason and explanation, where new lines go
in configs of every shape, which nodes count as passed already, the plan's fields
(missing, dev_paths, nothing_to_pass, pve_version) and its refusals.

Host facts are the real H200 capture (tests/pve/captures.py) or, for devices it does not
have (a DRI render node, unregistered majors), a small /proc/devices written out here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.facts.procfs import parse_proc_devices
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.config import LXC, parse
from gpudoctor.pve.facts import HostFacts, HostNode
from gpudoctor.pve.hooks import read_hooks
from gpudoctor.pve.planner import FixPlan, FixPlanError, MissingRule, PlanOptions, plan
from tests.pve.captures import h200_facts
from tests.pve.test_planner import INCIDENT

DEVICES = parse_proc_devices(
    "Character devices:\n  1 mem\n 10 misc\n195 nvidia\n195 nvidiactl\n226 drm\n"
    "238 nvidia-uvm\n243 hidraw\n243 usbmisc\n"
)
RENDER = "/dev/dri/renderD128"
RENDER_MOUNT = f"lxc.mount.entry: {RENDER} dev/dri/renderD128 none bind,optional,create=file"
RENDER_RULE = "lxc.cgroup2.devices.allow: c 226:128 rwm"


def facts_with(*nodes: HostNode, version: str | None = "8.2.4") -> HostFacts:
    """Return host facts holding ``nodes`` (no NVIDIA node found in /dev) and DEVICES."""
    return HostFacts(DEVICES, nodes, (), version)


def node(
    path: str, major: int, minor: int, kind: str = "char", children: tuple[HostNode, ...] = ()
) -> HostNode:
    return HostNode(path, kind, major, minor, 0o666, children=children)


RENDER_NODE = node(RENDER, 226, 128)


def added(p: FixPlan) -> list[str]:
    return [e.line for e in p.edits if e.action == "add"]


def only(devices: tuple[str, ...] = (), mode: str = "rules") -> PlanOptions:
    """Options that pass the given devices only (not the host's NVIDIA nodes)."""
    return PlanOptions(mode=mode, devices=devices, include_host_nvidia=False)


# --- what each edit says --------------------------------------------------------------------


def test_every_rules_mode_edit_says_why_and_the_explanation_repeats_it() -> None:
    p = plan(parse(INCIDENT), h200_facts(), PlanOptions(prune=True))
    assert [(e.action, e.line, e.reason) for e in p.edits] == [
        ("add", "lxc.cgroup2.devices.allow: c 238:* rwm",
         "/dev/nvidia-uvm, /dev/nvidia-uvm-tools are nvidia-uvm major 238 on the host now, "
         "and no rule allows it (cures device.open and ct.device_rules)"),
        ("add", "lxc.cgroup2.devices.allow: c 241:* rwm",
         "/dev/nvidia-caps/nvidia-cap1, /dev/nvidia-caps/nvidia-cap2 are nvidia-caps major "
         "241 on the host now, and no rule allows it (cures device.open and ct.device_rules)"),
        ("add", "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
         "/dev/nvidia-caps is not passed into the CT (no check requires it alone: passed with the nodes device.nodes requires)"),
        ("remove", "lxc.cgroup2.devices.allow: c 509:* rwm",
         "major 509 is not registered in /proc/devices (an old NVIDIA major?)"),
        ("remove", "lxc.cgroup2.devices.allow: c 234:* rwm",
         "major 234 is not registered in /proc/devices (an old NVIDIA major?)"),
    ]  # fmt: skip
    verbs = {"add": "add", "remove": "remove"}
    assert p.explanation == tuple(f"{verbs[e.action]} `{e.line}`: {e.reason}" for e in p.edits)
    assert p.mode == "rules" and p.pve_version is None


def test_every_devn_mode_edit_says_why_and_the_explanation_repeats_it() -> None:
    p = plan(parse(INCIDENT), h200_facts("8.2.4"), PlanOptions(mode="devn"))
    reasons = {e.line: e.reason for e in p.edits}
    assert reasons["dev0: /dev/nvidia0,gid=0,mode=0666"] == (
        "/dev/nvidia0 (major 195, re-read by Proxmox at every start; cures ct.device_rules)"
    )
    assert reasons[
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"
    ] == ("replaced by devN entries for /dev/nvidia-uvm")
    assert reasons["lxc.cgroup2.devices.allow: c 195:* rwm"] == (
        "its nvidia/nvidiactl nodes are passed as devN entries, which allow them"
    )
    assert p.explanation == tuple(f"{e.action} `{e.line}`: {e.reason}" for e in p.edits)
    assert p.pve_version == "8.2.4"


def test_a_rule_names_every_driver_of_its_major_or_says_char_when_none() -> None:
    """The reason of a new rule names the /proc/devices owners of the major (``a/b`` when
    several), ``char`` when no driver registered it; one path ``is``, several ``are``."""
    facts = facts_with(
        node("/dev/hidraw0", 243, 0),
        node("/dev/odd0", 250, 3),  # dynamic, registered by nobody
        node("/dev/odd1", 300, 4),  # static, registered by nobody: one minor
        node("/dev/zero0", 0, 7),  # major 0: no driver (mem is 1)
    )
    p = plan(parse("arch: amd64\n"), facts, only(("/dev/hidraw0", "/dev/odd0", "/dev/odd1",
                                                  "/dev/zero0")))  # fmt: skip
    rules = [(e.line, e.reason) for e in p.edits if "devices.allow" in e.line]
    assert rules == [
        ("lxc.cgroup2.devices.allow: c 243:* rwm",
         "/dev/hidraw0 is hidraw/usbmisc major 243 on the host now, and no rule allows it (cures device.open and ct.device_rules)"),
        ("lxc.cgroup2.devices.allow: c 250:* rwm",
         "/dev/odd0 is char major 250 on the host now, and no rule allows it (cures device.open and ct.device_rules)"),
        ("lxc.cgroup2.devices.allow: c 300:4 rwm",
         "/dev/odd1 is char major 300 on the host now, and no rule allows it (cures device.open and ct.device_rules)"),
        ("lxc.cgroup2.devices.allow: c 0:7 rwm",
         "/dev/zero0 is char major 0 on the host now, and no rule allows it (cures device.open and ct.device_rules)"),
    ]  # fmt: skip


def test_missing_names_every_uncovered_node_with_its_driver() -> None:
    """``missing`` lists each node whose current numbers no rule allows, with the driver;
    a node covered by a per-minor rule is left out, its siblings of the same major are not."""
    text = INCIDENT.replace(
        "lxc.cgroup2.devices.allow: c 234:* rwm\n",
        "lxc.cgroup2.devices.allow: c 234:* rwm\nlxc.cgroup2.devices.allow: c 241:1 rwm\n",
    )
    p = plan(parse(text), h200_facts(), PlanOptions())
    assert p.missing == (
        MissingRule("/dev/nvidia-uvm", 238, 0, "nvidia-uvm"),
        MissingRule("/dev/nvidia-uvm-tools", 238, 1, "nvidia-uvm"),
        MissingRule("/dev/nvidia-caps/nvidia-cap2", 241, 2, "nvidia-caps"),
    )
    assert ("lxc.cgroup2.devices.allow: c 241:* rwm",
            "/dev/nvidia-caps/nvidia-cap2 is nvidia-caps major 241 on the host now, and no rule "
            "allows it (cures device.open and ct.device_rules)") in [(e.line, e.reason) for e in p.edits]  # fmt: skip


# --- where new lines go ---------------------------------------------------------------------

PLACEMENTS = [
    # (config, the line the new rule follows)
    ("arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.memory.max: 1G\n"
     f"{RENDER_MOUNT}\n", "lxc.cgroup2.devices.allow: c 195:* rwm"),
    ("arch: amd64\nlxc.cgroup2.devices.deny: c 5:1 rwm\nlxc.cgroup2.memory.max: 1G\n"
     f"{RENDER_MOUNT}\n", "lxc.cgroup2.devices.deny: c 5:1 rwm"),
    (f"arch: amd64\nlxc.cgroup2.memory.max: 1G\n{RENDER_MOUNT}\n", "lxc.cgroup2.memory.max: 1G"),
    (f"arch: amd64\nlxc.cgroup.devices.allow: c 226:* rwm\n{RENDER_MOUNT}\nlxc.apparmor.profile: "
     "unconfined\n", "lxc.cgroup.devices.allow: c 226:* rwm"),
    (f"arch: amd64\n{RENDER_MOUNT}\nmemory: 512\n", RENDER_MOUNT),
]  # fmt: skip


@pytest.mark.parametrize("mode", ["rules", "devn"])
@pytest.mark.parametrize(("text", "after"), PLACEMENTS)
def test_a_new_rule_follows_the_device_lines_else_the_nearest_related_lxc_key(
    text: str, after: str, mode: str
) -> None:
    """A rule for a bind-mounted node no rule allows goes right after the last allow/deny
    line; without one after the last ``lxc.cgroup2.*`` line, else ``lxc.cgroup.*``, else
    any ``lxc.*`` line; in rules mode and in devN mode (nodes that stay bind mounts)."""
    p = plan(parse(text), facts_with(RENDER_NODE), only(mode=mode))
    assert p.mode == mode
    legacy = after.startswith("lxc.cgroup.")  # commented out in the same write (issue 45.7)
    assert [(e.line, e.reason) for e in p.edits] == [
        (RENDER_RULE, f"{RENDER} is drm major 226 on the host now, and no rule allows it (cures device.open and ct.device_rules)"),
        *([(after, f"legacy `{after}` is ignored on cgroup v2 hosts (PVE >= 7) and rejected by"
                   " PVE 9 (ct.device_rules)")] if legacy else []),
    ]  # fmt: skip
    after = "#" + after if legacy else after
    lines = p.new_text.splitlines()
    assert lines.index(RENDER_RULE) == lines.index(after) + 1
    assert (
        p.new_text.replace(RENDER_RULE + "\n", "", 1) == text.replace(after[1:], after, 1)
        if legacy
        else text
    )


def test_an_empty_live_section_gets_the_lines_at_the_top_in_the_default_style() -> None:
    """No live line to follow: the rule and the mount go first, before the snapshot, with
    ``: `` (Proxmox's style), not styled like a snapshot's line."""
    snap = "[before]\nlxc.cgroup2.devices.allow = c 1:3 rwm\n"
    for text in ("", "\n", snap):
        p = plan(parse(text), facts_with(RENDER_NODE), only((RENDER,)))
        assert p.new_text == f"{RENDER_RULE}\n{RENDER_MOUNT}\n{text}", text


def test_lines_after_the_first_line_copy_its_equals_style() -> None:
    text = "lxc.cgroup2.devices.allow = c 195:* rwm\n"
    p = plan(parse(text), facts_with(RENDER_NODE), only((RENDER,)))
    assert p.new_text == text + (
        "lxc.cgroup2.devices.allow = c 226:128 rwm\n"
        "lxc.mount.entry = /dev/dri/renderD128 dev/dri/renderD128 none bind,optional,create=file\n"
    )


# --- what counts as passed already ----------------------------------------------------------


def test_a_node_inside_a_bind_mounted_directory_is_passed_already() -> None:
    """``--device /dev/dri/renderD128`` where ``/dev/dri`` is bind-mounted: only the rule
    is added; without that mount the node gets its own mount too."""
    dri = "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir\n"
    p = plan(parse("arch: amd64\n" + dri), facts_with(RENDER_NODE), only((RENDER,)))
    assert added(p) == [RENDER_RULE]
    bare = plan(parse("arch: amd64\n"), facts_with(RENDER_NODE), only((RENDER,)))
    assert added(bare) == [RENDER_RULE, RENDER_MOUNT]


def test_a_new_mount_follows_the_last_mount_entry_not_the_last_line() -> None:
    kvm = "lxc.mount.entry: /dev/kvm dev/kvm none bind,optional,create=file"
    text = f"arch: amd64\n{kvm}\nlxc.apparmor.profile: unconfined\nmemory: 512\n"
    p = plan(parse(text), facts_with(RENDER_NODE), only((RENDER,)))
    lines = p.new_text.splitlines()
    assert lines.index(RENDER_MOUNT) == lines.index(kvm) + 1


@pytest.mark.parametrize(
    ("path", "mount"),
    [("/dev/nvidia-uvm", "/dev dev none rbind,create=dir"),
     ("/gpu0", "/ mnt/host none rbind,create=dir")],
)  # fmt: skip
def test_a_bind_mount_of_all_of_dev_or_of_root_does_not_count_as_passing_a_node(
    path: str, mount: str
) -> None:
    """Only a node's own mount, or its own directory's (below /dev), counts: a CT that
    bind-mounts the host's whole /dev (or /) still gets the node's mount entry."""
    text = f"arch: amd64\nlxc.mount.entry: {mount}\n"
    p = plan(parse(text), facts_with(node(path, 238, 0)), only((path,)))
    entry = f"lxc.mount.entry: {path} {path.lstrip('/')} none bind,optional,create=file"
    assert entry in added(p)


@pytest.mark.parametrize(
    ("devices", "devs"),
    [(("/dev/nvidia-uvm",), "dev0: /dev/nvidia-uvm\n"),
     (("/dev/nvidia-caps",),
      "dev0: /dev/nvidia-caps/nvidia-cap1\ndev1: /dev/nvidia-caps/nvidia-cap2\n")],
)  # fmt: skip
def test_rules_mode_leaves_nodes_with_devn_entries_alone(devices, devs: str) -> None:
    """In rules mode a node (or every node of a directory) that has a devN entry gets no
    bind mount and no rule: Proxmox makes the node and allows it at start."""
    text = "arch: amd64\n" + devs
    p = plan(parse(text), h200_facts("8.2.4"), PlanOptions(mode="rules", devices=devices,
                                                         include_host_nvidia=False))  # fmt: skip
    assert p.edits == () and p.missing == ()
    assert p.dev_paths == tuple(line.split(": ")[1] for line in devs.splitlines())


@pytest.mark.parametrize(
    ("source", "host"),
    [("/dev/dri/", node("/dev/dri", 0, 0, "dir", children=(RENDER_NODE,))),
     ("/dev/renderX", node("/dev/renderX", 226, 128))],
)  # fmt: skip
def test_a_bind_mounted_source_is_a_passed_node_trailing_slash_or_not(
    source: str, host: HostNode
) -> None:
    """A bind mount's source, read as written less trailing slashes (``/dev/dri/``), is a
    passed node: its render node needs a rule (and is probed) though nothing asks for it."""
    target = source.strip("/")
    text = f"arch: amd64\nlxc.mount.entry: {source} {target} none bind,optional,create=dir\n"
    p = plan(parse(text), facts_with(host), only())
    assert added(p) == [RENDER_RULE]
    assert p.probe_paths == (RENDER if host.kind == "dir" else host.path,)


# --- the nodes wanted, and refusals ---------------------------------------------------------


def test_an_nvidia_path_that_is_not_a_device_node_is_not_passed() -> None:
    """A regular file at /dev/nvidia-uvm (left by a broken script) is reported, not passed."""
    base = h200_facts()
    fake = node("/dev/nvidia-uvm", 0, 0, "file")
    facts = replace(base, nodes=tuple(fake if n.path == fake.path else n for n in base.nodes))
    p = plan(parse("arch: amd64\n"), facts, PlanOptions())
    assert "/dev/nvidia-uvm is a regular file, not a device node: not passed" in p.warnings
    assert not any("/dev/nvidia-uvm " in a for a in added(p))


def test_an_nvidia_node_gone_between_listing_and_stat_is_reported_not_passed() -> None:
    """/dev listed nvidia-uvm, then it vanished before its stat (a driver unloading): the
    node the host no longer has is said and not passed; a requested one is refused
    (``device_refusal``, issue 34.7), so only a found one reaches this warning."""
    base = h200_facts()
    gone = HostNode("/dev/nvidia-uvm", "missing")
    facts = replace(base, nodes=tuple(gone if n.path == gone.path else n for n in base.nodes))
    p = plan(parse("arch: amd64\n"), facts, PlanOptions())
    assert "/dev/nvidia-uvm does not exist on the host: not passed" in p.warnings
    assert not any("/dev/nvidia-uvm " in a for a in added(p))
    assert any("/dev/nvidia0 " in a for a in added(p))  # the others still are


def test_a_device_that_is_no_char_node_is_refused_as_a_usage_error() -> None:
    facts = facts_with(node("/dev/sda", 8, 0, "block"))
    with pytest.raises(FixPlanError) as info:
        plan(parse("arch: amd64\n"), facts, only(("/dev/sda",)))
    assert str(info.value) == (
        "--device /dev/sda is a block device, not a character device: only character devices, "
        "or directories under /dev that hold them, can be passed into a CT"
    )
    assert info.value.code == "usage"


def test_a_mode_the_host_cannot_honour_is_a_plan_error_not_a_usage_error() -> None:
    with pytest.raises(FixPlanError) as info:
        plan(parse(INCIDENT), h200_facts("7.4.3"), PlanOptions(mode="devn"))
    assert info.value.code == "plan"
    assert str(info.value) == "--mode devn needs Proxmox VE >= 8.1 (this host runs 7.4.3)"


@pytest.mark.parametrize(
    ("mode", "version", "warned"),
    [("devn", None, True), ("devn", "8.2.4", False), ("auto", None, False),
     ("rules", None, False), ("raw", None, False)],
)  # fmt: skip
def test_an_explicit_devn_on_an_unknown_proxmox_version_is_warned_about(
    mode: str, version: str | None, warned: bool
) -> None:
    p = plan(parse(INCIDENT), h200_facts(version), PlanOptions(mode=mode))
    unknown = "Proxmox VE version unknown (pveversion): devN entries need >= 8.1"
    assert (unknown in p.warnings) is warned


@pytest.mark.parametrize(
    ("nvidia", "options", "nothing"),
    [(False, PlanOptions(), True),
     (False, PlanOptions(devices=(RENDER,)), False),
     (False, PlanOptions(include_host_nvidia=False), False),
     (True, PlanOptions(), False)],
)  # fmt: skip
def test_nothing_to_pass_only_when_the_host_has_no_nvidia_node_and_none_is_asked_for(
    nvidia: bool, options: PlanOptions, nothing: bool
) -> None:
    facts = h200_facts() if nvidia else facts_with(RENDER_NODE, version=None)
    p = plan(parse("arch: amd64\n"), facts, replace(options, mode="rules"))
    assert p.nothing_to_pass is nothing


def test_a_hooks_node_is_passed_even_when_the_host_nodes_are_not_asked_for() -> None:
    """``--no-host-nvidia``-style options: the node a commented-out hook made is still
    passed (rule + mount after the last ``lxc.*`` line), and the hook line is commented out
    in place. (A deny-all line makes the policy an allow list, so the rule is needed.)"""
    hook = "lxc.hook.autodev = sh -c 'mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c 511 0'"
    text = f"lxc.uts.name = ct\n{hook}\nlxc.autodev = 1\nlxc.cgroup2.devices.deny = a\n"
    config = parse(text, LXC)
    facts = replace(h200_facts(), hooks=read_hooks(LocalHost(), config))
    p = plan(config, facts, PlanOptions(mode="rules", include_host_nvidia=False))
    assert p.new_text == (
        "lxc.uts.name = ct\n"
        f"#{hook}\n"
        "lxc.autodev = 1\n"
        "lxc.cgroup2.devices.deny = a\n"
        "lxc.cgroup2.devices.allow = c 238:* rwm\n"
        "lxc.mount.entry = /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n"
    )
    comment = next(e for e in p.edits if e.action == "comment")
    assert comment.line == hook
    assert f"comment out `{hook}`: {comment.reason}" in p.explanation


@pytest.mark.parametrize(
    ("extra", "allow_list"),
    [("", False),  # no device line at all: LXC allows every device, keep it so
     ("lxc.include = /usr/share/lxc/config/common.conf\n", True),  # may hold rules: add ours
     ("lxc.cgroup2.devices.deny = a\n", True)],
)  # fmt: skip
def test_a_plain_lxc_config_with_no_device_rules_gets_no_allow_list(
    extra: str, allow_list: bool
) -> None:
    """LXC with no ``lxc.cgroup2.devices.*`` line allows every device; the first allow line
    would make an allow list that denies /dev/null (DESIGN.md section 3): the plan then
    only bind-mounts, and ``ct.device_rules`` counts every node as allowed."""
    config = parse(f"lxc.uts.name = ct\n{extra}", LXC)
    p = plan(config, h200_facts(), PlanOptions(mode="rules"))
    added = [e.line for e in p.edits if e.action == "add"]
    assert any("lxc.mount.entry = /dev/nvidia-uvm" in line for line in added)
    assert any("devices.allow" in line for line in added) is allow_list
    assert (p.missing == ()) is not allow_list


# --- bind mounts into /dev that have no create= ------------------------------------------


def test_a_bind_mount_into_dev_without_create_gets_one_in_place() -> None:
    """LXC's /dev is a fresh tmpfs: a bind mount with nothing to land on is skipped. The
    planner rewrites each such line where it stands (file for a node, dir for a node
    directory) and says why; a line that already has ``create=``, a mount outside /dev,
    a non-bind mount and a source the host does not have are left alone."""
    dri = node("/dev/dri", 0, 0, kind="dir", children=(RENDER_NODE,))
    text = (
        "arch: amd64\n"
        "lxc.mount.entry: tmpfs dev/shm tmpfs defaults\n"  # skipped lines first: the
        "lxc.mount.entry: /dev/dri srv/dri none bind,optional\n"  # planner goes on after them
        f"lxc.mount.entry: {RENDER} dev/dri/renderD128 none bind,optional\n"
        "lxc.mount.entry: /dev/dri/ dev/dri none bind,optional\n"
        f"{RENDER_MOUNT}\n"
        "lxc.mount.entry: /dev/gone dev/gone none bind,optional\n"
        f"{RENDER_RULE}\n"
    )
    p = plan(parse(text), facts_with(RENDER_NODE, dri), only())
    why = (
        "{} has no create=: the CT's /dev has no file for the bind mount to land on, so LXC"
        " skips it and the node is missing inside after every start (cures device.nodes)"
    )
    assert [(e.action, e.line, e.reason) for e in p.edits] == [
        ("remove", f"lxc.mount.entry: {RENDER} dev/dri/renderD128 none bind,optional",
         why.format("/dev/dri/renderD128")),
        ("add", f"lxc.mount.entry: {RENDER} dev/dri/renderD128 none bind,optional,create=file",
         why.format("/dev/dri/renderD128")),
        ("remove", "lxc.mount.entry: /dev/dri/ dev/dri none bind,optional", why.format("/dev/dri")),
        ("add", "lxc.mount.entry: /dev/dri/ dev/dri none bind,optional,create=dir",
         why.format("/dev/dri")),
    ]  # fmt: skip
    assert p.new_text.splitlines()[3:5] == [
        f"lxc.mount.entry: {RENDER} dev/dri/renderD128 none bind,optional,create=file",
        "lxc.mount.entry: /dev/dri/ dev/dri none bind,optional,create=dir",
    ]
    assert p.new_text.splitlines()[:3] == text.splitlines()[:3]
    assert p.new_text.splitlines()[5:] == text.splitlines()[5:]


def test_each_planned_mount_names_the_check_it_cures() -> None:
    """Issue 45.6: every plan line names the check it cures. A node device.nodes requires
    (nvidiactl, nvidia-uvm, nvidiaN), or one ``--device`` asked for, cures device.nodes;
    the host's other NVIDIA nodes (nvidia-caps, nvidia-uvm-tools, nvidia-modeset) say that
    no check requires them alone; a rule cures device.open and ct.device_rules."""
    p = plan(parse("arch: amd64\n"), h200_facts(), PlanOptions())
    why = {e.line.split()[1]: e.reason for e in p.edits if e.line.startswith("lxc.mount.entry")}
    alone = "(no check requires it alone: passed with the nodes device.nodes requires)"
    assert why["/dev/nvidiactl"] == "/dev/nvidiactl is not passed into the CT (cures device.nodes)"
    assert why["/dev/nvidia0"].endswith("(cures device.nodes)")
    assert why["/dev/nvidia-uvm"].endswith("(cures device.nodes)")
    assert why["/dev/nvidia-caps"] == f"/dev/nvidia-caps is not passed into the CT {alone}"
    assert why["/dev/nvidia-uvm-tools"].endswith(alone)
    rules = [e.reason for e in p.edits if "devices.allow" in e.line]
    assert rules and all(r.endswith("(cures device.open and ct.device_rules)") for r in rules)
    asked = plan(parse("arch: amd64\n"), facts_with(node("/dev/hidraw0", 243, 0)),
                 only(("/dev/hidraw0",)))  # fmt: skip
    [mount] = [e.reason for e in asked.edits if e.line.startswith("lxc.mount.entry")]
    assert mount == "/dev/hidraw0 is not passed into the CT (cures device.nodes)"
