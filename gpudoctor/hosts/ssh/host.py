"""SSHHost: a remote machine reached over SSH (paramiko) with OpenSSH's configuration and
trust decisions: ``ssh -G`` resolves the options (Match, Include, ProxyJump,
ProxyCommand, IdentityFile, UserKnownHostsFile, HostKeyAlias, StrictHostKeyChecking,
...), :mod:`gpudoctor.hosts.ssh.connect` opens the connection (every jump hop verified),
:mod:`gpudoctor.hosts.ssh.trust` judges host keys (unknown keys are refused unless the
user asks; a CHANGED key always is). Passwords and passphrases are never logged.

File operations go through the gpudoctor agent started over one exec channel
(``python3 -I -c ...``); :meth:`SSHHost.run` uses a fresh exec channel per command,
wrapped in coreutils ``timeout`` so the remote process group dies at the deadline.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Sequence

import paramiko

from gpudoctor.hosts.agent.client import DEFAULT_CALL_TIMEOUT, AgentHost, agent_command
from gpudoctor.hosts.base import CommandResult, ForwardingHost, HostError
from gpudoctor.hosts.byte_stream import ByteStream
from gpudoctor.hosts.ssh.auth import Credentials
from gpudoctor.hosts.ssh.connect import (
    Connection,
    ConnectSettings,
    connect,
    failure_reason,
    fingerprint,
)
from gpudoctor.hosts.ssh.target import (
    DEFAULT_SSH_CONFIG,
    SSHTarget,
    resolve_target,
    split_spec,
)

__all__ = ["SSHHost", "SSHTarget", "fingerprint", "resolve_target", "split_spec"]

# Seconds a command may outlive its own timeout before the client closes the channel.
RUN_GRACE = 10.0
STDERR_KEPT = 65536  # bytes of a command's stderr kept (the rest is read and dropped)


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
            self._err += chunk[: STDERR_KEPT - len(self._err)]  # the first 64 KiB, no more

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

    def read_some(self, limit: int) -> bytes:
        """Return up to ``limit`` bytes of the remote stdout as they come (``b""`` at EOF):
        first what :meth:`readline` buffered, then straight from the channel."""
        buffered = getattr(self._out, "_rbuffer", b"")
        if buffered:
            self._out._rbuffer = bytes(buffered[limit:])  # type: ignore[attr-defined]
            return bytes(buffered[:limit])
        return self.channel.recv(limit)

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
        spec: ``[user@]host[:port]`` or an alias from the ssh config.
        user, port: override what ``spec`` and the ssh config say.
        key_filename: a private key file tried first (besides the agent and IdentityFile).
        password, passphrase: used for auth / to unlock key files; never logged.
        known_hosts: an extra known_hosts file (``--known-hosts``), read first; accepted
            keys are saved there when given, else in the first ``UserKnownHostsFile``.
        accept_new_host_key: save the key of a host never seen before (never a changed one).
        connect_timeout: seconds for each connection step (TCP, banner, key exchange,
            auth); None: the config's ``ConnectTimeout``, else 10 s.
        ssh_config: the OpenSSH client config file (``ssh -F``); the default reads what
            ``ssh`` reads; None: no config file at all.
        system_known_hosts: also read the configured known_hosts files (tests turn it off).
        call_timeout: seconds a file operation (an agent call) may take; past it the
            agent is stopped and the call raises :class:`HostError`.
    """

    python = "python3"
    run_opens_session = True  # each run() is a fresh exec channel (sshd session, shell)

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
        connect_timeout: float | None = None,
        ssh_config: str | None = DEFAULT_SSH_CONFIG,
        system_known_hosts: bool = True,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.name = spec
        self.target = resolve_target(spec, user=user, port=port, ssh_config=ssh_config)
        self.settings = ConnectSettings(
            known_hosts=known_hosts,
            accept_new_host_key=accept_new_host_key,
            connect_timeout=connect_timeout,
            ssh_config=ssh_config,
            use_config_known_hosts=system_known_hosts,
        )
        self._creds = Credentials(key_filename, password, passphrase)
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._agent = AgentHost(
            lambda: self.open_stream(agent_command(self.python)),
            name=spec,
            call_timeout=call_timeout,
        )
        self.files = self._agent  # file operations go through the agent's channel

    def __repr__(self) -> str:  # no secrets in reprs
        return f"SSHHost({self.name!r})"

    @property
    def connect_timeout(self) -> float:
        """Return the seconds each connection step may take."""
        return self.settings.connect_timeout or self.target.connect_timeout or 10.0

    # -- connection ---------------------------------------------------------------

    def connect(self) -> SSHHost:
        """Open the SSH connection now (otherwise done on first use); return self."""
        self._transport()
        return self

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._conn is not None:
                if self._conn.transport.is_active():
                    return self._conn.transport
                self._conn.close()
                self._conn = None
            self._conn = connect(self.target, self.settings, self._creds)
            return self._conn.transport

    def open_stream(self, argv: Sequence[str]) -> ChannelStream:
        """Run ``argv`` remotely on a new exec channel and return its pipes."""
        return self._exec(shlex.join(argv))

    def _exec(self, command: str) -> ChannelStream:
        try:
            channel = self._transport().open_session(timeout=self.connect_timeout)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(
                f"{self.name}: cannot open an SSH channel: {failure_reason(exc)}"
            ) from None
        return ChannelStream(channel)

    def close(self) -> None:
        """Stop the agent and close the SSH connection."""
        self._agent.close()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- Host protocol --------------------------------------------------------------

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` remotely as ``timeout -k 2 T argv; exit $?`` on its own exec
        channel; return its result (returncode 127 when the program is missing; 124, or
        137 when it ignored TERM and was killed 2 s later, with ``timed_out``).

        The ``; exit $?`` keeps the login shell waiting: run alone, ``timeout`` is exec'd
        and dies of its own KILL at the deadline, which sshd reports as a signal that
        paramiko drops (the command would read as returncode -1, not timed out)."""
        started = time.monotonic()
        command = shlex.join(["timeout", "-k", "2", f"{timeout:g}", *argv]) + "; exit $?"
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
        if finished:
            rc = channel.recv_exit_status()
            reader.join(RUN_GRACE)  # stdout's end (a background process may hold it open)
            timed_out = rc in (124, 137) and elapsed >= timeout * 0.95
        else:
            rc, timed_out = -9, True
        stream.close()  # nothing more is read: the reader ends with what has arrived
        reader.join(1.0)
        err = stream.stderr_text()
        return CommandResult(
            argv=tuple(argv),
            returncode=rc,
            stdout=(out_box[0] if out_box else b"").decode("utf-8", "replace"),
            stderr=err,
            timed_out=timed_out,
            duration_s=elapsed,
        )
