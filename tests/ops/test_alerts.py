"""Issue 15 item 3: the shipped alert rules (gpudoctor/service/alerts.yml), on series that
gpudoctor really writes.

The input series come from real runs of `gpudoctor check --format prometheus -o FILE`,
parsed back from the textfile: this machine itself (no NVIDIA driver: driver.loaded FAILs)
and two real lab CTs seen from their host over SSH (one with the stand-in GPU denied and a
legacy `lxc.cgroup.devices.allow` line that ct.device_rules WARNs about, one healthy).
``promtool test rules`` (Debian's ``prometheus`` package) then evaluates the rules on them;
the end-to-end test serves such a file through a real node_exporter to a real Prometheus.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpudoctor.service import alert_rules_text
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab, LabContainer
from tests.lab.sshd import LabSSHD
from tests.support.signals import default_signals

pytestmark = pytest.mark.lab

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter")
SAMPLE = re.compile(r"^(gpudoctor_[a-z_]+)(\{.*\})? (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def need(tool: str | None, package: str) -> str:
    if not tool:
        pytest.skip(f"{package} missing (apt-get install {package}; tests/run.sh does)")
    return tool


def parse_textfile(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Return ``(metric, labels, value)`` per sample line of a textfile."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = dict(LABEL.findall(match.group(2) or ""))
        samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def run_check(args: list[str], out: Path, env: dict[str, str] | None = None) -> str:
    """Run `gpudoctor check ARGS --format prometheus -o OUT` (exit 0 or 3); return the file."""
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", *args, "--format", "prometheus", "-o", str(out)],
        capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode in (0, 3), done.stderr[-1500:]
    return out.read_text()


def ct_check_args(ct: LabContainer) -> list[str]:
    return ["--host", "labpve", "--ct", ct.name, "--flavor", "lxc",
            "--device", f"{FAKE_GPU_INSIDE}:misc", "--only", "device,ct.device_rules"]  # fmt: skip


@pytest.fixture(scope="module")
def textfiles(
    lab: Lab, lab_sshd: LabSSHD, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """Return ``{"node": ..., "denied": ..., "healthy": ...}`` textfiles of real runs."""
    tmp = tmp_path_factory.mktemp("textfiles")
    env = {"HOME": str(lab_sshd.client_home(tmp / "home"))}
    denied = lab.container(
        devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)},
        extra_config=["lxc.cgroup.devices.allow = c 10:* rwm"],  # legacy: ignored on cgroup2
    )
    healthy = lab.container(
        devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)}, allow=[f"c {lab.fake_gpu_major}:* rwm"]
    )
    try:
        yield {
            "node": run_check(["--only", "driver"], tmp / "node.prom"),
            "denied": run_check(ct_check_args(denied), tmp / "denied.prom", env),
            "healthy": run_check(ct_check_args(healthy), tmp / "healthy.prom", env),
            "denied_ct": denied.name,
            "home": env["HOME"],
        }
    finally:
        denied.destroy()
        healthy.destroy()


def recorded_fragile_textfile(monkeypatch: pytest.MonkeyPatch) -> str:
    """Return the textfile of ct.device_rules run on the recorded H200 node (its real
    /proc/devices: nvidia-uvm 238, nvswitch 239, nvlink 240) with a community config that
    pins those dynamic majors (tests/pve/test_ct_rules.py's stand-in): three "fragile
    config" WARNs about one config file, written by the real writer."""
    from checks.ct import device_rules
    from gpudoctor.context import CheckOptions
    from gpudoctor.output.prometheus import textfile
    from gpudoctor.registry import validate
    from gpudoctor.runner import run_checks
    from tests.pve.captures import DATA
    from tests.pve.test_ct_rules import recorded_pve_host

    for key in ("GPUDOCTOR_PVE_ROOT", "GPUDOCTOR_PVE_LOCK_DIR", "GPUDOCTOR_PVEVERSION"):
        monkeypatch.delenv(key, raising=False)
    host = recorded_pve_host((DATA / "community/jammsen-231.conf").read_text())
    options = CheckOptions(ct="200", flavor="pve", fix_host="root@pve1")
    report = run_checks(host, options, ct_host=host, specs=validate([device_rules]),
                        target_name="pve1/200")  # fmt: skip
    assert sum("fragile config" in f.message for f in report.findings) == 3
    return textfile([report], None)


def input_series(samples, stale: bool = False) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    """Return promtool ``input_series`` for 60 minutes at 1m steps: each status gauge keeps
    its value (the timer rewrites the same verdict every minute); timestamps follow the
    clock (``0+60x60``: one run per minute), or stop at 0 when ``stale``."""
    series = []  # promtool's notation: "a+bxn" = a, a+b, ... a+n*b
    for metric, labels, value in samples:
        selector = metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        if metric.endswith("_timestamp_seconds"):
            values = "0+0x60" if stale else "0+60x60"
        else:
            values = f"{value:.6f}+0x60"
        series.append({"series": selector, "values": values})
    return series


def rules_by_name() -> dict[str, dict]:
    groups = yaml.safe_load(alert_rules_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def expected(alert: str, labels: dict[str, str]) -> dict:
    """Return promtool's exp_alerts entry: the alert's labels (the series' kept labels +
    the rule's) and its annotations with ``{{ $labels.X }}`` filled in."""
    rule = rules_by_name()[alert]
    all_labels = {**labels, **rule.get("labels", {})}

    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: all_labels.get(m.group(1), ""), text)

    return {
        "exp_labels": all_labels,
        "exp_annotations": {k: fill(v) for k, v in rule.get("annotations", {}).items()},
    }


def promtool_test(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    rules = tmp_path / "gpudoctor.yml"
    rules.write_text(alert_rules_text())
    spec = tmp_path / "test.yml"
    tests = [{"interval": "1m", **test} for test in tests]
    spec.write_text(
        json.dumps({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests})
    )  # fmt: skip  (JSON is YAML)
    return subprocess.run([need(PROMTOOL, "prometheus"), "test", "rules", str(spec)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_written_series_carry_the_metric_contract(
    textfiles: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the alert rules read is really in gpudoctor's textfile, with the values the
    runs found: the denied CT FAILs device.open and WARNs in ct.device_rules; the node
    FAILs driver.loaded; every target has up/status/last_run; a fragile config is one
    WARN series however many rules pin dynamic majors (never a repeated series, which
    node_exporter would refuse)."""
    fragile = parse_textfile(recorded_fragile_textfile(monkeypatch))
    assert ("gpudoctor_check_status", {"check": "ct.device_rules", "subject":
            "/etc/pve/nodes/pve1/lxc/200.conf", "target": "pve1/200"}, 2.0) in fragile  # fmt: skip
    for name in ("node", "denied", "healthy"):
        samples = parse_textfile(textfiles[name]) + fragile
        keys = [(m, tuple(sorted(lb.items()))) for m, lb, _ in samples]
        assert len(keys) == len(set(keys)), name
    node = parse_textfile(textfiles["node"])
    denied = parse_textfile(textfiles["denied"])
    target = f"labpve/{textfiles['denied_ct']}"
    status = {(m, lb.get("check"), lb.get("subject")): v for m, lb, v in denied}
    assert status[("gpudoctor_check_status", "device.open", FAKE_GPU_INSIDE)] == 3
    assert 2 in {v for (m, c, _), v in status.items() if c == "ct.device_rules"}
    assert {lb["target"] for _, lb, _ in denied} == {target}
    for samples in (node, denied):
        names = {m for m, _, _ in samples}
        assert {"gpudoctor_up", "gpudoctor_status", "gpudoctor_last_run_timestamp_seconds",
                "gpudoctor_check_status"} <= names  # fmt: skip
    assert ("gpudoctor_check_status", {"check": "driver.loaded", "subject": "kernel module",
            "target": "local"}, 3.0) in node  # fmt: skip


def test_promtool_fires_each_alert_on_real_series(
    textfiles: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = parse_textfile(textfiles["node"])
    denied = parse_textfile(textfiles["denied"]) + parse_textfile(
        recorded_fragile_textfile(monkeypatch)
    )
    healthy = parse_textfile(textfiles["healthy"])
    target = f"labpve/{textfiles['denied_ct']}"
    fragile = [lb for m, lb, v in denied if lb.get("check") == "ct.device_rules" and v == 2]
    fresh = input_series(node + denied + healthy)
    tests = [
        {   # everything current: GPU unusable after 10m, driver missing, fragile after 30m
            "input_series": fresh,
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": "GpudoctorCtGpuUnusable", "exp_alerts": []},
                {"eval_time": "11m", "alertname": "GpudoctorCtGpuUnusable",
                 "exp_alerts": [expected("GpudoctorCtGpuUnusable", {"target": t})
                                for t in sorted({target, "pve1/200"})]},
                {"eval_time": "11m", "alertname": "GpudoctorHostDriverMissing",
                 "exp_alerts": [expected("GpudoctorHostDriverMissing", {
                     "check": "driver.loaded",
                     "subject": "kernel module", "target": "local"})]},
                {"eval_time": "29m", "alertname": "GpudoctorFragileConfig", "exp_alerts": []},
                {"eval_time": "31m", "alertname": "GpudoctorFragileConfig",
                 "exp_alerts": [expected("GpudoctorFragileConfig", lb) for lb in fragile]},
                {"eval_time": "59m", "alertname": "GpudoctorResultStale", "exp_alerts": []},
                {"eval_time": "59m", "alertname": "GpudoctorTargetUnreachable", "exp_alerts": []},
            ],
        },
        {   # the timer stopped at t=0: stale after 30m (+5m for)
            "input_series": input_series(node + healthy, stale=True),
            "alert_rule_test": [
                {"eval_time": "34m", "alertname": "GpudoctorResultStale", "exp_alerts": []},
                {"eval_time": "36m", "alertname": "GpudoctorResultStale", "exp_alerts": [
                    expected("GpudoctorResultStale", lb)
                    for m, lb, _ in node + healthy
                    if m == "gpudoctor_last_run_timestamp_seconds"]},
                {"eval_time": "36m", "alertname": "GpudoctorCtGpuUnusable", "exp_alerts": []},
            ],
        },
    ]  # fmt: skip
    done = promtool_test(tmp_path, tests)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "SUCCESS" in done.stdout


def test_promtool_catches_a_wrong_expectation(textfiles: dict[str, str], tmp_path: Path) -> None:
    """The harness can fail: the healthy CT alone must not raise GpudoctorCtGpuUnusable."""
    healthy = parse_textfile(textfiles["healthy"])
    target = healthy[0][1]["target"]
    tests = [{"input_series": input_series(healthy), "alert_rule_test": [
        {"eval_time": "11m", "alertname": "GpudoctorCtGpuUnusable",
         "exp_alerts": [expected("GpudoctorCtGpuUnusable", {"target": target})]}]}]  # fmt: skip
    done = promtool_test(tmp_path, tests)
    assert done.returncode == 1 and "FAILED" in done.stdout + done.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_alert_fires_in_a_real_prometheus_for_a_denied_ct(
    textfiles: dict[str, str], tmp_path: Path
) -> None:
    """End to end: the denied CT's textfile (written by `gpudoctor check --host --ct -o`)
    in a real node_exporter's textfile directory, scraped by a real Prometheus every 1 s
    that loads the shipped rules (their ``for:`` set to 0s here; promtool tests the
    durations): GpudoctorCtGpuUnusable fires for that CT and no driver alert does."""
    prometheus = need(PROMETHEUS, "prometheus")
    exporter = need(NODE_EXPORTER, "prometheus-node-exporter")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    (textdir / "gpudoctor-ct.prom").write_text(textfiles["denied"])
    rules = tmp_path / "rules.yml"
    rules.write_text(re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", alert_rules_text()))
    exporter_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "node",
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
    }))  # fmt: skip
    procs = [
        subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{exporter_port}",
                          "--collector.disable-defaults", "--collector.textfile",
                          f"--collector.textfile.directory={textdir}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{prom_port}"],
                         stdout=subprocess.DEVNULL, stderr=(tmp_path / "prom.log").open("w"),
                         preexec_fn=default_signals),
    ]  # fmt: skip
    target = f"labpve/{textfiles['denied_ct']}"
    firing: list[dict] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not firing:
            time.sleep(0.5)
            try:
                alerts = get_json(f"http://127.0.0.1:{prom_port}/api/v1/alerts")["data"]["alerts"]
            except OSError:
                continue
            firing = [a for a in alerts if a["state"] == "firing"]
        assert firing, (tmp_path / "prom.log").read_text()[-2000:]
        names = {(a["labels"]["alertname"], a["labels"].get("target")) for a in firing}
        assert ("GpudoctorCtGpuUnusable", target) in names
        assert not any(n == "GpudoctorHostDriverMissing" for n, _ in names)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics").read()
        assert b'gpudoctor_check_status{check="device.open"' in metrics
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def recorded_host_kernel_textfile() -> str:
    """Return the textfile of host.xid and host.kernel_modules run on the recorded H200
    with a real kernel log (Xid 79 of tests/data/recorded/kernel_log) and a next-boot
    kernel that DKMS did not build for (real proxmox-boot-tool/dkms formats), written by
    the real writer."""
    from gpudoctor.context import CheckOptions
    from gpudoctor.output.prometheus import textfile
    from gpudoctor.runner import run_checks
    from tests.fakes.kernel_records import JOURNAL, journal_json
    from tests.unit.test_kernel_facts import DATA, pve_host

    listing = "Automatically selected kernels:\n6.8.12-4-pve\n6.8.12-5-pve\n"
    host = pve_host("6.8.12-4-pve", listing, "nvidia/580.159.04, 6.8.12-4-pve, x86_64: installed",
                    {"6.8.12-4-pve"})  # fmt: skip
    log = (DATA / "kernel_log" / "k80-470_journalctl-xid79-two-gpus.txt").read_text()
    host.commands[JOURNAL] = (0, journal_json(log))
    report = run_checks(host, CheckOptions(only=("host",)), target_name="pve1")
    return textfile([report], None)


def test_promtool_fires_the_xid_and_kernel_alerts(tmp_path: Path) -> None:
    """gpudoctor_xid_events carries each GPU's Xid 79 (fatal="1"); GpudoctorGpuXid fires at
    once for both GPUs, GpudoctorNextKernelWithoutDriver after 15m for the next kernel."""
    samples = parse_textfile(recorded_host_kernel_textfile())
    xids = [(lb["pci"], lb["code"], lb["fatal"], v) for m, lb, v in samples
            if m == "gpudoctor_xid_events"]  # fmt: skip
    assert xids == [("0000:05:00", "79", "1", 1.0), ("0000:06:00", "79", "1", 1.0)]
    gpu = [{"target": "pve1", "pci": p, "code": "79"} for p, *_ in xids]
    kernel = {"check": "host.kernel_modules", "subject": "6.8.12-5-pve", "target": "pve1"}
    assert ("gpudoctor_check_status", kernel, 2.0) in samples
    tests = [{"input_series": input_series(samples), "alert_rule_test": [
        {"eval_time": "1m", "alertname": "GpudoctorGpuXid",
         "exp_alerts": [expected("GpudoctorGpuXid", lb) for lb in gpu]},
        {"eval_time": "14m", "alertname": "GpudoctorNextKernelWithoutDriver", "exp_alerts": []},
        {"eval_time": "16m", "alertname": "GpudoctorNextKernelWithoutDriver",
         "exp_alerts": [expected("GpudoctorNextKernelWithoutDriver", kernel)]},
        {"eval_time": "16m", "alertname": "GpudoctorCtGpuUnusable", "exp_alerts": []},
    ]}]  # fmt: skip
    done = promtool_test(tmp_path, tests)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
