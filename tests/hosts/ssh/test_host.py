"""SSHHost against a real SSH server in this process (tests/hosts/ssh/inproc_sshd.py:
paramiko's server side on 127.0.0.1, running each exec request as a real ``sh -c``
process): commands with their output, status, stdin and deadline; the exec channel as a
byte stream (what the file agent speaks over); one connection reused, and made again
when the server dropped it; one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh import host as ssh_host
from gpudoctor.hosts.ssh.host import SSHHost
from tests.hosts.ssh.inproc_sshd import Policy, Server, running
from tests.hosts.ssh.test_authenticate import make_key
from tests.hosts.ssh.test_connect import BASH_TCP


@pytest.fixture
def key_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh keys of the machine's user
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    path = tmp_path / "id"
    make_key(path)
    return path


@pytest.fixture
def server(key_path: Path) -> Iterator[Server]:
    key = paramiko.ECDSAKey.from_private_key_file(str(key_path))
    with running(Policy(keys={key.asbytes()})) as started:
        yield started


@pytest.fixture
def host(server: Server, key_path: Path, tmp_path: Path) -> Iterator[SSHHost]:
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    made = SSHHost(
        f"alice@127.0.0.1:{server.port}",
        key_filename=str(key_path),
        known_hosts=str(known),
        ssh_config=None,
        system_known_hosts=False,
        connect_timeout=20,
    )
    try:
        yield made
    finally:
        made.close()


def test_a_command_gives_its_output_status_and_the_deadline_it_ran_under(
    host: SSHHost, server: Server
) -> None:
    done = host.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=12.5)
    assert (done.argv, done.returncode, done.stdout, done.stderr, done.timed_out) == (
        ("sh", "-c", "echo out; echo err >&2; exit 3"),
        3,
        "out\n",
        "err\n",
        False,
    )
    assert done.duration_s > 0
    assert server.commands == ["timeout -k 2 12.5 sh -c 'echo out; echo err >&2; exit 3'; exit $?"]


def test_input_reaches_the_command_and_its_end_is_seen(host: SSHHost) -> None:
    assert host.run(["cat"], input="line 1\nline 2\n").stdout == "line 1\nline 2\n"
    alone = host.run(["cat"], timeout=60)  # no input: stdin is closed at once, cat ends
    assert (alone.returncode, alone.stdout, alone.timed_out) == (0, "", False)


def test_a_stderr_flood_is_kept_to_64_kib(host: SSHHost) -> None:
    done = host.run(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x >&2; echo fine"])
    assert done.stdout == "fine\n"
    assert done.stderr == "x" * 65536  # the first 64 KiB, to the byte


def test_a_missing_program_is_127(host: SSHHost) -> None:
    assert host.run(["/no/such/program"]).returncode == 127


def test_a_command_past_its_timeout_is_stopped_and_says_so(host: SSHHost) -> None:
    late = host.run(["sleep", "30"], timeout=0.5)
    assert (late.returncode, late.timed_out) == (124, True)
    assert late.duration_s >= 0.475
    on_its_own = host.run(["sh", "-c", "exit 124"], timeout=30)  # 124, but not late
    assert (on_its_own.returncode, on_its_own.timed_out) == (124, False)


def test_a_command_whose_status_never_comes_is_given_up_by_the_client(
    host: SSHHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote side keeps the channel past the command's timeout and grace (a hung
    sshd): the client stops waiting, closes the channel, and reports -9, timed out."""
    monkeypatch.setattr(ssh_host, "RUN_GRACE", -29.5)  # wait 0.5 s of the 30 s
    late = host.run(["sleep", "30"], timeout=30)
    assert (late.returncode, late.timed_out, late.stdout) == (-9, True, "")


def test_what_a_command_printed_before_its_status_stopped_coming_is_kept(
    host: SSHHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, after the command wrote a line and an error: both are in the result."""
    monkeypatch.setattr(ssh_host, "RUN_GRACE", -28.0)  # wait 2 s of the 30 s
    late = host.run(["sh", "-c", "echo started; echo oops >&2; exec sleep 30"], timeout=30)
    assert (late.returncode, late.timed_out, late.stdout, late.stderr) == (
        -9, True, "started\n", "oops\n")  # fmt: skip


def test_one_connection_serves_every_call_and_is_made_again_when_dropped(
    host: SSHHost, server: Server
) -> None:
    assert host.connect() is host
    host.run(["true"])
    host.run(["true"])
    assert len(server.transports) == 1
    server.transports[0].close()  # sshd restarted
    assert server.wait_closed()
    client = host._conn.transport  # type: ignore[union-attr]
    client.join(30)  # the client has seen the connection end
    assert not client.is_active()
    assert host.run(["echo", "again"]).stdout == "again\n"
    assert len(server.transports) == 2
    host.close()
    assert server.wait_closed()


def test_the_exec_channel_is_a_byte_stream(host: SSHHost) -> None:
    stream = host.open_stream(["sh", "-c", "cat; echo done >&2"])
    stream.write(b"first line\nsecond")
    assert stream.readline(100) == b"first line\n"
    assert stream.read_some(3) == b"sec"
    assert stream.read_some(100) == b"ond"
    stream.write(b"12345678")
    stream.channel.shutdown_write()
    assert stream.read_all(limit=4) == b"1234"  # the rest read and dropped
    assert stream.channel.recv_exit_status() == 0
    assert stream.stderr_text() == "done\n"
    stream.close()
    assert stream.channel.closed


def test_a_stream_gives_a_long_line_in_pieces_and_bytes_as_they_come(host: SSHHost) -> None:
    stream = host.open_stream(["cat"])
    try:
        stream.write(b"z")
        assert stream.read_some(10) == b"z"  # nothing buffered: straight from the channel
        stream.write(b"0123456789\n")
        assert stream.readline(4) == b"0123"  # never more than the limit
        assert stream.readline(100) == b"456789\n"
    finally:
        stream.close()


def test_a_stdout_flood_is_kept_to_the_limit_and_read_to_its_end(host: SSHHost) -> None:
    """300 kB over several SSH packets, 100 kB kept (the rest read and dropped, so the
    command is not blocked on a full channel); stderr that is not UTF-8 shown replaced."""
    flood = "head -c 300000 /dev/zero | tr '\\0' y; printf '\\303\\251\\377' >&2"
    stream = host.open_stream(["sh", "-c", flood])
    try:
        assert stream.read_all(limit=100_000) == b"y" * 100_000
        assert stream.channel.recv_exit_status() == 0
        assert stream.stderr_text() == "\u00e9\ufffd"
    finally:
        stream.close()


def test_a_stream_is_closed_quietly_after_its_connection_died(
    host: SSHHost, server: Server
) -> None:
    stream = host.open_stream(["sleep", "30"])
    server.transports[0].close()  # sshd gone
    client = host._conn.transport  # type: ignore[union-attr]
    client.join(30)  # the client has seen the connection end
    assert not client.is_active()
    stream.close()  # no OSError/EOFError from the dead connection
    assert stream.channel.closed


def test_closing_a_stream_closes_its_channel_while_the_command_runs(host: SSHHost) -> None:
    stream = host.open_stream(["sleep", "30"])
    stream.close()
    assert stream.channel.closed


def test_a_closed_host_can_be_used_again_files_too(host: SSHHost, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x")
    assert host.files.read_text(str(tmp_path / "f.txt")) == "x"
    host.close()
    assert host.files.read_text(str(tmp_path / "f.txt")) == "x"  # a new agent, a new connection
    assert host.run(["echo", "back"]).stdout == "back\n"


def test_a_dead_connection_stops_its_proxy_command_before_the_next(
    server: Server, key_path: Path, tmp_path: Path
) -> None:
    """Through a ProxyCommand that outlives its connection (and ignores TERM): when the
    transport has died, the next call connects anew and the old proxy is stopped, not
    left behind."""
    bridge = BASH_TCP.replace("%h", "127.0.0.1").replace("%p", str(server.port))
    config = tmp_path / "config"
    config.write_text(
        f"Host box\n  HostName 127.0.0.1\n  Port {server.port}\n"
        f"  ProxyCommand sh -c \"trap '' TERM; {bridge}; exec sleep 60\"\n"
    )
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    host = SSHHost(
        "alice@box",
        key_filename=str(key_path),
        known_hosts=str(known),
        ssh_config=str(config),
        system_known_hosts=False,
    )
    try:
        host.run(["true"])
        first = host._conn
        assert first is not None and first.proxy is not None
        first.transport.close()  # the transport died (a protocol error, a lost keepalive)
        assert host.run(["echo", "anew"]).stdout == "anew\n"
        assert first.proxy.returncode == -9  # stopped (TERM ignored: killed) and reaped
    finally:
        host.close()


def test_a_stream_can_be_abandoned_at_once(host: SSHHost) -> None:
    stream = host.open_stream(["sleep", "30"])
    stream.abort()
    assert stream.channel.closed
    assert host.run(["echo", "still"]).stdout == "still\n"  # the connection is fine


def test_file_operations_go_through_the_agent_over_the_channel(
    host: SSHHost, server: Server, tmp_path: Path
) -> None:
    (tmp_path / "remote.txt").write_text("on the other side\n")
    assert host.files.read_text(str(tmp_path / "remote.txt")) == "on the other side\n"
    assert server.commands[0].startswith("python3 -I -c ")


def test_a_refused_channel_is_one_line(key_path: Path, tmp_path: Path) -> None:
    key = paramiko.ECDSAKey.from_private_key_file(str(key_path))
    with running(Policy(keys={key.asbytes()}, sessions=False)) as server:
        known = tmp_path / "known_hosts"
        known.write_text(server.known_hosts_line())
        spec = f"alice@127.0.0.1:{server.port}"
        host = SSHHost(
            spec,
            key_filename=str(key_path),
            known_hosts=str(known),
            ssh_config=None,
            system_known_hosts=False,
        )
        try:
            with pytest.raises(HostError) as exc:
                host.run(["true"])
        finally:
            host.close()
    assert str(exc.value) == f"{spec}: cannot open an SSH channel: Administratively prohibited"


@pytest.mark.parametrize(
    ("given", "config", "used"), [(3.0, "7", 3.0), (None, "7", 7.0), (None, None, 10.0)]
)
def test_the_connect_timeout_is_the_given_one_else_the_configs_else_10_s(
    tmp_path: Path, given: float | None, config: str | None, used: float
) -> None:
    path = tmp_path / "config"
    path.write_text(f"Host box\n  ConnectTimeout {config}\n" if config else "")
    host = SSHHost("box", ssh_config=str(path), connect_timeout=given)
    assert host.connect_timeout == used
