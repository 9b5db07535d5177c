"""The deadline pool (real threads), host -> CT explanations and the fleet outputs, on
synthetic reports (the lab tests run the same code against real containers)."""

from __future__ import annotations

import contextlib
import io
import json
import threading

from gpudoctor.fleet.explain import explain, explained_keys, explains
from gpudoctor.fleet.inventory import CtSpec, Inventory, NodeSpec
from gpudoctor.fleet.pool import DeadlinePool, Job
from gpudoctor.fleet.results import CHECKED, STOPPED_STATE, FleetResult, Outcome
from gpudoctor.fleet.summary import fleet_document, write_fleet_human
from gpudoctor.model import CheckResult, Finding, Report, Status

# -- the pool ------------------------------------------------------------------------------


def make_job(key: str, label: str, run, results: dict, timeout: float = 30.0, abandon=None) -> Job:
    return Job(
        key=key, label=label, run=run, timeout_s=timeout,
        on_timeout=lambda waited: ("timeout", waited),
        on_error=lambda exc: ("error", str(exc)),
        done=lambda result, began, ended: results.__setitem__(label, (result, began, ended)),
        abandon=abandon,
    )  # fmt: skip


def test_hung_job_is_abandoned_at_its_deadline_and_the_rest_finish_first() -> None:
    release = threading.Event()
    abandoned = threading.Event()
    results: dict = {}
    pool = DeadlinePool(workers=2, per_key=2)
    pool.submit(make_job("n1", "hung", lambda: release.wait(), results, timeout=0.5,
                         abandon=abandoned.set))  # fmt: skip
    for i in range(6):
        pool.submit(make_job("n1", f"ok{i}", lambda i=i: i * 10, results))
    pool.submit(make_job("n2", "boom", lambda: 1 / 0, results))
    pool.wait()
    release.set()
    assert results["hung"][0][0] == "timeout"
    assert results["hung"][0][1] >= 0.5
    assert abandoned.wait(5)
    assert [results[f"ok{i}"][0] for i in range(6)] == [0, 10, 20, 30, 40, 50]
    assert results["boom"][0] == ("error", "division by zero")
    # the other jobs went on in the second worker while the hung one held the first
    assert all(results[f"ok{i}"][2] <= results["hung"][2] for i in range(6))


def test_per_key_and_total_bounds_hold() -> None:
    lock = threading.Lock()
    running: dict[str, int] = {"n1": 0, "n2": 0, "all": 0}
    peak: dict[str, int] = {"n1": 0, "n2": 0, "all": 0}
    gate = threading.Barrier(3, timeout=5)  # 3 jobs CAN run at once; never more

    def work(key: str) -> None:
        with lock:
            for k in (key, "all"):
                running[k] += 1
                peak[k] = max(peak[k], running[k])
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait()
        with lock:
            for k in (key, "all"):
                running[k] -= 1

    results: dict = {}
    pool = DeadlinePool(workers=3, per_key=2)
    for i in range(6):
        key = "n1" if i < 4 else "n2"
        pool.submit(make_job(key, f"j{i}", lambda key=key: work(key), results))
    pool.wait()
    assert len(results) == 6
    assert peak["n1"] <= 2 and peak["n2"] <= 2 and peak["all"] <= 3
    assert peak["all"] == 3  # the bound is reached, not just respected


def test_done_callbacks_may_submit_more_jobs() -> None:
    results: dict = {}
    pool = DeadlinePool(workers=2, per_key=2)

    def first_done(result, began, ended) -> None:
        results["first"] = result
        pool.submit(make_job("n", "second", lambda: "child", results))

    pool.submit(Job("n", "first", lambda: "parent", 5, lambda s: None, lambda e: None, first_done))
    pool.wait()
    assert results["first"] == "parent"
    assert results["second"][0] == "child"


# -- explanations and outputs ----------------------------------------------------------------


def report(target: str, labels: tuple, *findings: Finding) -> Report:
    return Report(target, tuple(CheckResult(f.check_id, (f,)) for f in findings), labels=labels)


def f(check: str, status: Status, subject: str = "check", message: str = "m") -> Finding:
    return Finding(check, status, subject, message, remediation=f"fix {check}")


UVM = "/dev/nvidia-uvm"


def fleet() -> FleetResult:
    """pve3: nvidia-uvm missing on the host -> its CTs fail on uvm and CUDA; CT 303 also
    fails on its own (EPERM on nvidia0: its config); pve4 is fine but CT 401 is stopped."""
    inv = Inventory(
        (NodeSpec("pve3", "root@pve3"), NodeSpec("pve4", "root@pve4")),
        (*tuple(CtSpec("pve3", str(i)) for i in (301, 302, 303)), CtSpec("pve4", "401")),
    )
    host3 = report("pve3", (("node", "pve3"),),
                   f("driver.loaded", Status.PASS, "kernel module"),
                   f("device.nodes", Status.FAIL, UVM, "nvidia-uvm is missing on the host"))  # fmt: skip
    cts = []
    for ct in ("301", "302", "303"):
        findings = [f("device.nodes", Status.FAIL, UVM), f("cuda.init", Status.FAIL, "cuInit")]
        if ct == "303":
            findings.append(f("device.open", Status.FAIL, "/dev/nvidia0", "EPERM"))
        labels = (("node", "pve3"), ("ct", ct))
        cts.append(Outcome("pve3", ct, CHECKED, report(f"pve3/ct{ct}", labels, *findings)))
    host4 = report("pve4", (("node", "pve4"),), f("driver.loaded", Status.PASS, "kernel module"))
    stopped = report("pve4/ct401", (("node", "pve4"), ("ct", "401")),
                     f("fleet.state", Status.SKIP, "ct 401", "CT 401 is stopped"))  # fmt: skip
    cts.append(Outcome("pve4", "401", STOPPED_STATE, stopped))
    nodes = (Outcome("pve3", None, CHECKED, host3), Outcome("pve4", None, CHECKED, host4))
    return FleetResult(inv, nodes, tuple(cts), 1.5)


def test_host_finding_explains_the_same_failure_in_its_cts() -> None:
    (exp,) = explain(fleet())
    assert exp.node == "pve3"
    assert exp.cts == ("301", "302", "303")
    assert exp.headline == (
        "/dev/nvidia-uvm: device.nodes FAIL on node pve3 -> 3 CTs fail (device.nodes, cuda.init)"
    )
    keys = explained_keys((exp,))
    assert ("pve3", "303", "cuda.init", "cuInit") in keys
    # CT 303's own EPERM is not the host's fault
    assert ("pve3", "303", "device.open", "/dev/nvidia0") not in keys


def test_explains_rules() -> None:
    no_driver = f("driver.loaded", Status.FAIL, "kernel module")
    assert explains(no_driver, f("cuda.init", Status.FAIL, "cuInit"))
    assert not explains(no_driver, f("device.open", Status.FAIL, "/dev/fakegpu"))
    assert not explains(no_driver, f("cuda.init", Status.SKIP, "cuInit"))
    assert not explains(f("driver.loaded", Status.PASS), f("driver.loaded", Status.FAIL))
    assert explains(f("fleet.reach", Status.ERROR, "node"), f("fleet.reach", Status.ERROR, "ct 1"))


def test_human_output_table_explanation_and_unexplained_problems() -> None:
    result = fleet()
    out = io.StringIO()
    write_fleet_human(result, explain(result), out, warnings=("node pve9 is offline",))
    text = out.getvalue()
    assert "warning: node pve9 is offline" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("NODE"))
    assert header.split() == ["NODE", "HOST", "CTS", "WORST"]
    pve3 = next(line for line in lines if line.startswith("pve3"))
    assert "301 FAIL" in pve3 and "303 FAIL" in pve3 and pve3.rstrip().endswith("FAIL")
    pve4 = next(line for line in lines if line.startswith("pve4"))
    assert "401 SKIP stopped" in pve4 and pve4.rstrip().endswith("SKIP")
    assert "device.nodes FAIL on node pve3 -> 3 CTs fail" in text
    problems = text[text.index("Problems:") :]
    assert "== pve3/ct303" in problems and "EPERM" in problems  # its own failure stays
    assert "== pve3/ct301" not in problems  # explained by the host: shown once, above
    assert "== pve3\n" not in problems  # the host's finding: shown once, as the cause
    assert "remedy: fix device.nodes" in text  # ... with its remedy
    assert "301 FAIL (host)" in pve3 and "303 FAIL (host)" not in pve3  # 303 fails on its own
    assert text.rstrip().splitlines()[-1].startswith("FAIL  2 node(s), 4 CT(s): 1 SKIP, 3 FAIL")


def test_json_document_tags_every_report_and_carries_the_fleet() -> None:
    result = fleet()
    doc = json.loads(json.dumps(fleet_document(result, explain(result))))
    assert doc["schema"] == "gpudoctor.check/1"
    assert doc["status"] == "FAIL"
    assert [r["labels"] for r in doc["reports"]] == [
        {"node": "pve3"}, {"node": "pve3", "ct": "301"}, {"node": "pve3", "ct": "302"},
        {"node": "pve3", "ct": "303"}, {"node": "pve4"}, {"node": "pve4", "ct": "401"},
    ]  # fmt: skip
    fleet_part = doc["fleet"]
    assert [n["node"] for n in fleet_part["nodes"]] == ["pve3", "pve4"]
    assert fleet_part["nodes"][1]["cts"][0]["state"] == "stopped"
    assert fleet_part["explanations"][0]["cts"] == ["301", "302", "303"]


def test_prometheus_output_has_node_and_ct_labels() -> None:
    from gpudoctor.output.prometheus import write_prometheus

    out = io.StringIO()
    write_prometheus(fleet().reports(), out)
    text = out.getvalue()
    assert 'node="pve3",ct="303"' in text
    assert 'check="device.open"' in text


# -- node state listings -------------------------------------------------------------------

PCT_LIST = """VMID       Status     Lock         Name
200        running                 ollama-docker-nvidia
202        stopped    backup       wolf
210        running                 jellyfin
"""
LXC_LS = """NAME      STATE
bench1    RUNNING
bench2    STOPPED
bench3    FROZEN
"""


def test_parse_states_of_pct_list_and_lxc_ls() -> None:
    from gpudoctor.fleet.execute import parse_states

    assert parse_states(PCT_LIST, "pve") == {"200": "running", "202": "stopped", "210": "running"}
    assert parse_states(LXC_LS, "lxc") == {
        "bench1": "running", "bench2": "stopped", "bench3": "frozen",
    }  # fmt: skip
    assert parse_states("", "pve") == {}


def test_fleet_catalogue_has_the_ct_config_check() -> None:
    from gpudoctor.fleet.execute import fleet_catalogue

    specs = {s.id: s for s in fleet_catalogue()}
    assert specs["ct.device_rules"].scope == "ct_host"
    assert "device.open" in specs
