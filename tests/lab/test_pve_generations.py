"""gpudoctor's remote programs on every Proxmox VE generation's own userland: stand-in
hosts of Debian 11 (PVE 7, Python 3.9) and Debian 13 (PVE 9, Python 3.13), each a real
LXC CT with its own python3 and sshd (tests/lab/pve_generations.py). PVE 8 (Debian 12,
Python 3.11) is this machine: the rest of the lab.

Over SSH: the host agent (hosts/agent/server.py), the config program's locked
compare-and-swap (pve/conf_program.py), the GPU, P2P and all-reduce probes, and
``gpudoctor check --host``. Through ``lxc-attach``: the in-CT python and sh agents, which
must answer alike, and the catalogue through the sh agent (the "old CT" case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.facts.allreduce import run_allreduce_probe
from gpudoctor.facts.gpu import run_gpu_probe
from gpudoctor.facts.multigpu import run_p2p_probe
from gpudoctor.hosts.container import ContainerHost
from gpudoctor.hosts.ssh.host import SSHHost
from gpudoctor.model import Status
from gpudoctor.pve.apply import (
    ApplyError,
    Layout,
    compare_and_swap,
    read_config,
    resolve_target,
)
from gpudoctor.runner import run_checks
from tests.conftest import lab_unavailable
from tests.lab.debian_rootfs import RootfsUnavailable
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab
from tests.lab.pve_generations import PYTHON_OF, StandinHost, standin_host

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module", params=["pve7", "pve9"])
def standin(request: pytest.FixtureRequest, lab: Lab) -> Iterator[StandinHost]:
    """One stand-in host per generation for the module (the stand-in GPU denied in it)."""
    try:
        ct = standin_host(lab, request.param)
    except RootfsUnavailable as exc:
        lab_unavailable(str(exc))
    ct.generation = request.param  # type: ignore[attr-defined]
    yield ct
    ct.destroy()


@pytest.fixture
def ssh(standin: StandinHost) -> Iterator[SSHHost]:
    host = standin.host()
    yield host
    host.close()


def test_the_stand_in_runs_its_own_debian_and_python(standin: StandinHost, ssh: SSHHost) -> None:
    """The userland is the release's own (not this machine's bind-mounted), so what runs
    there below is really that generation's python3 and tools."""
    version = ssh.run(["cat", "/etc/debian_version"]).stdout.strip()
    assert version.split(".")[0] == str(standin.release.version)
    out = ssh.run(["python3", "-c", "import sys; print(*sys.version_info[:2])"]).stdout.split()
    assert tuple(map(int, out)) == PYTHON_OF[standin.generation]  # type: ignore[attr-defined]


def test_host_agent_file_operations(standin: StandinHost, ssh: SSHHost) -> None:
    """The host agent runs under the host's python3: its answers equal the files as this
    machine reads them in the stand-in's rootfs."""
    on_disk = standin.rootfs / "etc/debian_version"
    assert ssh.read_text("/etc/debian_version") == on_disk.read_text()
    assert ssh.stat("/etc/debian_version").size == on_disk.stat().st_size
    assert sorted(ssh.list_dir("/etc/ssh")) == sorted(os.listdir(standin.rootfs / "etc/ssh"))
    with pytest.raises(FileNotFoundError):
        ssh.stat("/nonexistent")
    assert ssh.try_open(FAKE_GPU_INSIDE).errname == "EPERM"  # the CT's device policy


def test_config_program_compare_and_swap(standin: StandinHost, ssh: SSHHost) -> None:
    """The locked compare-and-swap write (flock + the config program under the host's
    python3): the new bytes land, the old ones are backed up, a stale SHA-1 is refused."""
    conf_dir = standin.rootfs / "var/lib/lxc/ct1"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "config").write_bytes(b"lxc.uts.name = ct1\n")
    layout = Layout(lxcpath="/var/lib/lxc", own_lock_dir="/run/gpudoctor-test")
    target = resolve_target(ssh, "lxc", "ct1", layout)
    before = read_config(ssh, target, layout)
    new = b"lxc.uts.name = ct1\nlxc.cgroup2.devices.allow = c 195:* rwm\n"
    result = compare_and_swap(ssh, target, layout, before.sha1, new, "/root/backup/ct1.conf")
    assert (conf_dir / "config").read_bytes() == new
    assert (standin.rootfs / "root/backup/ct1.conf").read_bytes() == b"lxc.uts.name = ct1\n"
    assert result.new_sha1 == read_config(ssh, target, layout).sha1 != before.sha1
    with pytest.raises(ApplyError) as refused:
        compare_and_swap(ssh, target, layout, before.sha1, b"stale\n")
    assert refused.value.code == "changed"
    assert (conf_dir / "config").read_bytes() == new


def test_probes_run_under_the_hosts_python(ssh: SSHHost) -> None:
    """The GPU, P2P and all-reduce probes run to their end on the host's python3 and say
    what is missing (no NVIDIA driver, no torch) instead of a traceback."""
    gpu = run_gpu_probe(ssh, 60)
    assert (gpu.returncode, gpu.stderr) == (0, "")
    assert "libcuda.so.1" in gpu.stage("cuda").data["load_error"]
    assert "libnvidia-ml.so.1" in gpu.stage("nvml").data["load_error"]
    p2p = run_p2p_probe(ssh, 60)
    assert (p2p.returncode, p2p.stderr) == (0, "")
    assert "libcuda.so.1" in p2p.init["load_error"]
    allreduce = run_allreduce_probe(ssh, 2, 60)
    assert allreduce.error == "no_torch"
    assert allreduce.error_detail == "torch is not importable by /usr/bin/python3"


def test_check_host_cli(standin: StandinHost, tmp_path: Path) -> None:
    """``gpudoctor check --host`` against the stand-in: a report, never a traceback."""
    home = tmp_path / "home"
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True)
    (ssh_dir / "config").write_text(
        f"Host standin\n  HostName 127.0.0.1\n  Port {standin.port}\n  User root\n"
        f"  IdentityFile {standin.client_key}\n"
    )
    (ssh_dir / "known_hosts").write_text(standin.known_hosts.read_text())
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--host", "standin", "--json"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert done.returncode in (3, 4), done.stderr  # problems found: no NVIDIA driver here
    status = {f["check"]: f["status"] for f in report["findings"]}
    assert status["proc.usable"] == "PASS"  # the checks ran on the stand-in's own /proc
    assert status["driver.loaded"] in ("FAIL", "ERROR")


def test_in_ct_agents_answer_alike(standin: StandinHost, lab: Lab) -> None:
    """The release as an old CT (``lxc-attach``): the python agent (the CT's python3) and
    the sh agent (the CT's dash and coreutils) give the same answers, errno included."""
    host = lab.host
    py = ContainerHost(host, standin.name, flavor="lxc", lxcpath=standin.lxcpath, agent="python")
    sh = ContainerHost(host, standin.name, flavor="lxc", lxcpath=standin.lxcpath, agent="sh")
    try:
        assert (py.agent_kind, sh.agent_kind, sh.has_python) == ("python", "sh", True)
        for path in (FAKE_GPU_INSIDE, "/dev/null", "/", "/etc/debian_version", "/nonexistent",
                     "/dev/null/below", "/etc/ssh", "/tmp"):  # fmt: skip
            for call in ("stat", "list_dir"):
                assert _outcome(getattr(py, call), path) == _outcome(getattr(sh, call), path), (
                    call, path,
                )  # fmt: skip
            for write in (True, False):
                assert py.try_open(path, write) == sh.try_open(path, write), (path, write)
        for text_file in ("/proc/devices", "/proc/self/mounts", "/etc/debian_version",
                          "/etc/os-release"):  # fmt: skip
            assert sh.read_text(text_file) == py.read_text(text_file), text_file
        assert sh.try_open(FAKE_GPU_INSIDE).errname == "EPERM"
        assert (
            sh.read_text("/etc/debian_version")
            == (standin.rootfs / "etc/debian_version").read_text()
        )
    finally:
        py.close()
        sh.close()


def test_catalogue_through_the_sh_agent_of_an_old_ct(standin: StandinHost, lab: Lab) -> None:
    """The checks inside the release's CT through its sh agent: the denied stand-in GPU
    is found denied by the device policy."""
    ct = ContainerHost(lab.host, standin.name, flavor="lxc", lxcpath=standin.lxcpath, agent="sh")
    try:
        report = run_checks(ct, CheckOptions(devices=(DeviceRequest(FAKE_GPU_INSIDE, "misc"),)))
    finally:
        ct.close()
    status = {r.check_id: r.status for r in report.results}
    assert status["device.nodes"] == Status.PASS
    assert status["device.open"] == Status.FAIL
    opened = next(f for f in report.findings if f.check_id == "device.open")
    assert "EPERM" in opened.message
    assert status["proc.usable"] == Status.PASS, report.result("proc.usable")
    assert Status.ERROR not in status.values(), [
        r for r in report.results if r.status == Status.ERROR
    ]


def _outcome(call, path: str) -> object:
    try:
        value = call(path)
    except OSError as exc:
        return ("OSError", exc.errno)
    if hasattr(value, "mtime"):
        return value.__class__(**{**value.__dict__, "mtime": int(value.mtime)})
    return sorted(value) if isinstance(value, list) else value
