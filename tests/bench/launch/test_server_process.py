"""One server process, never orphaned (gpudoctor/bench/launch/server.py), in-process and
fast: a free port (in a range, avoiding ports handed out), the log's last lines (never
through a link), readiness and its log line, a server that exits or never answers, a stop
that takes the whole process group and every tagged straggler, the guardian that kills a
launch's processes when the launcher goes, a server the user started.

Real short-lived processes (``sh``, ``sleep``, Python one-liners), each reaped by the
test that starts it; the readiness probe is a function the test controls (what the
engine's ``GET /health`` answers)."""

from __future__ import annotations

import ctypes
import io
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpudoctor.bench.launch import interrupts
from gpudoctor.bench.launch import server as server_mod
from gpudoctor.bench.launch.server import (
    TAG_VAR,
    ExternalServer,
    Guardian,
    NoFreePort,
    ServerCrashed,
    ServerProcess,
    free_port,
    reap,
    tagged_processes,
    tail_lines,
)
from tests.support.signals import default_signals, status_signals

WAIT_S = 60.0  # an event that never comes fails the test (not a timing assumption)


@pytest.fixture
def tag(request: pytest.FixtureRequest) -> str:
    """A tag no other test's process carries."""
    return f"gdb-test-{os.getpid()}-{request.node.name[:40]}:"


def _gone(pid: int) -> bool:
    """Return True once ``pid`` no longer runs (a zombie counts as gone)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


# --- free ports ---------------------------------------------------------------------------


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_any_free_port_can_be_bound() -> None:
    port = free_port()
    assert port >= 1024  # the kernel's pick (bind to port 0), never a fixed low port
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_port_of_the_range_is_free_not_held_and_not_avoided() -> None:
    held = _listening()
    try:
        low = held.getsockname()[1]
        if low > 65533:
            pytest.skip("the kernel gave a port at the top of the range")
        avoided = low + 1
        found = set()
        for seed in range(20):
            random.seed(seed)
            found.add(free_port(port_range=(low, low + 2), avoid=frozenset({avoided})))
        assert found == {low + 2}
        spread = set()
        for seed in range(40):  # every port of a free range is handed out, from a random one
            random.seed(seed)
            spread.add(free_port(port_range=(low + 1, low + 3)))
        assert spread == {low + 1, low + 2, low + 3}
    finally:
        held.close()


def test_a_range_with_no_free_port_is_one_line() -> None:
    held = _listening()
    try:
        port = held.getsockname()[1]
        with pytest.raises(NoFreePort) as none:
            free_port(port_range=(port, port + 1), avoid=frozenset({port + 1}))
        assert str(none.value) == (
            f"no free port in engine.port_range {port}-{port + 1} (2 port(s), all in use on"
            " 127.0.0.1): widen the range or stop what listens there (ss -ltnp)"
        )
    finally:
        held.close()


# --- the log's last lines --------------------------------------------------------------------


def test_the_last_lines_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(80)) + b"bad \xff byte\n")
    assert tail_lines(log, 3) == ["line 78", "line 79", "bad \ufffd byte"]
    assert len(tail_lines(log)) == 50 and tail_lines(log)[0] == "line 31"
    log.write_text("Loading weights\nCUDA out of memory\n")
    assert tail_lines(log) == ["Loading weights", "CUDA out of memory"]  # from its first byte


def test_only_the_last_256_kib_of_a_huge_log_are_read(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"first\n" + b"x" * (256 * 1024) + b"\nlast\n")
    lines = tail_lines(log, 1000)
    assert lines[-1] == "last" and "first" not in lines
    assert len(lines[0]) == 256 * 1024 - len(b"\nlast\n")


def test_a_missing_log_or_a_link_gives_no_lines(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0\n")
    link = tmp_path / "server.log"
    link.symlink_to(secret)
    assert tail_lines(link) == [] and tail_lines(tmp_path / "none.log") == []


# --- tagged processes ------------------------------------------------------------------------


def _sleeper(tag: str, ignore_term: bool = False, new_session: bool = True,
             on_term: Path | None = None) -> subprocess.Popen:  # fmt: skip
    code = "import signal, sys, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    if on_term is not None:  # asked to stop: say so, then exit
        code += (f"def bye(*_):\n    open({str(on_term)!r}, 'w').close()\n    sys.exit(0)\n"
                 "signal.signal(signal.SIGTERM, bye)\n")  # fmt: skip
    code += "print('up', flush=True)\ntime.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, TAG_VAR: tag},
                            stdout=subprocess.PIPE, start_new_session=new_session,
                            preexec_fn=default_signals)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # handlers set
    return proc


def test_reap_ends_every_process_of_a_tag_and_only_those(tag: str, tmp_path: Path) -> None:
    asked = tmp_path / "asked-to-stop"
    mine = _sleeper(tag + "slot1/", on_term=asked)
    stubborn = _sleeper(tag + "slot2/", ignore_term=True)
    other = _sleeper("gdb-test-other:" + tag)
    try:
        found = sorted(p.pid for p in tagged_processes(tag))
        assert found == sorted([mine.pid, stubborn.pid])
        assert reap(tag, grace_s=0.2) == 2
        assert _gone(mine.pid) and _gone(stubborn.pid)  # reaped by reap() (our children)
        assert asked.exists()  # SIGTERM first: a server may shut down cleanly
        assert other.poll() is None and tagged_processes(tag) == []
        assert reap(tag) == 0
    finally:
        for proc in (mine, stubborn, other):
            proc.kill()
            proc.wait(WAIT_S)


def test_a_launcher_with_the_tag_does_not_count_itself(tag: str) -> None:
    code = ("from gpudoctor.bench.launch.server import tagged_processes, reap\n"
            f"print(len(tagged_processes({tag!r})), reap({tag!r}))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, TAG_VAR: tag},
                          capture_output=True, text=True, timeout=WAIT_S)  # fmt: skip
    assert done.stdout == "0 0\n", done.stderr


def test_an_empty_prefix_matches_no_untagged_process() -> None:
    for proc in tagged_processes(""):
        try:
            tag = proc.environ().get(TAG_VAR)
        except psutil.Error:  # it ended meanwhile
            continue
        assert tag, proc


# --- one server process ----------------------------------------------------------------------


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "logs" / "a@tp1.log"
    path.parent.mkdir()
    path.write_text("an earlier launch: Application startup complete\n")
    return path


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """The servers a test starts, stopped (and reaped) after it."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.stop(grace_s=1)


def _server(started: list[ServerProcess], script: str, log: Path, tag: str,
            env: dict[str, str] | None = None) -> ServerProcess:  # fmt: skip
    server = ServerProcess(["sh", "-c", script], env or {}, log, tag)
    started.append(server)
    return server


def test_a_server_gets_its_environment_its_own_session_and_a_log_of_its_own(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    script = 'echo "$GPU_ENV $GPUDOCTOR_BENCH_TAG"; echo ready > "$0.flag"; exec sleep 600'
    server = ServerProcess(["sh", "-c", script, str(log)], {"GPU_ENV": "GPU-a"}, log, tag)
    started.append(server)
    flag = Path(str(log) + ".flag")
    assert server.wait_ready(flag.exists, WAIT_S) >= 0
    text = log.read_text()
    assert text.startswith("an earlier launch: Application startup complete\n")
    assert f"\n### gpudoctor bench: sh -c {script} {log}\n" in text
    assert text.endswith(f"GPU-a {tag}\n")
    assert server.alive() and server.returncode is None
    assert os.getpgid(server.pid) == server.pid and os.getsid(server.pid) == server.pid
    assert server.tail(1) == [f"GPU-a {tag}"]
    assert len(server.tail()) == 4  # the whole log (less than 50 lines)
    assert server.argv == ["sh", "-c", script, str(log)]
    assert os.readlink(f"/proc/{server.pid}/fd/0") == "/dev/null"  # never the user's terminal
    assert server.log_ready_s is None  # no ready line asked for: none noted


def test_a_servers_tail_is_its_last_50_lines(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    script = 'i=0; while [ $i -lt 80 ]; do echo "line $i"; i=$((i+1)); done; echo done > "$0.flag"'
    server = ServerProcess(["sh", "-c", script, str(log)], {}, log, tag)
    started.append(server)
    server.wait_exit(WAIT_S)
    assert server.tail() == [f"line {i}" for i in range(30, 80)]


def test_the_log_is_read_a_chunk_at_a_time_each_byte_once(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    server = _server(started, "printf 'abcdefghijklmnopqrstuvwxyz'", log, tag)
    server.wait_exit(WAIT_S)
    never = re.compile("never printed")
    server._scan_log(never, chunk=10)
    server._scan_log(never, chunk=10)
    assert server.log_bytes_read == 20  # two reads of at most 10 bytes, none read twice
    server._scan_log(never, chunk=10)
    assert server.log_bytes_read == 26 and server.log_ready_s is None


def test_bytes_that_are_not_utf8_do_not_hide_the_ready_line(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    script = "printf 'weights \\377\\376 loaded\\nINFO: Application startup complete.\\n'; exec sleep 600"
    server = _server(started, script, log, tag)
    server.wait_ready(lambda: log.read_text(errors="replace").endswith("complete.\n"), WAIT_S,
                      "Application startup complete")  # fmt: skip
    assert b"\377\376" in log.read_bytes() and server.log_ready_s is not None


def test_readiness_notes_when_the_ready_line_shows_in_this_servers_log_only(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    server = _server(started, "echo starting; exec sleep 600", log, tag)
    assert server.wait_ready(lambda: "starting" in log.read_text(), WAIT_S,
                             "Application startup complete") > 0  # fmt: skip
    assert server.log_ready_s is None  # the earlier launch's line is not this server's
    ready = _server(started, "printf 'INFO: Application startup complete'; exec sleep 600",
                    log, tag)  # fmt: skip
    seconds = ready.wait_ready(lambda: log.read_text().endswith("complete"), WAIT_S,
                               "Application startup complete")  # fmt: skip
    assert ready.log_ready_s is not None and 0 < ready.log_ready_s <= seconds
    assert seconds <= time.monotonic() - ready.started_at  # seconds since start, not a clock


def test_the_ready_line_is_found_after_many_lines(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    script = ("i=0; while [ $i -lt 300 ]; do echo noise $i; i=$((i+1)); done; echo Uvicorn running on;"
              " i=0; while [ $i -lt 300 ]; do echo after ................................................ $i; i=$((i+1)); done; exec sleep 600")  # fmt: skip
    server = _server(started, script, log, tag)
    server.wait_ready(lambda: log.read_text().endswith(". 299\n"), WAIT_S,
                      "Uvicorn running on")  # fmt: skip
    assert server.log_ready_s is not None
    assert 0 < server.log_bytes_read <= log.stat().st_size - server._log_start  # once each


def test_a_server_that_exits_during_startup_says_its_code_and_last_lines(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    server = _server(started, "echo 'CUDA out of memory' >&2; exit 3", log, tag)
    with pytest.raises(ServerCrashed) as crashed:
        server.wait_ready(lambda: False, WAIT_S)
    assert str(crashed.value) == "server exited with code 3 during startup"
    assert crashed.value.returncode == 3 and crashed.value.tail[-1] == "CUDA out of memory"
    assert not server.alive() and server.returncode == 3


def test_a_crashed_start_is_named_by_the_engines_own_error_line(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    """Issue 45.8: the reason carries the engine's last exception line, not only the code."""
    script = "echo 'Traceback (most recent call last):'; echo '  File \"x\"'; echo 'ValueError: bad len' >&2; exit 1"
    server = _server(started, script, log, tag)
    with pytest.raises(ServerCrashed) as crashed:
        server.wait_ready(lambda: False, WAIT_S)
    assert str(crashed.value) == "server exited with code 1 during startup: ValueError: bad len"
    assert crashed.value.tail[-1] == "ValueError: bad len"


def test_the_log_directory_is_made_and_one_another_user_can_write_is_refused(
    tmp_path: Path, tag: str, started: list[ServerProcess]
) -> None:
    log = tmp_path / "run" / "logs" / "a@tp1.log"
    started.append(ServerProcess(["true"], {}, log, tag))
    assert log.read_text().startswith("\n### gpudoctor bench: true\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # any user could swap the log for a link
    with pytest.raises(OSError):
        ServerProcess(["true"], {}, shared / "a.log", tag)
    assert not (shared / "a.log").exists()


def test_a_server_not_ready_in_time_is_stopped(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    server = _server(started, "echo waiting; echo 'ERROR [x.py:1] stuck'; exec sleep 600", log, tag)
    with pytest.raises(ServerCrashed) as crashed:
        server.wait_ready(lambda: False, 0.3)
    assert str(crashed.value) == "server not ready after 0 s: stuck"
    assert crashed.value.returncode is None and "waiting" in crashed.value.tail
    assert server.returncode == -signal.SIGTERM


def test_stop_takes_the_whole_group_and_kills_what_ignores_sigterm(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    script = ("trap '' TERM; env -u GPUDOCTOR_BENCH_TAG sleep 600 & echo $! > \"$0.child\";"
              " wait")  # fmt: skip  # the grandchild carries no tag: only the group reaches it
    server = ServerProcess(["sh", "-c", script, str(log)], {}, log, tag)
    started.append(server)
    child = Path(str(log) + ".child")
    server.wait_ready(lambda: child.exists() and child.read_text().strip() != "", WAIT_S)
    grandchild = int(child.read_text())
    assert server.stop(grace_s=0.2) == -signal.SIGKILL
    assert _gone(grandchild) and not server.alive()


def test_stop_reaps_a_tagged_straggler_in_another_session(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    code = ("import subprocess, sys\n"
            "p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
            "print('straggler', p.pid, flush=True)\nimport time\ntime.sleep(600)\n")  # fmt: skip
    server = ServerProcess([sys.executable, "-c", code], {}, log, tag)
    started.append(server)

    def said() -> list[str]:
        return re.findall(r"^straggler (\d+)$", log.read_text(), re.MULTILINE)

    server.wait_ready(lambda: bool(said()), WAIT_S)
    straggler = int(said()[0])
    assert os.getpgid(straggler) != server.pid
    assert server.stop(grace_s=5) == -signal.SIGTERM
    assert _gone(straggler)


def test_wait_exit_returns_when_the_server_is_gone(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    server = _server(started, "exec sleep 600", log, tag)
    server.wait_exit(0.05)  # still running: returns after the wait
    assert server.alive()
    os.killpg(server.pid, signal.SIGKILL)
    server.wait_exit(WAIT_S)
    assert server.returncode == -signal.SIGKILL


def test_a_ctrl_c_dropped_at_the_fork_stops_the_new_server(log: Path, tag: str) -> None:
    with pytest.raises(KeyboardInterrupt):
        interrupts.handler(signal.SIGINT, None)  # Python dropped this one (at-fork callback)
    try:
        with pytest.raises(KeyboardInterrupt):
            ServerProcess(["sleep", "600"], {}, log, tag)
    finally:
        interrupts.reset()
    assert tagged_processes(tag) == []


def test_a_ctrl_c_recorded_as_it_forked_ends_the_child_before_its_exec(
    log: Path, tag: str, tmp_path: Path
) -> None:
    """47.3: a Ctrl-C recorded while Popen forks: the child leaves before it runs the
    server (exit 130); the launcher raises KeyboardInterrupt once Popen has returned."""
    ran = tmp_path / "ran"
    interrupts.reset()
    try:
        with interrupts.deferred():
            interrupts.handler(signal.SIGINT, None)
            child = subprocess.Popen(
                ["sh", "-c", f"touch {ran}"], preexec_fn=server_mod._child_setup
            )
        assert child.wait(WAIT_S) == 128 + signal.SIGINT
        assert not ran.exists()
        with interrupts.deferred():
            interrupts.handler(signal.SIGINT, None)
            with pytest.raises(KeyboardInterrupt):  # asked right after its Popen returned
                ServerProcess(["sleep", "600"], {}, log, tag)
    finally:
        interrupts.reset()
    assert tagged_processes(tag) == []


def test_a_server_starts_with_default_signal_handlers(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    """The launcher's handler (which only records while it forks) is not the child's:
    SIGINT, SIGTERM and SIGHUP are SIG_DFL in the server before its exec too."""
    code = ("import signal; print([signal.getsignal(s) == signal.SIG_DFL for s in "
            "(signal.SIGTERM, signal.SIGHUP)])")  # fmt: skip
    with interrupts.catching():
        server = ServerProcess([sys.executable, "-c", code], {}, log, tag)
        started.append(server)
        server.wait_exit(WAIT_S)
    assert "[True, True]" in server.tail()[-1]


def test_a_zombie_counts_as_gone_and_the_living_are_returned(tag: str) -> None:
    """47.3: the guardian waited its whole 10 s grace (then 5 s more) for a server that had
    exited on its SIGTERM but that its parent, the launcher, had not waited for yet: a
    zombie. It counts as gone now, and is never reaped by the waiter (its parent's wait
    gets the exit code)."""
    dead = subprocess.Popen(["sleep", "600"])
    living = subprocess.Popen(["sleep", "600"])
    server = subprocess.Popen(["sleep", "600"], env={**os.environ, TAG_VAR: tag})
    try:
        dead.kill()
        zombie = psutil.Process(dead.pid)
        assert _gone(dead.pid)  # a zombie now (not waited for)
        assert server_mod.wait_gone([zombie], timeout_s=3600) == []
        assert zombie.status() == psutil.STATUS_ZOMBIE  # not reaped by the waiter
        alive = psutil.Process(living.pid)
        assert server_mod.wait_gone([alive, zombie], timeout_s=0.0) == [alive]
        assert server_mod.wait_gone([alive], timeout_s=0.2, interval_s=0.01) == [alive]
        # the guardian's case: another process reaps our child, which its SIGTERM ends
        reaper = ("from gpudoctor.bench.launch.server import reap\n"
                  f"print(reap({tag!r}, grace_s=3600))")  # fmt: skip
        done = subprocess.run([sys.executable, "-c", reaper], capture_output=True, text=True,
                              timeout=WAIT_S)  # fmt: skip
        assert done.stdout == "1\n", done.stderr
        assert server.wait(WAIT_S) == -signal.SIGTERM
    finally:
        for proc in (dead, living, server):
            proc.kill()
            proc.wait(WAIT_S)


def test_a_server_dies_with_its_launcher(tmp_path: Path, tag: str) -> None:
    """The launcher SIGKILLed (no cleanup ran): its server gets SIGTERM from the kernel."""
    log = tmp_path / "server.log"
    code = ("import sys\nfrom pathlib import Path\n"
            "from gpudoctor.bench.launch.server import ServerProcess\n"
            f"s = ServerProcess(['sleep', '600'], {{}}, Path({str(log)!r}), {tag!r})\n"
            "print(s.pid, flush=True)\nsys.stdin.read()\n")  # fmt: skip
    launcher = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert launcher.stdout is not None
        server_pid = int(launcher.stdout.readline())
    finally:
        launcher.kill()
        launcher.wait(WAIT_S)
    assert _gone(server_pid)


# --- the guardian and a server the user started ----------------------------------------------


@pytest.mark.signals
def test_the_guardian_kills_the_launchs_processes_when_released(tag: str) -> None:
    server = _sleeper(tag + "slot1/")
    codes: list[int] = []
    waiter = threading.Thread(target=lambda: codes.append(server.wait(WAIT_S)))
    waiter.start()  # reaps the server as it dies (the guardian waits for it to be gone)
    guardian = Guardian(tag)
    try:
        assert server.poll() is None
        assert os.getsid(guardian.proc.pid) == guardian.proc.pid  # Ctrl-C's group is not its
        fds = [os.readlink(f"/proc/{guardian.proc.pid}/fd/{fd}") for fd in (0, 1, 2)]
        assert fds[0].startswith("pipe:") and fds[1:] == ["/dev/null", "/dev/null"]
        ready = time.monotonic() + WAIT_S  # its handlers are set once it has imported
        while (
            not {signal.SIGINT, signal.SIGTERM} <= status_signals(guardian.proc.pid)
            and time.monotonic() < ready
        ):
            time.sleep(0.02)
        guardian.proc.send_signal(signal.SIGTERM)  # a `kill` of the launcher's processes
        guardian.proc.send_signal(signal.SIGINT)
        guardian.close()
        waiter.join(WAIT_S)
        assert codes == [-signal.SIGTERM] and guardian.proc.returncode == 0
    finally:
        server.kill()
        waiter.join(WAIT_S)
        server.wait(WAIT_S)
        guardian.proc.kill()
        guardian.proc.wait(WAIT_S)


def test_a_server_the_user_started_is_never_ours_to_stop() -> None:
    server = ExternalServer()
    answers = iter([False, False, True])
    seconds = server.wait_ready(lambda: next(answers), WAIT_S, interval_s=0.001)
    assert 0 <= seconds <= time.monotonic() - server.started_at
    assert server.alive() and server.tail() == [] and server.stop() is None
    assert server.pid is None and server.returncode is None and server.log_ready_s is None
    server.wait_exit(WAIT_S)  # returns at once


def test_a_server_the_user_started_that_never_answers() -> None:
    server = ExternalServer()
    with pytest.raises(ServerCrashed) as crashed:
        server.wait_ready(lambda: False, 0.05, interval_s=0.01)
    assert str(crashed.value) == "no answer after 0 s" and crashed.value.tail == []
    assert crashed.value.returncode is None


def test_a_server_is_sent_sigterm_when_its_launcher_dies() -> None:
    """What each server runs between fork and exec: PR_SET_PDEATHSIG = SIGTERM (read back
    with PR_GET_PDEATHSIG; set here on this process, then cleared)."""
    libc = ctypes.CDLL(None, use_errno=True)
    got = ctypes.c_int(-1)
    try:
        server_mod._set_pdeathsig()
        assert libc.prctl(2, ctypes.byref(got)) == 0  # PR_GET_PDEATHSIG
    finally:
        libc.prctl(1, 0)  # PR_SET_PDEATHSIG 0: this test process keeps none
    assert got.value == signal.SIGTERM


def test_the_guardian_reaps_once_its_pipe_closes_and_ignores_ctrl_c(
    tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guardian's loop, run here: it reads the launcher's pipe to its end (the launcher
    exited or was killed), then ends every process of the launch; meanwhile SIGINT and
    SIGTERM are ignored (put back after the test)."""
    victim = _sleeper(tag + "slot1/")
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    pipe = io.TextIOWrapper(io.BufferedReader(io.BytesIO(b"x" * 10000)))
    monkeypatch.setattr(sys, "stdin", pipe)
    try:
        server_mod._guard(tag)
        ignored = {s: signal.getsignal(s) for s in saved}
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        victim.kill()
        victim.wait(WAIT_S)
    assert pipe.buffer.read() == b""  # read to the end
    assert ignored == {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_IGN}
    assert tagged_processes(tag) == []


def test_a_server_is_stopped_when_the_thread_that_started_it_ends(
    log: Path, tag: str, started: list[ServerProcess]
) -> None:
    """PR_SET_PDEATHSIG fires when the starting thread ends (a slot thread of a packed
    launch, or the launcher itself): its server gets SIGTERM from the kernel."""
    made: list[ServerProcess] = []
    starter = threading.Thread(target=lambda: made.append(ServerProcess(["sleep", "600"], {},
                                                                        log, tag)))  # fmt: skip
    starter.start()
    starter.join(WAIT_S)
    started.extend(made)
    (server,) = made
    assert server.proc.wait(WAIT_S) == -signal.SIGTERM
