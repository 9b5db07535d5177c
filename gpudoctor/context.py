"""What a check sees while it runs: the host, the options, shared facts, upstream results."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from gpudoctor.facts import node_snapshot
from gpudoctor.facts.gpu import GpuProbe, run_gpu_probe
from gpudoctor.facts.node_snapshot import NodeSnapshot
from gpudoctor.facts.nodes import discover_nvidia_nodes
from gpudoctor.facts.procfs import ProcDevices, parse_proc_devices
from gpudoctor.hosts.base import FileStat, Host
from gpudoctor.model import CheckResult, Finding, Status

T = TypeVar("T")


@dataclass(frozen=True)
class DeviceRequest:
    """An extra device node to probe (``--device PATH[:DRIVER]``).

    Attributes:
        path: the node's path inside the target (``/dev/dri/card0``).
        driver: the /proc/devices name its major must match (``drm``), or None.
    """

    path: str
    driver: str | None = None

    @classmethod
    def parse(cls, text: str) -> DeviceRequest:
        """Return the request for ``PATH`` or ``PATH:DRIVER``; raise ValueError if malformed."""
        path, sep, driver = text.partition(":")
        if not path.startswith("/"):
            raise ValueError(f"--device {text!r}: the path must be absolute (/dev/...)")
        if sep and not driver:
            raise ValueError(f"--device {text!r}: empty driver name after ':'")
        return cls(path, driver or None)


@dataclass(frozen=True)
class CheckOptions:
    """Options of one check run.

    Attributes:
        devices: extra device nodes to probe beyond the NVIDIA set.
        model_dirs: model directories that must be present and complete.
        only: check ids (or families) to run; empty = all.
        timeout_s: per-check timeout in seconds.
        probe_timeout_s: timeout of the CUDA/NVML child probe in seconds.
        ct: the container id when checking a CT from its host (``--ct``).
        flavor: ``pve`` or ``lxc``: how the container's host is managed.
        lxcpath: LXC's container directory for flavor ``lxc`` (``--lxcpath``; None: LXC's
            default, ``lxc-config lxc.lxcpath``).
        fix_host: how to name the CT's host in remedies (``root@pve1``), when known.
        expect_gpus: GPUs the workload needs (``--expect-gpus``), when known.
        deep: run the slow, opt-in checks too (``--deep``: NCCL all-reduce, ...).
    """

    devices: tuple[DeviceRequest, ...] = ()
    model_dirs: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    timeout_s: float = 20.0
    probe_timeout_s: float = 20.0
    ct: str | None = None
    flavor: str = "pve"
    lxcpath: str | None = None
    fix_host: str | None = None
    expect_gpus: int | None = None
    deep: bool = False

    def config_path(self) -> str:
        """Return the CT config path remedies should name (``/etc/pve/lxc/<id>.conf``)."""
        ct = self.ct or "<id>"
        if self.flavor == "lxc":
            return f"{(self.lxcpath or '/var/lib/lxc').rstrip('/')}/{ct}/config"
        return f"/etc/pve/lxc/{ct}.conf"

    def fix_command(self) -> str:
        """Return the ``gpudoctor fix`` command line for this target, with every flag the
        findings need: a ``--device PATH`` per device checked with ``--device`` (without it
        fix passes only the host's NVIDIA nodes and says "nothing to pass through")."""
        host = self.fix_host or "<proxmox-host>"
        flavor = " --flavor lxc" if self.flavor == "lxc" else ""
        if self.flavor == "lxc" and self.lxcpath:
            flavor += f" --lxcpath {self.lxcpath}"
        devices = "".join(f" --device {d.path}" for d in self.devices)
        return f"gpudoctor fix --host {host} --ct {self.ct or '<id>'}{flavor}{devices}"


class FactCache:
    """Facts shared by all checks of one run, each fetched once (thread-safe).

    The GPU probe can be started early (:meth:`start_gpu_probe`) so that it runs in
    parallel with the file-based checks: the whole catalogue then costs about one cuInit.
    Observe before disturbing: the device-node facts (:meth:`nodes_before`) are read before
    the probe starts, since the driver library in the probe may rewrite nodes (issue 21).
    """

    def __init__(self, host: Host, options: CheckOptions) -> None:
        self.host = host
        self.options = options
        self._lock = threading.Lock()
        self._futures: dict[str, Future[Any]] = {}

    def get(self, key: str, loader: Callable[[], T]) -> T:
        """Return the fact ``key``, calling ``loader`` the first time (errors are cached too)."""
        with self._lock:
            future = self._futures.get(key)
            owner = future is None
            if owner:
                future = self._futures[key] = Future()
        assert future is not None
        if owner:
            try:
                future.set_result(loader())
            except BaseException as exc:  # cached and re-raised to every reader
                future.set_exception(exc)
        return future.result()

    def start_gpu_probe(self) -> None:
        """Read the node facts (:meth:`nodes_before`), then start the GPU probe in a
        background thread (idempotent)."""
        with self._lock:
            if "gpu_probe" in self._futures or getattr(self, "_probe_started", False):
                return
            self._probe_started = True
        with contextlib.suppress(Exception):  # cached for the checks that read it
            self.nodes_before()
        threading.Thread(target=self._prefetch_probe, name="gpu-probe", daemon=True).start()

    def _prefetch_probe(self) -> None:
        """Run the probe for later readers; its error is cached for them, not printed here."""
        with contextlib.suppress(BaseException):
            self.gpu_probe()

    def gpu_probe(self) -> GpuProbe:
        """Return the GPU probe's result (running it now if nobody started it, after the
        node facts were read)."""

        def load() -> GpuProbe:
            with contextlib.suppress(Exception):
                self.nodes_before()
            return run_gpu_probe(self.host, self.options.probe_timeout_s)

        return self.get("gpu_probe", load)

    def probe_started(self) -> bool:
        """Return True when the GPU probe was started (or ran) in this run."""
        with self._lock:
            return "gpu_probe" in self._futures or getattr(self, "_probe_started", False)

    def nodes_before(self) -> NodeSnapshot:
        """Return the NVIDIA nodes, ``/proc/devices`` and the cgroup files as they were
        before the GPU probe ran (read once, first; for a local check the snapshot
        :mod:`gpudoctor.early_probe` took just before it forked the probe). The node facts
        the checks read (:meth:`nvidia_nodes`, :meth:`node_stat`, :meth:`proc_devices`,
        :meth:`read_optional`) then answer from it."""
        return self.get("nodes_before", self._observe)

    def _observe(self) -> NodeSnapshot:
        from gpudoctor import early_probe
        from gpudoctor.hosts.local import LocalHost

        raw = early_probe.take_snapshot() if isinstance(self.host, LocalHost) else None
        if raw is not None:
            snap = node_snapshot.from_early(raw)
        else:
            snap = node_snapshot.take(self.host, [d.path for d in self.options.devices])
        self._prime("nvidia_nodes", list(snap.nodes))
        for path, st in snap.stats:
            self._prime("node:" + path, st)
        for path, text in snap.files:
            self._prime("file:" + path, text)
        devices = dict(snap.files).get("/proc/devices")
        if "/proc/devices" in dict(snap.files):
            self._prime("proc_devices", parse_proc_devices(devices) if devices else ProcDevices())
        return snap

    def _prime(self, key: str, value: object) -> None:
        """Record ``value`` as fact ``key`` unless it was read already."""
        with self._lock:
            if key not in self._futures:
                future: Future[Any] = Future()
                future.set_result(value)
                self._futures[key] = future

    def nvidia_nodes(self) -> list[str]:
        """Return the NVIDIA node paths present (``ls /dev/nvidia* /dev/nvidia-caps*``)."""
        return self.get("nvidia_nodes", lambda: discover_nvidia_nodes(self.host.list_dir))

    def node_stat(self, path: str) -> FileStat | None:
        """Return ``stat PATH`` (None when it does not exist; other errors raise), as it
        was before the probe for every node the snapshot looked at."""
        return self.get("node:" + path, lambda: node_snapshot.stat_or_none(self.host, path))

    def proc_devices(self) -> ProcDevices:
        """Return the parsed ``/proc/devices`` of the host (empty when unreadable)."""

        def load() -> ProcDevices:
            try:
                return parse_proc_devices(self.host.read_text("/proc/devices"))
            except OSError:
                return ProcDevices()

        return self.get("proc_devices", load)

    def read_optional(self, path: str) -> str | None:
        """Return a file's text, or None when it cannot be read (cached)."""

        def load() -> str | None:
            try:
                return self.host.read_text(path)
            except OSError:
                return None

        return self.get("file:" + path, load)


class CheckContext:
    """The view one check has of the run: host, options, facts and upstream results."""

    def __init__(
        self,
        check_id: str,
        host: Host,
        options: CheckOptions,
        facts: FactCache,
        results: dict[str, CheckResult],
    ) -> None:
        self.check_id = check_id
        self.host = host
        self.options = options
        self.facts = facts
        self._results = results

    def result(self, check_id: str) -> CheckResult | None:
        """Return an upstream check's result (declared in ``requires``/``after``), or None."""
        return self._results.get(check_id)

    def failed(self, check_id: str) -> bool:
        """Return True when an upstream check ran and reported FAIL or ERROR."""
        result = self.result(check_id)
        return result is not None and result.status in (Status.FAIL, Status.ERROR)

    def finding(self, status: Status, subject: str, message: str, **extra: Any) -> Finding:
        """Return a Finding of this check (``extra``: evidence, remediation, fix_hint, caused_by)."""
        if "evidence" in extra:
            extra["evidence"] = tuple(extra["evidence"])
        if "caused_by" in extra:
            extra["caused_by"] = tuple(extra["caused_by"])
        return Finding(self.check_id, status, subject, message, **extra)

    def passed(self, subject: str, message: str, **extra: Any) -> Finding:
        """Return a PASS finding."""
        return self.finding(Status.PASS, subject, message, **extra)

    def warn(self, subject: str, message: str, **extra: Any) -> Finding:
        """Return a WARN finding."""
        return self.finding(Status.WARN, subject, message, **extra)

    def fail(self, subject: str, message: str, **extra: Any) -> Finding:
        """Return a FAIL finding."""
        return self.finding(Status.FAIL, subject, message, **extra)

    def skip(self, subject: str, message: str, **extra: Any) -> Finding:
        """Return a SKIP finding (the check does not apply here, and says why)."""
        return self.finding(Status.SKIP, subject, message, **extra)
