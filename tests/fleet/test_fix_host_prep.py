"""``fix --cluster``: a host cause found on any CT of a node is named once per node, with
its ``--host-prep`` command, in the report and in ``--json`` (issue 32 item 2)."""

from __future__ import annotations

from gpudoctor.commands.fix_cluster import report
from gpudoctor.fleet.fix import ClusterFixResult, CtFix
from gpudoctor.pve.fixer import FixOutcome
from gpudoctor.pve.planner import FixPlan

CAUSE = "the cause is on the host: /dev/nvidia-uvm ...: gpudoctor fix --host root@pve1 --host-prep"


def planned(node: str, ct: str, cause: str) -> CtFix:
    plan = FixPlan("a\n", "a\n", restart_reasons=("/dev/nvidia-uvm is a regular file",),
                   host_cause=cause)  # fmt: skip
    outcome = FixOutcome("dry_run", 4, "dry run: nothing written", plan=plan)
    return CtFix(node, ct, "dry_run", 0, outcome.message, "", outcome)


def test_the_host_cause_is_named_once_per_node() -> None:
    result = ClusterFixResult((planned("pve1", "200", CAUSE), planned("pve1", "201", CAUSE),
                               planned("pve2", "300", "")))  # fmt: skip
    assert result.host_prep == (("pve1", CAUSE),)
    assert result.to_dict()["host_prep"] == [{"node": "pve1", "why": CAUSE}]
    lines: list[str] = []
    report(result, as_json=False, dry_run=True, echo=lines.append)
    assert lines.count(f"pve1: {CAUSE}") == 1
    assert "  why: restart: /dev/nvidia-uvm is a regular file" in lines


def test_with_host_prep_the_unit_is_installed_on_each_node_that_needs_it(
    tmp_path, monkeypatch
) -> None:
    """``fix --cluster --host-prep``: the host prep runs on pve1 (its CT's state points to
    the host) through the real ``systemctl --root`` on a scratch tree standing for pve1's
    root, never on pve2 (no host cause there: not even connected); a dry run installs
    nothing and shows the diff; a second run has nothing to change."""
    import shutil

    import pytest

    from gpudoctor.fleet.fix import ClusterFixSettings, prepare_nodes
    from gpudoctor.hosts.local import LocalHost
    from gpudoctor.pve import uvm_unit
    from tests.fakes.pvetree import PveTree

    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    root = tmp_path / "pve1-root"
    (root / "etc/systemd/system").mkdir(parents=True)
    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", str(root))
    result = ClusterFixResult((planned("pve1", "200", CAUSE), planned("pve2", "300", "")))
    asked: list[str] = []

    def host_of(node: str) -> LocalHost:
        asked.append(node)
        return LocalHost()

    layout = PveTree(tmp_path).layout()
    dry = prepare_nodes(result, ClusterFixSettings(layout=layout, host_prep=True, dry_run=True),
                        host_of)  # fmt: skip
    assert [(p.node, p.status, p.exit_code) for p in dry] == [("pve1", "dry_run", 0)]
    assert (
        "+ExecStart=" in dry[0].diff
        and not (root / "etc/systemd/system" / uvm_unit.UNIT_NAME).exists()
    )
    lines: list[str] = []
    report(ClusterFixResult(result.fixes, prepared=dry), as_json=False, dry_run=True,
           echo=lines.append)  # fmt: skip
    assert "pve1: --host-prep: dry_run: dry run: nothing written" in lines

    done = prepare_nodes(result, ClusterFixSettings(layout=layout, host_prep=True), host_of)
    assert [(p.node, p.status) for p in done] == [("pve1", "applied")], done
    assert (root / "etc/systemd/system/multi-user.target.wants" / uvm_unit.UNIT_NAME).is_symlink()
    assert asked == ["pve1", "pve1"]
    again = prepare_nodes(result, ClusterFixSettings(layout=layout, host_prep=True), host_of)
    assert [p.status for p in again] == ["nothing_to_change"]
    assert prepare_nodes(result, ClusterFixSettings(layout=layout), host_of) == ()
    assert ClusterFixResult(result.fixes, prepared=done).to_dict()["prepared"][0]["node"] == "pve1"
