"""``check --host local --ct NAME --flavor lxc --lxcpath DIR``: a real LXC container
started in a directory that is NOT LXC's default lxcpath (the lab's own directory, as
``lxc-start -P DIR`` leaves it), checked from its host inside the lab's pure-cgroup2
namespace, as a real subprocess."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import LXCPATH_IN_NAMESPACE, Lab, LabContainer

pytestmark = pytest.mark.lab


def check(lab: Lab, *args: str) -> tuple[int, dict, str]:
    argv = [str(lab.venv_python), "-m", "gpudoctor", "check", "--host", "local", *args, "--json"]
    result = lab.namespace.run(argv, 240)
    report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
    return result.returncode, report, result.stderr


def test_check_reaches_a_container_outside_the_default_lxcpath(
    lab: Lab, lab_container: Callable[..., LabContainer]
) -> None:
    """The mistake: a CT made with `lxc-create -P /srv/lxc` could not be checked from its
    host (`check` had no --lxcpath; lxc-attach looked in LXC's default and the error
    blamed the container). With --lxcpath (the option fix has, defined once for both),
    the checks run inside the CT and the host-side config check reads DIR/NAME/config."""
    ct = lab_container(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)}, start=False)
    ct.lxcpath = str(lab.lxcpath)  # a directory of its own, not LXC's default
    assert ct.lxcpath != LXCPATH_IN_NAMESPACE
    ct.start()
    code, report, stderr = check(
        lab, "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
        "--device", f"{FAKE_GPU_INSIDE}:{lab.fake_gpu_driver}", "--only", "device.open,ct.device_rules",
    )  # fmt: skip
    assert report, stderr
    findings = report["findings"]
    opened = [
        f for f in findings if f["check"] == "device.open" and FAKE_GPU_INSIDE in f["subject"]
    ]
    # reached inside the CT: its device policy (no rule for the major) denies the open
    assert [f["status"] for f in opened] == ["FAIL"], findings
    rules = [f for f in findings if f["check"] == "ct.device_rules"]
    assert rules and all(f["status"] != "SKIP" for f in rules), rules
    assert any(f"{ct.lxcpath}/{ct.name}/config" in json.dumps(f) for f in rules), rules
    assert code == 3, stderr


def test_lxcpath_without_flavor_lxc_is_a_usage_error(lab: Lab) -> None:
    code, _report, stderr = check(lab, "--ct", "200", "--lxcpath", "/srv/lxc")
    assert code == 2
    assert "--flavor lxc" in stderr


def test_inventory_lxcpath_is_the_same_setting(
    lab: Lab, lab_sshd, lab_container: Callable[..., LabContainer], tmp_path
) -> None:
    """An inventory node's `lxcpath` reaches the CT (lxc-attach -P) AND the host-side
    config check, which read LXC's default directory before (its findings named
    /var/lib/lxc/NAME/config whatever the inventory said)."""
    import subprocess
    import sys

    ct = lab_container(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)}, start=False)
    ct.lxcpath = str(lab.lxcpath)
    ct.start()
    inventory = tmp_path / "hosts.toml"
    inventory.write_text(
        f'[[nodes]]\nname = "lab"\nssh = "{lab_sshd.spec}"\nflavor = "lxc"\n'
        f'lxcpath = "{ct.lxcpath}"\nknown_hosts = "{lab_sshd.known_hosts}"\n'
        f'identity_file = "{lab_sshd.client_key}"\ncts = ["{ct.name}"]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--inventory", str(inventory), "--json",
         "--only", "ct.device_rules", "--device", f"{FAKE_GPU_INSIDE}:{lab.fake_gpu_driver}"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    doc = json.loads(done.stdout)
    rules = [f for r in doc["reports"] for f in r["findings"] if f["check"] == "ct.device_rules"]
    assert rules, done.stderr
    text = json.dumps(rules)
    assert f"{ct.lxcpath}/{ct.name}/config" in text, text
    assert f"{LXCPATH_IN_NAMESPACE}/{ct.name}/config" not in text
