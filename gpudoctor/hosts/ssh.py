"""SSHHost: a remote machine reached over SSH (paramiko), host keys verified.

Host keys are checked against ``~/.ssh/known_hosts`` plus an optional extra file with
paramiko's ``RejectPolicy``: an unknown key or a CHANGED key is a clear
:class:`HostError` saying how to accept it. ``accept_new_host_key=True`` behaves like
OpenSSH's ``StrictHostKeyChecking=accept-new``: a host with no known key at all has its
key saved; a changed key is still refused. Passwords and passphrases are never logged.

File operations go through the gpudoctor agent started over one exec channel
(``python3 -I -c ...``); :meth:`SSHHost.run` uses a fresh exec channel per command,
wrapped in coreutils ``timeout`` so the remote process group dies at the deadline.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paramiko

from gpudoctor.hosts.base import CommandResult, ForwardingHost, HostError
from gpudoctor.hosts.remote import AgentHost, ByteStream, agent_command
from gpudoctor.hosts.ssh_target import (
    DEFAULT_SSH_CONFIG,
    SSHTarget,
    resolve_target,
    split_spec,
)

__all__ = ["SSHHost", "SSHTarget", "fingerprint", "resolve_target", "split_spec"]

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
# Seconds a command may outlive its own timeout before the client closes the channel.
RUN_GRACE = 10.0


def fingerprint(key: paramiko.PKey) -> str:
    """Return the key's OpenSSH SHA256 fingerprint (``ssh-keygen -lf``: ``SHA256:...``)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def how_to_accept(target: SSHTarget) -> str:
    """Return the advice printed with an unknown-key error."""
    port = f"-p {target.port} " if target.port != 22 else ""
    return (
        f"verify the fingerprint, then add it: ssh-keyscan {port}{target.hostname} "
        f">> ~/.ssh/known_hosts (or pass --accept-new-host-key)"
    )


class _UnknownHostKey(Exception):
    def __init__(self, key: paramiko.PKey, known_types: list[str]) -> None:
        super().__init__("unknown host key")
        self.key = key
        self.known_types = known_types


class _VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Reject unknown keys, or save them when ``accept_new`` and no key is known at all."""

    def __init__(self, accept_new: bool, save_to: Path) -> None:
        self.accept_new = accept_new
        self.save_to = save_to

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> None:
        system_keys = getattr(client, "_system_host_keys", None)
        known = client.get_host_keys().lookup(hostname) or (
            system_keys.lookup(hostname) if system_keys is not None else None
        )
        if not self.accept_new or known:
            # With a key of another type already known, this is a change, not a new host.
            raise _UnknownHostKey(key, sorted(known.keys()) if known else [])
        self.save_to.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.save_to, "a", encoding="ascii") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class ChannelStream(ByteStream):
    """An SSH exec channel's stdin/stdout/stderr as a :class:`ByteStream`."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self._out = channel.makefile("rb")
        self._err = bytearray()
        self._err_thread = threading.Thread(target=self._drain, daemon=True)
        self._err_thread.start()

    def _drain(self) -> None:
        for chunk in iter(lambda: self.channel.recv_stderr(4096), b""):
            if len(self._err) < 65536:
                self._err += chunk

    def read_all(self, limit: int = 16 << 20) -> bytes:
        """Return the rest of the remote command's stdout (until EOF), at most ``limit``
        bytes kept (the rest is read and dropped: a flood cannot exhaust memory)."""
        kept: list[bytes] = []
        size = 0
        for chunk in iter(lambda: self.channel.recv(65536), b""):
            if size < limit:
                kept.append(chunk[: limit - size])
                size += len(kept[-1])
        return b"".join(kept)

    def write(self, data: bytes) -> None:
        """Send ``data`` on the channel (raises OSError when it is closed)."""
        self.channel.sendall(data)

    def readline(self, limit: int) -> bytes:
        """Return the next stdout line of the remote command, at most ``limit`` bytes
        (``b""`` at EOF)."""
        return self._out.readline(limit)

    def stderr_text(self) -> str:
        """Return the remote command's stderr so far."""
        if self.channel.exit_status_ready():
            self._err_thread.join(1.0)
        return self._err.decode("utf-8", "replace")

    def close(self) -> None:
        """Close the channel (the remote agent sees EOF and exits)."""
        with contextlib.suppress(OSError, EOFError):
            self.channel.shutdown_write()
        self.channel.close()

    def abort(self) -> None:
        """Close the channel at once: nothing more is read from it (sshd then closes the
        remote command's pipes; it dies at its next write)."""
        self.channel.close()


class SSHHost(ForwardingHost):
    """A machine reached over SSH. Connects on first use; thread-safe.

    Args:
        spec: ``[user@]host[:port]`` or an alias from ``~/.ssh/config``.
        user, port: override what ``spec`` and the ssh config say.
        key_filename: a private key file to use (besides the agent and default keys).
        password, passphrase: used for auth / to unlock the key; never logged.
        known_hosts: an extra known_hosts file (``--known-hosts``); accepted keys are
            saved there when given, else in ``~/.ssh/known_hosts``.
        accept_new_host_key: save the key of a host never seen before (never a changed one).
        connect_timeout: seconds for TCP connect, banner and auth.
        ssh_config: path of the OpenSSH client config (None: ignore it).
        system_known_hosts: also trust ``~/.ssh/known_hosts`` (tests turn it off).
    """

    python = "python3"

    def __init__(
        self,
        spec: str,
        *,
        user: str | None = None,
        port: int | None = None,
        key_filename: str | None = None,
        password: str | None = None,
        passphrase: str | None = None,
        known_hosts: str | None = None,
        accept_new_host_key: bool = False,
        connect_timeout: float = 10.0,
        ssh_config: str | None = DEFAULT_SSH_CONFIG,
        system_known_hosts: bool = True,
        call_timeout: float = 30.0,
    ) -> None:
        self.name = spec
        self.target = resolve_target(spec, user=user, port=port, ssh_config=ssh_config)
        self.key_filename = key_filename
        self.known_hosts = known_hosts
        self.accept_new_host_key = accept_new_host_key
        self.connect_timeout = connect_timeout
        self.system_known_hosts = system_known_hosts
        self._password = password
        self._passphrase = passphrase
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._agent = AgentHost(
            lambda: self.open_stream(agent_command(self.python)),
            name=spec,
            call_timeout=call_timeout,
        )
        self.files = self._agent  # file operations go through the agent's channel

    def __repr__(self) -> str:  # no secrets in reprs
        return f"SSHHost({self.name!r})"

    # -- connection ---------------------------------------------------------------

    def connect(self) -> SSHHost:
        """Open the SSH connection now (otherwise done on first use); return self."""
        self._transport()
        return self

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._client.close()
                self._client = None
            self._client = self._open_client()
            transport = self._client.get_transport()
            assert transport is not None
            return transport

    def _open_client(self) -> paramiko.SSHClient:
        target = self.target
        client = paramiko.SSHClient()
        if self.system_known_hosts:
            system_file = Path(DEFAULT_KNOWN_HOSTS).expanduser()
            if system_file.is_file():
                client.load_system_host_keys(str(system_file))
        save_to = Path(self.known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        if self.known_hosts and Path(self.known_hosts).is_file():
            client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(_VerifyPolicy(self.accept_new_host_key, save_to))
        keys = [self.key_filename] if self.key_filename else []
        keys += [k for k in target.identity_files if os.path.exists(k)]
        where = f"{target.user}@{target.hostname}:{target.port}"
        try:
            client.connect(
                target.hostname,
                port=target.port,
                username=target.user,
                key_filename=keys or None,
                password=self._password,
                passphrase=self._passphrase,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                allow_agent=True,
                look_for_keys=not keys,
            )
        except _UnknownHostKey as exc:
            client.close()
            if exc.known_types:
                raise HostError(
                    f"{where}: the SSH host key has CHANGED: the host now shows a "
                    f"{exc.key.get_name()} key ({fingerprint(exc.key)}) but known_hosts holds "
                    f"only {', '.join(exc.known_types)} for it. If the change is expected, "
                    f"remove the old key: ssh-keygen -R '{target.known_hosts_name}', then add "
                    f"the new one"
                ) from None
            raise HostError(
                f"{where}: unknown SSH host key {exc.key.get_name()} "
                f"{fingerprint(exc.key)}; {how_to_accept(target)}"
            ) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostError(
                f"{where}: the SSH host key has CHANGED (now {exc.key.get_name()} "
                f"{fingerprint(exc.key)}, known {exc.expected_key.get_name()} "
                f"{fingerprint(exc.expected_key)}): a reinstalled host or a man in the middle. "
                f"If the change is expected, remove the old key: "
                f"ssh-keygen -R '{target.known_hosts_name}', then add the new one"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise HostError(
                f"{where}: SSH authentication failed ({exc}); load a key into ssh-agent, "
                f"set IdentityFile in ~/.ssh/config, or pass a key file"
            ) from None
        except TimeoutError:
            client.close()
            raise HostError(
                f"{where}: connection timed out after {self.connect_timeout:g} s"
            ) from None
        except (paramiko.SSHException, OSError) as exc:
            client.close()
            text = str(exc)
            if "banner" in text or "No existing session" in text:
                # paramiko's words when the peer accepted TCP but never spoke SSH in time.
                text = (
                    f"no SSH handshake within {self.connect_timeout:g} s "
                    f"(is an sshd listening on port {target.port}?)"
                )
            raise HostError(f"{where}: cannot connect: {text}") from None
        transport = client.get_transport()
        sock = getattr(transport, "sock", None)
        if isinstance(sock, socket.socket):  # small request/reply messages: no Nagle delay
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client

    def open_stream(self, argv: Sequence[str]) -> ChannelStream:
        """Run ``argv`` remotely on a new exec channel and return its pipes."""
        return self._exec(shlex.join(argv))

    def _exec(self, command: str) -> ChannelStream:
        try:
            channel = self._transport().open_session(timeout=self.connect_timeout)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(f"{self.name}: cannot open an SSH channel: {exc}") from None
        return ChannelStream(channel)

    def close(self) -> None:
        """Stop the agent and close the SSH connection."""
        self._agent.close()
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- Host protocol --------------------------------------------------------------

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` remotely as ``timeout -k 2 T argv`` on its own exec channel;
        return its result (returncode 127 when the program is missing)."""
        started = time.monotonic()
        command = shlex.join(["timeout", "-k", "2", f"{timeout:g}", *argv])
        stream = self._exec(command)
        channel = stream.channel
        out_box: list[bytes] = []
        reader = threading.Thread(target=lambda: out_box.append(stream.read_all()), daemon=True)
        reader.start()
        try:
            if input is not None:
                channel.sendall(input.encode())
            channel.shutdown_write()
        except (OSError, EOFError):
            pass
        finished = channel.status_event.wait(timeout + RUN_GRACE)
        elapsed = time.monotonic() - started
        if not finished:
            stream.close()
            reader.join(1.0)
            rc, timed_out = -9, True
        else:
            rc = channel.recv_exit_status()
            reader.join(RUN_GRACE)
            timed_out = rc in (124, 137) and elapsed >= timeout * 0.95
        err = stream.stderr_text()
        stream.close()
        return CommandResult(
            argv=tuple(argv),
            returncode=rc,
            stdout=(out_box[0] if out_box else b"").decode("utf-8", "replace"),
            stderr=err,
            timed_out=timed_out,
            duration_s=elapsed,
        )
