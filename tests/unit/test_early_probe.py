"""The CUDA/NVML probe started first thing in the process (gpudoctor/early_probe.py).

Real child processes throughout; the GPU machine is stood for by the fake driver
(tests/unit/fake_libcuda.c, built as libcuda.so.1 and libnvidia-ml.so.1) and, in the
end-to-end test, by a private mount namespace whose /proc/devices and /proc/driver/nvidia
say an NVIDIA driver is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudoctor import early_probe
from gpudoctor.context import CheckOptions, FactCache
from gpudoctor.facts.gpu import STAGES, probe_source
from gpudoctor.hosts.local import LocalHost
from tests.conftest import lab_unavailable
from tests.unit.multigpu_host import build_fake_libcuda

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _probe_keeps_root(monkeypatch):
    """These tests are about WHICH child runs; the fake driver lives in pytest's 0700 tmp
    dirs, which the default unprivileged probe (uid 65534) cannot reach: keep root here
    (tests/unit/test_node_changes.py covers the drop)."""
    monkeypatch.setenv(early_probe.KEEP_ROOT_ENV, "1")


@pytest.fixture(autouse=True)
def no_leftover_child():
    """Every test leaves no early child behind (and reaps one it left)."""
    yield
    early_probe.discard()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["check"], True),
        (["check", "--json", "-v", "--timeout", "5", "--model-dir", "/dev/shm/m"], True),
        (["--debug", "check", "--json"], True),
        (["check", "--host", "local"], True),
        (["check", "--host=local"], True),
        (["check", "--host", "root@pve1"], False),
        (["check", "--host=root@pve1"], False),
        (["check", "--host"], False),
        (["check", "--ct", "200"], False),
        (["check", "--host", "local", "--ct", "200"], False),
        (["check", "--only", "cuda.init"], False),
        (["check", "--only=device"], False),
        (["check", "--cluster", "pve1"], False),
        (["check", "--inventory", "hosts.toml"], False),
        (["check", "--help"], False),
        (["fix", "--host", "local"], False),
        (["bench", "check"], False),
        (["--version"], False),
        ([], False),
    ],
)
def test_wanted_only_for_a_plain_local_whole_catalogue_check(args, expected):
    assert early_probe.wanted(args) is expected


def test_nvidia_registered_reads_proc_devices(tmp_path):
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n  1 mem\n  4 tty\n\nBlock devices:\n  8 sd\n")
    assert not early_probe.nvidia_registered(str(devices))
    devices.write_text("Character devices:\n  1 mem\n195 nvidia\n238 nvidia-uvm\n")
    assert early_probe.nvidia_registered(str(devices))
    assert not early_probe.nvidia_registered(str(tmp_path / "missing"))


def test_probe_argv_is_what_run_gpu_probe_runs():
    host = LocalHost()
    assert early_probe.probe_argv(host.python) == [
        host.python,
        "-I",
        "-S",
        "-c",
        probe_source(),
        *early_probe.probe_stages(),
    ]
    assert early_probe.probe_stages({}) == STAGES and STAGES[0] == "privilege"
    assert "privilege" not in early_probe.probe_stages({early_probe.KEEP_ROOT_ENV: "1"})


def child(code: str) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", code]


def test_adopt_returns_the_running_childs_output():
    argv = child("import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)")
    early_probe._PENDING.append(early_probe.spawn(argv))
    outcome = early_probe.adopt(argv, timeout_s=60)
    assert outcome is not None
    assert (outcome["stdout"], outcome["stderr"]) == ("out\n", "err\n")
    assert outcome["returncode"] == 7
    assert outcome["timed_out"] is False
    assert early_probe.adopt(argv, timeout_s=60) is None  # handed over once


def test_adopt_refuses_another_command_and_reaps_the_child():
    argv = child("import time; time.sleep(60)")
    pending = early_probe.spawn(argv)
    early_probe._PENDING.append(pending)
    assert early_probe.adopt([*argv, "other"], timeout_s=60) is None
    with pytest.raises(ProcessLookupError):
        os.kill(pending.pid, 0)  # killed and reaped, not a zombie


def test_discard_kills_a_child_nobody_adopted():
    pending = early_probe.spawn(child("import time; time.sleep(60)"))
    early_probe._PENDING.append(pending)
    early_probe.discard()
    with pytest.raises(ProcessLookupError):
        os.kill(pending.pid, 0)


def test_the_fact_cache_adopts_the_early_child_instead_of_running_another(tmp_path, monkeypatch):
    """The check's GPU probe reads the child started at process start: LocalHost.run is
    never called for it."""
    fake = build_fake_libcuda(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake))
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    monkeypatch.setenv("GPUDOCTOR_EARLY_PROBE", "spawn")  # a fork keeps pytest's library path
    monkeypatch.setattr(early_probe, "nvidia_registered", lambda: True)
    early_probe.start(["gpudoctor", "check", "--json"])
    assert len(early_probe._PENDING) == 1

    def no_second_probe(self, argv, timeout=30.0, input=None):
        raise AssertionError(f"probe started again: {argv[:3]}")

    monkeypatch.setattr(LocalHost, "run", no_second_probe)
    probe = FactCache(LocalHost(), CheckOptions()).gpu_probe()
    assert probe.stage("cuda").data["init"] == 0
    assert probe.stage("cuda").data["devices"][0]["name"] == "NVIDIA H200"
    assert not early_probe._PENDING


@pytest.mark.lab
def test_gpudoctor_check_runs_exactly_one_probe_on_an_nvidia_machine(tmp_path):
    """`python -m gpudoctor check` on a machine whose /proc says an NVIDIA driver is loaded
    (a private mount namespace) and whose libcuda is the fake: cuda.init PASSes from the
    probe started at process start, and cuInit ran exactly once (no second probe)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        lab_unavailable("needs root and unshare(1) for a private mount namespace")
    fake = build_fake_libcuda(tmp_path)
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n195 nvidia\n238 nvidia-uvm\n")
    log = tmp_path / "cuinit.log"
    version = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
    script = (
        f"mount --bind {tmp_path}/devices /proc/devices && mount -t tmpfs none /proc/driver"
        f" && mkdir /proc/driver/nvidia && printf '{version}' > /proc/driver/nvidia/version"
        f" && exec {sys.executable} -m gpudoctor check --json"
    )
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fake),
        "FAKE_CUDA_DEVICES": "1",
        "FAKE_CUDA_INIT_LOG": str(log),
        "FAKE_CUDA_INIT_MS": "200",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if done.returncode not in (0, 3):
        if "unshare" in done.stderr or "mount" in done.stderr:
            lab_unavailable(f"private mount namespace refused: {done.stderr.strip()}")
        raise AssertionError(done.stderr)
    report = json.loads(done.stdout)
    status = {c["check"]: c["status"] for c in report["checks"]}
    assert status["driver.loaded"] == "PASS"
    assert status["cuda.init"] == "PASS"
    assert len(log.read_text().split()) == 1


def test_early_probe_off_starts_nothing(monkeypatch):
    """GPUDOCTOR_EARLY_PROBE=0 (check_latency.py's A/B): the runner starts the probe itself."""
    monkeypatch.setattr(early_probe, "nvidia_registered", lambda: True)
    monkeypatch.setenv("GPUDOCTOR_EARLY_PROBE", "0")
    early_probe.start(["gpudoctor", "check"])
    assert early_probe._PENDING == []


def probe_code(body: str) -> list[str]:
    """argv of a probe whose source defines ``main(stages)`` running ``body`` (and runs it
    when started as a script, as a spawned probe is)."""
    source = (
        "import os, sys, time\n\n"
        "def write_whole(path, value):\n"
        "    with open(path + '.part', 'w') as fh:\n        fh.write(str(value))\n"
        "    os.rename(path + '.part', path)\n\n"
        "def main(stages):\n"
        + "".join(f"    {line}\n" for line in body.splitlines())
        + "\nif __name__ == '__main__':\n    main(sys.argv[1:])\n"
    )
    return [sys.executable, "-I", "-S", "-c", source, "env", "cuda"]


def wait_for_content(path: Path, bound_s: float = 60.0) -> str:
    """Return ``path``'s text once a probe has written it (whole: written then renamed),
    polling; ``bound_s`` bounds a broken probe only, no timing is judged."""
    deadline = time.monotonic() + bound_s
    while not path.exists():
        assert time.monotonic() < deadline, f"the probe never wrote {path}"
        time.sleep(0.01)
    return path.read_text()


def stages_of(stdout: str) -> dict[str, dict]:
    """The probe's final line per stage, timing fields dropped (they differ run to run)."""
    timing = {"elapsed_s", "init_s"}
    found = {}
    for line in stdout.splitlines():
        data = json.loads(line)
        if not data.get("started"):
            found[data["stage"]] = {k: v for k, v in data.items() if k not in timing}
    return found


BOTH_WAYS = """
import json, sys
from gpudoctor import early_probe
argv = early_probe.probe_argv(sys.executable)
outcomes = []
for start in (early_probe.spawn, early_probe.fork_probe):
    early_probe._PENDING.append(start(argv))
    outcomes.append(early_probe.adopt(argv, timeout_s=60))
print(json.dumps(outcomes))
"""


def test_the_forked_probe_prints_what_the_spawned_interpreter_prints(tmp_path):
    """The real probe source against the fake driver, run both ways from one process that
    started with the driver on its library path (the loader reads it at start, as on a
    GPU host): the same stages, the same values; the fork only saves the new
    interpreter's start-up."""
    fake = build_fake_libcuda(tmp_path)
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake), "FAKE_CUDA_DEVICES": "2",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", BOTH_WAYS], capture_output=True, text=True,
                          env=env, timeout=120, check=True)  # fmt: skip
    spawned, forked = json.loads(done.stdout)
    assert (forked["returncode"], forked["stderr"]) == (0, "")
    assert stages_of(forked["stdout"]) == stages_of(spawned["stdout"])
    cuda = stages_of(forked["stdout"])["cuda"]
    assert cuda["init"] == 0 and cuda["device_count"] == 2


@pytest.mark.parametrize("start", [early_probe.spawn, early_probe.fork_probe])
def test_a_probe_hung_in_cuinit_is_killed_at_its_timeout_with_what_it_printed(start, tmp_path):
    """A probe hung in cuInit, spawned or forked: it leads its own session, so at the
    deadline its whole process group (the grandchild holding the pipe too, else the read
    would wait 60 s) is SIGKILLed, and the stage it announced is still returned (the
    parent names the hung stage)."""
    forked = tmp_path / "grandchild.pid"
    argv = probe_code(
        'print(\'{"stage": "cuda", "started": true}\', flush=True)\n'
        "pid = os.fork()\n"
        f"pid or time.sleep(60)\nwrite_whole({str(forked)!r}, pid)\n"
        "time.sleep(60)"
    )
    early_probe._PENDING.append(start(argv))
    wait_for_content(forked)  # the stage announced, the grandchild started: now hung
    outcome = early_probe.adopt(argv, timeout_s=0.5)
    assert outcome is not None and outcome["timed_out"] is True
    assert outcome["returncode"] == -9
    assert outcome["stdout"] == '{"stage": "cuda", "started": true}\n'


def test_a_forked_probe_that_raises_exits_1_with_its_traceback():
    argv = probe_code("print('half', flush=True)\nraise RuntimeError('driver said no')")
    early_probe._PENDING.append(early_probe.fork_probe(argv))
    outcome = early_probe.adopt(argv, timeout_s=60)
    assert outcome is not None and outcome["returncode"] == 1
    assert outcome["stdout"] == "half\n"
    assert "RuntimeError: driver said no" in outcome["stderr"]


def _cmdline_once_exec_is_done(pid: int) -> list[bytes]:
    """Return /proc/PID/cmdline's arguments once the kernel has set them: posix_spawn returns
    as the new program's exec begins, and the new arguments appear a moment later (an empty
    cmdline in between)."""
    for _ in range(10_000):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        if raw:
            return raw.split(b"\0")
        time.sleep(0.001)
    raise AssertionError(f"/proc/{pid}/cmdline stayed empty")


@pytest.mark.parametrize(("mode", "forked"), [(None, True), ("spawn", False)])
def test_the_mode_picks_fork_or_a_new_interpreter(mode, forked, monkeypatch):
    """Default: fork; GPUDOCTOR_EARLY_PROBE=spawn: a new interpreter (the latency A/B)."""
    monkeypatch.setattr(early_probe, "nvidia_registered", lambda: True)
    # a probe that lives until discarded: the real one exits at once on a GPU-less box,
    # and a reaped child has no /proc/PID/exe to read
    monkeypatch.setattr(early_probe, "probe_argv", lambda python: probe_code("time.sleep(60)"))
    if mode:
        monkeypatch.setenv("GPUDOCTOR_EARLY_PROBE", mode)
    else:
        monkeypatch.delenv("GPUDOCTOR_EARLY_PROBE", raising=False)
    # a probe that waits to be killed: a probe that had already exited would be a zombie,
    # whose /proc/PID/cmdline is empty and whose exe cannot be read (the test then raced)
    waits = (
        "import time\ndef main(stages):\n    time.sleep(120)\n"
        "if __name__ == '__main__':\n    main([])"
    )
    monkeypatch.setattr(early_probe, "probe_argv", lambda python: [python, "-I", "-S", "-c", waits])
    early_probe.start(["gpudoctor", "check"])
    (pending,) = early_probe._PENDING
    try:
        cmdline = _cmdline_once_exec_is_done(pending.pid)
        exe = os.path.realpath(f"/proc/{pending.pid}/exe")
    finally:
        os.kill(pending.pid, signal.SIGKILL)  # the group may not exist yet (setsid pending)
        early_probe.adopt(pending.argv, timeout_s=60)
    assert exe == os.path.realpath(sys.executable)
    # a fork keeps this process's command line; a new interpreter has the probe's own
    assert (b"-S" not in cmdline) is forked


def test_quick_exit_only_after_a_plain_local_check_with_no_live_worker():
    """The teardown is skipped only where nothing can be lost: a plain local `check` (its
    files are closed by `with` blocks) and no non-daemon thread still at work."""
    import threading

    from gpudoctor.cli import quick_exit_allowed

    assert quick_exit_allowed(["check", "--json"])
    assert not quick_exit_allowed(["fix", "--host", "local"])
    assert not quick_exit_allowed(["bench", "plan.toml"])
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert not quick_exit_allowed(["check", "--json"])
    finally:
        release.set()
        worker.join()


def test_a_quickly_exiting_check_writes_its_whole_output(tmp_path):
    """`check --json -o FILE` through the quick exit: stdout and the file are complete."""
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--json", "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode in (0, 3, 4), done.stderr
    assert json.loads(out.read_text())["checks"]


def imported_modules(path: Path) -> set[str]:
    """Return every module ``path`` imports (at module level or inside functions)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_early_probe_imports_nothing_of_gpudoctor():
    """No circle: the CLI imports early_probe (cli -> early_probe), never the other way."""
    imported = imported_modules(REPO / "gpudoctor" / "early_probe.py")
    assert not {m for m in imported if m.split(".")[0] in ("gpudoctor", "click")}, imported
    assert "gpudoctor.early_probe" in imported_modules(REPO / "gpudoctor" / "entry.py")


ENTRY_ORDER = """
import sys
import threading
from gpudoctor import early_probe
early_probe.start = lambda argv: print("start", argv[1:], "click" in sys.modules, flush=True)
sys.argv = ["gpudoctor", "--version"]
from gpudoctor.entry import main
main()
"""


def test_the_console_entry_starts_the_probe_before_click_then_runs_the_cli():
    """gpudoctor.entry.main (the console script and ``python -m gpudoctor``) calls
    early_probe.start with argv while click is not imported yet, then runs the CLI."""
    done = subprocess.run([sys.executable, "-c", ENTRY_ORDER], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["start ['--version'] False", "gpudoctor, version 0.1.0"]


@pytest.mark.parametrize("start", [early_probe.spawn, early_probe.fork_probe])
def test_after_the_kill_a_helper_holding_the_pipes_is_not_waited_for(start, tmp_path):
    """Attack/fault blocked (issue 22.9): a driver helper that left the probe's session
    (``setsid``) keeps the probe's stdout open after the probe is SIGKILLed at its
    deadline. Reading until end-of-file would wait as long as the helper lives (``check
    --timeout 5`` took 30 s and reported the wrong cause); the read stops about a second
    after the kill and the probe's own output is still returned."""
    pid_file = tmp_path / "helper.pid"
    argv = probe_code(
        'print(\'{"stage": "cuda", "started": true}\', flush=True)\n'
        "import subprocess\n"
        "helper = subprocess.Popen(['setsid', 'sleep', '600'])\n"
        f"write_whole({str(pid_file)!r}, helper.pid)\n"
        "time.sleep(600)"
    )
    early_probe._PENDING.append(start(argv))
    wait_for_content(pid_file)  # the stage announced, the helper started: now hung
    box: dict = {}
    reader = threading.Thread(target=lambda: box.update(early_probe.adopt(argv, 0.5) or {}))
    reader.start()
    reader.join(20)  # liveness bound only: without the fix the read waits 600 s
    try:
        assert not reader.is_alive(), "the read waited for the helper's end-of-file"
        assert box["timed_out"] is True and box["returncode"] == -9
        assert box["stdout"] == '{"stage": "cuda", "started": true}\n'
        os.kill(int(pid_file.read_text()), 0)  # alive: the read did not wait for it
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        reader.join(5)
