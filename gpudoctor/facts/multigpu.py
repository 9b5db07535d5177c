"""Multi-GPU facts: how many GPUs are visible, the P2P probe, the all-reduce probe, NCCL's /dev/shm.

The probes run as child processes through ``host.run`` (see :mod:`gpudoctor.probes.p2p_probe`
and :mod:`gpudoctor.probes.allreduce_probe`); this module runs them and parses what they print
into frozen dataclasses. Everything else here is pure.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpudoctor.facts.gpu import GpuProbe, StageResult, parse_probe_output
from gpudoctor.hosts.base import Host

MIB = 1 << 20
PROBES = Path(__file__).parent.parent / "probes"
GPU_NODE = re.compile(r"^nvidia(\d+)$")
GPUS_DIR = "/proc/driver/nvidia/gpus"
MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)", re.M)
SLOW_RATIO = 0.5
"""A pair is "far below the others" under this fraction of the median of its peers."""
P2P_STATUS_MEANING = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "DR": "disabled by regkey",
    "NS": "not supported",
    "U": "unknown",
}
"""``nvidia-smi topo -p2p`` status codes, as the P2P probe reports NVML's nvmlGpuP2PStatus_t."""


@lru_cache(maxsize=2)
def probe_source(name: str) -> str:
    """Return a probe script's source (``p2p_probe`` or ``allreduce_probe``), sent with ``-c``."""
    return (PROBES / f"{name}.py").read_text()


# ---------------------------------------------------------------------------- GPU count


@dataclass(frozen=True)
class GpuInventory:
    """How many GPUs each layer sees.

    Attributes:
        nvml: devices NVML enumerates (``nvidia-smi -L | wc -l``), None when NVML failed.
        cuda: devices CUDA enumerates after CUDA_VISIBLE_DEVICES, None when cuInit failed.
        kernel: GPUs the kernel driver knows (``ls /proc/driver/nvidia/gpus``; the HOST's
            count, also inside a container), None when unreadable.
        nodes: ``/dev/nvidiaN`` minors present here (``ls /dev/nvidia[0-9]*``).
        kernel_minors: the minors of the kernel driver's GPUs ("Device Minor:" of each
            ``/proc/driver/nvidia/gpus/*/information``), () when unreadable.
        names: GPU names (CUDA's, else NVML's), in index order.
        cuda_visible_devices: the probe's CUDA_VISIBLE_DEVICES, when set.
    """

    nvml: int | None
    cuda: int | None
    kernel: int | None
    nodes: tuple[int, ...]
    kernel_minors: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    cuda_visible_devices: str | None = None

    @property
    def visible(self) -> int | None:
        """Return the GPUs a CUDA program here can use (CUDA's count, else NVML's)."""
        return self.cuda if self.cuda is not None else self.nvml

    def evidence(self) -> list[str]:
        """Return evidence lines (``cuDeviceGetCount``, ``nvidia-smi -L``, ``ls /dev/nvidia*``)."""

        def na(value: int | None) -> str:
            return "N/A" if value is None else str(value)

        lines = [
            f"CUDA devices (cuDeviceGetCount): {na(self.cuda)}",
            f"NVML devices (nvidia-smi -L): {na(self.nvml)}",
            f"kernel driver GPUs (ls /proc/driver/nvidia/gpus): {na(self.kernel)}",
            "GPU nodes here: " + (", ".join(f"/dev/nvidia{n}" for n in self.nodes) or "none"),
        ]
        if self.cuda_visible_devices is not None:
            lines.append(f"CUDA_VISIBLE_DEVICES={self.cuda_visible_devices}")
        return lines

    @property
    def missing_nodes(self) -> tuple[int, ...]:
        """Return the ``/dev/nvidiaN`` minors the host driver has but this system lacks."""
        if self.kernel is None:
            return ()
        minors = self.kernel_minors or tuple(range(self.kernel))
        return tuple(k for k in minors if k not in self.nodes)


def gpu_node_minors(list_dir: Callable[[str], list[str]]) -> tuple[int, ...]:
    """Return the minors of the ``/dev/nvidiaN`` nodes present (``ls /dev/nvidia[0-9]*``),
    sorted; () when /dev cannot be listed. Cheap: no GPU probe."""
    try:
        return tuple(sorted(int(m[1]) for n in list_dir("/dev") if (m := GPU_NODE.match(n))))
    except OSError:
        return ()


def gpu_inventory(
    probe: GpuProbe,
    list_dir: Callable[[str], list[str]],
    read_text: Callable[[str], str | None] = lambda _path: None,
) -> GpuInventory:
    """Return the GpuInventory from the GPU probe and the host's /dev and /proc files
    (``read_text`` returns a file's text or None)."""
    nvml, cuda, env = probe.stage("nvml"), probe.stage("cuda"), probe.stage("env")
    nvml_count = len(nvml.data.get("devices") or []) if nvml.data.get("init") == 0 else None
    cuda_count = cuda.data.get("device_count") if cuda.data.get("init") == 0 else None
    try:
        buses = list_dir(GPUS_DIR)
    except OSError:
        buses = None
    minors = []
    for bus in buses or []:
        match = MINOR_LINE.search(read_text(f"{GPUS_DIR}/{bus}/information") or "")
        if match:
            minors.append(int(match[1]))
    nodes = gpu_node_minors(list_dir)
    source = cuda.data.get("devices") if cuda_count is not None else nvml.data.get("devices")
    names = tuple(str(d.get("name")) for d in source or [])
    visible_env = (env.data.get("env") or {}).get("CUDA_VISIBLE_DEVICES")
    kernel = None if buses is None else len(buses)
    exact = tuple(sorted(minors)) if buses and len(minors) == len(buses) else ()
    return GpuInventory(nvml_count, cuda_count, kernel, nodes, exact, names, visible_env)


def nccl_shm_bytes(gpu_count: int) -> int:
    """Return the /dev/shm space (bytes) NCCL may need for one process per GPU on ``gpu_count``
    GPUs of this node: 0 below 2 GPUs, else ``gpu_count * 128 MiB`` (256 MiB for 2 GPUs,
    512 MiB for 4, 1 GiB for 8). Equivalent check: ``df -B1 --output=avail /dev/shm``.

    Why: NCCL's SHM transport (used between GPUs of one node whenever P2P is off or
    unavailable: ACS/IOMMU, VMs, ``NCCL_P2P_DISABLE=1``) and its proxy keep their FIFOs in
    ``/dev/shm/nccl-*`` segments, one per connection, and NCCL >= 2.19 also falls back to
    /dev/shm for host buffers when cuMem host allocations are unavailable in a container.
    Recorded failures give the per-connection segment size:

    * 9,637,888 B = 4 MiB SIMPLE + 4.69 MiB LL128 + 512 KiB LL buffers + a 4 KiB header
      (NVIDIA/nccl#525 and #290 "posix_fallocate failed: No space left on device", 4 GPUs in
      Docker's default 64 MiB /dev/shm; pytorch/ci-infra#490, 4 x T4, 2026);
    * 33,030,528 B (31.5 MiB) with a recent NCCL under vLLM at TP=2
      (ai-dynamo/dynamo#1408: "failed to extend /dev/shm/nccl-YrFC5V to 33030532 bytes").

    A rank keeps up to four of them (ring send + receive on two channels; trees reuse the
    peers), so 4 x 32 MiB = 128 MiB per GPU covers both generations. It is a floor, not a
    target: NVIDIA's own containers are started with ``--shm-size=1g`` or more, and the
    PyTorch tutorials' CI needed 2 GB (pytorch/tutorials#2475). Weights kept in /dev/shm come
    on top.
    """
    if gpu_count < 2:
        return 0
    return gpu_count * 128 * MIB


# ---------------------------------------------------------------------------- P2P probe


@dataclass(frozen=True)
class PairResult:
    """One ordered GPU pair of the P2P probe (src copies into dst).

    Attributes:
        src: source GPU index (CUDA order).
        dst: destination GPU index.
        can_access_peer: ``cuDeviceCanAccessPeer(src, dst)``; None when not asked.
        enable_rc: ``cuCtxEnablePeerAccess`` return code (0 or 704 = already enabled).
        enable_name: its CUresult name.
        copy_ok: the copied bytes equal the source's (None when no copy ran).
        mismatch: what the destination held instead ({dst_looks, bad_chunks, chunks, ...}).
        gbps: copy bandwidth in GB/s (1e9 bytes/s), None when not measured.
        error: a CUDA call that failed (``cuMemcpyPeer returned 700 ...``), else "".
        seconds: how long testing this pair took (s), None when unknown.
        finished: False when the probe was killed while testing this pair.
    """

    src: int
    dst: int
    can_access_peer: int | None = None
    enable_rc: int | None = None
    enable_name: str | None = None
    copy_ok: bool | None = None
    mismatch: dict[str, Any] = field(default_factory=dict)
    gbps: float | None = None
    error: str = ""
    seconds: float | None = None
    finished: bool = True

    @property
    def label(self) -> str:
        """Return ``GPU 0 -> GPU 1``."""
        return f"GPU {self.src} -> GPU {self.dst}"

    @property
    def peer_enabled(self) -> bool:
        """Return True when the copy went over peer access (P2P)."""
        return bool(self.can_access_peer) and self.enable_rc in (0, 704)


@dataclass(frozen=True)
class P2PProbe:
    """The parsed output of one P2P probe run.

    Attributes:
        init: the ``init`` stage (cuInit code, devices, sizes), empty when it never finished.
        links: NVML's view of each unordered pair {(a, b): {"level": "PIX"|"NODE"|"SYS"|...,
            "read"/"write"/"nvlink": "OK"|"TNS"|...}} (``nvidia-smi topo -m``, ``topo -p2p``).
        pairs: every pair tested (or started, when the probe hung), in test order.
        setup_error: a failure while creating contexts/buffers, else "".
        unfinished_stage: the stage that began but never printed its result (``setup``,
            ``topology``, ``pair:2-3``), "" when none.
        finished: True when the probe printed its ``done`` line.
        timed_out: True when it was killed at its timeout.
        returncode: the child's exit status.
        stderr: the child's stderr tail.
        timeout_s: the timeout it ran under.
    """

    init: dict[str, Any]
    pairs: tuple[PairResult, ...]
    links: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)
    setup_error: str = ""
    unfinished_stage: str = ""
    finished: bool = False
    timed_out: bool = False
    returncode: int = 0
    stderr: str = ""
    timeout_s: float = 0.0

    @property
    def hung_pair(self) -> PairResult | None:
        """Return the pair being tested when the probe was killed, or None."""
        return next((p for p in self.pairs if not p.finished), None) if self.timed_out else None

    def link(self, a: int, b: int) -> str:
        """Return how NVML says GPUs a and b are connected: ``NVLink``, ``PCIe PIX``, ...,
        plus the driver's P2P verdict when it is not OK (``PCIe SYS, P2P TNS``); "" if unknown."""
        info = self.links.get((min(a, b), max(a, b)))
        if not info:
            return ""
        text = "NVLink" if info.get("nvlink") == "OK" else f"PCIe {info.get('level', '?')}"
        read, write = info.get("read"), info.get("write")
        if read == write == "OK" or read is write is None:
            return text
        if read == write:
            return f"{text}, P2P {read} ({P2P_STATUS_MEANING.get(str(read), '?')})"
        return f"{text}, P2P read {read} write {write}"

    def topology_lines(self) -> list[str]:
        """Return evidence lines grouping the GPU pairs by link (``nvidia-smi topo -m``)."""
        groups: dict[str, list[str]] = {}
        for a, b in sorted(self.links):
            groups.setdefault(self.link(a, b), []).append(f"{a}-{b}")
        return [f"topology {kind}: {', '.join(pairs)}" for kind, pairs in groups.items()]

    @property
    def device_count(self) -> int:
        """Return how many GPUs the probe's CUDA saw (0 when cuInit failed)."""
        return int(self.init.get("device_count") or 0)


def parse_p2p_output(stdout: str, **run: Any) -> P2PProbe:
    """Return the P2PProbe for the probe's JSON-lines ``stdout`` (``run``: timed_out, ...)."""
    stages = parse_probe_output(stdout)
    pairs = tuple(pair_from_stage(s) for name, s in stages.items() if name.startswith("pair:"))
    setup = stages.get("setup", StageResult("setup"))
    raw_links = stages.get("topology", StageResult("topology")).data.get("links") or {}
    links = {}
    for key, info in raw_links.items():
        a, b = (int(x) for x in key.split("-"))
        links[(a, b)] = {str(k): str(v) for k, v in info.items()}
    return P2PProbe(
        init=stages["init"].data if "init" in stages else {},
        pairs=pairs,
        links=links,
        setup_error=str(setup.data.get("error", "")),
        unfinished_stage=next((n for n, st in stages.items() if not st.finished), ""),
        finished="done" in stages,
        **run,
    )


def pair_from_stage(stage: StageResult) -> PairResult:
    """Return the PairResult of one ``pair:S-D`` stage."""
    src, dst = (int(x) for x in stage.name.split(":", 1)[1].split("-"))
    d = stage.data
    return PairResult(
        src=src,
        dst=dst,
        can_access_peer=d.get("can_access_peer"),
        enable_rc=d.get("enable_rc"),
        enable_name=d.get("enable_name"),
        copy_ok=d.get("copy_ok"),
        mismatch=dict(d.get("mismatch") or {}),
        gbps=d.get("gbps"),
        error=str(d.get("error", "")),
        seconds=d.get("pair_s"),
        finished=stage.finished,
    )


def run_p2p_probe(host: Host, timeout_s: float, size_mib: int = 32, reps: int = 5) -> P2PProbe:
    """Run the P2P probe on ``host`` in a child interpreter; return what it found.

    Equivalent: ``timeout T python3 -I -S gpudoctor/probes/p2p_probe.py --size-mib 32``.
    """
    argv = [
        host.python,
        "-I",
        "-S",
        "-c",
        probe_source("p2p_probe"),
        "--size-mib",
        str(size_mib),
        "--reps",
        str(reps),
    ]
    result = host.run(argv, timeout=timeout_s)
    return parse_p2p_output(
        result.stdout,
        timed_out=result.timed_out,
        returncode=result.returncode,
        stderr=result.stderr[-2000:],
        timeout_s=timeout_s,
    )


def slow_pairs(
    pairs: Iterable[PairResult], ratio: float = SLOW_RATIO
) -> list[tuple[PairResult, float]]:
    """Return [(pair, median GB/s of its class)] for pairs under ``ratio`` x that median.

    Pairs are compared within their class (peer-enabled with peer-enabled, staged with
    staged): a PCIe pair next to NVLink pairs is a topology fact, not a fault.
    """
    measured = [p for p in pairs if p.gbps is not None and p.copy_ok]
    slow: list[tuple[PairResult, float]] = []
    for enabled in (True, False):
        group = [p for p in measured if p.peer_enabled == enabled]
        if len(group) < 3:
            continue
        median = statistics.median(p.gbps for p in group if p.gbps is not None)
        slow += [(p, median) for p in group if p.gbps is not None and p.gbps < ratio * median]
    return slow


def bandwidth_matrix(pairs: Sequence[PairResult], count: int) -> list[str]:
    """Return text rows of the GB/s matrix (src rows, dst columns; ``-`` on the diagonal,
    ``x`` when not measured), like p2pBandwidthLatencyTest's "Unidirectional" matrix."""
    cell = {(p.src, p.dst): p for p in pairs}
    rows = ["GB/s src\\dst " + " ".join(f"{d:>7}" for d in range(count))]
    for s in range(count):
        values = []
        for d in range(count):
            p = cell.get((s, d))
            if s == d:
                values.append(f"{'-':>7}")
            elif p is None or p.gbps is None:
                values.append(f"{'x':>7}")
            else:
                mark = "" if p.peer_enabled else "*"
                values.append(f"{p.gbps:>6.1f}{mark or ' '}")
        rows.append(f"{s:>12} " + " ".join(values))
    return rows
