"""Open an authenticated SSH connection as ``ssh -o BatchMode=yes`` would: the socket
(direct TCP, ``ProxyCommand``, or a ``direct-tcpip`` channel through each ``ProxyJump``
hop, every hop's host key verified), the handshake (host key algorithms ordered by what
known_hosts holds), trust (:mod:`gpudoctor.hosts.ssh.trust`) and authentication
(:mod:`gpudoctor.hosts.ssh.auth`). Failures are one-line :class:`HostError` texts that
state the real reason and the real elapsed time."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import paramiko

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.auth import Credentials, authenticate
from gpudoctor.hosts.ssh.known_hosts import HostKeys
from gpudoctor.hosts.ssh.target import DEFAULT_SSH_CONFIG, SSHTarget, resolve_target
from gpudoctor.hosts.ssh.trust import host_key_order, known_keys, policy_for, verify_host_key

DEFAULT_CONNECT_TIMEOUT = 10.0
# Offer AEAD ciphers first (see aead_first); False: paramiko's own order (benchmarks).
PREFER_AEAD = True
# paramiko's transport thread logs failures (with a traceback) at ERROR. Without a handler
# Python's last-resort handler would print them on stderr, beside gpudoctor's own
# one-line error; a NullHandler keeps them for whoever configures logging (--debug).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def fingerprint(key: Any) -> str:
    """Return the key's OpenSSH SHA256 fingerprint (``ssh-keygen -lf``: ``SHA256:...``)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def failure_reason(exc: BaseException) -> str:
    """Return the words that say why an SSH step failed: a refused channel's reason
    (``ChannelException.text``, e.g. ``Connect failed``), else the exception's text, else
    its type's name (an ``EOFError`` says nothing)."""
    return getattr(exc, "text", "") or str(exc) or type(exc).__name__


@dataclass(frozen=True)
class ConnectSettings:
    """Options that apply to every hop of a connection.

    Attributes:
        known_hosts: ``--known-hosts``: read first, receives accepted keys.
        accept_new_host_key: ``--accept-new-host-key``.
        connect_timeout: seconds per step (TCP, banner, key exchange, auth); None:
            ``ConnectTimeout`` from the config, else 10 s.
        ssh_config: the OpenSSH client config (``-F``), None for none.
        use_config_known_hosts: read the configured known_hosts files (tests turn it off).
    """

    known_hosts: str | None = None
    accept_new_host_key: bool = False
    connect_timeout: float | None = None
    ssh_config: str | None = DEFAULT_SSH_CONFIG
    use_config_known_hosts: bool = True


def aead_first(ciphers: Sequence[str]) -> tuple[str, ...]:
    """Return ``ciphers`` with the AEAD ones (``*-gcm@openssh.com``, ``chacha20-poly1305``)
    moved to the front, the rest in their order: only a reordering, nothing added or
    dropped. AEAD packets need no separate MAC, which paramiko computes and compares per
    packet in Python: less client CPU per packet."""
    aead = [c for c in ciphers if c.endswith("-gcm@openssh.com") or c.startswith("chacha20")]
    return (*aead, *(c for c in ciphers if c not in aead))


class _Transport(paramiko.Transport):
    """A paramiko Transport whose host key algorithms can be ordered per host and which
    prefers AEAD ciphers (:func:`aead_first`)."""

    host_key_algorithms: tuple[str, ...] | None = None

    @property
    def preferred_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        """Return the host key algorithms offered, best first."""
        return self.host_key_algorithms or super().preferred_keys

    @property
    def preferred_ciphers(self) -> tuple[str, ...]:  # type: ignore[override]
        """Return the ciphers offered, best first: paramiko's, AEAD ones first."""
        offered = tuple(super().preferred_ciphers)
        return aead_first(offered) if PREFER_AEAD else offered


@dataclass
class Connection:
    """An authenticated transport and what it stands on (jump hops, a proxy process).

    Attributes:
        transport: the authenticated paramiko Transport.
        target: the resolved target.
        trusted: how the host key was trusted (for ``--debug``-style messages).
        hops: the connections to the jump hosts, first hop first.
        proxy: the ProxyCommand process, if any.
    """

    transport: paramiko.Transport
    target: SSHTarget
    trusted: str = ""
    hops: list[Connection] = field(default_factory=list)
    proxy: subprocess.Popen[bytes] | None = None

    def close(self) -> None:
        """Close the transport, then the hops and the proxy process."""
        with contextlib.suppress(Exception):
            self.transport.close()
        for hop in reversed(self.hops):
            hop.close()
        _stop(self.proxy)


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop a ProxyCommand's process group (TERM, then KILL) and close its stderr file."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    errors = getattr(proc, "stderr_file", None)
    if errors is not None:
        errors.close()


def connect(
    target: SSHTarget,
    settings: ConnectSettings,
    creds: Credentials,
    jumps: tuple[str, ...] | None = None,
) -> Connection:
    """Return an authenticated :class:`Connection` to ``target``. ``jumps`` overrides the
    target's ``ProxyJump`` (the hops before it in a chain); raise HostError on failure."""
    timeout = settings.connect_timeout or target.connect_timeout or DEFAULT_CONNECT_TIMEOUT
    started = time.monotonic()
    hops: list[Connection] = []
    proxy: subprocess.Popen[bytes] | None = None
    chain = target.proxy_jump if jumps is None else jumps
    policy = policy_for(
        target, settings.known_hosts, settings.accept_new_host_key, settings.use_config_known_hosts
    )
    known = known_keys(target, policy)
    try:
        if chain:
            hop = _connect_hop(chain, settings)
            hops = [*hop.hops, hop]
            hop.hops = []
            sock: Any = _jump_channel(hop, target, timeout)
        elif target.proxy_command:
            sock, proxy = _start_proxy(target.proxy_command)
        else:
            sock = _tcp(target, timeout, started)
        transport = _handshake(sock, target, known, timeout, started, proxy)
        conn = Connection(transport, target)
        conn.hops, conn.proxy = hops, proxy
    except BaseException:
        for hop in reversed(hops):
            hop.close()
        _stop(proxy)
        raise
    try:
        conn.trusted = verify_host_key(
            conn.transport.get_remote_server_key(), target, policy, known, fingerprint
        )
        authenticate(conn.transport, target, creds, timeout)
    except BaseException:
        conn.close()
        raise
    sock_obj = getattr(conn.transport, "sock", None)
    if isinstance(sock_obj, socket.socket) and sock_obj.family != socket.AF_UNIX:
        with contextlib.suppress(OSError):  # small request/reply messages: no Nagle delay
            sock_obj.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _connect_hop(chain: tuple[str, ...], settings: ConnectSettings) -> Connection:
    """Connect to the LAST jump host of ``chain`` (through the hops before it, or its own
    ProxyJump/ProxyCommand when it is the first), as ``ssh -J a,b`` runs ``ssh -J a b``."""
    spec = chain[-1]
    hop_target = resolve_target(spec, ssh_config=settings.ssh_config)
    try:
        return connect(hop_target, settings, Credentials(), chain[:-1] or None)
    except HostError as exc:
        raise HostError(f"jump host {spec}: {exc}") from None


def _jump_channel(hop: Connection, target: SSHTarget, timeout: float) -> paramiko.Channel:
    """Return a ``direct-tcpip`` channel from ``hop`` to the target (``ssh -W host:port``)."""
    try:
        return hop.transport.open_channel(
            "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=timeout
        )
    except (paramiko.SSHException, OSError, EOFError) as exc:
        reason = failure_reason(exc)
        raise HostError(
            f"{target.where}: the jump host {hop.target.alias} cannot reach "
            f"{target.hostname}:{target.port}: {reason}"
        ) from None


def _start_proxy(command: str) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """Start ``ProxyCommand`` as OpenSSH does (``$SHELL -c "exec CMD"``: /bin/sh here) on
    one end of a socket pair; return the other end and the process."""
    ours, theirs = socket.socketpair()
    errors = tempfile.TemporaryFile()  # noqa: SIM115 - read on failure, closed with the process
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", f"exec {command}"],
            stdin=theirs,
            stdout=theirs,
            stderr=errors,
            start_new_session=True,
        )
    except OSError as exc:
        ours.close()
        raise HostError(f"cannot start the ProxyCommand {command!r}: {exc}") from None
    finally:
        theirs.close()
    proc.stderr_file = errors  # type: ignore[attr-defined]
    return ours, proc


def _tcp(target: SSHTarget, timeout: float, started: float) -> socket.socket:
    where = target.where
    try:
        return socket.create_connection((target.hostname, target.port), timeout=timeout)
    except socket.gaierror as exc:
        raise HostError(
            f"{where}: cannot resolve the host name {target.hostname!r} ({exc.strerror}); "
            f"check the name or its HostName in ~/.ssh/config"
        ) from None
    except ConnectionRefusedError:
        raise HostError(
            f"{where}: cannot connect: connection refused (nothing listens on port "
            f"{target.port}; is sshd running?)"
        ) from None
    except TimeoutError:
        raise HostError(
            f"{where}: cannot connect: no answer within {_elapsed(started)} (a firewall, a "
            f"wrong address, or a host that is down)"
        ) from None
    except OSError as exc:
        raise HostError(f"{where}: cannot connect: {exc.strerror or exc}") from None


def _elapsed(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"


def _handshake(
    sock: Any,
    target: SSHTarget,
    known: HostKeys,
    timeout: float,
    started: float,
    proxy: subprocess.Popen[bytes] | None,
) -> paramiko.Transport:
    """Run the SSH handshake on ``sock``; return the transport (key exchange done)."""
    transport = _Transport(sock)
    offered = paramiko.Transport.preferred_keys.fget(transport)  # type: ignore[attr-defined]
    transport.host_key_algorithms = host_key_order(known, offered)
    transport.banner_timeout = timeout
    transport.handshake_timeout = timeout
    try:
        transport.start_client(timeout=timeout)
        error: BaseException | None = None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        error = exc
    done = getattr(transport, "completion_event", None)
    if (
        error is None
        and transport.is_active()
        and done is not None
        and done.is_set()
        and getattr(transport, "host_key", None) is not None
    ):
        return transport
    transport.close()
    raise HostError(
        f"{target.where}: cannot connect: {_why(error, transport, started, timeout, target, proxy)}"
    )


def _why(
    error: BaseException | None,
    transport: paramiko.Transport,
    started: float,
    timeout: float,
    target: SSHTarget,
    proxy: subprocess.Popen[bytes] | None,
) -> str:
    """Return the one-phrase reason a handshake failed, with the real elapsed time."""
    took = _elapsed(started)
    banner = getattr(transport, "remote_version", "") or ""
    text = str(error) if error is not None else ""
    cause = error.__context__ if error is not None else None
    if proxy is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proxy.wait(0.5)
        if proxy.poll() is not None:
            said = _proxy_stderr(proxy)
            return f"the ProxyCommand exited with status {proxy.returncode} after {took}" + (
                f": {said}" if said else ""
            )
    if isinstance(error, paramiko.ssh_exception.IncompatiblePeer):  # no algorithm, or SSH-1
        return f"the server and gpudoctor share no SSH algorithm ({text})"
    if text.startswith("Indecipherable protocol version"):
        said = text.split('"', 1)[-1].rstrip('"')[:60]
        return f"port {target.port} does not speak SSH: it sent {said!r} after {took}"
    if "Error reading SSH protocol banner" in text or (error is None and not banner):
        if (
            error is None
            or isinstance(cause, socket.timeout)
            or (cause is None and "timed out" in text)
        ):
            return f"no SSH banner within {took} (is an sshd listening on port {target.port}?)"
        return (
            f"the peer closed the connection after {took} without an SSH banner "
            f"(port {target.port} does not speak SSH, or sshd dropped this client: "
            f"MaxStartups, TCP wrappers, fail2ban)"
        )
    if error is None:
        return f"the SSH key exchange did not finish within {took}"
    if isinstance(error, EOFError) or isinstance(cause, EOFError):
        return f"the server closed the connection during the SSH handshake after {took}"
    return f"SSH handshake failed after {took}: {text or type(error).__name__}"


def _proxy_stderr(proxy: subprocess.Popen[bytes]) -> str:
    """Return the last line the ProxyCommand wrote on stderr ("" for none)."""
    errors = proxy.stderr_file  # type: ignore[attr-defined]  # set by _start_proxy
    try:
        errors.seek(0)
        lines = errors.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
    except (OSError, ValueError):
        return ""
    return lines[-1].strip() if lines else ""
