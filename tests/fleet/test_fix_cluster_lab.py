"""``fix --cluster`` against REAL systems: the per-CT fixer (gpudoctor.pve.fixer, plain LXC
flavor) on several real LXC containers through the lab's real sshd, at most
``max_restarts`` restarts at once, stopping at the first rollback unless keep-going.

The rollback is real: one container's ``lxc.hook.pre-start`` fails its next start once
(tests/fleet/fleet_lab.py), so the fixer's restart fails and it puts the old config back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.commands.fix_cluster import ClusterFixRequest, run_cluster_fix
from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.fleet.execute import FleetSettings, check_fleet
from gpudoctor.fleet.fix import ClusterFixResult, ClusterFixSettings, CtFix, fix_cluster
from gpudoctor.fleet.inventory import CtSpec, Inventory, NodeSpec
from gpudoctor.model import Status
from gpudoctor.pve.apply import Layout
from gpudoctor.pve.fixer import FixOptions
from gpudoctor.pve.planner import PlanOptions
from tests.fleet.fleet_lab import LabFleet, dead_node, lab_node
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab
from tests.lab.sshd import LabSSHD

pytestmark = pytest.mark.lab

KINDS = ["flaky", "fix1", "fix2", "fix3", "fix4"]
MAX_RESTARTS = 2


@pytest.fixture(scope="module")
def fixable(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabFleet, Path]]:
    made = LabFleet(lab, tmp_path_factory.mktemp("fixfleet"), prefix=f"fx{os.getpid()}")
    try:
        _, marker = made.flaky_start("flaky")
        for kind in KINDS[1:]:
            made.denied(kind)
        yield made, marker
    finally:
        made.destroy()


def fix_settings(tmp_path: Path, lab_sshd: LabSSHD, **kw: object) -> ClusterFixSettings:
    layout = Layout(backup_dir=str(tmp_path / "host-backups"),
                    client_backup_dir=str(tmp_path / "client-backups"))  # fmt: skip
    plan = PlanOptions(devices=(FAKE_GPU_INSIDE,), include_host_nvidia=False)
    settings: dict[str, object] = {"plan": plan, "layout": layout, "max_restarts": MAX_RESTARTS,
                                   "connection": FleetSettings(connect_timeout_s=20)}  # fmt: skip
    settings.update(kw)
    return ClusterFixSettings(**settings)  # type: ignore[arg-type]


def max_overlap(fixes: list[CtFix]) -> int:
    """Return the largest number of fixes whose [started, finished] intervals overlap."""
    events = sorted([(f.started_s, 1) for f in fixes] + [(f.finished_s, -1) for f in fixes])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def device_statuses(inventory: Inventory) -> dict[str, Status]:
    options = CheckOptions(devices=(DeviceRequest(FAKE_GPU_INSIDE, "misc"),), only=("device",))
    result = check_fleet(inventory, FleetSettings(options=options, parallel=4, target_timeout_s=30))
    return {o.ct or "": o.status for o in result.cts}


def test_fix_command_dry_run_from_an_inventory_file(
    fixable: tuple[LabFleet, Path], lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    """The body of ``gpudoctor fix --inventory FILE --dry-run`` (click-free): the diffs and
    one line per CT; nothing written; the question is never asked in a dry run."""
    fleet, _ = fixable
    names = [fleet.made[k].name for k in KINDS]
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[[nodes]]\nname = "lab"\nssh = "{lab_sshd.spec}"\nflavor = "lxc"\n'
        f'known_hosts = "{lab_sshd.known_hosts}"\nidentity_file = "{lab_sshd.client_key}"\n'
        f"cts = {json.dumps(names)}\n"
    )
    before = {k: fleet.made[k].config_path.read_bytes() for k in KINDS}
    settings = fix_settings(tmp_path, lab_sshd)
    template = FixOptions(ct="", flavor="lxc", plan=settings.plan, dry_run=True,
                          layout=settings.layout)  # fmt: skip
    lines: list[str] = []
    request = ClusterFixRequest(inventory=str(inventory), ct=(f"{fleet.prefix}-fix*",))
    code = run_cluster_fix(request, template, lambda text="", err=False: lines.append(text),
                           ask=lambda question: pytest.fail("asked in a dry run"))  # fmt: skip
    assert code == 0
    out = "\n".join(lines)
    for name in names[1:]:
        assert f"--- lab/{name}" in out
        assert f"lab/{name}: dry_run: dry run: nothing written" in out
    assert names[0] not in out  # narrowed away by --ct
    assert "+lxc.cgroup2.devices.allow = c 10:232 rwm" in out
    assert {k: fleet.made[k].config_path.read_bytes() for k in KINDS} == before


def test_cli_fix_inventory_dry_run(
    fixable: tuple[LabFleet, Path], lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    """``gpudoctor fix --inventory FILE --dry-run --json`` through the CLI (once the lead has
    wired --inventory/--cluster into gpudoctor/commands/fix.py, see the issue 7 report)."""
    from click.testing import CliRunner

    from gpudoctor.cli import cli

    runner = CliRunner()
    if "--inventory" not in runner.invoke(cli, ["fix", "--help"]).output:
        pytest.skip("gpudoctor fix has no --inventory yet (commands/fix.py patch of issue 7)")
    fleet, _ = fixable
    names = [fleet.made[k].name for k in KINDS]
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[[nodes]]\nname = "lab"\nssh = "{lab_sshd.spec}"\nflavor = "lxc"\n'
        f'known_hosts = "{lab_sshd.known_hosts}"\nidentity_file = "{lab_sshd.client_key}"\n'
        f"cts = {json.dumps(names)}\n"
    )
    args = ["fix", "--inventory", str(inventory), "--device", FAKE_GPU_INSIDE, "--dry-run",
            "--json", "--max-restarts", "2"]  # fmt: skip
    env = {"GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "hb"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "cb")}  # fmt: skip
    result = runner.invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [c["ct"] for c in doc["cts"]] == names
    assert {c["status"] for c in doc["cts"]} == {"dry_run"}


def test_fix_cluster_stops_at_the_first_rollback_then_keep_going_fixes_the_rest(
    fixable: tuple[LabFleet, Path], lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    fleet, marker = fixable
    inventory = fleet.inventory(lab_node(lab_sshd), KINDS)
    names = [fleet.made[k].name for k in KINDS]
    assert set(device_statuses(inventory).values()) == {Status.FAIL}  # all denied before

    # 1. a dry run plans every CT and changes nothing
    configs = {k: fleet.made[k].config_path.read_bytes() for k in KINDS}
    planned = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd, dry_run=True))
    assert [f.status for f in planned.fixes] == ["dry_run"] * len(KINDS), [
        (f.ct, f.status, f.message) for f in planned.fixes
    ]
    assert all("+lxc.cgroup2.devices.allow = c 10:232 rwm" in f.diff for f in planned.fixes)
    assert {k: fleet.made[k].config_path.read_bytes() for k in KINDS} == configs

    # 2. asked and declined: nothing written, nothing restarted
    declined = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd), confirm=lambda c: False)
    assert [f.status for f in declined.fixes] == ["declined"] * len(KINDS), [
        (f.ct, f.status, f.message) for f in declined.fixes
    ]
    assert {k: fleet.made[k].config_path.read_bytes() for k in KINDS} == configs

    # 3. apply (confirmed), the flaky CT's next start fails: rolled back, the rest stops
    pids = {k: fleet.made[k].init_pid() for k in KINDS}
    asked: list[int] = []

    def approve_and_break_flaky(changes) -> bool:  # type: ignore[no-untyped-def]
        asked.append(len(changes))
        marker.write_text("1")
        return True

    first = fix_cluster(
        inventory, fix_settings(tmp_path, lab_sshd), confirm=approve_and_break_flaky
    )
    assert asked == [len(KINDS)]
    by_ct = {f.ct: f for f in first.fixes}
    flaky = by_ct[names[0]]
    assert flaky.status == "rolled_back", flaky.message
    assert "injected pre-start failure" in flaky.message or "lxc-start" in flaky.message
    assert first.stopped_by == f"lab/{names[0]}"
    assert first.exit_code == 3
    assert fleet.made["flaky"].config_path.read_bytes() == configs["flaky"]  # old bytes back
    assert fleet.made["flaky"].state() == "RUNNING"
    others = [by_ct[n] for n in names[1:]]
    assert {f.status for f in others} <= {"applied", "skipped"}
    assert any(f.status == "skipped" for f in others)
    for kind, fix in zip(KINDS[1:], others, strict=True):
        if fix.status == "applied":  # started before the rollback was known
            assert fix.started_s < flaky.finished_s
            assert fleet.made[kind].init_pid() != pids[kind]
        else:  # never touched
            assert "not attempted" in fix.message
            assert fleet.made[kind].config_path.read_bytes() == configs[kind]
            assert fleet.made[kind].init_pid() == pids[kind]
    attempted = [f for f in first.fixes if f.status != "skipped"]
    assert max_overlap(attempted) <= MAX_RESTARTS

    # 4. keep-going: the flaky CT fails again and is rolled back, every other CT is fixed
    marker.write_text("1")
    second = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd, yes=True, keep_going=True,
                                                 max_restarts=MAX_RESTARTS))  # fmt: skip
    status = {f.ct: f.status for f in second.fixes}
    assert status[names[0]] == "rolled_back"
    assert {status[n] for n in names[1:]} <= {"applied", "nothing_to_change"}
    assert second.stopped_by is None
    applied = [f for f in second.fixes if f.status in ("applied", "rolled_back")]
    assert max_overlap(applied) <= MAX_RESTARTS
    assert len(applied) >= 2

    # 5. no failure injected: the last CT is fixed; the whole fleet opens the device now
    last = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd, yes=True))
    assert [f.status for f in last.fixes] == ["applied"] + ["nothing_to_change"] * (
        len(KINDS) - 1
    ), [f"{f.ct}: {f.status}: {f.message}" for f in last.fixes]
    assert last.exit_code == 0
    assert set(device_statuses(inventory).values()) == {Status.PASS}


def test_unreachable_node_is_an_error_not_a_crash(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    ghost = dead_node(lab_sshd)
    offline = NodeSpec("pve9", "root@pve9", online=False)
    inventory = Inventory((ghost, offline), (CtSpec(ghost.name, "ghost"), CtSpec("pve9", "900")))
    result: ClusterFixResult = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd, yes=True))
    dead, off = result.fixes
    assert dead.status == "error" and "cannot connect" in dead.message
    assert off.status == "error" and "node pve9 is offline" in off.message
    assert result.exit_code == 3
    assert result.to_dict()["cts"][1]["fix"] is None


def test_fix_cluster_restarts_a_ct_whose_config_is_right_but_whose_node_came_late(
    lab: Lab, lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    """Issue 32: the autostart race per node: the CT started before its host node existed
    (a placeholder file inside), its config needs no change; the cluster plan shows the
    restart and why, ``--yes`` restarts it and the node opens inside."""
    from gpudoctor.commands.fix_cluster import report

    fleet = LabFleet(lab, tmp_path, prefix=f"rc{os.getpid()}")
    node_path = lab.nodes_dir / f"late-{lab.unique_name()}"
    try:
        fleet.made["race"] = lab.container(
            name=fleet._name("race"), devices={FAKE_GPU_INSIDE: str(node_path)},
            allow=[f"c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"])  # fmt: skip
        lab.make_node(node_path.name, lab.fake_gpu_major, lab.fake_gpu_minor)
        inventory = fleet.inventory(lab_node(lab_sshd), ["race"])
        config = fleet.made["race"].config_path.read_bytes()
        planned = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd, dry_run=True))
        [fix] = planned.fixes
        assert fix.status == "dry_run" and fix.diff == "", fix.message
        assert "needs a restart" in fix.message
        lines: list[str] = []
        report(planned, as_json=False, dry_run=True, echo=lines.append)
        assert any(ln.startswith(f"  why: restart: {FAKE_GPU_INSIDE} is a regular file")
                   for ln in lines), lines  # fmt: skip
        assert planned.host_prep == ()  # a stand-in node: not one the host makes late

        applied = fix_cluster(inventory, fix_settings(tmp_path, lab_sshd, yes=True))
        assert [f.status for f in applied.fixes] == ["applied"], applied.to_dict()
        assert fleet.made["race"].config_path.read_bytes() == config
        assert device_statuses(inventory) == {fleet.made["race"].name: Status.PASS}
    finally:
        fleet.destroy()
