"""The error corpus: bad invocations of every command, each as a real subprocess.

Every one must end with an exit code in {1, 2, 3, 130}, no "Traceback" on stdout or
stderr, and the documented error form as the last stderr line:
``gpudoctor: error: <what failed>; <what to do>`` (gpudoctor/errors.py). The SSH peers are
real loopback sockets: a closed port, a server that accepts then closes, and one that
accepts and never sends its banner.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli.support import ERROR_LINE, REPO, gpudoctor, last_line
from tests.support.signals import default_signals

OK_CODES = {1, 2, 3, 130}


class Peer:
    """A loopback TCP server standing for a broken SSH host: ``close`` accepts and closes
    at once (a dying sshd, a port-forwarder with no backend), ``silent`` accepts and never
    sends the SSH banner (a hung sshd, the wrong service)."""

    def __init__(self, behaviour: str) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.behaviour = behaviour
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.behaviour == "close":
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture(scope="module")
def peers():
    closing, silent = Peer("close"), Peer("silent")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]  # nothing listens there once probe is closed
    yield {"closed": closed, "close": closing.port, "silent": silent.port}
    closing.close()
    silent.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Files the invocations name: a regular file (to put paths under), bad TOML, empty
    run directories, a valid-looking plan pointing at a missing model."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "file").write_text("x\n")
    (root / "bad.toml").write_text("name = [unclosed\n")
    (root / "noplan.toml").write_text('name = "x"\n[axes]\ntp = ["one"]\n')
    (root / "run-a").mkdir()
    (root / "run-b").mkdir()
    (root / "run-b" / "results.jsonl").write_text("{not json\n")
    (root / "secret").write_text("")
    model = root / "model"
    model.mkdir()
    for name, body in (("port.toml", 'args = { port = 8000 }'), ("model.toml", 'args = { model = "x" }'),
                       ("conc.toml", "[axes]\nconcurrency = [1000000000000000000000000000000]"),
                       ("rate.toml", "[workload]\nrequest_rate = nan"),
                       ("ok.toml", "")):  # fmt: skip
        (root / name).write_text(
            f'[model]\npath = "{model}"\n[engine]\nname = "transformers"\n{body}\n'
        )
    (root / "run-link").mkdir()
    (root / "run-link" / "results.jsonl").symlink_to(root / "run-b" / "results.jsonl")
    return root


def corpus(p: dict, f: Path) -> list[tuple[list[str], set[int]]]:
    """Return (argv, allowed exit codes) for each bad invocation."""
    closed, close = p["closed"], p["close"]
    kh = ["--known-hosts", str(f / "known_hosts")]
    return [
        # check: unwritable outputs, refused before any check runs
        (["check", "-o", "/proc/x"], {1}),
        (["check", "-o", f"{f}/file/x.prom"], {1}),
        (["check", "-o", str(f)], {2}),
        (["check", "--format", "prometheus", "-o", "/proc/gpudoctor.prom"], {1}),
        (["check", "--json", "-o", "/nonexistent/dir/x.json"], {1}),
        # check: values that cannot be right
        (["check", "--timeout", "-1"], {2}),
        (["check", "--timeout", "abc"], {2}),
        (["check", "--timeout", "1e400"], {2}),  # inf: an OverflowError deep inside once
        (["check", "--timeout", "nan"], {2}),
        (["check", "--parallel", "100000"], {2}),
        (["check", "--expect-gpus", "-2"], {2}),
        (["check", "--inventory", str(f / "bad.toml"), "--parallel", "0"], {2}),
        (["check", "--inventory", str(f / "bad.toml"), "--target-timeout", "0"], {2}),
        (["check", "--cluster", "X", "--inventory", "Y"], {2}),
        (["check", "--host", "root@h", "--cluster", "X"], {2}),
        (["check", "--only", "nope"], {2}),
        (["check", "--only", "ct.device_rules"], {2}),
        (["check", "--ct", "abc"], {2}),
        (["check", "--device", "relative/path"], {2}),
        (["check", "--format", "yaml"], {2}),
        (["check", "--no-such-flag"], {2}),
        (["check", "--json", "--timeout", "-1"], {2}),
        # check: missing files, bad TOML, unreachable things
        (["check", "--inventory", "/nonexistent/hosts.toml"], {1, 2}),
        (["check", "--inventory", str(f / "bad.toml")], {1}),
        (["check", "--host", f"root@127.0.0.1:{closed}", *kh], {1}),
        (["check", "--host", f"root@127.0.0.1:{close}", *kh], {1}),
        (["check", "--host", f"root@127.0.0.1:{closed}", "--ct", "200", *kh], {1}),
        (["check", "--host", f"root@127.0.0.1:{close}", "--json", *kh], {1}),
        (["check", "--cluster", f"127.0.0.1:{closed}"], {1}),
        (
            [
                "check",
                "--cluster",
                f"127.0.0.1:{closed}",
                "--api-token-id",
                "root@pam!x",
                "--api-token-secret-file",
                str(f / "secret"),
            ],
            {2},
        ),
        (["check", "--cluster", f"127.0.0.1:{closed}", "--api-token-secret-file", "/nope"], {2}),
        # fix
        (["fix"], {2}),
        (["fix", "--cluster", "X", "--inventory", "Y"], {2}),
        (["fix", "--host", "X", "--ct", "1", "--cluster", "Z"], {2}),  # --host was dropped
        (["fix", "--host", "local", "--ct", "x", "--mode", "devn", "--flavor", "lxc"], {2}),
        (["fix", "--host", f"root@127.0.0.1:{closed}", "--ct", "200", *kh], {1}),
        (["fix", "--host", f"root@127.0.0.1:{close}", "--ct", "200", *kh], {1}),
        (["fix", "--host", f"root@127.0.0.1:{closed}", "--host-prep", *kh], {1}),
        (["fix", "--cluster", f"127.0.0.1:{closed}", "--dry-run"], {1}),
        (["fix", "--inventory", str(f / "bad.toml"), "--dry-run"], {1}),
        (["fix", "--json", "--inventory", str(f / "bad.toml"), "--dry-run"], {1}),
        (["fix", "--api", "https://127.0.0.1:1", "--ct", "200"], {2}),
        (["fix", "--ct", "200", "--mode", "nope"], {2}),
        (["fix", "--ct", "200", "--dry-run"], {1}),  # this machine is no Proxmox host
        (["fix", "--ct", "200", "--dry-run", "--json"], {1}),
        (["fix", "--json", "--cluster", "X", "--inventory", "Y"], {2}),
        # weights
        (["weights", "ensure", "a/b", "--to", "/proc/x"], {1}),
        (["weights", "ensure", "a/b", "--to", f"{f}/file/x"], {1}),
        (["weights", "ensure"], {2}),
        (["weights", "ensure", "a/b", "--to", f"{f}/file"], {2}),
        # bench run / report / compare
        (["bench", "run", "/nonexistent/plan.toml"], {2}),
        (["bench", "run", str(f / "bad.toml")], {1, 2}),
        (["bench", "run", str(f / "noplan.toml")], {1, 2}),
        (["bench", "run", str(REPO / "docs/examples/cpu-tiny.toml"), "--out", "/proc/x"], {1}),
        (["bench", str(REPO / "docs/examples/cpu-tiny.toml"), "--out", f"{f}/file/run"], {1}),
        (["bench", "report", "/nonexistent/run"], {2}),
        (["bench", "report", str(f / "run-a")], {1}),
        (["bench", "report", str(f / "run-a"), "--out", "/proc/x"], {1}),
        (["bench", "compare", "/nonexistent/a", str(f / "run-a")], {2}),
        (["bench", "compare", str(f / "run-a"), str(f / "run-b")], {1}),
        (["bench", "run", "/nonexistent/plan.toml", "--json"], {2}),
        # bench: static plan checks run without validation too (issue 26.9)
        (["bench", str(f / "port.toml"), "--dry-run", "--no-validate"], {1}),
        (["bench", str(f / "model.toml"), "--dry-run", "--no-validate"], {1}),
        (["bench", str(f / "conc.toml"), "--dry-run", "--no-validate"], {1}),
        (["bench", str(f / "rate.toml"), "--dry-run", "--no-validate", "--json"], {1}),
        (
            ["bench", str(f / "ok.toml"), "--dry-run", "--no-validate", "--quirks", "/nonexistent"],
            {2},
        ),
        (["bench", str(f / "ok.toml"), "--dry-run", "--quirks", "/nonexistent"], {2}),
        # bench: a run file that is a symlink is never read through (issue 22.1)
        (["bench", "report", str(f / "run-link")], {1}),
        (["bench", "compare", str(f / "run-link"), str(f / "run-b")], {1}),
        # service (writes nothing here: each fails before touching /etc)
        (["service", "rules", "-o", "/proc/x"], {1}),
        (["service", "install", "/nonexistent/plan.toml", "--out", str(f / "run")], {2}),
        (["service", "bogus"], {2}),
        # list, the root
        (["list", "--markdown", "/proc/x"], {1}),
        (["list", "--markdown", f"{f}/file/docs"], {1}),
        (["list", "--bogus"], {2}),
        (["--bogus"], {2}),
        (["nosuchcommand"], {2}),
        (["--debug"], {2}),
        ([], {2}),  # no command: the help, then one line
        (["bench"], {2}),
    ]


CORPUS_SIZE = len(corpus({"closed": 1, "close": 1, "silent": 1}, Path("/")))


def test_corpus_is_big_enough(peers, files):
    cases = corpus(peers, files)
    assert len(cases) >= 40
    assert {args[0] for args, _ in cases if args} >= {"check", "fix", "weights", "bench", "list"}


@pytest.mark.parametrize("index", range(CORPUS_SIZE))
def test_bad_invocation_is_one_line(index, peers, files):
    args, codes = corpus(peers, files)[index]
    done = gpudoctor(*args, env={"HOME": str(files), "XDG_CACHE_HOME": str(files / "cache")})
    where = (
        f"gpudoctor {' '.join(args)}\nstdout: {done.stdout[-800:]}\nstderr: {done.stderr[-1500:]}"
    )
    assert done.returncode in OK_CODES & codes, where
    assert "Traceback" not in done.stdout and "Traceback" not in done.stderr, where
    assert ERROR_LINE.match(last_line(done.stderr)), where
    if "--json" in args:  # a JSON object on stdout says the same
        doc = json.loads(done.stdout)
        assert doc["ok"] is False and doc["error"], where
        assert doc["exit_code"] == done.returncode, where


def test_ssh_peer_without_banner_is_one_line(peers, files):
    """An SSH peer that accepts TCP but never speaks: paramiko's own "Error reading SSH
    protocol banner" log and traceback must not reach the user, only our one line."""
    done = gpudoctor("check", "--host", f"root@127.0.0.1:{peers['silent']}",
                     "--known-hosts", str(files / "kh"), env={"HOME": str(files)})  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "Exception (client)" not in done.stderr
    assert ERROR_LINE.match(last_line(done.stderr)), done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1, done.stderr


def test_debug_shows_the_traceback(files):
    """--debug (and GPUDOCTOR_DEBUG=1) is the one way to get a traceback."""
    done = gpudoctor("--debug", "list", "--markdown", f"{files}/file/docs", "--help")
    assert done.returncode == 0  # --help wins
    run = gpudoctor("--debug", "bench", "compare", str(files / "run-a"), str(files / "run-b"))
    assert run.returncode == 1 and ERROR_LINE.match(last_line(run.stderr))
    env = gpudoctor("check", "--host", "root@127.0.0.1:1", "--known-hosts", str(files / "kh"),
                    env={"GPUDOCTOR_DEBUG": "1", "HOME": str(files)})  # fmt: skip
    assert "Traceback" in env.stderr and ERROR_LINE.match(last_line(env.stderr))


@pytest.mark.signals
def test_interrupted_run_exits_130(peers, files):
    """Ctrl-C (SIGINT) while connecting to a host that never answers: exit 130, one line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpudoctor", "check", "--host",
         f"root@127.0.0.1:{peers['silent']}", "--known-hosts", str(files / "kh")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_signals,
    )  # fmt: skip
    time.sleep(2.0)  # imported and waiting for the banner
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err
    assert ERROR_LINE.match(last_line(err)), err
