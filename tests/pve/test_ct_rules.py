"""ct.device_rules: the host-side check that runs the planner read-only on the CT config."""

from __future__ import annotations

import pytest
from gpudoctor.checks.ct import device_rules

from gpudoctor.context import CheckOptions
from gpudoctor.hosts.local import LocalHost
from gpudoctor.model import Status
from gpudoctor.registry import validate
from gpudoctor.runner import run_checks
from tests.fakes.pvetree import PveTree

# /dev/null (char 1:3) stands for a GPU node: a real node whose major the test knows.
CONF = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"


def run(tree: PveTree, monkeypatch: pytest.MonkeyPatch, ct: str = "200"):
    for key, value in tree.env().items():
        monkeypatch.setenv(key, value)
    report = run_checks(
        LocalHost(), CheckOptions(ct=ct, flavor="pve", fix_host="root@pve1"),
        ct_host=LocalHost(), specs=validate([device_rules]),
    )  # fmt: skip
    return report.findings


def test_metadata_is_valid() -> None:
    assert validate([device_rules])[0].scope == "ct_host"


def test_fails_when_the_current_major_of_a_passed_node_is_not_allowed(
    tmp_path, monkeypatch
) -> None:
    tree = PveTree(tmp_path)
    tree.add_ct("200", CONF)
    findings = run(tree, monkeypatch)
    fails = [f for f in findings if f.status is Status.FAIL]
    assert len(fails) == 1 and fails[0].subject == "/dev/null"
    assert "major 1" in fails[0].message
    assert fails[0].remediation == "lxc.cgroup2.devices.allow: c 1:3 rwm"
    assert fails[0].fix_hint == "gpudoctor fix --host root@pve1 --ct 200"


def test_passes_once_a_rule_covers_it(tmp_path, monkeypatch) -> None:
    tree = PveTree(tmp_path)
    tree.add_ct("200", CONF + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    findings = run(tree, monkeypatch)
    assert [f.status for f in findings] == [Status.PASS]


def test_skips_when_the_config_cannot_be_read(tmp_path, monkeypatch) -> None:
    findings = run(PveTree(tmp_path), monkeypatch, ct="404")
    assert [f.status for f in findings] == [Status.SKIP]
    assert "does not exist" in findings[0].message


def recorded_pve_host(conf_text: str):
    """A RecordedHost standing for the H200 node (its /proc/devices and /dev/nvidia*
    captures: uvm 238, nvswitch 239, nvlink 240, caps 241) with CT 200's config in /etc/pve."""
    import json

    from tests.fakes.recorded_host import RecordedHost, stats_from_ls
    from tests.pve.captures import H200_LS, H200_PROC_DEVICES

    vmlist = json.dumps({"version": 1, "ids": {"200": {"node": "pve1", "type": "lxc"}}})
    return RecordedHost(
        files={
            "/etc/pve/.vmlist": vmlist,
            "/etc/pve/nodes/pve1/lxc/200.conf": conf_text,
            "/proc/devices": H200_PROC_DEVICES.read_text(),
        },
        nodes=stats_from_ls(H200_LS.read_text()),
    )


def run_on(host, monkeypatch: pytest.MonkeyPatch):
    for key in ("GPUDOCTOR_PVE_ROOT", "GPUDOCTOR_PVE_LOCK_DIR", "GPUDOCTOR_PVEVERSION"):
        monkeypatch.delenv(key, raising=False)
    options = CheckOptions(ct="200", flavor="pve", fix_host="root@pve1")
    report = run_checks(host, options, ct_host=host, specs=validate([device_rules]))
    return report.findings


def test_rules_pinning_a_dynamic_nvidia_major_are_a_fragile_warn(monkeypatch) -> None:
    from tests.pve.captures import DATA

    host = recorded_pve_host((DATA / "community/jammsen-231.conf").read_text())
    findings = run_on(host, monkeypatch)
    fragile = [f for f in findings if f.status is Status.WARN and "fragile" in f.message]
    pinned = {int(f.message.split("(")[1].split(" ")[0]) for f in fragile}
    assert pinned == {238, 239, 240}  # uvm, nvswitch, nvlink; not 195 (static) nor 226
    uvm = next(f for f in fragile if "nvidia-uvm" in f.message)
    assert uvm.check_id == "ct.device_rules"
    assert "breaks when the major moves" in uvm.message
    assert uvm.fix_hint == "gpudoctor fix --host root@pve1 --ct 200 --mode devn"


def test_devn_entries_and_static_majors_are_not_fragile(monkeypatch) -> None:
    conf = (
        "arch: amd64\n"
        "dev0: /dev/nvidia0,gid=0,mode=0666\n"
        "dev1: /dev/nvidia-uvm,gid=0,mode=0666\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"
    )
    findings = run_on(recorded_pve_host(conf), monkeypatch)
    assert not [f for f in findings if "fragile" in f.message]
    assert Status.PASS in [f.status for f in findings]


def test_a_fifo_at_a_device_path_is_a_finding_not_a_planner_error(tmp_path, monkeypatch) -> None:
    """Issue 21.4: a real FIFO where --device points: the check reports it (FAIL, named as
    "a FIFO", with the stat as evidence) and never ends as ERROR "PlanError: ..."."""
    import os

    from gpudoctor.context import DeviceRequest

    fifo = tmp_path / "kvm"
    os.mkfifo(fifo, 0o644)
    tree = PveTree(tmp_path)
    tree.add_ct("200", CONF + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    for key, value in tree.env().items():
        monkeypatch.setenv(key, value)
    options = CheckOptions(ct="200", flavor="pve", devices=(DeviceRequest(str(fifo)),))
    report = run_checks(LocalHost(), options, ct_host=LocalHost(), specs=validate([device_rules]))
    statuses = [f.status for f in report.findings]
    assert Status.ERROR not in statuses, report.findings
    fail = next(f for f in report.findings if f.subject == str(fifo))
    assert fail.status is Status.FAIL
    assert f"--device {fifo} is a FIFO, not a character device" in fail.message
    assert fail.evidence == (f"host: stat {fifo}: a FIFO, mode 0644",)
    assert "PlanError" not in fail.message
    # the rest of the config is still judged: /dev/null's rule covers the node it passes
    passed = [f for f in report.findings if f.status is Status.PASS]
    assert len(passed) == 1 and "(1 node(s))" in passed[0].message, report.findings


def test_a_fix_hint_only_where_that_command_changes_something(monkeypatch) -> None:
    """Issue 32 item 4: a stale rule's WARN offers fix with the --prune it needs; a legacy
    line (fix only flags it) offers no fix command, only the remedy by hand."""
    conf = (
        "arch: amd64\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"
        "lxc.cgroup2.devices.allow: c 238:* rwm\n"
        "lxc.cgroup2.devices.allow: c 509:* rwm\n"
        "lxc.cgroup.devices.allow: c 195:* rwm\n"
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
    )
    host = recorded_pve_host(conf)
    findings = run_on(host, monkeypatch)
    warns = [f for f in findings if f.status is Status.WARN]
    stale = next(f for f in warns if "stale rule `c 509:* rwm`" in f.message)
    assert stale.fix_hint == "gpudoctor fix --host root@pve1 --ct 200 --prune"
    legacy = next(f for f in warns if "lxc.cgroup.devices" in f.message)
    assert legacy.fix_hint == ""
