"""ct.device_rules: the host-side check that runs the planner read-only on the CT config."""

from __future__ import annotations

import pytest
from gpudoctor.checks.ct_rules import device_rules

from gpudoctor.context import CheckOptions
from gpudoctor.hosts.local import LocalHost
from gpudoctor.model import Status
from gpudoctor.registry import validate
from gpudoctor.runner import run_checks
from tests.fix.pvetree import PveTree

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
