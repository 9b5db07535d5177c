"""gpudoctor reads and writes CT configs by Proxmox's own rules (issue 21.3).

Each rule is pve-container's / pve-common's (src/PVE/LXC/Config.pm parse_pct_config,
$dev_desc, $MAX_DEVICES; src/PVE/JSONSchema.pm parse_property_string): see
gpudoctor/pve/devspec.py for where each comes from.
"""

from __future__ import annotations

import re

import pytest

from gpudoctor.facts.procfs import parse_proc_devices
from gpudoctor.pve.config import Kind, parse
from gpudoctor.pve.devspec import parse_dev_value
from gpudoctor.pve.entries import read_entries
from gpudoctor.pve.facts import HostFacts, HostNode
from gpudoctor.pve.planner import FixPlanError, PlanOptions, plan
from tests.pve.captures import h200_facts

PROXMOX_MODE = re.compile(r"0[0-7]{3}")


def devn_plan(text: str, facts: HostFacts | None = None, **options):
    return plan(parse(text), facts or h200_facts("8.2.4"), PlanOptions(mode="devn", **options))


def dev_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.match(r"dev[0-9]+:", ln)]


@pytest.mark.parametrize(
    "value",
    ["mode=0666,path=/dev/nvidia0", "/dev/nvidia0,mode=0666", "gid=0,path=/dev/nvidia0,mode=0666"],
)
def test_the_path_is_found_wherever_it_stands(value) -> None:
    entries = read_entries(parse(f"arch: amd64\ndev0: {value}\n"))
    [(_, dev)] = entries.devs
    assert dev.path == "/dev/nvidia0" and dev.problems == ()
    assert dict(dev.options)["mode"] == "0666"
    p = devn_plan(f"arch: amd64\ndev0: {value}\n")
    new_devs = dev_lines(p.new_text)
    # no second devN for the same node (Proxmox: "failed to mknod ... File exists")
    assert sum("/dev/nvidia0," in ln or ln.endswith("/dev/nvidia0") for ln in new_devs) == 1
    assert f"dev0: {value}" in new_devs


def test_a_key_given_twice_last_wins_with_a_warning() -> None:
    text = "arch: amd64\ndev0: /dev/nvidia0\nmemory: 512\ndev0: /dev/nvidiactl\nmemory: 1024\n"
    config = parse(text)
    entries = read_entries(config)
    assert [d.path for _, d in entries.devs] == ["/dev/nvidiactl"]
    assert config.get("memory") == "1024"
    p = devn_plan(text)
    warned = [w for w in p.warnings if "has no effect" in w]
    assert any(w.startswith("line 2: `dev0: /dev/nvidia0`") and "line 4" in w for w in warned)
    assert any(w.startswith("line 3: `memory: 512`") for w in warned)
    # /dev/nvidia0 is NOT passed (its line has no effect): the plan gives it a new entry
    assert any("/dev/nvidia0,gid=" in ln for ln in dev_lines(p.new_text))


def test_non_ascii_digits_and_case_folding_make_no_key_and_no_header() -> None:
    arabic = "dev\u0660: /dev/nvidia0"  # ARABIC-INDIC DIGIT ZERO: Python's \d, not Perl's
    kelvin = "[\u212asnap]"  # KELVIN SIGN: folds to k under Python's IGNORECASE
    long_s = "[\u017fnap]"  # LATIN SMALL LETTER LONG S: folds to s
    text = f"arch: amd64\n{arabic}\n{kelvin}\nmemory: 512\n{long_s}\nhostname: x\n"
    config = parse(text)
    assert [config.lines[i].kind for i in (1, 2, 4)] == [Kind.INVALID] * 3
    assert config.sections() == []
    assert config.get("memory") == "512" and config.get("hostname") == "x"  # still live
    assert read_entries(config).devs == ()
    warnings = devn_plan(text).warnings
    assert any(f"line 2 is not valid config: `{arabic}`" in w for w in warnings)
    assert any(f"line 3 is not valid config: `{kelvin}`" in w for w in warnings)
    # the ASCII spellings are what Proxmox takes
    assert parse("[Ksnap]\n").sections()[0].name == "Ksnap"
    assert parse("[PVE:PENDING]\n").sections()[0].name == "PVE:PENDING"


def test_more_than_256_entries_is_refused_clearly() -> None:
    full = "".join(f"dev{i}: /dev/null{i}\n" for i in range(256))
    with pytest.raises(FixPlanError, match=r"dev256: Proxmox knows dev0 to dev255 only"):
        devn_plan("arch: amd64\n" + full)
    # 255 used: the one free index is taken, and the second node needs dev256
    almost = "".join(f"dev{i}: /dev/null{i}\n" for i in range(1, 256))
    with pytest.raises(FixPlanError, match="dev256"):
        devn_plan("arch: amd64\n" + almost)


def test_an_existing_dev256_is_warned_about() -> None:
    warnings = devn_plan("arch: amd64\ndev256: /dev/nvidia0\ndev01: /dev/nvidiactl\n").warnings
    assert any(w.startswith("line 2: `dev256: /dev/nvidia0`: unknown setting 'dev256'")
               for w in warnings)  # fmt: skip
    assert any(w.startswith("line 3: `dev01: /dev/nvidiactl`: unknown setting 'dev01'")
               for w in warnings)  # fmt: skip


def test_a_negative_dev_gid_is_refused_by_the_planner_itself() -> None:
    with pytest.raises(FixPlanError, match=r"--dev-gid -1: a gid is >= 0") as info:
        devn_plan("arch: amd64\n", dev_gid=-1)
    assert info.value.code == "usage"
    # in rules mode too: the planner validates its options whatever the mode
    with pytest.raises(FixPlanError, match="dev-gid"):
        plan(parse("arch: amd64\n"), h200_facts(), PlanOptions(mode="rules", dev_gid=-1))
    assert "gid=0," in devn_plan("arch: amd64\n", dev_gid=0).new_text


def node_facts(*nodes: HostNode) -> HostFacts:
    devices = parse_proc_devices("Character devices:\n  1 mem\n 10 misc\n195 nvidia\n")
    return HostFacts(devices, nodes, tuple(n.path for n in nodes if "nvidia" in n.path), "8.2.4")


def test_setgid_and_sticky_bits_are_not_written_into_mode() -> None:
    odd = HostNode("/dev/nvidia0", "char", 195, 0, 0o2666, 44)
    sticky = HostNode("/dev/nvidiactl", "char", 195, 255, 0o1660, 44)
    p = devn_plan("arch: amd64\n", node_facts(odd, sticky))
    lines = dev_lines(p.new_text)
    assert lines == ["dev0: /dev/nvidia0,gid=44,mode=0666", "dev1: /dev/nvidiactl,gid=44,mode=0660"]
    for line in lines:
        parsed = parse_dev_value(line.split(": ", 1)[1])
        assert parsed.problems == () and PROXMOX_MODE.fullmatch(parsed.get("mode") or "")


@pytest.mark.parametrize("mode", ["devn", "rules"])
@pytest.mark.parametrize("path", ["/dev/nv,idia0", "/dev/nv=0", "/dev/nv idia0", "/dev/nv\tx"])
def test_a_device_path_neither_devn_nor_a_mount_entry_can_carry_is_refused(path, mode) -> None:
    node = HostNode(path, "char", 10, 232, 0o666)
    with pytest.raises(
        FixPlanError, match=r"neither a devN entry nor an lxc\.mount\.entry"
    ) as info:
        plan(parse("arch: amd64\n"), node_facts(node), PlanOptions(mode=mode, devices=(path,)))
    assert info.value.code == "usage"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/dev/nvidia0,mode=666", "mode: '666' does not match 0[0-7]{3}"),
        ("/dev/nvidia0,gid=-1", "gid: -1 is below the minimum value of 0"),
        ("/dev/nvidia0,uid=abc", "uid: type check ('integer') failed"),
        ("/etc/shadow", "/etc/shadow is not a valid device path (outside /dev)"),
        ("/dev/../etc/shadow", "is not a valid device path (with a . or .. component)"),
        ("/dev/nvidia0,foo=bar", "invalid key in comma-separated list property: foo"),
        ("/dev/nvidia0,/dev/nvidiactl", "duplicate key in comma-separated list property: path"),
        ("/dev/nvidia0,mode=0666,mode=0660", "duplicate key in comma-separated list property"),
        ("/dev/nvidia0,deny-write=maybe", "deny-write: type check ('boolean') failed"),
        ("mode=0666", "Path has to be defined"),
    ],
)
def test_an_existing_devn_that_proxmox_rejects_is_warned_naming_the_line(value, why) -> None:
    text = f"arch: amd64\nhostname: gpu\ndev0: {value}\n"
    warnings = [w for w in devn_plan(text).warnings if "devN value Proxmox rejects" in w]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"line 3: `dev0: {value}`")
    assert why in warnings[0]


@pytest.mark.parametrize(
    "value",
    ["/dev/nvidia0", "path=/dev/nvidia0,deny-write=1", "/dev/dri/renderD128,uid=0,gid=44,mode=0660",
     "/dev/nvidia0,deny-write=TRUE", "/dev/nvidia0,gid=+5", "/dev/nvidia0,,mode=0666"],
)  # fmt: skip
def test_values_proxmox_accepts_give_no_warning(value) -> None:
    assert parse_dev_value(value).problems == ()
    assert not [w for w in devn_plan(f"dev0: {value}\n").warnings if "line 1" in w]


def test_every_devn_value_the_planner_writes_is_one_proxmox_accepts() -> None:
    p = devn_plan("arch: amd64\n")
    values = [ln.split(": ", 1)[1] for ln in dev_lines(p.new_text)]
    assert len(values) >= 5  # the H200's nodes
    assert all(parse_dev_value(v).problems == () for v in values)


def test_the_check_warns_on_a_rejected_devn_line(tmp_path, monkeypatch) -> None:
    from gpudoctor.checks.ct import device_rules

    from gpudoctor.context import CheckOptions
    from gpudoctor.hosts.local import LocalHost
    from gpudoctor.model import Status
    from gpudoctor.registry import validate
    from gpudoctor.runner import run_checks
    from tests.fakes.pvetree import PveTree

    tree = PveTree(tmp_path)
    tree.add_ct("200", "arch: amd64\ndev0: /dev/null,mode=666\n")
    for key, value in tree.env().items():
        monkeypatch.setenv(key, value)
    report = run_checks(LocalHost(), CheckOptions(ct="200", flavor="pve"), ct_host=LocalHost(),
                        specs=validate([device_rules]))  # fmt: skip
    warns = [f for f in report.findings if f.status is Status.WARN]
    assert any("line 2: `dev0: /dev/null,mode=666`" in f.message and "0[0-7]{3}" in f.message
               for f in warns), [f.message for f in report.findings]  # fmt: skip
