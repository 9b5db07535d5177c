"""SSH peers that are not (working) sshds, as tiny real loopback servers: one that closes
at once, one that never speaks, one that speaks another protocol. Each gives ONE line
with the real reason and the real elapsed time, and paramiko's own traceback ("Exception
(client): Error reading SSH protocol banner") never reaches stderr."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.host import SSHHost


def serve(handler: Callable[[socket.socket], None]) -> Iterator[int]:
    """Run a loopback TCP server calling ``handler(conn)`` per connection; yield its port."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def loop() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conns.append(conn)
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        listener.close()
        for conn in conns:
            conn.close()


def close_after(delay: float) -> Callable[[socket.socket], None]:
    def handler(conn: socket.socket) -> None:
        time.sleep(delay)
        conn.close()

    return handler


def silent(conn: socket.socket) -> None:
    time.sleep(30)


def http(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    time.sleep(5)


@pytest.fixture
def peer(request: pytest.FixtureRequest) -> Iterator[int]:
    yield from serve(request.param)


def host_for(port: int, tmp_path: Path, timeout: float) -> SSHHost:
    return SSHHost(
        f"root@127.0.0.1:{port}",
        ssh_config=None,
        system_known_hosts=False,
        known_hosts=str(tmp_path / "known_hosts"),
        connect_timeout=timeout,
    )


def elapsed_in(message: str) -> float:
    found = re.search(r"(?:after|within) (\d+\.\d) s", message)
    assert found, message
    return float(found.group(1))


@pytest.mark.parametrize("peer", [close_after(0.5)], indirect=True)
def test_peer_that_closes_says_so_with_the_real_time(peer: int, tmp_path: Path) -> None:
    """The incident: the peer closed after ~0.6 s and the message claimed a 10 s wait."""
    with pytest.raises(HostError) as exc:
        host_for(peer, tmp_path, 10).run(["true"])
    message = str(exc.value)
    assert message.startswith(f"root@127.0.0.1:{peer}: cannot connect: the peer closed")
    assert "without an SSH banner" in message
    assert 0.4 <= elapsed_in(message) < 10
    assert "\n" not in message


@pytest.mark.parametrize("peer", [silent], indirect=True)
def test_silent_peer_is_a_banner_timeout(peer: int, tmp_path: Path) -> None:
    """A port that accepts but never speaks (a hung sshd) fails at the connect timeout."""
    with pytest.raises(HostError) as exc:
        host_for(peer, tmp_path, 1).run(["true"])
    message = str(exc.value)
    assert "cannot connect: no SSH banner within " in message
    assert f"is an sshd listening on port {peer}?" in message
    assert elapsed_in(message) >= 1.0


@pytest.mark.parametrize("peer", [http], indirect=True)
def test_other_protocol_is_one_line(peer: int, tmp_path: Path) -> None:
    """An HTTP server on the port: paramiko skips pre-banner lines (RFC 4253 4.2) and
    then times out; the message says so with the time it really took."""
    with pytest.raises(HostError) as exc:
        host_for(peer, tmp_path, 1).run(["true"])
    message = str(exc.value)
    assert f"127.0.0.1:{peer}: cannot connect: no SSH banner within" in message
    assert elapsed_in(message) >= 1.0 and "\n" not in message


def test_closed_port_is_refused(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(HostError, match=rf"127.0.0.1:{port}: cannot connect: connection refused"):
        host_for(port, tmp_path, 5).run(["true"])


@pytest.mark.parametrize("peer", [close_after(0.2)], indirect=True)
def test_no_paramiko_traceback_on_stderr(peer: int, tmp_path: Path) -> None:
    """In a fresh interpreter (no logging configured, as the CLI runs), nothing but our
    own line reaches stderr: paramiko's "Exception (client)" and traceback stay silent."""
    code = (
        "import sys\n"
        "from gpudoctor.hosts.ssh.host import SSHHost\n"
        "from gpudoctor.hosts.base import HostError\n"
        f"h = SSHHost('root@127.0.0.1:{peer}', ssh_config=None, system_known_hosts=False,"
        f" known_hosts={str(tmp_path / 'kh')!r}, connect_timeout=5)\n"
        "try:\n    h.run(['true'])\nexcept HostError as e:\n    print('ERR', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("ERR "), done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("peer", [silent], indirect=True)
def test_connect_timeout_comes_from_the_ssh_config(
    peer: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ConnectTimeout from the config named by $GPUDOCTOR_SSH_CONFIG (ssh -F) applies."""
    config = tmp_path / "config"
    config.write_text(f"Host silentbox\n  HostName 127.0.0.1\n  Port {peer}\n  ConnectTimeout 1\n")
    monkeypatch.setenv("GPUDOCTOR_SSH_CONFIG", str(config))
    host = SSHHost("silentbox", known_hosts=str(tmp_path / "kh"), system_known_hosts=False)
    assert host.connect_timeout == 1.0
    with pytest.raises(HostError) as exc:
        host.run(["true"])
    message = str(exc.value)
    assert message.startswith(f"silentbox (root@127.0.0.1:{peer}): cannot connect: no SSH banner")
    assert 1.0 <= elapsed_in(message) < 10


def test_failing_proxy_command_says_what_it_said(tmp_path: Path) -> None:
    """A ProxyCommand that dies (no route, a typo) is reported with its exit status and
    the last line of its stderr, in one line."""
    config = tmp_path / "config"
    config.write_text(
        "Host viaproxy\n  HostName 192.0.2.1\n"
        "  ProxyCommand sh -c 'echo \"channel 0: open failed: no route to %h\" >&2; exit 3'\n"
    )
    host = SSHHost("viaproxy", ssh_config=str(config), known_hosts=str(tmp_path / "kh"))
    with pytest.raises(HostError) as exc:
        host.run(["true"])
    message = str(exc.value)
    assert message.startswith("viaproxy (root@192.0.2.1:22): cannot connect: the ProxyCommand")
    took = elapsed_in(message)
    assert message.endswith(
        f"exited with status 3 after {took} s: channel 0: open failed: no route to 192.0.2.1"
    )
