"""The agent protocol gives the same answers as LocalHost for the same paths.

The agent runs as a real local subprocess (``python3 -I -c BOOTSTRAP``, source sent on
stdin), exactly as it runs over SSH or inside a container.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
from pathlib import Path

import pytest

from gpudoctor.hosts.agent import server as agent_mod
from gpudoctor.hosts.agent.client import AgentHost, ProcessStream, agent_command, local_agent_host
from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.local import LocalHost

OLD_PYTHON = Path("/root/.pyenv/versions/3.6.15/bin/python3.6")


@pytest.fixture
def agent() -> AgentHost:
    host = local_agent_host(python=sys.executable)
    yield host
    host.close()


@pytest.fixture
def local() -> LocalHost:
    return LocalHost()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "b.txt").write_text("bee")
    (tmp_path / "dir" / ".hidden").write_text("")
    (tmp_path / "file.txt").write_text("héllo\nworld\n")
    (tmp_path / "link").symlink_to(tmp_path / "file.txt")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return tmp_path


def paths_to_compare(tree: Path) -> list[str]:
    paths = ["/dev/null", "/dev/zero", str(tree / "dir"), str(tree / "file.txt")]
    paths.append(str(tree / "link"))
    if os.path.exists("/dev/kvm"):
        paths.append("/dev/kvm")
    return paths


def test_stat_matches_localhost(agent: AgentHost, local: LocalHost, tree: Path) -> None:
    for path in paths_to_compare(tree):
        assert agent.stat(path) == local.stat(path), path
    kvm = "/dev/kvm"
    if os.path.exists(kvm):
        st = agent.stat(kvm)
        assert (st.kind, st.major, st.minor) == ("char", 10, 232)


def test_stat_follows_symlinks(agent: AgentHost, tree: Path) -> None:
    assert agent.stat(str(tree / "link")).kind == "file"
    assert agent.stat(str(tree / "link")).size == len("héllo\nworld\n".encode())


@pytest.mark.parametrize(
    ("relative", "error"),
    [
        ("missing", FileNotFoundError),
        ("dangling", FileNotFoundError),
        ("file.txt/below", NotADirectoryError),
    ],
)
def test_stat_errors_are_the_same_oserror(
    agent: AgentHost, local: LocalHost, tree: Path, relative: str, error: type
) -> None:
    path = str(tree / relative)
    with pytest.raises(error) as remote_exc:
        agent.stat(path)
    with pytest.raises(error) as local_exc:
        local.stat(path)
    assert remote_exc.value.errno == local_exc.value.errno
    assert remote_exc.value.filename == path
    assert remote_exc.value.strerror == local_exc.value.strerror


def test_try_open_matches_localhost(agent: AgentHost, local: LocalHost, tree: Path) -> None:
    cases = [*paths_to_compare(tree), str(tree / "missing"), "/proc/self/nope"]
    for path in cases:
        for write in (True, False):
            assert agent.try_open(path, write) == local.try_open(path, write), (path, write)
    assert agent.try_open("/dev/null").ok
    assert agent.try_open(str(tree / "missing")).errname == "ENOENT"
    assert agent.try_open(str(tree / "dir"), write=True).errname == "EISDIR"


def test_read_text_matches_localhost(agent: AgentHost, local: LocalHost, tree: Path) -> None:
    for path in (str(tree / "file.txt"), "/proc/devices", "/etc/hostname"):
        if os.path.exists(path):
            assert agent.read_text(path) == local.read_text(path)
    assert agent.read_text(str(tree / "file.txt"), limit=3) == local.read_text(
        str(tree / "file.txt"), limit=3
    )
    with pytest.raises(IsADirectoryError):
        agent.read_text(str(tree / "dir"))
    with pytest.raises(FileNotFoundError):
        agent.read_text(str(tree / "missing"))


def test_list_dir_and_disk_usage(agent: AgentHost, local: LocalHost, tree: Path) -> None:
    assert agent.list_dir(str(tree / "dir")) == [".hidden", "b.txt"]
    assert agent.list_dir("/dev") == local.list_dir("/dev")
    with pytest.raises(NotADirectoryError):
        agent.list_dir(str(tree / "file.txt"))
    remote, here = agent.disk_usage(str(tree)), local.disk_usage(str(tree))
    assert remote.total == here.total
    assert 0 <= remote.free <= remote.total
    assert 0 < remote.used <= remote.total


def test_run_matches_localhost(agent: AgentHost, local: LocalHost) -> None:
    argv = ["sh", "-c", 'read line; echo "out:$line"; echo err >&2; exit 3']
    remote, here = agent.run(argv, input="hi\n"), local.run(argv, input="hi\n")
    assert (remote.returncode, remote.stdout, remote.stderr) == (3, "out:hi\n", "err\n")
    assert (here.returncode, here.stdout, here.stderr) == (3, "out:hi\n", "err\n")
    assert remote.argv == tuple(argv)
    missing = agent.run(["/nonexistent/program", "x"])
    assert missing.returncode == 127
    assert "No such file" in missing.stderr


def test_run_timeout_kills_the_whole_process_group(agent: AgentHost, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; wait"
    result = agent.run(["sh", "-c", script], timeout=1.0)
    assert result.timed_out
    assert not result.ok
    child = int(pidfile.read_text())
    # The background grandchild was in the killed group: it is gone (or a zombie).
    state = Path(f"/proc/{child}/stat")
    assert not state.exists() or state.read_text().split()[2] == "Z"


def test_calls_are_served_concurrently(agent: AgentHost, tmp_path: Path) -> None:
    """A blocked ``run`` does not hold up other calls from other threads."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    results: list[object] = []
    runner = threading.Thread(target=lambda: results.append(agent.run(["cat", str(fifo)])))
    runner.start()
    stats = []
    workers = [
        threading.Thread(target=lambda: stats.append(agent.stat("/dev/null"))) for _ in range(8)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(20)
    assert len(stats) == 8
    assert runner.is_alive()  # still blocked on the fifo while the stats were answered
    with open(fifo, "w") as writer:
        writer.write("released\n")
    runner.join(20)
    assert results[0].stdout == "released\n"


def test_broken_agent_raises_host_error_then_restarts(agent: AgentHost) -> None:
    first_pid = agent.ping()["pid"]
    os.kill(first_pid, 9)
    with pytest.raises(HostError, match=r"lost|cannot send"):
        for _ in range(50):  # the reader notices EOF; a call fails with HostError
            agent.stat("/dev/null")
    assert agent.stat("/dev/null").kind == "char"  # the next call starts a fresh agent
    assert agent.ping()["pid"] != first_pid


def test_agent_that_cannot_start_is_a_clear_error() -> None:
    host = AgentHost(lambda: ProcessStream(["/nonexistent/python3", "-I"]), name="box")
    with pytest.raises(HostError, match="box: cannot start /nonexistent/python3"):
        host.stat("/")
    broken = AgentHost(
        lambda: ProcessStream(["sh", "-c", "echo 'python3: not found' >&2; exit 127"]),
        name="ct9",
    )
    with pytest.raises(HostError, match=r"ct9: .*python3: not found"):
        broken.stat("/")


def test_hung_agent_times_out_and_the_next_call_gets_a_fresh_agent() -> None:
    """An agent that says hello and then never answers (a stat stuck in a hung driver)
    cannot hang the caller; the next call goes to a new agent."""
    script = 'import sys,time; print(\'{"hello": "gpudoctor-agent"}\', flush=True); time.sleep(60)'
    streams = iter(
        [
            ProcessStream([sys.executable, "-c", script]),
            ProcessStream(agent_command(sys.executable)),
        ]
    )
    host = AgentHost(lambda: next(streams), name="hung", call_timeout=0.5)
    try:
        with pytest.raises(HostError, match=r"hung: stat got no answer within 0\.5 s"):
            host.stat("/")
        assert host.stat("/dev/null").kind == "char"
    finally:
        host.close()


def test_agent_is_stdlib_only_and_python36_compatible() -> None:
    tree = ast.parse(Path(agent_mod.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert agent_command("python3")[:2] == ["python3", "-I"]


@pytest.mark.skipif(not OLD_PYTHON.exists(), reason="no Python 3.6 interpreter here")
def test_agent_runs_on_python36(tmp_path: Path) -> None:
    host = local_agent_host(python=str(OLD_PYTHON))
    try:
        assert host.ping()["python"].startswith("3.6")
        assert host.stat("/dev/null") == LocalHost().stat("/dev/null")
        assert host.run(["sh", "-c", "sleep 30"], timeout=0.5).timed_out
    finally:
        host.close()
