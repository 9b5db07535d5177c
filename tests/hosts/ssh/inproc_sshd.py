"""A real SSH server in this process on 127.0.0.1: paramiko's server side (a Transport in
server mode with a :class:`paramiko.ServerInterface`). It speaks the same protocol as
OpenSSH's sshd (version exchange, key exchange, host key proof, user authentication,
exec and ``direct-tcpip`` channels) and starts in milliseconds, so the client code
(:mod:`gpudoctor.hosts.ssh.auth`, ``connect``, ``host``) meets a real peer in fast tests.
The lab's OpenSSH sshd (tests/lab/sshd.py) stays for the lab tests.

What the server accepts is a :class:`Policy`: the public keys that log in (or count as
a first factor), a password, the methods it names as allowed. It records every
authentication attempt (method, user, key blob) in ``Server.attempts``; exec requests
run the command with ``/bin/sh -c`` as a real local process whose stdin, stdout, stderr
and exit status (or the signal that killed it) travel over the channel, as sshd does."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko


@dataclass
class Policy:
    """What the server lets in.

    Attributes:
        keys: public key blobs (``key.asbytes()``) that log in.
        first_factor_keys: key blobs that are accepted as a first factor only
            (``AuthenticationMethods publickey,password``): the password must follow.
        password: the password that logs in (or completes a first factor); None: none.
        allowed: the methods the server names (``publickey,password``).
        hold_auth: when set, every authentication request waits on this event
            (a server that does not answer), then fails.
        drop_on_auth: close the connection at the first authentication request (an sshd
            that crashes or is restarted mid-login).
        sessions: open session channels (False: refuse them, as an sshd with
            ``MaxSessions 0`` does).
        hold_forwards: when set, every ``direct-tcpip`` request waits on this event (a
            jump host that never answers), then is refused.
        hold_sessions: when set, every session request waits on this event (an sshd that
            stopped answering after login), then is refused.
        status_at_exit: send a command's exit status when it exits, as OpenSSH's sshd
            does, not after its stdout and stderr ended (the default, so that a test
            reading both after the status never races).
    """

    keys: set[bytes] = field(default_factory=set)
    first_factor_keys: set[bytes] = field(default_factory=set)
    password: str | None = None
    allowed: str = "publickey,password"
    hold_auth: threading.Event | None = None
    drop_on_auth: bool = False
    sessions: bool = True
    hold_forwards: threading.Event | None = None
    hold_sessions: threading.Event | None = None
    status_at_exit: bool = False


@dataclass(frozen=True)
class Attempt:
    """One authentication request the server saw: method, user, and the key blob offered
    (empty for a password) or the password given."""

    method: str
    user: str
    detail: bytes


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.first_factor_done = False

    def get_allowed_auths(self, username: str) -> str:
        if self.first_factor_done:  # AuthenticationMethods publickey,password publickey,kbd
            return "password,keyboard-interactive"
        return self.server.policy.allowed

    def _hold(self) -> None:
        hold = self.server.policy.hold_auth
        if hold is not None:
            hold.wait()  # set by the test, or by close()

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        self._hold()
        if self.server.policy.drop_on_auth:
            for transport in self.server.transports:
                transport.close()
            return paramiko.AUTH_FAILED
        if "publickey" not in self.get_allowed_auths(username).split(","):
            return paramiko.AUTH_FAILED  # sshd does not look at a method it does not allow
        blob = key.asbytes()
        # the probe (no signature yet) and the signed request both arrive here; record once
        seen = Attempt("publickey", username, blob)
        if not self.server.attempts or self.server.attempts[-1] != seen:
            self.server.attempts.append(seen)
        policy = self.server.policy
        if blob in policy.keys:
            return paramiko.AUTH_SUCCESSFUL
        if blob in policy.first_factor_keys:
            self.first_factor_done = True
            return paramiko.AUTH_PARTIALLY_SUCCESSFUL
        return paramiko.AUTH_FAILED

    def check_auth_password(self, username: str, password: str) -> int:
        self._hold()
        self.server.attempts.append(Attempt("password", username, password.encode()))
        policy = self.server.policy
        if policy.password is None or password != policy.password:
            return paramiko.AUTH_FAILED
        if policy.first_factor_keys and not self.first_factor_done:
            return paramiko.AUTH_PARTIALLY_SUCCESSFUL
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        hold = self.server.policy.hold_sessions
        if kind == "session" and hold is not None:
            hold.wait()  # set by the test, or by close()
            return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        if kind == "session" and self.server.policy.sessions:
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.server.commands.append(command.decode())
        threading.Thread(
            target=_run_exec, args=(channel, command, self.server), daemon=True
        ).start()
        return True

    def check_channel_direct_tcpip_request(
        self, chanid: int, origin: tuple[str, int], destination: tuple[str, int]
    ) -> int:
        self.server.forwards.append(destination)
        hold = self.server.policy.hold_forwards
        if hold is not None:
            hold.wait()  # set by the test, or by close()
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        try:
            sock = socket.create_connection(destination, timeout=10)
        except OSError:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        self.server.pending_forwards[chanid] = sock
        return paramiko.OPEN_SUCCEEDED


def _run_exec(channel: paramiko.Channel, command: bytes, server: Server) -> None:
    """Run ``command`` as sshd does (``sh -c``, :meth:`Server.spawn`), pumping the channel
    both ways; send the exit status, then close the channel. A server already closed runs
    nothing and closes the channel. Under ``Policy.status_at_exit`` the status goes as
    soon as the command exits, before a process it left behind lets go of its stdout."""
    proc = server.spawn(command)
    if proc is None:
        with contextlib.suppress(Exception):
            channel.close()
        return
    assert proc.stdin and proc.stdout and proc.stderr

    def feed() -> None:
        with contextlib.suppress(OSError):
            for chunk in iter(lambda: channel.recv(65536), b""):
                proc.stdin.write(chunk)  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]

    def errors() -> None:
        for chunk in iter(lambda: proc.stderr.read1(65536), b""):  # type: ignore[union-attr]
            with contextlib.suppress(OSError, EOFError):
                channel.sendall_stderr(chunk)

    feeder = threading.Thread(target=feed, daemon=True)
    err = threading.Thread(target=errors, daemon=True)
    feeder.start()
    err.start()
    if server.policy.status_at_exit:
        threading.Thread(target=lambda: _send_status(channel, proc.wait()), daemon=True).start()
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        with contextlib.suppress(OSError, EOFError):
            channel.sendall(chunk)
    err.join()
    status = proc.wait()
    proc.stdout.close()  # read to EOF by this thread and the joined one: no fd left to GC
    proc.stderr.close()
    if not server.policy.status_at_exit:
        _send_status(channel, status)
    with contextlib.suppress(Exception):  # the client (or the whole connection) may be gone
        channel.shutdown_write()
        channel.close()


def _send_status(channel: paramiko.Channel, status: int) -> None:
    """Send the command's exit status, or (killed by a signal) an ``exit-signal`` request
    as sshd does (RFC 4254 6.10); nothing when the client or connection is gone."""
    with contextlib.suppress(Exception):
        if status >= 0:
            channel.send_exit_status(status)
        else:
            _send_exit_signal(channel, signal.Signals(-status).name.removeprefix("SIG"))


def _send_exit_signal(channel: paramiko.Channel, name: str) -> None:
    """Send an ``exit-signal`` request (signal name without ``SIG``, no core dump, no
    message), as sshd does for a command killed by a signal; paramiko has no call for it."""
    m = paramiko.Message()
    m.add_byte(bytes([paramiko.common.MSG_CHANNEL_REQUEST]))
    m.add_int(channel.remote_chanid)
    m.add_string("exit-signal")
    m.add_boolean(False)
    m.add_string(name)
    m.add_boolean(False)
    m.add_string("")
    m.add_string("")
    channel.transport._send_user_message(m)  # type: ignore[union-attr]


def process_stats() -> dict[int, tuple[str, list[str]]]:
    """Return every process now: pid -> (its /proc/PID/stat up to the command name, e.g.
    ``"4711 (sh)"``; the fields after it: state, ppid, pgrp, session, ...) (``ps -e``)."""
    found: dict[int, tuple[str, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        name_end = stat.rindex(")")
        found[int(entry.name)] = (stat[: name_end + 1], stat[name_end + 2 :].split())
    return found


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (``pkill -KILL -s SID``): a command's
    shell and what it started in process groups of its own (coreutils ``timeout`` moves
    itself and its command to a new group, which a kill of the shell's group misses).
    Scans again until none is left alive: a process forked meanwhile is in the session too."""
    for _ in range(100):
        alive = [pid for pid, (_name, fields) in process_stats().items()
                 if fields[0] != "Z" and int(fields[3]) == sid]  # fmt: skip
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _pump(a: paramiko.Channel | socket.socket, b: paramiko.Channel | socket.socket) -> None:
    with contextlib.suppress(OSError, EOFError):
        for chunk in iter(lambda: a.recv(65536), b""):
            b.sendall(chunk)
    with contextlib.suppress(OSError, EOFError):
        b.shutdown(socket.SHUT_WR) if isinstance(b, socket.socket) else b.shutdown_write()


class Server:
    """The listening server: ``port`` on 127.0.0.1, its ``host_keys`` (one ECDSA P-256 key
    made per server unless given; ``host_key`` is the first), ``policy``, and what clients
    did (``attempts``, ``commands``, ``forwards``)."""

    def __init__(
        self, policy: Policy | None = None, host_keys: list[paramiko.PKey] | None = None
    ) -> None:
        self.policy = policy or Policy()
        self.host_keys = host_keys or [paramiko.ECDSAKey.generate()]
        self.host_key = self.host_keys[0]
        self.attempts: list[Attempt] = []
        self.commands: list[str] = []
        self.forwards: list[tuple[str, int]] = []
        self.pending_forwards: dict[int, socket.socket] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._procs_lock = threading.Lock()
        self._closed = False
        self.transports: list[paramiko.Transport] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    @property
    def offered_blobs(self) -> list[bytes]:
        """Return the public key blobs clients offered, in order."""
        return [a.detail for a in self.attempts if a.method == "publickey"]

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        self.transports.append(transport)
        for key in self.host_keys:
            transport.add_server_key(key)
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            transport.start_server(server=_Interface(self))
        while transport.is_active():
            channel = transport.accept(timeout=1)
            if channel is None:
                continue
            sock = self.pending_forwards.pop(channel.get_id(), None)
            if sock is not None:
                threading.Thread(target=_pump, args=(channel, sock), daemon=True).start()
                threading.Thread(target=_pump, args=(sock, channel), daemon=True).start()

    def known_hosts_line(self, key: paramiko.PKey | None = None) -> str:
        """Return the known_hosts line for this server's ``key`` (the first host key)."""
        key = key or self.host_key
        return f"[127.0.0.1]:{self.port} {key.get_name()} {key.get_base64()}\n"

    def wait_closed(self) -> bool:
        """Wait until every connection's transport thread has ended (the client is gone);
        return True when they all have."""
        for transport in list(self.transports):
            transport.join(30)
        return not any(t.is_active() for t in self.transports)

    def spawn(self, command: bytes) -> subprocess.Popen[bytes] | None:
        """Start ``command`` as sshd does (``/bin/sh -c``, in a session of its own) and
        return it, kept in ``procs`` for :meth:`close`; None once the server is closed.
        Under one lock with ``close``, so an exec request the client sent just before the
        end cannot start a process that close() has not seen (left running, then reaped by
        whoever waits for any child: mutmut's worker loop aborts on an unknown pid)."""
        with self._procs_lock:
            if self._closed:
                return None
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command.decode()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self.procs.append(proc)
            return proc

    def close(self) -> None:
        """Stop listening and close every connection; kill and reap every command the
        server started (none starts after this)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        self._listener.close()
        for hold in (self.policy.hold_auth, self.policy.hold_forwards, self.policy.hold_sessions):
            if hold is not None:
                hold.set()
        for transport in self.transports:
            transport.close()
        with self._procs_lock:
            self._closed = True
        for proc in self.procs:  # no command outlives the server (nor is left unreaped)
            kill_session(proc.pid)
            proc.wait()


@contextlib.contextmanager
def running(
    policy: Policy | None = None, host_keys: list[paramiko.PKey] | None = None
) -> Iterator[Server]:
    """Yield a started :class:`Server`; close it at the end."""
    server = Server(policy, host_keys)
    try:
        yield server
    finally:
        server.close()
