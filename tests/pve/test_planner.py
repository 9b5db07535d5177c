"""The planner on real configs (tests/data/recorded) and the real H200 capture (uvm 238, caps 241)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.facts.procfs import parse_proc_devices
from gpudoctor.pve.config import LXC, Kind, parse
from gpudoctor.pve.entries import read_entries
from gpudoctor.pve.facts import HostFacts, HostNode
from gpudoctor.pve.planner import DEVN, FixPlanError, PlanOptions, _check_passes, check_needs, plan
from tests.pve.captures import DATA, h200_facts

INCIDENT = """#LLM bench box
arch: amd64
hostname: llm
memory: 65536
parent: before_gpu
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 509:* rwm
lxc.cgroup2.devices.allow: c 226:* rwm
lxc.cgroup2.devices.allow: c 234:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file

[before_gpu]
arch: amd64
hostname: llm
memory: 65536
snaptime: 1700000000
"""


def added(p) -> list[str]:
    return [e.line for e in p.edits if e.action == "add"]


def removed(p) -> list[str]:
    return [e.line for e in p.edits if e.action == "remove"]


def test_incident_adds_the_current_uvm_and_caps_majors_next_to_the_allow_lines() -> None:
    cfg = parse(INCIDENT)
    p = plan(cfg, h200_facts(), PlanOptions(label="200.conf"))
    assert added(p) == [
        "lxc.cgroup2.devices.allow: c 238:* rwm",
        "lxc.cgroup2.devices.allow: c 241:* rwm",
        "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
    ]
    assert removed(p) == []
    new = parse(p.new_text)
    lines = [ln.text for ln in new.lines]
    # right after the last existing allow line; the mount after the last mount entry
    assert lines.index("lxc.cgroup2.devices.allow: c 238:* rwm") == (
        lines.index("lxc.cgroup2.devices.allow: c 234:* rwm") + 1
    )
    assert lines.index(
        "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"
    ) == (
        lines.index(
            "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file"
        )
        + 1
    )
    # the snapshot section is untouched, byte for byte; nothing after it
    assert p.new_text.endswith(INCIDENT[INCIDENT.index("\n[before_gpu]") :])
    assert not any(ln.kind is Kind.DESCRIPTION for ln in new.lines[1:])  # no marker comment
    assert p.stale == ("c 509:* rwm", "c 234:* rwm")
    assert any("509" in w and "--prune" in w for w in p.warnings)
    assert {m.major for m in p.missing} == {238, 241}
    assert p.diff.startswith("--- a/200.conf\n+++ b/200.conf\n")
    assert "+lxc.cgroup2.devices.allow: c 238:* rwm\n" in p.diff


def test_prune_removes_only_the_stale_nvidia_majors() -> None:
    p = plan(parse(INCIDENT), h200_facts(), PlanOptions(prune=True))
    assert removed(p) == [
        "lxc.cgroup2.devices.allow: c 509:* rwm",
        "lxc.cgroup2.devices.allow: c 234:* rwm",
    ]
    pairs = parse(p.new_text).pairs()
    assert ("lxc.cgroup2.devices.allow", "c 226:* rwm") in pairs  # static drm major kept
    assert ("lxc.cgroup2.devices.allow", "c 195:* rwm") in pairs


def test_applying_the_plan_gives_a_config_with_nothing_left_to_do() -> None:
    facts = h200_facts()
    first = plan(parse(INCIDENT), facts, PlanOptions(prune=True))
    second = plan(parse(first.new_text), facts, PlanOptions(prune=True))
    assert not second.changed and second.diff == "" and second.edits == ()
    assert second.missing == ()


def test_a_dynamic_major_now_owned_by_another_driver_is_stale() -> None:
    # jammsen-231 allows 234, 237..240, 508; on the H200 host 239/240 are nvswitch/nvlink,
    # 243 hidraw etc.; 237 and 234 are unregistered, 508 too.
    cfg = parse((DATA / "community/jammsen-231.conf").read_text())
    p = plan(cfg, h200_facts(), PlanOptions())
    assert set(p.stale) == {"c 234:* rwm", "c 237:* rwm", "c 508:* rwm"}
    assert "c 238:* rwm" not in " ".join(added(p))  # 238 is already allowed there
    assert added(p) == ["lxc.cgroup2.devices.allow: c 241:* rwm"]  # caps, per-file mounts exist


def test_legacy_cgroup_v1_lines_are_flagged_and_not_counted() -> None:
    cfg = parse((DATA / "community/bslc-ct100-cgroupv1.conf").read_text())
    p = plan(cfg, h200_facts(), PlanOptions())
    assert sum("legacy" in w for w in p.warnings) == 2
    # v1 rules do not cover anything on cgroup v2: 195 and 238 are added as cgroup2 rules
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in added(p)
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in added(p)
    lines = p.new_text.splitlines()
    assert (  # the legacy lines are commented out in the same write (issue 45.7)
        lines.index("lxc.cgroup2.devices.allow: c 195:* rwm")
        == lines.index("#lxc.cgroup.devices.allow: c 243:* rwm") + 1
    )
    legacy = [ln.text for ln in cfg.lines if ln.key.startswith("lxc.cgroup.")]
    assert [e.line for e in p.edits if e.action == "comment"] == legacy and len(legacy) == 2
    assert all("#" + line in lines and line not in lines for line in legacy)


def test_inline_comment_rule_still_counts_and_is_flagged() -> None:
    cfg = parse((DATA / "community/schmidt-silas-inline-comments.conf").read_text())
    p = plan(cfg, h200_facts(), PlanOptions())
    assert any("# Die 195 anpassen" in w for w in p.warnings)
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" not in added(p)


def test_per_minor_rules_cover_their_minor_only() -> None:
    cfg = parse((DATA / "community/gma1n-jellyfin-lxc.conf").read_text())
    p = plan(cfg, h200_facts(), PlanOptions())
    # 195:0 and 195:255 are allowed per minor (rw, no m): nothing for 195
    assert not any(" 195:" in a for a in added(p))
    assert "lxc.cgroup2.devices.allow: c 238:* rwm" in added(p)


def test_equals_syntax_is_kept_for_new_lines() -> None:
    cfg = parse((DATA / "community/chrnnk-equals-syntax.conf").read_text())
    p = plan(cfg, h200_facts(), PlanOptions())
    assert "lxc.cgroup2.devices.allow = c 238:* rwm" in added(p)


def test_everything_allowed_needs_no_rule() -> None:
    cfg = parse((DATA / "community/wolf-quickstart-base.conf").read_text())
    p = plan(cfg, h200_facts(), PlanOptions())
    assert not any("devices.allow" in a for a in added(p))
    assert any("/dev/nvidia-uvm " in a for a in added(p))


def test_no_allow_lines_at_all_go_after_the_last_lxc_line_and_before_the_snapshot() -> None:
    text = (DATA / "community/charlzyx-102-snapshot-cgroupv1.conf").read_text()
    p = plan(parse(text), h200_facts(), PlanOptions())
    new = parse(p.new_text)
    assert [s.name for s in new.sections()] == ["bbr"]
    snap_old = text[text.index("[bbr]") :]
    assert p.new_text.endswith(snap_old)
    main_text = "".join(ln.raw for ln in new.lines[: new.main_end])
    assert "c 238:* rwm" in main_text and "c 195:* rwm" in main_text


def test_file_without_trailing_newline_and_without_lxc_keys() -> None:
    text = (DATA / "pve-container/src/test/test-debian-007/config").read_text()
    p = plan(parse(text), h200_facts(), PlanOptions())
    assert p.new_text.startswith(text + "\n")
    assert p.new_text.endswith("\n")


def test_devn_mode_plans_dev_entries_with_gid_and_mode() -> None:
    cfg = parse((DATA / "community/hewittmd97-100-description-devN.conf").read_text())
    p = plan(cfg, h200_facts("8.2.4"), PlanOptions(mode=DEVN, dev_gid=44))
    adds = added(p)
    assert adds[0] == "dev4: /dev/nvidia0,gid=44,mode=0666"
    assert "dev6: /dev/nvidia-uvm,gid=44,mode=0666" in adds
    assert "dev9: /dev/nvidia-caps/nvidia-cap2,gid=44,mode=0444" in adds
    assert not any("lxc." in a for a in adds)
    lines = p.new_text.splitlines()
    assert (
        lines.index("dev4: /dev/nvidia0,gid=44,mode=0666")
        == lines.index("dev3: /dev/dri/card1,gid=44") + 1
    )


def test_devn_mode_replaces_bind_mounts_of_the_same_nodes_and_is_idempotent() -> None:
    facts = h200_facts("8.1.3")
    p = plan(parse(INCIDENT), facts, PlanOptions(mode=DEVN))
    mounts = [r for r in removed(p) if "lxc.mount.entry" in r]
    assert len(mounts) == 4
    # 195 (nvidia) is now allowed by the devN entries; 226 is not NVIDIA's; the stale
    # 509/234 are flagged only (--prune removes them)
    assert set(removed(p)) - set(mounts) == {"lxc.cgroup2.devices.allow: c 195:* rwm"}
    again = plan(parse(p.new_text), facts, PlanOptions(mode=DEVN))
    assert not again.changed


def test_devn_mode_refused_on_old_proxmox_and_plain_lxc() -> None:
    with pytest.raises(FixPlanError, match=r"8\.1"):
        plan(parse(INCIDENT), h200_facts("7.4.3"), PlanOptions(mode=DEVN))
    with pytest.raises(FixPlanError, match="plain LXC"):
        plan(parse("lxc.uts.name = a\n", LXC), h200_facts(), PlanOptions(mode=DEVN))


def test_plain_lxc_device_behind_a_bind_mount_gets_a_per_minor_rule() -> None:
    text = (
        "lxc.uts.name = web1\n"
        "lxc.mount.entry = /srv/nodes/fakegpu dev/fakegpu none bind,optional,create=file 0 0\n"
        "lxc.cgroup2.devices.deny = a\n"
        "lxc.cgroup2.devices.allow = c 1:3 rwm\n"
        "lxc.cgroup2.devices.allow = c 136:* rwm\n"
    )
    devices = parse_proc_devices("Character devices:\n  1 mem\n 10 misc\n136 pts\n")
    facts = HostFacts(devices, (HostNode("/srv/nodes/fakegpu", "char", 10, 232, 0o666),))
    p = plan(
        parse(text, LXC), facts, PlanOptions(devices=("/dev/fakegpu",), include_host_nvidia=False)
    )
    assert added(p) == ["lxc.cgroup2.devices.allow = c 10:232 rwm"]  # misc is shared: one minor
    assert p.new_text.splitlines()[-1] == "lxc.cgroup2.devices.allow = c 10:232 rwm"
    assert p.probe_paths == ("/dev/fakegpu",)


def test_missing_requested_device_is_a_usage_error_not_a_warning() -> None:
    """Issue 34.7: a warning then "nothing to change", exit 0, hid a typo."""
    with pytest.raises(FixPlanError, match="/dev/nope does not exist on the host") as raised:
        plan(
            parse(INCIDENT),
            h200_facts(),
            PlanOptions(devices=("/dev/nope",), include_host_nvidia=False),
        )
    assert raised.value.code == "usage"


@pytest.mark.parametrize("path", sorted((DATA / "community").glob("*.conf")), ids=lambda p: p.name)
def test_every_community_config_plans_and_replans_to_a_fixed_point(path: Path) -> None:
    facts = h200_facts()
    cfg = parse(path.read_text())
    first = plan(cfg, facts, PlanOptions(prune=True))
    second = plan(parse(first.new_text), facts, PlanOptions(prune=True))
    assert not second.changed, second.diff
    # sections and description lines are never touched
    old_sections = cfg.lines[cfg.main_end :]
    new_cfg = parse(first.new_text)
    assert new_cfg.lines[new_cfg.main_end :] == old_sections
    old_desc = [ln for ln in cfg.lines if ln.kind is Kind.DESCRIPTION]
    commented = {"#" + e.line for e in first.edits if e.action == "comment"}  # legacy keys
    new_desc = [ln for ln in new_cfg.lines if ln.kind is Kind.DESCRIPTION]
    assert [ln for ln in new_desc if ln.text not in commented] == old_desc
    # every NVIDIA node check asks for is passed and allowed read-write afterwards, and so
    # is every other one when the CT needed a fix (a healthy CT is left alone: issue 45.6)
    entries = read_entries(new_cfg)
    for node in facts.nodes:
        for char in node.char_nodes:
            if check_needs(char.path) or not _check_passes(read_entries(cfg), facts):
                assert entries.dev_for(char.path) or entries.covered(char.major, char.minor), (
                    char.path
                )


def test_new_rule_goes_after_a_trailing_deny_all_which_would_wipe_it() -> None:
    text = (
        "lxc.cgroup2.devices.allow = c 195:* rwm\n"
        "lxc.mount.entry = /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n"
        "lxc.cgroup2.devices.deny = a\n"
        "lxc.cgroup2.devices.allow = c 1:3 rwm\n"
        "lxc.cgroup2.devices.deny = c 5:1 rwm\n"
    )
    p = plan(
        parse(text, LXC),
        h200_facts(),
        PlanOptions(devices=("/dev/nvidia-uvm",), include_host_nvidia=False),
    )
    assert p.new_text == text + "lxc.cgroup2.devices.allow = c 238:* rwm\n"


# --- fuzzing: any config plans to a fixed point, sections untouched ----------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

COMMUNITY_LINES = sorted(
    {ln for p in (DATA / "community").glob("*.conf") for ln in p.read_text().splitlines()}
)
FUZZ_LINES = st.one_of(
    st.sampled_from(COMMUNITY_LINES),
    st.sampled_from(
        ["", "[snap1]", "[pve:pending]", "lxc.cgroup2.devices.deny: a", "lock: backup"]
    ),
    st.builds(lambda m: f"lxc.cgroup2.devices.allow: c {m}:* rwm", st.integers(0, 600)),
    st.text(st.characters(blacklist_characters="\n\0", blacklist_categories=["Cs"]), max_size=20),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(FUZZ_LINES, max_size=30),
    st.booleans(),
    st.sampled_from(["raw", "rules", "devn", "auto"]),
)
def test_fuzz_any_config_plans_to_a_fixed_point(lines: list[str], prune: bool, mode: str) -> None:
    cfg = parse("\n".join(lines) + "\n")
    facts = h200_facts("8.2.4")
    options = PlanOptions(prune=prune, mode=mode)
    first = plan(cfg, facts, options)
    new = parse(first.new_text)
    assert new.lines[new.main_end :] == cfg.lines[cfg.main_end :]  # sections byte-identical
    commented = {"#" + e.line for e in first.edits if e.action == "comment"}  # legacy keys
    assert [ln for ln in new.lines if ln.kind is Kind.DESCRIPTION and ln.text not in commented] == [
        ln for ln in cfg.lines if ln.kind is Kind.DESCRIPTION
    ]
    again = plan(new, facts, options)
    assert not again.changed, again.diff


def test_an_allow_rule_with_too_little_access_does_not_count() -> None:
    """``c 195:* m`` (mknod only) does not let the CT read or write the nodes: it is not
    counted as an allow rule, and the plan adds ``c 195:* rwm``."""
    text = INCIDENT.replace("allow: c 195:* rwm", "allow: c 195:* m", 1)
    cfg = parse(text)
    entries = read_entries(cfg)
    assert entries.allows[0][1].text == "c 195:* m"
    assert not entries.covered(195, 0) and not entries.covered(195)
    assert entries.covered(226, 0)  # a full rule still counts
    p = plan(cfg, h200_facts(), PlanOptions())
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in added(p)
    assert 195 in {m.major for m in p.missing}


def test_prune_keeps_the_rule_of_a_passed_non_nvidia_device_with_a_dynamic_major() -> None:
    """A GPU CT that also passes /dev/hidraw0 (major 243, dynamic, hidraw): ``--prune``
    keeps ``c 243:* rwm``, the rule that device needs, and drops only the stale majors."""
    hidraw = HostNode("/dev/hidraw0", "char", 243, 0, 0o600)
    base = h200_facts()
    facts = HostFacts(base.devices, (*base.nodes, hidraw), base.nvidia, base.pve_version)
    text = INCIDENT.replace(
        "lxc.mount.entry: /dev/nvidia0 ",
        "lxc.cgroup2.devices.allow: c 243:* rwm\n"
        "lxc.mount.entry: /dev/hidraw0 dev/hidraw0 none bind,optional,create=file\n"
        "lxc.mount.entry: /dev/nvidia0 ",
        1,
    )
    p = plan(parse(text), facts, PlanOptions(prune=True))
    pairs = parse(p.new_text).pairs()
    assert ("lxc.cgroup2.devices.allow", "c 243:* rwm") in pairs
    assert "c 243:* rwm" not in p.stale
    assert removed(p) == [
        "lxc.cgroup2.devices.allow: c 509:* rwm",
        "lxc.cgroup2.devices.allow: c 234:* rwm",
    ]


# --- fix proposes only what a finding justifies (issue 45.6, 45.7) ----------------------

FOUR_MOUNTS = "".join(
    f"lxc.mount.entry = /dev/{n} dev/{n} none bind,optional,create=file\n"
    for n in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
)


@pytest.mark.parametrize(
    "rules",
    ["lxc.cgroup2.devices.allow = a\n",
     "lxc.cgroup2.devices.allow = c 195:* rwm\nlxc.cgroup2.devices.allow = c 238:* rwm\n"],
)  # fmt: skip
def test_a_ct_that_check_passes_gets_an_empty_plan(rules: str) -> None:
    """On the H200 a CT with `allow = a` (or the two majors) and the four usual mounts runs
    CUDA and check passes; fix planned "add /dev/nvidia-caps ... is not passed into the CT"
    (exit 4) and `fix --yes` would have restarted it for that."""
    cfg = parse("lxc.uts.name = gpu\n" + rules + FOUR_MOUNTS, LXC)
    assert _check_passes(read_entries(cfg), h200_facts())
    p = plan(cfg, h200_facts(), PlanOptions())
    assert (p.changed, p.edits, p.diff, p.missing) == (False, (), "", ())
    asked = plan(cfg, h200_facts(), PlanOptions(devices=("/dev/nvidia-caps",)))
    assert any("/dev/nvidia-caps" in e.line for e in asked.edits)  # --device still passes it


def test_a_ct_that_needs_a_fix_gets_every_node_of_the_host() -> None:
    without_uvm = FOUR_MOUNTS.replace("/dev/nvidia-uvm dev/nvidia-uvm none", "/dev/null dev/x none")
    cfg = parse("lxc.uts.name = gpu\nlxc.cgroup2.devices.allow = a\n" + without_uvm, LXC)
    assert not _check_passes(read_entries(cfg), h200_facts())
    p = plan(cfg, h200_facts(), PlanOptions())
    lines = [e.line for e in p.edits]
    assert any("/dev/nvidia-uvm dev/nvidia-uvm" in line for line in lines)
    assert any("/dev/nvidia-caps" in line for line in lines)  # passed with the rest
    unallowed = parse(
        "lxc.uts.name = gpu\nlxc.cgroup2.devices.allow = c 195:* rwm\n" + FOUR_MOUNTS, LXC
    )
    assert not _check_passes(read_entries(unallowed), h200_facts())  # 238 not allowed
    assert not _check_passes(read_entries(parse("lxc.uts.name = a\n", LXC)), h200_facts())
    assert not _check_passes(read_entries(cfg), HostFacts(h200_facts().devices, (), (), None))


@pytest.mark.parametrize(
    ("path", "needed"),
    [("/dev/nvidiactl", True), ("/dev/nvidia-uvm", True), ("/dev/nvidia0", True),
     ("/dev/nvidia7", True), ("/dev/nvidia-uvm-tools", False), ("/dev/nvidia-modeset", False),
     ("/dev/nvidia-caps", False), ("/dev/nvidia-caps/nvidia-cap1", False),
     ("/dev/nvidia-nvswitch0", False), ("/dev/dri/card0", False), ("/dev/nvidia", False)],
)  # fmt: skip
def test_the_nodes_check_asks_for(path: str, needed: bool) -> None:
    assert check_needs(path) is needed


def test_legacy_keys_are_commented_out_in_the_same_write_only() -> None:
    """Issue 45.7: fix cured a CT of an old guide (`lxc.cgroup.devices.allow` only) but
    left the keys check calls "rejected by PVE 9"; they go, with the reason, in that write."""
    mounts = FOUR_MOUNTS.replace("lxc.mount.entry = ", "lxc.mount.entry: ")
    legacy = "lxc.cgroup.devices.allow: c 195:* rwm\nlxc.cgroup.devices.allow: c 238:* rwm\n"
    p = plan(parse("arch: amd64\n" + legacy + mounts), h200_facts(), PlanOptions())
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in [e.line for e in p.edits]
    assert "#lxc.cgroup.devices.allow: c 195:* rwm\n#lxc.cgroup.devices.allow: c 238:* rwm\n" in (
        p.new_text
    )
    assert "\nlxc.cgroup.devices.allow" not in p.new_text
    comments = [e for e in p.edits if e.action == "comment"]
    assert [c.line for c in comments] == legacy.splitlines()
    assert comments[0].reason == (
        "legacy `lxc.cgroup.devices.allow: c 195:* rwm` is ignored on cgroup v2 hosts (PVE >= 7)"
        " and rejected by PVE 9 (ct.device_rules)"
    )
    assert f"comment out `{comments[0].line}`: {comments[0].reason}" in p.explanation
    again = plan(parse(p.new_text), h200_facts(), PlanOptions())
    assert not again.changed, again.diff
    # nothing else to write: the legacy line stays (a warning), no write of its own
    healthy = "arch: amd64\nlxc.cgroup2.devices.allow: a\nlxc.cgroup.devices.allow: a\n"
    q = plan(parse(healthy + mounts), h200_facts(), PlanOptions())
    assert not q.changed and any("legacy" in w for w in q.warnings)
