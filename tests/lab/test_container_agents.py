"""The in-CT agents on REAL lab containers: the POSIX-sh agent (dash in the lab CT,
busybox ash in a ``lxc-create -t busybox`` CT that holds nothing else), the catalogue
and ``gpudoctor fix`` through it, and the clean environment every CT-side process gets.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.hosts.base import Host
from gpudoctor.hosts.container import CT_PATH, ContainerHost
from gpudoctor.model import Report, Status
from gpudoctor.runner import run_checks
from tests.lab.busybox import BusyboxContainer, busybox_container
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab, LabContainer

pytestmark = pytest.mark.lab

SECRETS = {
    "HF_TOKEN": "hf_leak_canary_1234567890",
    "PVE_TOKEN_SECRET": "pve-secret-canary-abcdef",
    "PVE_PASSWORD": "pve-password-canary-xyz",
}


@pytest.fixture(params=["local", "ssh"])
def parent(request: pytest.FixtureRequest, lab: Lab) -> Iterator[Host]:
    """The container's host: this machine (pure-cgroup2 namespace) or the lab sshd."""
    if request.param == "local":
        yield lab.host
        return
    host = request.getfixturevalue("lab_sshd").host()
    yield host
    host.close()


@pytest.fixture
def busybox(lab: Lab) -> Iterator[Callable[..., BusyboxContainer]]:
    """Return ``make(allow=(), devices=None) -> BusyboxContainer`` (destroyed after)."""
    made: list[BusyboxContainer] = []

    def make(**kwargs: object) -> BusyboxContainer:
        made.append(busybox_container(lab, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for ct in made:
        ct.destroy()


def inside(parent: Host, ct: LabContainer, **kwargs: object) -> ContainerHost:
    return ContainerHost(parent, ct.name, flavor="lxc", lxcpath=ct.lxcpath, **kwargs)  # type: ignore[arg-type]


def outcome(call: Callable[[], object]) -> object:
    """Return the call's result, or ``("OSError", errno)``."""
    try:
        return call()
    except OSError as exc:
        return ("OSError", exc.errno)


def test_sh_agent_answers_like_the_python_agent(
    parent: Host, denied_container: LabContainer
) -> None:
    """Same CT (dash as /bin/sh), same questions: the sh agent's answers equal the python
    agent's (errno included), mtime to the second."""
    py, sh = (
        inside(parent, denied_container, agent="python"),
        inside(parent, denied_container, agent="sh"),
    )
    try:
        assert (py.agent_kind, sh.agent_kind, sh.has_python) == ("python", "sh", True)
        paths = [FAKE_GPU_INSIDE, "/dev/null", "/", "/proc/devices", "/dev/shm", "/nonexistent",
                 "/dev/null/below", "/etc/hostname", "/tmp"]  # fmt: skip
        for path in paths:
            a, b = outcome(lambda p=path: py.stat(p)), outcome(lambda p=path: sh.stat(p))
            if not isinstance(a, tuple):
                a = a.__class__(**{**a.__dict__, "mtime": int(a.mtime)})  # type: ignore[attr-defined]
            assert a == b, path
            for write in (True, False):
                assert py.try_open(path, write) == sh.try_open(path, write), (path, write)
            assert outcome(lambda p=path: py.list_dir(p)) == outcome(lambda p=path: sh.list_dir(p))
        assert sh.try_open(FAKE_GPU_INSIDE).errname == "EPERM"
        for text_file in ("/proc/devices", "/proc/sys/kernel/overflowuid", "/proc/self/uid_map",
                          "/proc/self/mounts", "/etc/hostname"):  # fmt: skip
            assert sh.read_text(text_file) == py.read_text(text_file), text_file
        assert sh.read_text("/proc/devices", limit=7) == py.read_text("/proc/devices", limit=7)
        assert outcome(lambda: sh.read_text("/dev/shm")) == ("OSError", errno.EISDIR)
        assert sh.read_bytes("/proc/devices", 20, 5) == py.read_bytes("/proc/devices", 20, 5)
        assert sh.disk_usage("/dev/shm").total == py.disk_usage("/dev/shm").total
        assert sh.run(["hostname"]).stdout.strip() == denied_container.name
    finally:
        py.close()
        sh.close()


def check(host: Host) -> Report:
    return run_checks(host, CheckOptions(devices=(DeviceRequest(FAKE_GPU_INSIDE, "misc"),)))


@pytest.mark.parametrize("allowed", [False, True], ids=["denied", "allowed"])
def test_busybox_ct_without_python_gets_correct_verdicts(
    parent: Host, busybox: Callable[..., BusyboxContainer], lab: Lab, allowed: bool
) -> None:
    """A CT made by ``lxc-create -t busybox`` (no python3, no host /usr): the sh agent
    (busybox ash) serves the device checks; EPERM for the denied node, opens when allowed."""
    ct = busybox(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)},
                 allow=[f"c {lab.fake_gpu_major}:* rwm"] if allowed else [])  # fmt: skip
    assert not ct.shell("command -v python3").ok  # nothing but busybox
    with inside(parent, ct) as host:
        assert (host.agent_kind, host.has_python) == ("sh", False)
        report = check(host)
    status = {r.check_id: r.status for r in report.results}
    assert status["device.nodes"] == Status.PASS
    assert status["device.open"] == (Status.PASS if allowed else Status.FAIL)
    opened = next(f for f in report.findings if f.check_id == "device.open")
    assert ("opens" in opened.message) if allowed else ("EPERM" in opened.message)
    assert status["proc.usable"] == Status.PASS, report.result("proc.usable")
    assert status["shm.capacity"] in (Status.PASS, Status.WARN), report.result("shm.capacity")
    assert Status.ERROR not in status.values(), [
        r for r in report.results if r.status == Status.ERROR
    ]


def test_environment_inside_the_ct_is_clean(
    parent: Host, denied_container: LabContainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: gpudoctor's own secrets (HF_TOKEN, PVE_TOKEN_SECRET, PVE_PASSWORD in its
    environment) leak into the container through lxc-attach. Blocked: --clear-env plus
    PATH and LANG only. Recorded from /proc/PID/environ of the REAL CT-side processes:
    the python agent, the sh agent, and a command run through each."""
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    for agent in ("python", "sh"):
        with inside(parent, denied_container, agent=agent) as host:
            pid = host.ping()["pid"]
            environ = host.read_bytes(f"/proc/{pid}/environ", 65536).decode()
            command_env = host.run(["env"]).stdout
        for text in (environ, command_env):
            for key, value in SECRETS.items():
                assert key not in text and value not in text, (agent, text)
        variables = dict(v.split("=", 1) for v in environ.split("\0") if "=" in v)
        # lxc-attach adds container=lxc; sh sets PWD. Nothing else comes in.
        assert set(variables) <= {"PATH", "LANG", "container", "PWD"}, (agent, variables)
        assert (variables["PATH"], variables["LANG"]) == (CT_PATH, "C")


def test_pct_exec_environment_is_clean(
    lab: Lab, denied_container: LabContainer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Attack: Proxmox's ``pct exec`` passes its caller's environment (secrets included)
    into the CT. Blocked: the command inside is ``env -i PATH=.. LANG=C ...``. The pct here
    is a stand-in that, like the real one, keeps the environment (lxc-attach --keep-env)."""
    pct = tmp_path / "pct"
    pct.write_text(
        "#!/bin/sh\n# stand-in for Proxmox's pct exec: lxc-attach keeping the environment\n"
        '[ "$1" = exec ] || exit 2\nct=$2; shift 3\n'
        f'exec lxc-attach -P {denied_container.lxcpath} -n "$ct" --keep-env -- "$@"\n'
    )
    pct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    leaked = lab.host.run(["pct", "exec", denied_container.name, "--", "env"]).stdout
    assert SECRETS["HF_TOKEN"] in leaked  # the stand-in does leak, as pct does
    for agent in ("python", "sh"):
        with ContainerHost(lab.host, denied_container.name, flavor="pve", agent=agent) as host:
            environ = host.read_bytes(f"/proc/{host.ping()['pid']}/environ", 65536).decode()
            command_env = host.run(["env"]).stdout
        for text in (environ, command_env):
            assert not any(v in text for v in SECRETS.values()), (agent, text)


def test_sh_agent_stat_via_ls_when_stat_is_missing(
    lab: Lab, busybox: Callable[..., BusyboxContainer]
) -> None:
    """A CT whose busybox has no ``stat`` applet: nodes are read with ``ls -lnLd``."""
    ct = busybox(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)})
    (ct.rootfs / "bin" / "stat").unlink()
    with inside(lab.host, ct) as host:
        st = host.stat(FAKE_GPU_INSIDE)
        assert (st.kind, st.major, st.minor, st.mode) == ("char", 10, 232, 0o666)
        assert stat_mod.S_IMODE(host.stat("/tmp").mode) == stat_mod.S_IMODE(
            os.stat(ct.rootfs / "tmp").st_mode
        )
        assert host.disk_usage("/dev/shm").total > 0


def test_fix_rechecks_a_busybox_ct_through_the_sh_agent(
    lab: Lab, lab_sshd: object, busybox: Callable[..., BusyboxContainer], tmp_path: Path
) -> None:
    """``gpudoctor fix`` over SSH on a busybox CT (no python3): the fix is written, the CT
    restarted, and the before/after probes and the re-check run through the sh agent."""
    import json

    from click.testing import CliRunner

    from gpudoctor.cli import cli

    ct = busybox(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)})
    sshd = lab_sshd
    env = {
        "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "host-backups"),
        "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "client-backups"),
        "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks"),
    }
    args = ["fix", "--host", sshd.spec, "-i", str(sshd.client_key),  # type: ignore[attr-defined]
            "--known-hosts", str(sshd.known_hosts), "--ct", ct.name, "--flavor", "lxc",  # type: ignore[attr-defined]
            "--lxcpath", ct.lxcpath, "--device", FAKE_GPU_INSIDE, "--yes", "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args, env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied", out
    assert out["probes"]["before"][FAKE_GPU_INSIDE] == "EPERM"
    assert out["probes"]["after"][FAKE_GPU_INSIDE] == "OK"
    assert out["probes"]["after"]["/dev/null"] == "OK"  # the busybox sh agent opens it too
    opens = [c for c in out["checks"] if c["check"] == "device.open"]
    assert opens and opens[0]["status"] == "PASS", out["checks"]
    assert ct.shell(f"exec 3<>{FAKE_GPU_INSIDE}").ok


def test_unprivileged_ct_mode_findings_name_the_mapped_owner(
    lab: Lab, busybox: Callable[..., BusyboxContainer]
) -> None:
    """A REAL unprivileged CT (lxc.idmap u/g 0 100000 65536, rootfs shifted): host nodes
    show as 65534:65534 inside. A 0666 node opens; a 0660 node is EACCES, and the finding
    says it is the unprivileged CT's unmapped owner, not a plain "mode denies"."""
    node = lab.make_node("gpu0660", lab.fake_gpu_major, lab.fake_gpu_minor, mode=0o660)
    ct = busybox(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu), "/dev/gpu0660": str(node)},
                 allow=[f"c {lab.fake_gpu_major}:* rwm"], unprivileged=True)  # fmt: skip
    assert "0     100000      65536" in ct.shell("cat /proc/self/uid_map").stdout
    with inside(lab.host, ct) as host:
        st = host.stat("/dev/gpu0660")
        assert (st.uid, st.gid, st.mode) == (65534, 65534, 0o660)
        report = run_checks(
            host,
            CheckOptions(devices=(DeviceRequest(FAKE_GPU_INSIDE), DeviceRequest("/dev/gpu0660"))),
        )
    opens = {f.subject: f for f in report.findings if f.check_id == "device.open"}
    assert opens[FAKE_GPU_INSIDE].status == Status.PASS
    denied = opens["/dev/gpu0660"]
    assert denied.status == Status.FAIL
    assert "EACCES. This is an unprivileged CT" in denied.message
    assert "65534:65534, the overflow id" in denied.message
    assert "mode or ownership denies" not in denied.message
    assert "uid_map 0 100000 65536" in denied.evidence
