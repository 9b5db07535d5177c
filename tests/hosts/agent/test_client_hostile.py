"""A compromised container cannot exhaust gpudoctor's memory or hold it past a deadline.

Each test replaces the agent with a REAL hostile process (tests/fakes/hostile_agent.py,
run exactly as an agent is: a subprocess whose pipes carry the protocol) and performs one
attack on the real client path (:class:`gpudoctor.hosts.agent.client.AgentHost`). gpudoctor's
peak RSS is sampled (psutil) while the attack runs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpudoctor.hosts.agent import client
from gpudoctor.hosts.agent.client import AgentHost, ProcessStream
from gpudoctor.hosts.agent.replies import BadReply
from gpudoctor.hosts.base import HostError

HOSTILE = Path(__file__).parents[2] / "fakes" / "hostile_agent.py"
MIB = 1 << 20


class PeakRss:
    """Samples this process's RSS every 5 ms in a thread; ``growth`` is peak - start."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.start = self.proc.memory_info().rss
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.start


@pytest.fixture
def hostile() -> Iterator[Callable[..., tuple[AgentHost, list[ProcessStream]]]]:
    """Return ``make(mode, **AgentHost kwargs) -> (host, streams started)``."""
    made: list[AgentHost] = []

    def make(mode: str, **kwargs: Any) -> tuple[AgentHost, list[ProcessStream]]:
        streams: list[ProcessStream] = []

        def start() -> ProcessStream:
            streams.append(ProcessStream([sys.executable, str(HOSTILE), mode]))
            return streams[-1]

        host = AgentHost(start, name="ct666", **kwargs)
        made.append(host)
        return host, streams

    yield make
    for host in made:
        host.close()


def assert_dead(stream: ProcessStream) -> None:
    """The hostile process was killed (and reaped), not left running."""
    stream.proc.wait(10)
    assert stream.proc.returncode is not None


def test_endless_line_is_cut_at_the_line_bound(hostile: Callable[..., Any]) -> None:
    """Attack: the agent answers with an endless line (no newline, ever). Blocked: the
    client reads at most MAX_LINE (16 MiB), stops and kills the agent."""
    host, streams = hostile("endless-line")
    with PeakRss() as rss, pytest.raises(HostError, match=r"ct666: .*longer than 16 MiB"):
        host.stat("/dev/null")
    assert_dead(streams[0])
    assert rss.growth < 100 * MIB, rss.growth


def test_huge_reply_is_refused(hostile: Callable[..., Any]) -> None:
    """Attack: a well-formed reply line of 40 MiB. Blocked by the line bound."""
    host, streams = hostile("huge-reply")
    with PeakRss() as rss, pytest.raises(HostError, match=r"longer than 16 MiB"):
        host.read_text("/etc/hostname")
    assert_dead(streams[0])
    assert rss.growth < 100 * MIB, rss.growth


def test_flood_of_lines_is_stopped_at_the_stream_bound(
    hostile: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: endless valid lines for ids nobody asked about (each one small). Blocked by
    the total bound per agent (MAX_STREAM, lowered here to 8 MiB to keep the test short)."""
    monkeypatch.setattr(client, "MAX_STREAM", 8 * MIB)
    host, streams = hostile("flood")
    with PeakRss() as rss, pytest.raises(HostError, match=r"more than 8 MiB"):
        host.stat("/dev/null")
    assert_dead(streams[0])
    assert rss.growth < 100 * MIB, rss.growth


def test_silent_agent_is_killed_at_the_deadline(hostile: Callable[..., Any]) -> None:
    """Attack: the agent never answers (a hang or a stall). Blocked: the call ends at its
    deadline with a clear error and the agent is KILLED, so nothing is read after it."""
    host, streams = hostile("silent", call_timeout=0.5)
    with pytest.raises(
        HostError, match=r"ct666: stat got no answer within 0\.5 s; the agent was stopped"
    ):
        host.stat("/dev/null")
    assert_dead(streams[0])
    assert streams[0].proc.returncode == -9


def test_endless_hello_is_refused(hostile: Callable[..., Any]) -> None:
    """Attack: instead of its hello line the agent sends an endless line."""
    host, streams = hostile("endless-hello")
    with PeakRss() as rss, pytest.raises(HostError, match=r"ct666: .*longer than 16 MiB"):
        host.stat("/")
    assert_dead(streams[0])
    assert rss.growth < 100 * MIB, rss.growth


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("extra-key", r"ct666: stat: bad reply from the agent: unknown key\(s\) evil"),
        ("missing-key", r"ct666: stat: bad reply from the agent: missing key\(s\) mode"),
        (
            "wrong-type",
            r"ct666: stat: bad reply from the agent: wrong type for mode \(want int, got str\)",
        ),
    ],
)
def test_reply_schema_is_enforced(hostile: Callable[..., Any], mode: str, message: str) -> None:
    """Attack: a stat reply with an unknown key, a missing key or a mistyped value (what
    ``FileStat(**reply)`` would have taken or crashed on). Blocked: a clear BadReply."""
    host, _ = hostile(mode)
    with pytest.raises(BadReply, match=message):
        host.stat("/dev/null")


def shell_agent(script: str, **kwargs: Any) -> tuple[AgentHost, list[ProcessStream]]:
    """An AgentHost whose CT side is a hostile REAL shell posing as the sh agent (it
    answers the hello with the client's terminator, then runs ``script``)."""
    from gpudoctor.hosts.agent.shell import ShellConnection

    streams: list[ProcessStream] = []
    prelude = 'read -r T; printf "%s hello $$\\n" "$T"; read -r request; '

    def start() -> ProcessStream:
        streams.append(ProcessStream(["sh", "-c", prelude + script]))
        return streams[-1]

    host = AgentHost(start, name="ct667", connect=ShellConnection, **kwargs)
    return host, streams


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("yes | tr -d '\\n'", r"ct667: .*longer than 16 MiB"),
        (
            "yes \"$(head -c 65000 /dev/zero | tr '\\0' a)\"",
            r"ct667: the shell agent sent more than asked",
        ),
    ],
    ids=["endless-line", "flood"],
)
def test_hostile_shell_agent_is_bounded(script: str, message: str) -> None:
    """Attack: the sh agent (a CT without python3) answers a stat with an endless line,
    or with endless 64 KiB lines before any terminator. Blocked: at most 16 MiB is read,
    then the agent is killed."""
    host, streams = shell_agent(script)
    try:
        with PeakRss() as rss, pytest.raises(HostError, match=message):
            host.stat("/dev/null")
        assert_dead(streams[0])
        assert rss.growth < 100 * MIB, rss.growth
    finally:
        host.close()


def test_silent_shell_agent_is_killed_at_the_deadline() -> None:
    """Attack: the sh agent never answers. Blocked: the call ends at its deadline and the
    agent is killed."""
    host, streams = shell_agent("sleep 3600", call_timeout=0.5)
    try:
        with pytest.raises(
            HostError, match=r"ct667: stat got no answer within 0\.5 s; the agent was stopped"
        ):
            host.stat("/dev/null")
        assert_dead(streams[0])
    finally:
        host.close()


def test_a_stream_whose_command_fails_at_once_closes_without_a_thread_error():
    """`lxc-attach` that cannot even start (a missing shared library, seen on the H200:
    "error while loading shared libraries: libapparmor.so.1") exits at once with a line on
    stderr. Closing the stream must not close the stderr pipe under its drain thread
    ("Thread-1 (_drain_stderr) failed: ValueError: I/O operation on closed file")."""
    import threading

    from gpudoctor.hosts.agent.streams import ProcessStream

    failures: list[BaseException] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: failures.append(args.exc_value)
    try:
        for _ in range(20):  # the race needs the close to win now and then
            stream = ProcessStream(["sh", "-c", "echo 'cannot open shared object' >&2; exit 127"])
            assert stream.readline(100) == b""
            stream.close()
            stream._stderr_thread.join(2)
            assert "cannot open shared object" in stream._stderr.decode()
    finally:
        threading.excepthook = previous
    assert failures == []
