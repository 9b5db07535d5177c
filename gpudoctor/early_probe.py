"""Start the local CUDA/NVML probe first thing in the process, before click is imported.

``gpudoctor check`` costs about one ``cuInit`` only if the probe child (``gpu_probe.py``)
starts before the parent's own start-up work (click, the command modules, the catalogue,
the entry-point scan): that work then overlaps the child's ``cuInit`` instead of
preceding it (docs/performance.md). So the console script and ``python -m gpudoctor``
(:func:`gpudoctor.entry.main`) call :func:`start` with ``sys.argv`` before anything else;
it peeks at the arguments and, for a plain local ``gpudoctor check`` on a machine whose
``/proc/devices`` registers an NVIDIA driver, spawns the very command :func:`gpudoctor.facts.gpu.run_gpu_probe` would run
later. That function then :func:`adopt`s the running child instead of starting another:
same argv, same timeout (counted from the child's start), same result.

Stdlib only, and only ``os``/``sys`` at import: ``subprocess`` alone costs 10-15 ms of
imports (locale, re, enum). The child is a ``fork`` of this still-small, single-threaded
process that runs the probe's source itself: a new interpreter (``posix_spawn`` of
``python3 -I -S``) would put its own start-up (15-25 ms) on the critical path. The result is
the same bytes either way (tests/unit/test_early_probe.py). A child that nobody adopts (the
command took another path) is killed when the process exits. This module imports nothing
of gpudoctor: the CLI imports it, never the other way round.
Just before the child starts, :func:`snapshot` reads every device-node fact (``stat`` of
each ``/dev/nvidia*`` node, ``/proc/devices``, the cgroup and id-map files): the driver
library in the child may rewrite nodes (issue 21), and the node checks report what was
there before it ran (:mod:`gpudoctor.facts.node_snapshot` adopts it).
``GPUDOCTOR_EARLY_PROBE=0`` turns this off (the probe then starts where the runner starts it);
``GPUDOCTOR_EARLY_PROBE=spawn`` starts it as a new interpreter (benchmarks/check_latency.py's
A/B).
"""

from __future__ import annotations

import os
import sys

STAGES = ("privilege", "env", "nvml", "cuda")
KEEP_ROOT_ENV = "GPUDOCTOR_PROBE_AS_ROOT"


def probe_stages(env: dict | None = None) -> tuple:
    """Return the probe's stages: ``privilege`` first (root drops to nobody before the
    driver library loads, so it cannot rewrite device nodes), unless env
    ``GPUDOCTOR_PROBE_AS_ROOT=1`` asks for the old behaviour (the library, as root, may
    then remove and mknod nodes: that can leave a CT without them until its restart)."""
    keep_root = (os.environ if env is None else env).get(KEEP_ROOT_ENV) == "1"
    return STAGES[1:] if keep_root else STAGES


# Options of `gpudoctor check` after which the whole catalogue does not run here.
NOT_LOCAL = ("--host", "--ct", "--cluster", "--inventory", "--only", "-h", "--help")
GLOBAL_FLAGS = ("--debug",)  # root-group flags allowed before the subcommand
AFTER_KILL_S = 1.0  # reading after the kill at the deadline, as op_run (the spawned path) waits
# Observe before disturbing (issue 21): what is read before the probe child starts. The
# directories are gpudoctor.facts.nodes.NVIDIA_FAMILIES' (a test keeps them equal).
NODE_DIRS = ("/dev", "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels")
SNAPSHOT_FILES = (
    "/proc/devices",
    "/sys/fs/cgroup/devices/devices.list",
    "/proc/self/uid_map",
    "/proc/sys/kernel/overflowuid",
    "/proc/self/status",
    "/proc/driver/nvidia/params",
)


class Pending:
    """A probe child started early: its pid, pipes, argv and start time (monotonic s)."""

    def __init__(self, pid: int, out_fd: int, err_fd: int, argv: list[str], started: float):
        self.pid, self.out_fd, self.err_fd = pid, out_fd, err_fd
        self.argv, self.started = argv, started


_PENDING: list[Pending] = []  # at most one; list.pop() hands it over atomically
_SNAPSHOT: list[dict] = []  # the node facts read just before the child started (at most one)


def wanted(args: list[str]) -> bool:
    """Return True when ``args`` (argv without the program) is a local, whole-catalogue
    ``check``: the only case whose probe can be started before the CLI parses anything."""
    i = 0
    while i < len(args) and args[i] in GLOBAL_FLAGS:
        i += 1
    if i >= len(args) or args[i] != "check":
        return False
    rest = args[i + 1 :]
    for k, arg in enumerate(rest):
        name, eq, value = arg.partition("=")
        if name == "--host":
            host = value if eq else (rest[k + 1] if k + 1 < len(rest) else "")
            if host != "local":
                return False
        elif name in NOT_LOCAL:
            return False
    return True


def nvidia_registered(proc_devices: str = "/proc/devices") -> bool:
    """Return True when ``/proc/devices`` lists an NVIDIA character driver (``grep nvidia``);
    without one the runner never starts the probe (every probe check SKIPs)."""
    try:
        with open(proc_devices) as fh:
            return any(
                len(parts) == 2 and parts[1].startswith("nvidia")
                for parts in (line.split() for line in fh)
            )
    except OSError:
        return False


def snapshot() -> dict:
    """Return the device-node facts of this machine now, read with plain ``os`` calls
    before any CUDA or NVML call: ``{"dirs": {dir: sorted names}, "stats": {path:
    os.stat_result}, "files": {path: bytes}}`` for :data:`NODE_DIRS` (every ``/dev/nvidia*``
    entry and everything in the NVIDIA node directories) and :data:`SNAPSHOT_FILES`; a
    failure is recorded as its errno. ``ls /dev/nvidia*; stat ...; cat /proc/devices``."""
    dirs: dict[str, object] = {}
    stats: dict[str, object] = {}
    files: dict[str, object] = {}
    for path in SNAPSHOT_FILES:
        try:
            with open(path, "rb") as fh:
                files[path] = fh.read(1 << 20)
        except OSError as exc:
            files[path] = exc.errno or 5  # EIO
    for directory in NODE_DIRS:
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            dirs[directory] = exc.errno or 5
            continue
        dirs[directory] = names
        for name in names:
            if directory == "/dev" and not name.startswith("nvidia"):
                continue
            path = f"{directory}/{name}"
            try:
                stats[path] = os.stat(path)
            except OSError as exc:
                stats[path] = exc.errno or 5
    return {"dirs": dirs, "stats": stats, "files": files}


def take_snapshot() -> dict | None:
    """Return (once) the :func:`snapshot` taken just before the early child started, or
    None when no child was started early."""
    try:
        return _SNAPSHOT.pop()
    except IndexError:
        return None


def probe_argv(python: str) -> list[str]:
    """Return the probe's command line, byte-identical to ``run_gpu_probe``'s on a LocalHost:
    ``python3 -I -S -c <gpu_probe.py source> env nvml cuda``."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes", "gpu_probe.py")
    with open(path) as fh:
        return [python, "-I", "-S", "-c", fh.read(), *probe_stages()]


def spawn(argv: list[str]) -> Pending:
    """Start ``argv`` in its own session (stdin /dev/null, stdout and stderr piped); return it.
    Raises OSError when it cannot be started."""
    import time

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    started = time.monotonic()
    try:
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=actions, setsid=True)
    finally:
        os.close(out_w)
        os.close(err_w)
    return Pending(pid, out_r, err_r, argv, started)


def fork_probe(argv: list[str]) -> Pending:
    """Fork a child that runs the probe source of ``argv`` (``python -I -S -c SOURCE
    STAGE...``) in its own session, stdout and stderr piped, as :func:`spawn` would run it;
    return it labelled with ``argv``. Only for a single-threaded process. Raises OSError."""
    import time

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    try:
        pid = os.fork()
        if pid == 0:
            _probe_in_child(argv, out_w, err_w, (out_r, err_r))  # never returns
    finally:
        os.close(out_w)
        os.close(err_w)
    return Pending(pid, out_r, err_r, argv, started)


def _probe_in_child(argv: list[str], out_w: int, err_w: int, parent_ends: tuple[int, int]):
    """In the forked child: become ``argv``'s probe (new session, stdin /dev/null, the pipes
    as fds 1 and 2), run its source and ``os._exit`` with its status (1 on an exception)."""
    status = 1
    try:
        os.setsid()
        for fd in parent_ends:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out_w, 1), (err_w, 2)):
            os.dup2(fd, target)
        # fresh streams on fds 1 and 2 (the parent's may be wrappers that write elsewhere)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        source_at = argv.index("-c") + 1
        namespace: dict = {"__name__": "gpudoctor_probe"}
        exec(compile(argv[source_at], "gpu_probe.py", "exec"), namespace)
        namespace["main"](argv[source_at + 1 :])
        status = 0
    except SystemExit as exc:  # sys.exit() / sys.exit(None) is 0, as for a script
        status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        import contextlib

        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def start(argv: list[str]) -> None:
    """Start the probe child now when ``argv`` is a plain local ``gpudoctor check`` on an
    NVIDIA machine; otherwise do nothing. Never raises (the normal path runs it later)."""
    mode = os.environ.get("GPUDOCTOR_EARLY_PROBE", "fork")
    if mode == "0":  # off: benchmarks/check_latency.py's A/B
        return
    if _PENDING or not wanted(argv[1:]) or not nvidia_registered():
        return
    try:
        argv_of_probe = probe_argv(sys.executable)
        facts = snapshot()  # observe before disturbing: the probe may rewrite nodes
        pending = spawn(argv_of_probe) if mode == "spawn" else fork_probe(argv_of_probe)
    except Exception:  # OSError, or no POSIX_SPAWN_SETSID here: the normal path runs it
        return
    _SNAPSHOT.append(facts)
    _PENDING.append(pending)
    import atexit

    atexit.register(discard)


def adopt(argv: list[str], timeout_s: float) -> dict | None:
    """Return the early child's outcome if it runs exactly ``argv`` (waiting until it exits or
    ``timeout_s`` after its start, when its process group is SIGKILLed), as
    ``{"returncode", "stdout", "stderr", "timed_out", "duration_s"}``; None when there is no
    such child (the caller then runs ``argv`` itself)."""
    try:
        pending = _PENDING.pop()
    except IndexError:
        return None
    if pending.argv != list(argv):
        _collect(pending, 0.0)
        return None
    return _collect(pending, timeout_s)


def discard() -> None:
    """Kill and reap an early child nobody adopted (at exit); drop its snapshot."""
    _SNAPSHOT.clear()
    while _PENDING:
        _collect(_PENDING.pop(), 0.0)


def _collect(pending: Pending, timeout_s: float) -> dict:
    """Read the child's output until EOF or ``timeout_s`` after its start, when its process
    group is SIGKILLed (0: at once); after the kill, read for at most ``AFTER_KILL_S`` more
    (a driver helper outside the group may hold the pipes open), then stop. Reap the child
    (for at most ``AFTER_KILL_S`` once killed: one stuck in the kernel stays unreaped, -9)
    and return what it printed."""
    import contextlib
    import selectors
    import signal
    import time

    chunks: dict[int, list[bytes]] = {pending.out_fd: [], pending.err_fd: []}
    deadline = pending.started + timeout_s
    timed_out = False
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not timed_out:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(pending.pid, signal.SIGKILL)
                with contextlib.suppress(OSError):  # a fork not yet in its own session
                    os.kill(pending.pid, signal.SIGKILL)
            if timed_out and remaining <= -AFTER_KILL_S:
                break  # someone outside the group holds the pipes: stop reading
            wait = remaining + AFTER_KILL_S if timed_out else remaining
            for key, _ in selector.select(max(wait, 0.0)):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    for fd in chunks:
        os.close(fd)
    status = _reap(pending.pid, AFTER_KILL_S if timed_out else None)
    return {
        "returncode": -9 if status is None else os.waitstatus_to_exitcode(status),
        "stdout": b"".join(chunks[pending.out_fd]).decode("utf-8", "replace"),
        "stderr": b"".join(chunks[pending.err_fd]).decode("utf-8", "replace"),
        "timed_out": timed_out,
        "duration_s": time.monotonic() - pending.started,
    }


def _reap(pid: int, limit_s: float | None) -> int | None:
    """Return ``waitpid(pid)``'s status, waiting at most ``limit_s`` (None: as long as it
    takes); None when the child is still not reaped by then (killed, stuck in the kernel)."""
    import time

    if limit_s is None:
        return os.waitpid(pid, 0)[1]
    give_up = time.monotonic() + limit_s
    while True:
        reaped, status = os.waitpid(pid, os.WNOHANG)
        if reaped:
            return status
        if time.monotonic() >= give_up:
            return None
        time.sleep(0.01)
