"""Fleet check against REAL systems: 12 real LXC containers (pure cgroup v2, eBPF device
policy) on one host reached through the real sshd on 127.0.0.1, plus an unreachable node.

Healthy CTs allow the stand-in GPU (misc 10:232 bind-mounted as /dev/fakegpu), denied ones
do not (open() gives EPERM), two are stopped, one hangs in its probe (its python3 blocks,
see tests/fleet/fleet_lab.py), and the "dead" node is a closed port.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.fleet.execute import FleetSettings, check_fleet
from gpudoctor.fleet.explain import explain
from gpudoctor.fleet.inventory import CtSpec, Inventory, NodeSpec
from gpudoctor.fleet.results import FleetResult
from gpudoctor.model import Status
from tests.fleet.fleet_lab import LabFleet, dead_node, lab_node
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab
from tests.lab.sshd import LabSSHD

pytestmark = pytest.mark.lab

HEALTHY = [f"ok{i}" for i in range(1, 6)]
DENIED = [f"deny{i}" for i in range(1, 5)]
STOPPED = ["stop1", "stop2"]
HUNG = ["hang1"]
# the hung one early, so that it holds a slot while the others run
ORDER = ["ok1", "hang1", "deny1", "stop1", "ok2", "deny2", "ok3", "stop2", "deny3", "ok4",
         "deny4", "ok5"]  # fmt: skip
PARALLEL = 4
TARGET_TIMEOUT = 8.0
DEVICE = DeviceRequest(FAKE_GPU_INSIDE, "misc")


@pytest.fixture(scope="module")
def fleet(
    lab: Lab, lab_sshd: LabSSHD, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabFleet]:
    made = LabFleet(lab, tmp_path_factory.mktemp("fleet"))
    try:
        for kind in HEALTHY:
            made.healthy(kind)
        for kind in DENIED:
            made.denied(kind)
        for kind in STOPPED:
            made.stopped(kind)
        made.hung("hang1")
        yield made
    finally:
        made.destroy()


def settings(only: tuple[str, ...] = ("device", "ct")) -> FleetSettings:
    options = CheckOptions(devices=(DEVICE,), only=only, timeout_s=6, probe_timeout_s=6)
    return FleetSettings(options=options, parallel=PARALLEL, target_timeout_s=TARGET_TIMEOUT,
                         connect_timeout_s=5)  # fmt: skip


@pytest.fixture(scope="module")
def device_run(fleet: LabFleet, lab_sshd: LabSSHD) -> FleetResult:
    """One fleet check (device + ct.device_rules checks) of the whole lab fleet."""
    inventory = fleet.inventory(lab_node(lab_sshd), ORDER,
                                extra_nodes=((dead_node(lab_sshd), ["ghost1"]),))  # fmt: skip
    offline = NodeSpec("pve9", "root@pve9", online=False)  # the cluster says it is offline
    missing = CtSpec("lab", f"{fleet.prefix}-missing")  # listed, but not on the node
    inventory = replace(inventory, nodes=(*inventory.nodes, offline),
                        cts=(*inventory.cts, missing, CtSpec("pve9", "900")))  # fmt: skip
    return check_fleet(inventory, settings())


def finding(outcome, check: str, subject: str):  # type: ignore[no-untyped-def]
    matches = [f for f in outcome.report.findings if f.check_id == check and f.subject == subject]
    assert len(matches) == 1, outcome.report
    return matches[0]


def test_each_target_is_reported_correctly(device_run: FleetResult, fleet: LabFleet) -> None:
    name = {kind: ct.name for kind, ct in fleet.made.items()}
    by_kind = {kind: device_run.ct("lab", name[kind]) for kind in ORDER}
    for kind in HEALTHY:
        outcome = by_kind[kind]
        assert (outcome.state, outcome.status) == ("checked", Status.PASS), outcome.report.findings[
            0
        ].message
        assert finding(outcome, "device.open", FAKE_GPU_INSIDE).status is Status.PASS
        assert dict(outcome.report.labels) == {"node": "lab", "ct": name[kind]}
    for kind in DENIED:
        outcome = by_kind[kind]
        assert (outcome.state, outcome.status) == ("checked", Status.FAIL)
        opened = finding(outcome, "device.open", FAKE_GPU_INSIDE)
        assert opened.status is Status.FAIL and "EPERM" in opened.message
        rules = [f for f in outcome.report.findings if f.check_id == "ct.device_rules"]
        assert [f.status for f in rules] == [Status.FAIL]  # the host-side config check
        assert f"/var/lib/lxc/{name[kind]}/config" in rules[0].message
    for kind in STOPPED:
        outcome = by_kind[kind]
        assert (outcome.state, outcome.status) == ("stopped", Status.SKIP)
        assert "is stopped: not checked" in outcome.report.findings[0].message
        assert fleet.made[kind].state() == "STOPPED"  # not attempted, not started
    hung = by_kind["hang1"]
    assert (hung.state, hung.status) == ("timeout", Status.ERROR)
    assert f"no result within {TARGET_TIMEOUT:.0f} s" in hung.report.findings[0].message
    dead = device_run.nodes[1]
    assert (dead.node, dead.state, dead.status) == ("dead", "unreachable", Status.ERROR)
    assert "cannot connect" in dead.report.findings[0].message
    ghost = device_run.ct("dead", "ghost1")
    assert (
        ghost.status is Status.ERROR and "node dead not reached" in ghost.report.findings[0].message
    )
    host = device_run.nodes[0]
    assert host.state == "checked" and dict(host.report.labels) == {"node": "lab"}
    missing = device_run.ct("lab", f"{fleet.prefix}-missing")
    assert (missing.state, missing.status) == ("missing", Status.ERROR)
    assert "does not exist on node lab" in missing.report.findings[0].message
    offline = device_run.nodes[2]
    assert (offline.node, offline.state, offline.status) == ("pve9", "unreachable", Status.ERROR)
    assert "offline (cluster status)" in offline.report.findings[0].message
    assert device_run.ct("pve9", "900").status is Status.ERROR


def test_hung_and_unreachable_targets_do_not_hold_up_the_rest(
    device_run: FleetResult, fleet: LabFleet
) -> None:
    hung = device_run.ct("lab", fleet.made["hang1"].name)
    # the hung CT was given exactly its deadline, no less
    assert hung.finished_s - hung.started_s >= TARGET_TIMEOUT
    others = [o for o in (*device_run.nodes, *device_run.cts) if o is not hung]
    # every other target finished before the hung one was given up on
    assert all(o.finished_s < hung.finished_s for o in others), [
        (o.report.target, o.finished_s) for o in others
    ]
    dead = device_run.nodes[1]
    assert dead.finished_s < hung.started_s + TARGET_TIMEOUT
    # the whole run is bounded by the deadlines: one wave of jobs per `parallel` slots
    jobs = 2 + 1 + sum(1 for o in device_run.cts if o.state in ("checked", "timeout"))
    bound = (math.ceil(jobs / PARALLEL) + 1) * TARGET_TIMEOUT
    assert device_run.duration_s <= bound


def test_cli_inventory_file_full_catalogue_json(
    fleet: LabFleet, lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    """``check --inventory FILE --json``: the whole catalogue; the host's missing NVIDIA
    driver explains the same FAIL in every checked CT; the denied CTs' EPERM is their own."""
    from gpudoctor.cli import cli

    names = {kind: ct.name for kind, ct in fleet.made.items()}
    inventory = tmp_path / "hosts.toml"
    cts = ", ".join(f'"{names[k]}"' for k in ORDER)
    inventory.write_text(
        f'[defaults]\nflavor = "lxc"\nknown_hosts = "{lab_sshd.known_hosts}"\n'
        f'identity_file = "{lab_sshd.client_key}"\n\n'
        f'[[nodes]]\nname = "lab"\nssh = "{lab_sshd.spec}"\ncts = [{cts}]\n'
    )
    args = ["check", "--inventory", str(inventory), "--json", "--device", f"{FAKE_GPU_INSIDE}:misc",
            "--parallel", str(PARALLEL), "--target-timeout", str(TARGET_TIMEOUT),
            "--timeout", "6"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 3, result.output
    doc = json.loads(result.stdout)
    (node,) = doc["fleet"]["nodes"]
    states = {c["ct"]: c["state"] for c in node["cts"]}
    assert states[names["hang1"]] == "timeout"
    assert {states[names[k]] for k in STOPPED} == {"stopped"}
    assert {states[names[k]] for k in HEALTHY + DENIED} == {"checked"}
    (exp,) = [e for e in doc["fleet"]["explanations"] if e["cause"]["check"] == "driver.loaded"]
    assert exp["headline"].startswith("kernel module: driver.loaded FAIL on node lab -> 9 CTs fail")
    assert sorted(exp["cts"]) == sorted(names[k] for k in HEALTHY + DENIED)
    explained = {(e["ct"], e["check"]) for e in exp["effects"]}
    assert explained, exp  # the 9 CTs' failing checks are listed as the driver's effects
    assert all(check != "device.open" for _, check in explained)  # EPERM is the CT's own
    for report in doc["reports"]:
        assert report["labels"]["node"] == "lab"


def test_cli_inventory_human_table_and_ct_glob(
    fleet: LabFleet, lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    from gpudoctor.cli import cli

    inventory = tmp_path / "hosts.toml"
    names = [fleet.made[k].name for k in HEALTHY + DENIED]
    inventory.write_text(
        f'[[nodes]]\nname = "lab"\nssh = "{lab_sshd.spec}"\nflavor = "lxc"\n'
        f'known_hosts = "{lab_sshd.known_hosts}"\nidentity_file = "{lab_sshd.client_key}"\n'
        f"cts = {json.dumps(names)}\n"
    )
    args = ["check", "--inventory", str(inventory), "--ct", f"{fleet.prefix}-ok*",
            "--device", f"{FAKE_GPU_INSIDE}:misc", "--only", "device,ct"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("lab "))
    assert row.split()[:2] == ["lab", "SKIP"]  # no NVIDIA driver on the lab host: SKIP
    for kind in HEALTHY:
        assert f"{fleet.made[kind].name} PASS" in row
    assert "deny" not in result.stdout  # narrowed away by --ct
    closing = result.stdout.rstrip().splitlines()[-1]
    assert closing.startswith(f"SKIP  1 node(s), {len(HEALTHY)} CT(s): {len(HEALTHY)} PASS")


def test_explain_runs_on_the_lab_fleet(device_run: FleetResult) -> None:
    """With only the device checks the host has nothing failing: nothing is explained away,
    and every denied CT keeps its own FAIL."""
    explanations = explain(device_run)
    assert {e.node for e in explanations} == {"dead", "pve9"}  # only the unreachable nodes'
    by_node = {e.node: e for e in explanations}
    assert by_node["dead"].cts == ("ghost1",)
    assert by_node["pve9"].cts == ("900",)


def test_a_node_of_the_wrong_flavor_is_a_clear_error(lab_sshd: LabSSHD) -> None:
    """The lab host has no ``pct``: listed as a Proxmox node it is ERROR with the hint."""
    node = replace(lab_node(lab_sshd), name="notpve", flavor="pve")
    inventory = Inventory((node,), (CtSpec("notpve", "200"),))
    result = check_fleet(inventory, settings())
    (outcome,) = result.nodes
    assert (outcome.state, outcome.status) == ("error", Status.ERROR)  # reached, but no pct
    message = outcome.report.findings[0].message
    assert "`pct` is not installed there" in message and 'flavor = "lxc"' in message
    assert "could not list its CTs" in result.ct("notpve", "200").report.findings[0].message
