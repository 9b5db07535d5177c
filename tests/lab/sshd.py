"""A real OpenSSH server on 127.0.0.1 for lab tests: a "Proxmox-like host".

With a namespace it runs INSIDE the lab's pure-cgroup2 mount namespace, so every SSH
session sees pure cgroup v2 and ``lxc-start`` / ``lxc-attach`` over SSH behave as on
Proxmox; without one it is a plain sshd process (bastions, SSH-config tests). Per run: a
fresh ed25519 host key (optionally certified by a CA: ``ssh-keygen -s``), a fresh client
key (root login, key only), ``UsePAM no``, a free non-default port. Nothing is faked.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from gpudoctor.hosts.ssh.host import SSHHost
from tests.lab.lxc import LabError, PureCgroup2Namespace
from tests.support.signals import default_signals

SSHD = "/usr/sbin/sshd"


def lab_ssh_host(spec: str, client_key: Path, known_hosts: Path, /, **opts: Any) -> SSHHost:
    """Return an SSHHost for ``spec`` with the lab's client key, trusting only the lab's
    ``known_hosts`` (no ~/.ssh/config, no system known_hosts); ``opts`` override these."""
    settings: dict[str, Any] = {
        "key_filename": str(client_key),
        "known_hosts": str(known_hosts),
        "ssh_config": None,
        "system_known_hosts": False,
        "connect_timeout": 10.0,
    }
    settings.update(opts)
    return SSHHost(spec, **settings)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path, comment: str, key_type: str = "ed25519") -> Path:
    """Create an unencrypted key pair at ``path`` (``ssh-keygen -t ed25519``)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def sign_host_key(
    ca_key: Path,
    host_pub: Path,
    principals: str,
    validity: str = "-5m:+1h",
    serial: int | None = None,
    key_id: str = "lab-host",
) -> Path:
    """Sign ``host_pub`` as a HOST certificate with ``ca_key`` (``ssh-keygen -s CA -h -I
    key_id -n principals -V validity [-z serial]``); return the ``-cert.pub`` path."""
    serial_args = ["-z", str(serial)] if serial is not None else []
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(ca_key), "-h", "-I", key_id, "-n", principals,
         "-V", validity, *serial_args, str(host_pub)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return host_pub.with_name(host_pub.name.removesuffix(".pub") + "-cert.pub")


class LabSSHD:
    """An sshd on 127.0.0.1:``port`` in the lab namespace.

    Attributes:
        port: its TCP port.
        spec: the ``--host`` value reaching it (``root@127.0.0.1:PORT``).
        client_key: the private key file of a root login it accepts.
        known_hosts: a known_hosts file holding its host key (``[127.0.0.1]:PORT ...``).
        known_hosts_line: that file's single line.
        host_key: its private host key file.
    """

    def __init__(
        self,
        workdir: Path,
        namespace: PureCgroup2Namespace | None,
        *,
        host_ca: Path | None = None,
        principals: str = "127.0.0.1",
        validity: str = "-5m:+1h",
        log_level: str = "VERBOSE",
        extra_config: tuple[str, ...] = (),
        host_key_type: str = "ed25519",
        cert_serial: int | None = None,
        cert_key_id: str = "lab-host",
    ) -> None:
        self.dir = workdir
        self.namespace = namespace
        self.host_ca = host_ca
        self.principals = principals
        self.validity = validity
        self.host_cert: Path | None = None
        self.log_level = log_level
        self.extra_config = extra_config
        self.host_key_type = host_key_type
        self.cert_serial = cert_serial
        self.cert_key_id = cert_key_id
        self.port = free_port()
        self.spec = f"root@127.0.0.1:{self.port}"
        self.host_key = self.dir / f"ssh_host_{host_key_type}_key"
        self.client_key = self.dir / "client_key"
        self.known_hosts = self.dir / "known_hosts"
        self.config = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def known_hosts_line(self) -> str:
        """Return the known_hosts line for this server's host key."""
        return self.known_hosts.read_text().strip()

    def start(self, timeout: float = 15.0) -> LabSSHD:
        """Generate keys, write the config, start sshd and wait until it answers."""
        self.dir.mkdir(parents=True, exist_ok=True)
        keygen(self.host_key, "gpudoctor-lab-host", self.host_key_type)
        keygen(self.client_key, "gpudoctor-lab-client")
        (self.dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        key_type, key_b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {key_type} {key_b64}\n")
        if self.host_ca is not None:
            self.host_cert = sign_host_key(
                self.host_ca, self.host_key.with_suffix(".pub"), self.principals,
                self.validity, self.cert_serial, self.cert_key_id,
            )  # fmt: skip
        cert_line = [f"HostCertificate {self.host_cert}"] if self.host_cert else []
        self.config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    "UsePAM no",
                    "PermitRootLogin prohibit-password",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                    "StrictModes no",
                    "MaxSessions 64",
                    "MaxStartups 64",
                    f"LogLevel {self.log_level}",
                    *cert_line,
                    *self.extra_config,
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        prefix = self.namespace.prefix if self.namespace is not None else []
        log = open(self.log, "wb")  # noqa: SIM115 - handed to the child, closed below
        self.proc = subprocess.Popen(
            [*prefix, SSHD, "-D", "-e", "-f", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=default_signals,  # stop() sends SIGTERM
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"sshd exited: {self.log.read_text(errors='replace')[-800:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise LabError(f"sshd did not listen on 127.0.0.1:{self.port} within {timeout:g} s")

    def authorize(self, public_key: Path) -> None:
        """Let the holder of ``public_key`` (a ``.pub`` file) log in as root."""
        with open(self.dir / "authorized_keys", "a", encoding="ascii") as fh:
            fh.write(public_key.read_text().strip() + "\n")

    def client_home(self, home: Path, alias: str = "labpve") -> Path:
        """Make ``home`` a client HOME for CLI runs (``HOME=home gpudoctor ...``):
        ``.ssh/config`` maps ``alias`` and ``127.0.0.1`` to this server (port, root,
        the client key) and ``.ssh/known_hosts`` trusts its host key. Return ``home``."""
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh_dir / "config").write_text(
            f"Host {alias}\n  HostName 127.0.0.1\n  Port {self.port}\n  User root\n"
            f"  IdentityFile {self.client_key}\n"
            f"Host 127.0.0.1\n  IdentityFile {self.client_key}\n"
        )
        (ssh_dir / "known_hosts").write_text(self.known_hosts_line + "\n")
        return home

    def host(self, **opts: Any) -> SSHHost:
        """Return an SSHHost for root on this server, trusting only its known_hosts file
        (not ~/.ssh/known_hosts nor ~/.ssh/config); ``opts`` override the defaults."""
        return lab_ssh_host(self.spec, self.client_key, self.known_hosts, **opts)

    def stop(self) -> None:
        """Stop sshd (SIGTERM, then SIGKILL) and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
