"""A small SSH "site" of real OpenSSH servers on 127.0.0.1 for the ssh_config lab tests:
two bastions, a target, a target only an ssh-agent key may log into, and two targets
whose host keys carry a CA's certificate (one valid, one expired), plus a real
``ssh-agent``, per-alias known_hosts files and the ssh_config tying them together. The
real ``~/.ssh`` is never read or written: every alias names its own files."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.lab.sshd import LabSSHD, keygen
from tests.support.signals import default_signals


def pub(path: Path) -> tuple[str, str]:
    """Return ``(key_type, base64)`` of the public key beside private key ``path``."""
    key_type, b64 = path.with_suffix(".pub").read_text().split()[:2]
    return key_type, b64


@dataclass
class Site:
    """The servers, keys and files of one test site (see the module docstring)."""

    root: Path
    servers: dict[str, LabSSHD] = field(default_factory=dict)
    agent: subprocess.Popen[bytes] | None = None
    agent_sock: Path | None = None
    config: Path | None = None

    def start(self) -> Site:
        """Start every server and the agent, write known_hosts files and the config."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.client_key = keygen(self.root / "client_key", "site-client")
        self.agent_key = keygen(self.root / "agent_key", "site-agent-only")
        self.ca = keygen(self.root / "host_ca", "site-host-ca")
        self.user_ca = keygen(self.root / "user_ca", "site-user-ca")
        self.cert_key = keygen(self.root / "cert_key", "site-cert-user")
        self.user_cert = self._sign_user_key()
        plain = {"b1": None, "b2": None, "t": None, "ta": None, "tu": None, "tr": None, "te": None}
        certified = {"tc": "-5m:+1h", "tx": "-2d:-1d"}
        for name in [*plain, *certified]:
            server = LabSSHD(
                self.root / name,
                None,
                host_ca=self.ca if name in certified else None,
                principals="127.0.0.1,t.internal",
                validity=certified.get(name, "-5m:+1h"),
                log_level="DEBUG1" if name in ("b1", "b2") else "VERBOSE",
                extra_config=(f"TrustedUserCAKeys {self.user_ca}.pub",) if name == "tu" else (),
                host_key_type={"tr": "rsa", "te": "ecdsa"}.get(name, "ed25519"),
            )
            self.servers[name] = server
            server.start()
            if name == "ta":  # only the agent's key may log in there
                (server.dir / "authorized_keys").write_text("")
                server.authorize(self.agent_key.with_suffix(".pub"))
            elif name == "tu":  # only a user certificate of the user CA may log in there
                (server.dir / "authorized_keys").write_text("")
            else:
                server.authorize(self.client_key.with_suffix(".pub"))
        self._start_agent()
        self._write_known_hosts()
        self._write_config()
        return self

    def _sign_user_key(self) -> Path:
        """Sign the cert user's key for principal root (``ssh-keygen -s USER_CA -n root``)
        and move the certificate away from the key: only CertificateFile finds it."""
        subprocess.run(
            ["ssh-keygen", "-q", "-s", str(self.user_ca), "-I", "site-user", "-n", "root",
             "-V", "-5m:+1h", str(self.cert_key.with_suffix(".pub"))],
            check=True,
            capture_output=True,
        )  # fmt: skip
        moved = self.root / "certs" / "user-cert.pub"
        moved.parent.mkdir(exist_ok=True)
        (self.root / "cert_key-cert.pub").rename(moved)
        return moved

    def _start_agent(self) -> None:
        self.agent_sock = self.root / "agent.sock"
        self.agent = subprocess.Popen(
            ["ssh-agent", "-D", "-a", str(self.agent_sock)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=default_signals,  # stop() sends SIGTERM
        )
        deadline = time.monotonic() + 10
        while not self.agent_sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(self.agent_sock)}
        subprocess.run(
            ["ssh-add", str(self.agent_key)], env=env, check=True, capture_output=True, timeout=30
        )
        self.agent_key.unlink()  # from now on only the agent holds the private key

    def line(self, name: str, host: str | None = None) -> str:
        """Return the known_hosts line of server ``name`` (under ``host`` if given)."""
        server = self.servers[name]
        key_type, b64 = pub(server.host_key)
        return f"{host or f'[127.0.0.1]:{server.port}'} {key_type} {b64}\n"

    def _write_known_hosts(self) -> None:
        impostor = keygen(self.root / "impostor", "impostor")
        bad_type, bad_b64 = pub(impostor)
        ca_type, ca_b64 = pub(self.ca)
        t_port, b1_port = self.servers["t"].port, self.servers["b1"].port
        files = {
            "kh_site": "".join(self.line(n) for n in ("b1", "b2", "t", "ta", "tu", "tr", "te")),
            "kh_alias": self.line("t", "t.internal") + self.line("b1"),
            "kh_wrong_t": self.line("b1") + f"[127.0.0.1]:{t_port} {bad_type} {bad_b64}\n",
            "kh_wrong_b1": f"[127.0.0.1]:{b1_port} {bad_type} {bad_b64}\n",
            "kh_ca": f"@cert-authority [127.0.0.1]:* {ca_type} {ca_b64}\n",
            "kh_ca_any": f"@cert-authority * {ca_type} {ca_b64}\n",
            "kh_empty": "",
        }
        self.known_hosts = {}
        for name, text in files.items():
            path = self.root / name
            path.write_text(text)
            self.known_hosts[name] = path

    def _write_config(self) -> None:
        port = {name: server.port for name, server in self.servers.items()}
        kh = self.known_hosts
        self.config = self.root / "ssh_config"
        blocks = {
            "b1": [f"Port {port['b1']}"],
            "b2": [f"Port {port['b2']}"],
            "b1bad": [f"Port {port['b1']}", f"UserKnownHostsFile {kh['kh_wrong_b1']}"],
            "direct": [f"Port {port['t']}"],
            "jump1": [f"Port {port['t']}", "ProxyJump b1"],
            "jump2": [f"Port {port['t']}", "ProxyJump b1,b2"],
            "viacommand": [f"Port {port['t']}", f"ProxyCommand ssh -F {self.root}/ssh_config -W %h:%p b1"],
            "alias-ok": [f"Port {port['t']}", "HostKeyAlias t.internal", f"UserKnownHostsFile {kh['kh_alias']}"],
            "alias-wrong": [f"Port {port['t']}", "HostKeyAlias other.internal", f"UserKnownHostsFile {kh['kh_alias']}"],
            "agent": [f"Port {port['ta']}", f"IdentityFile {self.agent_key}.pub", f"IdentityAgent {self.agent_sock}"],
            "agent-off": [f"Port {port['ta']}", f"IdentityFile {self.agent_key}.pub"],
            "agent-any": [f"Port {port['ta']}", "IdentitiesOnly no", f"IdentityAgent {self.agent_sock}"],
            "changed-behind-jump": [f"Port {port['t']}", "ProxyJump b1", f"UserKnownHostsFile {kh['kh_wrong_t']}"],
            "jump-changed": [f"Port {port['t']}", "ProxyJump b1bad"],
            "cert": [f"Port {port['tc']}", f"UserKnownHostsFile {kh['kh_ca']}"],
            "cert-alias": [f"Port {port['tc']}", "HostKeyAlias t.internal", f"UserKnownHostsFile {kh['kh_ca_any']}"],
            "cert-expired": [f"Port {port['tx']}", f"UserKnownHostsFile {kh['kh_ca']}"],
            "cert-wrong-principal": [f"Port {port['tc']}", "HostKeyAlias elsewhere.internal", f"UserKnownHostsFile {kh['kh_ca_any']}"],
            "rsa-host": [f"Port {port['tr']}"],
            "ecdsa-host": [f"Port {port['te']}"],
            "unknown": [f"Port {port['t']}", f"UserKnownHostsFile {kh['kh_empty']}"],
            "usercert": [f"Port {port['tu']}", f"IdentityFile {self.cert_key}", f"CertificateFile {self.user_cert}"],
            "usercert-missing": [f"Port {port['tu']}", f"IdentityFile {self.cert_key}"],
            "changed-no": [f"Port {port['t']}", f"UserKnownHostsFile {kh['kh_wrong_t']}", "StrictHostKeyChecking no"],
        }  # fmt: skip
        text = ""
        for alias, lines in blocks.items():
            text += f"Host {alias}\n  HostName 127.0.0.1\n" + "".join(f"  {x}\n" for x in lines)
        text += f"Host * !agent !agent-off !agent-any\n  IdentityFile {self.client_key}\n"
        text += (
            "Host *\n  User root\n  BatchMode yes\n  IdentitiesOnly yes\n  IdentityAgent none\n"
            f"  GlobalKnownHostsFile /dev/null\n  UserKnownHostsFile {kh['kh_site']}\n"
            "  StrictHostKeyChecking yes\n  ConnectTimeout 10\n"
        )
        self.config.write_text(text)

    def ssh(self, alias: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run ``ssh -F CONFIG -o BatchMode=yes ALIAS argv`` (the reference verdict)."""
        return subprocess.run(
            ["ssh", "-F", str(self.config), "-o", "BatchMode=yes", alias, *(argv or ("true",))],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """Stop every server and the agent."""
        for server in self.servers.values():
            server.stop()
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(5)
