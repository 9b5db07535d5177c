"""Real LXC containers on PURE cgroup v2, for lab tests.

This machine mounts cgroups in hybrid mode (v1 controllers + ``unified``), but Proxmox
runs pure cgroup v2, where LXC enforces ``lxc.cgroup2.devices.*`` with an eBPF device
program. :class:`PureCgroup2Namespace` recreates that: ONE long-lived process holds a
private mount namespace where ``/sys/fs/cgroup`` is a cgroup2 mount; every ``lxc-*``
command (and the lab sshd) runs inside it through ``nsenter --mount``. Mounts made on
the host later still propagate into it (slave propagation), never back out.

Nothing here is fake: the containers are real LXC 5 containers with a real kernel
device policy. Only the GPU is a stand-in (a misc char node such as /dev/kvm's 10:232).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from gpudoctor.hosts.base import CommandResult
from tests.lab.namespace import LabError, LabHost, PureCgroup2Namespace, kill_container_cgroups
from tests.lab.subids import SubordinateIds

__all__ = [
    "REPO_ROOT",
    "Lab",
    "LabContainer",
    "LabError",
    "LabHost",
    "PureCgroup2Namespace",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# LXC's default lxcpath; in the lab namespace the lab's own lxc directory is mounted here.
LXCPATH_IN_NAMESPACE = "/var/lib/lxc"
CONTAINER_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Nodes every container needs (LXC's common.conf list): mknod of anything, null, zero,
# full, random, urandom, tty, console, ptmx, pts.
BASE_DEVICE_RULES = (
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:1 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
)

# The container's PID 1: exits on the halt signal, so lxc-stop is quick.
INIT_SCRIPT = """#!/usr/bin/busybox sh
trap 'exit 0' TERM PWR INT
while :; do /usr/bin/busybox sleep 3600 & wait $!; done
"""


def build_rootfs(path: Path) -> Path:
    """Create a minimal rootfs at ``path``: an own /sbin/init (busybox), empty mount
    points, and /bin, /lib, /lib64 pointing into /usr (bind-mounted read-only from the
    host at start). Return ``path``."""
    for sub in ("proc", "sys", "dev", "tmp", "root", "etc", "sbin", "usr", "run", "var/tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        if not (path / link).is_symlink():
            (path / link).symlink_to(target)
    init = path / "sbin" / "init"
    init.write_text(INIT_SCRIPT)
    init.chmod(0o755)
    (path / "tmp").chmod(0o1777)
    return path


def host_python_mounts() -> list[str]:
    """Return the host directories to bind-mount read-only so the repo's venv Python
    runs inside: the base Python installation and the repository (holding .venv)."""
    dirs = {str(Path(sys.base_prefix).resolve()), str(REPO_ROOT)}
    return sorted(d for d in dirs if not d.startswith("/usr"))


class LabContainer:
    """One real LXC container in the lab's private lxcpath (plain LXC layout:
    ``<lxcpath>/<name>/config`` with ``key = value`` lines, rootfs beside it).

    Paths: ``dir``, ``config_path`` and ``rootfs`` are paths on this machine
    (``/var/lib/gpudoctor-lab/s<pid>/lxc/<name>/...``); ``lxcpath`` is LXC's path as the
    lab namespace (and so the lab sshd) sees it: ``/var/lib/lxc``, where the lab's
    directory is bind-mounted. Over SSH the config is ``/var/lib/lxc/<name>/config``.

    Create it with :meth:`Lab.container`. Device rules and bind-mounted nodes come from
    the constructor; :meth:`set_device_rules` rewrites them (takes effect at restart).
    """

    def __init__(
        self,
        lab: Lab,
        name: str,
        allow: Iterable[str] = (),
        devices: Mapping[str, str] | None = None,
        extra_config: Iterable[str] = (),
    ) -> None:
        self.lab = lab
        self.name = name
        self.lxcpath = LXCPATH_IN_NAMESPACE
        self.dir = lab.lxcpath / name
        self.rootfs = self.dir / "rootfs"
        self.config_path = self.dir / "config"
        self.log_path = self.dir / "lxc.log"
        self.devices = dict(devices or {})
        self.allow = list(allow)
        self.extra_config = list(extra_config)

    # -- config -----------------------------------------------------------------------

    def render_config(self) -> str:
        """Return the LXC config text for the current rules and devices."""
        lines = [
            f"lxc.uts.name = {self.name}",
            f"lxc.rootfs.path = dir:{self.rootfs}",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.init.cmd = /sbin/init",
            "lxc.signal.halt = SIGTERM",
            "lxc.console.path = none",
            "lxc.tty.max = 0",
            "lxc.pty.max = 4",
            "lxc.mount.auto = proc:mixed sys:ro cgroup:ro",
            "lxc.mount.entry = /usr usr none ro,bind 0 0",
            "lxc.mount.entry = /etc etc none ro,bind 0 0",
            "lxc.mount.entry = tmpfs tmp tmpfs rw,nosuid,nodev,mode=1777 0 0",
            "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
        ]
        for host_dir in host_python_mounts():
            rel = host_dir.lstrip("/")
            lines.append(f"lxc.mount.entry = {host_dir} {rel} none ro,bind,create=dir 0 0")
        lines += self.device_lines()
        return "\n".join(lines) + "\n"

    def device_lines(self) -> list[str]:
        """Return the config lines every lab CT ends with: a bind mount per passed node,
        ``devices.deny = a``, the base rules, this CT's ``allow`` rules, its extra lines."""
        lines = []
        for inside, host_path in self.devices.items():
            rel = inside.lstrip("/")
            lines.append(f"lxc.mount.entry = {host_path} {rel} none bind,optional,create=file 0 0")
        lines.append("lxc.cgroup2.devices.deny = a")
        lines += [f"lxc.cgroup2.devices.allow = {rule}" for rule in BASE_DEVICE_RULES]
        lines += [f"lxc.cgroup2.devices.allow = {rule}" for rule in self.allow]
        return lines + list(self.extra_config)

    def write_config(self) -> None:
        """Write :meth:`render_config` to ``config_path``."""
        self.config_path.write_text(self.render_config())

    def set_device_rules(self, allow: Iterable[str]) -> None:
        """Replace the extra allow rules (e.g. ``["c 10:* rwm"]``) and rewrite the config."""
        self.allow = list(allow)
        self.write_config()

    def create(self) -> LabContainer:
        """Create the rootfs (a copy of the lab's template) and the config; return self."""
        self.dir.mkdir(parents=True)
        shutil.copytree(self.lab.rootfs_template, self.rootfs, symlinks=True)
        self.write_config()
        return self

    # -- lifecycle --------------------------------------------------------------------

    def lxc(self, tool: str, *args: str, timeout: float = 60.0) -> CommandResult:
        """Run ``lxc-TOOL -P LXCPATH -n NAME ARGS`` inside the lab namespace."""
        return self.lab.namespace.run(
            [f"lxc-{tool}", "-P", self.lxcpath, "-n", self.name, *args], timeout
        )

    def start(self, timeout: float = 30.0, log_level: str = "INFO") -> LabContainer:
        """Start the container and wait until it is RUNNING; raise LabError with LXC's
        log tail when it does not start. LXC logs to ``log_path`` at ``log_level``
        (``TRACE`` shows the cgroup layout and the eBPF device program). Return self."""
        argv = ["start", "-l", log_level, "-o", str(self.log_path)]
        result = self.lxc(*argv, timeout=timeout)
        if result.ok:
            result = self.lxc("wait", "-s", "RUNNING", "-t", str(int(timeout)), timeout=timeout)
        if not result.ok or self.state() != "RUNNING":
            raise LabError(
                f"lxc-start {self.name} failed (rc {result.returncode}): "
                f"{result.stderr.strip()} {self.log_tail()}"
            )
        return self

    def stop(self, kill: bool = False, timeout: float = 30.0) -> None:
        """Stop the container (``lxc-stop``; ``kill`` = SIGKILL at once) if it runs."""
        if self.state() == "STOPPED":
            return
        self.lxc("stop", *(["-k"] if kill else ["-t", "10"]), timeout=timeout)

    def restart(self) -> LabContainer:
        """Stop then start (a new init PID; config changes take effect). Return self."""
        self.stop()
        return self.start()

    def state(self) -> str:
        """Return ``RUNNING``, ``STOPPED``, ... as ``lxc-info -s`` says."""
        out = self.lxc("info", "-s", timeout=15).stdout
        return out.split(":", 1)[1].strip() if ":" in out else "STOPPED"

    def init_pid(self) -> int | None:
        """Return the container's init PID on the host (``lxc-info -p``), or None."""
        out = self.lxc("info", "-p", timeout=15).stdout
        text = out.split(":", 1)[1].strip() if ":" in out else ""
        return int(text) if text.isdigit() else None

    def attach(
        self,
        argv: Sequence[str],
        timeout: float = 60.0,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` inside the container (``lxc-attach --clear-env``, PATH set, the
        repo on PYTHONPATH) and return its result."""
        variables = {"PATH": CONTAINER_PATH_ENV, "HOME": "/root", "PYTHONPATH": str(REPO_ROOT)}
        variables.update(env or {})
        sets = [arg for key, value in variables.items() for arg in ("-v", f"{key}={value}")]
        result = self.lab.namespace.run(
            ["lxc-attach", "-P", self.lxcpath, "-n", self.name, "--clear-env", *sets, "--", *argv],
            timeout,
            input,
        )
        return CommandResult(
            tuple(argv),
            result.returncode,
            result.stdout,
            result.stderr,
            result.timed_out,
            result.duration_s,
        )

    def shell(self, script: str, timeout: float = 60.0) -> CommandResult:
        """Run a busybox ``sh -c SCRIPT`` inside the container."""
        return self.attach(["/usr/bin/busybox", "sh", "-c", script], timeout)

    def python(self, *args: str, timeout: float = 120.0) -> CommandResult:
        """Run the repo's venv Python inside the container (``.venv/bin/python ARGS``)."""
        return self.attach([str(self.lab.venv_python), *args], timeout)

    def gpudoctor(self, *args: str, timeout: float = 120.0) -> CommandResult:
        """Run ``python -m gpudoctor ARGS`` inside the container with the repo's venv."""
        return self.python("-m", "gpudoctor", *args, timeout=timeout)

    def log_tail(self, lines: int = 15) -> str:
        """Return the last lines of LXC's log for this container (for error messages)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def destroy(self) -> None:
        """Kill the container if it runs and delete its directory."""
        with contextlib.suppress(LabError, OSError):
            self.stop(kill=True)
        # Whatever lxcpath it was (re)started with (pct stand-ins, fixers), nothing of it
        # may outlive the test: kill what is left in its cgroups.
        kill_container_cgroups(self.name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.lab.forget(self)


class Lab:
    """The session's lab: the pure-cgroup2 namespace, a private lxcpath, a rootfs
    template, stand-in device nodes, and every container made (destroyed at the end).

    Attributes:
        root: the lab's private directory (``/var/lib/gpudoctor-lab/s<pid>``).
        lxcpath: the lab containers' directory on this machine (``<root>/lxc``); inside the
            lab namespace it is mounted on ``/var/lib/lxc`` (:data:`LXCPATH_IN_NAMESPACE`).
        namespace: the :class:`PureCgroup2Namespace`.
        host: a :class:`LabHost` (this machine as a pure-cgroup2 container host).
        fake_gpu: host path of the stand-in GPU node (char 10:232, mode 0666).
        fake_gpu_major, fake_gpu_minor: its numbers; ``fake_gpu_driver``: its
            /proc/devices name (``misc``).
    """

    BASE = Path("/var/lib/gpudoctor-lab")
    _counter = itertools.count(1)

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or self.BASE / f"s{os.getpid()}"
        self.lxcpath = self.root / "lxc"
        self.nodes_dir = self.root / "nodes"
        self.rootfs_template = self.root / "rootfs-template"
        self.namespace = PureCgroup2Namespace(self.lxcpath)
        self.host = LabHost(self.namespace)
        self.venv_python = REPO_ROOT / ".venv" / "bin" / "python"
        self.fake_gpu_major, self.fake_gpu_minor, self.fake_gpu_driver = 10, 232, "misc"
        self.fake_gpu = self.nodes_dir / "fakegpu"
        self.containers: list[LabContainer] = []
        self.subordinate_ids: list[SubordinateIds] = []

    def grant_subordinate_ids(self, base: int, count: int) -> None:
        """Let root map ``[base, base + count)`` for an unprivileged CT (see
        :mod:`tests.lab.subids`); taken back at :meth:`teardown`."""
        grant = SubordinateIds(base, count)
        if grant.grant():
            self.subordinate_ids.append(grant)

    def setup(self) -> Lab:
        """Clear stale lab dirs of dead sessions, start the namespace, build the rootfs
        template and the stand-in node. Return self."""
        remove_stale_lab_dirs(self.BASE)
        self.lxcpath.mkdir(parents=True, exist_ok=True)
        (self.root / "owner.pid").write_text(str(os.getpid()))
        self.namespace.start()
        # A Proxmox root's shell has no pyenv: hide this machine's ~/.bashrc from lab
        # SSH sessions (bash sources it for every ssh command: slow, and PATH changes).
        # sshd takes the home from the password database, not $HOME (the suite's own).
        home = Path(pwd.getpwuid(os.getuid()).pw_dir)
        for rc_file in (home / ".bashrc", home / ".profile"):
            if rc_file.is_file():
                empty = self.root / f"empty{rc_file.name}"
                empty.write_text("")
                self.namespace.bind_mount(empty, rc_file, read_only=True)
        build_rootfs(self.rootfs_template)
        self.fake_gpu = self.make_node("fakegpu", self.fake_gpu_major, self.fake_gpu_minor)
        return self

    def make_node(self, name: str, major: int, minor: int, mode: int = 0o666) -> Path:
        """Create a char device node ``<root>/nodes/NAME`` (``mknod NAME c MAJOR MINOR``,
        then ``chmod MODE``) on the host and return its path (to bind-mount in)."""
        self.nodes_dir.mkdir(parents=True, exist_ok=True)
        path = self.nodes_dir / name
        if path.exists():
            path.unlink()
        os.mknod(path, 0o020000 | mode, os.makedev(major, minor))
        path.chmod(mode)
        return path

    def unique_name(self, prefix: str = "gd") -> str:
        """Return a container name unique on this machine (cgroup names are global)."""
        return f"{prefix}{os.getpid()}-{next(self._counter)}"

    def container(
        self,
        allow: Iterable[str] = (),
        devices: Mapping[str, str] | None = None,
        name: str | None = None,
        start: bool = True,
        extra_config: Iterable[str] = (),
    ) -> LabContainer:
        """Create (and by default start) a container.

        Args:
            allow: extra ``lxc.cgroup2.devices.allow`` rules (``"c 10:* rwm"``), beyond
                the base rules for /dev/null etc.; everything else is denied.
            devices: ``{path inside: host node}`` bind mounts, e.g.
                ``{"/dev/fakegpu": str(lab.fake_gpu)}``.
            name: the container name (default: unique).
            start: start it and wait until RUNNING.
            extra_config: more raw config lines.
        """
        ct = LabContainer(self, name or self.unique_name(), allow, devices, extra_config)
        ct.create()
        self.containers.append(ct)
        if start:
            ct.start()
        return ct

    def forget(self, ct: LabContainer) -> None:
        """Drop ``ct`` from the containers destroyed at teardown."""
        if ct in self.containers:
            self.containers.remove(ct)

    def teardown(self) -> None:
        """Destroy every container, stop the namespace, delete the lab directory."""
        for ct in list(self.containers):
            ct.destroy()
        self.namespace.stop()
        for grant in self.subordinate_ids:
            grant.release()
        self.subordinate_ids.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def remove_stale_lab_dirs(base: Path) -> None:
    """Delete lab dirs whose owning pytest process is gone (after killing their
    containers), so a crashed run leaves nothing behind for the next one."""
    if not base.is_dir():
        return
    for root in base.iterdir():
        owner = root / "owner.pid"
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            pid = 0
        if pid and Path(f"/proc/{pid}").exists():
            continue
        lxcpath = root / "lxc"
        for ct_dir in lxcpath.iterdir() if lxcpath.is_dir() else ():
            kill_container_cgroups(ct_dir.name)
        shutil.rmtree(root, ignore_errors=True)


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds pass; return it."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def quote(argv: Sequence[str]) -> str:
    """Return ``argv`` as one shell-quoted string (for messages)."""
    return shlex.join(argv)
