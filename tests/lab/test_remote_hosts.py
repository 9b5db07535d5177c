"""SSHHost against a real OpenSSH server, and ContainerHost against real LXC containers
(flavor lxc), reached through this machine (LabHost) and through SSH."""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpudoctor.hosts.base import Host, HostError
from gpudoctor.hosts.connect import open_host
from gpudoctor.hosts.container import ContainerHost
from gpudoctor.hosts.local import LocalHost
from gpudoctor.hosts.ssh.host import SSHHost
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab, LabContainer, wait_for
from tests.lab.sshd import LabSSHD, keygen

pytestmark = pytest.mark.lab


@pytest.fixture
def ssh(lab_sshd: LabSSHD) -> Iterator[SSHHost]:
    host = lab_sshd.host()
    yield host
    host.close()


# -- host keys ------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_advice(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = lab_sshd.host(known_hosts=str(empty))
    with pytest.raises(HostError) as exc:
        host.run(["true"])
    message = str(exc.value)
    assert "unknown SSH host key ssh-ed25519 SHA256:" in message
    assert f"ssh-keyscan -p {lab_sshd.port} 127.0.0.1 >> {empty}" in message
    assert "--accept-new-host-key" in message
    assert empty.read_text() == ""  # nothing trusted behind the user's back


def test_known_host_key_connects(ssh: SSHHost) -> None:
    result = ssh.run(["id", "-u"])
    assert result.ok
    assert result.stdout.strip() == "0"


def test_accept_new_saves_the_key_then_it_is_known(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    with lab_sshd.host(known_hosts=str(known), accept_new_host_key=True) as host:
        assert host.run(["true"]).ok
    assert known.read_text().strip() == lab_sshd.known_hosts_line
    with lab_sshd.host(known_hosts=str(known)) as again:
        assert again.run(["true"]).ok


def test_changed_host_key_is_refused_even_with_accept_new(
    lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    other = keygen(tmp_path / "other_host_key", "impostor")
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{lab_sshd.port} {key_type} {key_b64}\n")
    before = known.read_text()
    for accept_new in (False, True):
        host = lab_sshd.host(known_hosts=str(known), accept_new_host_key=accept_new)
        with pytest.raises(HostError, match="host key has CHANGED") as exc:
            host.run(["true"])
        assert f"ssh-keygen -R '[127.0.0.1]:{lab_sshd.port}'" in str(exc.value)
    assert known.read_text() == before


def test_known_key_of_another_type_counts_as_changed(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    """known_hosts holds an ECDSA key for the host, the server shows ed25519: OpenSSH's
    accept-new refuses that too, and so does gpudoctor."""
    other = tmp_path / "ecdsa_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(other)],
        check=True,
        capture_output=True,
    )
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{lab_sshd.port} {key_type} {key_b64}\n")
    host = lab_sshd.host(known_hosts=str(known), accept_new_host_key=True)
    with pytest.raises(HostError, match="host key has CHANGED") as exc:
        host.run(["true"])
    assert "ecdsa-sha2-nistp256" in str(exc.value)
    assert known.read_text().count("\n") == 1


def test_wrong_client_key_is_an_auth_error(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger", "stranger")
    host = lab_sshd.host(key_filename=str(stranger), password="hunter2-secret")
    logger = logging.getLogger("paramiko")
    records: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        with pytest.raises(HostError, match="SSH authentication failed") as exc:
            host.run(["true"])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert "hunter2-secret" not in str(exc.value)
    assert records  # paramiko did log the exchange ...
    assert not [r for r in records if "hunter2-secret" in r]  # ... but never the password


def test_closed_port_is_a_clear_error(lab_sshd: LabSSHD) -> None:
    from tests.lab.sshd import free_port

    host = SSHHost(
        f"root@127.0.0.1:{free_port()}",
        ssh_config=None,
        system_known_hosts=False,
        known_hosts=str(lab_sshd.known_hosts),
        connect_timeout=5,
    )
    with pytest.raises(HostError, match="cannot connect"):
        host.stat("/")


def test_ssh_config_alias(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host labbox\n  HostName 127.0.0.1\n  Port {lab_sshd.port}\n  User root\n"
        f"  IdentityFile {lab_sshd.client_key}\n"
    )
    host = open_host(
        "labbox",
        ssh_config=str(config),
        known_hosts=str(lab_sshd.known_hosts),
        system_known_hosts=False,
    )
    try:
        assert isinstance(host, SSHHost)
        assert host.run(["id", "-un"]).stdout.strip() == "root"
    finally:
        host.close()


# -- the Host protocol over SSH ---------------------------------------------------------


def test_ssh_file_ops_match_localhost(ssh: SSHHost, tmp_path: Path) -> None:
    """The sshd runs on this machine, so the answers must equal LocalHost's."""
    local = LocalHost()
    (tmp_path / "f.txt").write_text("data\n")
    for path in ("/dev/null", "/dev/kvm", str(tmp_path), str(tmp_path / "f.txt")):
        assert ssh.stat(path) == local.stat(path)
        assert ssh.try_open(path) == local.try_open(path)
    assert ssh.read_text(str(tmp_path / "f.txt")) == "data\n"
    assert ssh.read_bytes(str(tmp_path / "f.txt"), 3, 1) == b"ata"
    assert ssh.read_text("/proc/devices") == local.read_text("/proc/devices")
    assert ssh.list_dir(str(tmp_path)) == ["f.txt"]
    assert ssh.disk_usage(str(tmp_path)).total == local.disk_usage(str(tmp_path)).total
    with pytest.raises(FileNotFoundError):
        ssh.stat(str(tmp_path / "missing"))
    assert ssh.try_open(str(tmp_path / "missing")).errname == "ENOENT"


def test_ssh_run(ssh: SSHHost, tmp_path: Path) -> None:
    result = ssh.run(["sh", "-c", 'read x; echo "got $x"; echo oops >&2; exit 4'], input="it\n")
    assert (result.returncode, result.stdout, result.stderr) == (4, "got it\n", "oops\n")
    assert result.argv[0] == "sh"
    quoted = ssh.run(["printf", "%s|", "a b", "$HOME", "'q'"])
    assert quoted.stdout == "a b|$HOME|'q'|"
    missing = ssh.run(["/nonexistent/tool"])
    assert missing.returncode == 127
    pidfile = tmp_path / "pid"
    slow = ssh.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=1)
    assert slow.timed_out
    assert not slow.ok
    child = int(pidfile.read_text())
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"
    # TERM ignored: KILLed 2 s later. sshd would report the killed `timeout` as a signal
    # (paramiko drops it: -1, not timed out) but for run()'s `; exit $?`: 137, timed out.
    deaf = ssh.run(["sh", "-c", "trap '' TERM; sleep 30"], timeout=0.5)
    assert (deaf.returncode, deaf.timed_out) == (137, True)


def test_ssh_sessions_see_pure_cgroup2(ssh: SSHHost) -> None:
    fstype = ssh.run(["stat", "-f", "-c", "%T", "/sys/fs/cgroup"]).stdout.strip()
    assert fstype == "cgroup2fs"


def test_ssh_is_thread_safe(ssh: SSHHost) -> None:
    errors: list[BaseException] = []
    results: list[object] = []

    def work(index: int) -> None:
        try:
            if index % 2:
                results.append(ssh.stat("/dev/null").kind)
            else:
                results.append(ssh.run(["echo", str(index)]).stdout.strip())
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert sorted(map(str, results)) == sorted(["char"] * 6 + [str(i) for i in range(0, 12, 2)])


# -- ContainerHost ------------------------------------------------------------------------


@pytest.fixture(params=["local", "ssh"])
def parent(request: pytest.FixtureRequest, lab: Lab) -> Iterator[Host]:
    """The container's host: this machine (pure-cgroup2 namespace) or the lab sshd."""
    if request.param == "local":
        yield lab.host
        return
    host = request.getfixturevalue("lab_sshd").host()
    yield host
    host.close()


def container_host(parent: Host, ct: LabContainer, **kwargs: object) -> ContainerHost:
    return ContainerHost(parent, ct.name, flavor="lxc", lxcpath=ct.lxcpath, **kwargs)


def test_container_host_sees_the_denied_device(
    parent: Host, denied_container: LabContainer
) -> None:
    with container_host(parent, denied_container) as inside:
        assert inside.name == f"{parent.name}/{denied_container.name}"
        st = inside.stat(FAKE_GPU_INSIDE)
        assert (st.kind, st.major, st.minor, st.mode) == ("char", 10, 232, 0o666)
        opened = inside.try_open(FAKE_GPU_INSIDE)
        assert opened.errname == "EPERM"
        assert " misc\n" in inside.read_text("/proc/devices")
        assert "fakegpu" in inside.list_dir("/dev")
        assert inside.run(["hostname"]).stdout.strip() == denied_container.name
        with pytest.raises(FileNotFoundError):
            inside.stat("/dev/nvidia-uvm")
        # Inside means inside: the host's /dev/kvm is not there.
        assert not inside.exists("/dev/kvm")


def test_container_host_sees_the_allowed_device(
    parent: Host, allowed_container: LabContainer
) -> None:
    with container_host(parent, allowed_container) as inside:
        assert inside.try_open(FAKE_GPU_INSIDE).ok


def test_container_host_survives_a_restart(
    parent: Host, denied_container: LabContainer, lab: Lab
) -> None:
    inside = container_host(parent, denied_container)
    try:
        assert inside.try_open(FAKE_GPU_INSIDE).errname == "EPERM"
        denied_container.set_device_rules([f"c {lab.fake_gpu_major}:* rwm"])
        denied_container.restart()
        assert call_retrying_once(lambda: inside.try_open(FAKE_GPU_INSIDE)).ok
    finally:
        inside.close()


def call_retrying_once(func: Callable[[], object]) -> object:
    """Call ``func``; after a HostError (the old agent died with the CT) call it again."""
    try:
        return func()
    except HostError:
        return func()


def test_container_host_errors_are_clear(parent: Host, lab: Lab) -> None:
    ghost = ContainerHost(parent, "no-such-ct", flavor="lxc", lxcpath=str(lab.lxcpath))
    with pytest.raises(HostError, match="no-such-ct"):
        ghost.stat("/")
    ghost.close()


def test_container_without_python_falls_back_to_the_shell_agent(
    parent: Host, denied_container: LabContainer
) -> None:
    """No such interpreter in the CT: the POSIX-sh agent serves the device checks."""
    inside = container_host(parent, denied_container, python="/opt/no/python3")
    try:
        assert inside.agent_kind == "sh"
        assert not inside.has_python
        assert inside.stat("/").kind == "dir"
        assert inside.try_open(FAKE_GPU_INSIDE).errname == "EPERM"
    finally:
        inside.close()


def test_pve_flavor_builds_pct_exec(lab: Lab) -> None:
    """Flavor pve runs ``pct exec ID -- python3 -I -c ...`` on the host (no pct here:
    the error names the missing tool)."""
    ct = ContainerHost(LocalHost(name="pve1"), 200, flavor="pve")
    assert ct.name == "pve1/ct200"
    with pytest.raises(HostError, match="pct"):
        ct.stat("/")


def test_no_stray_agent_after_close(parent: Host, denied_container: LabContainer) -> None:
    inside = container_host(parent, denied_container)
    assert inside.ping()["pid"] > 1
    running = denied_container.attach(["ps", "-eo", "args"]).stdout
    assert "gpudoctor-agent" in running
    inside.close()
    assert wait_for(
        lambda: "gpudoctor-agent" not in denied_container.attach(["ps", "-eo", "args"]).stdout,
        timeout=10,
    )


def test_default_lxcpath_over_ssh_reaches_lab_containers(
    lab_sshd: LabSSHD, denied_container: LabContainer
) -> None:
    """In the lab namespace /var/lib/lxc IS the lab's lxcpath, so plain ``lxc-attach -n``
    and ``/var/lib/lxc/<name>/config`` work over SSH, as on a plain LXC host."""
    with lab_sshd.host() as host:
        config = host.read_text(f"/var/lib/lxc/{denied_container.name}/config")
        assert config == denied_container.config_path.read_text()
        with ContainerHost(host, denied_container.name, flavor="lxc") as inside:
            assert inside.try_open(FAKE_GPU_INSIDE).errname == "EPERM"


def test_client_home_makes_cli_style_connections_work(lab_sshd: LabSSHD, tmp_path: Path) -> None:
    home = lab_sshd.client_home(tmp_path / "home")
    for spec in ("labpve", lab_sshd.spec):
        host = SSHHost(
            spec,
            ssh_config=str(home / ".ssh" / "config"),
            known_hosts=str(home / ".ssh" / "known_hosts"),
            system_known_hosts=False,
        )
        with host:
            assert host.run(["id", "-u"]).stdout.strip() == "0"
