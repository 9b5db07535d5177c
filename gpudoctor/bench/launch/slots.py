"""The host's GPUs as a pool of slots: which GPUs exist, which are healthy, which sets of
them a tensor-parallel server should get, and who holds which right now.

Where the GPUs come from (:func:`discover_gpus`):

- NVML through gpudoctor's own probe (``gpudoctor check``'s ``nvml`` stage, run in a
  child interpreter): index, UUID, name, memory. ``nvidia-smi --query-gpu=index,uuid,
  name,memory.total --format=csv`` prints the same.
- Stand-in GPUs for a machine without one (the CPU lab, the packing benchmark):
  ``GPUDOCTOR_FAKE_GPUS="GPU-aaaa,GPU-bbbb,..."`` declares their UUIDs. A stand-in's
  health is read from the file ``GPUDOCTOR_FAKE_GPU_FAULTS`` names (lines ``UUID reason``),
  its topology from the ``nvidia-smi topo -m`` text that ``GPUDOCTOR_FAKE_GPU_TOPO`` names.

A server gets its GPUs as ``CUDA_VISIBLE_DEVICES=<uuid>,<uuid>`` (UUIDs, not indices:
indices change with the environment, UUIDs do not).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_GPUS = "GPUDOCTOR_FAKE_GPUS"
FAKE_FAULTS = "GPUDOCTOR_FAKE_GPU_FAULTS"
FAKE_TOPO = "GPUDOCTOR_FAKE_GPU_TOPO"

NVIDIA_SMI_TIMEOUT_S = 30.0  # the longest `nvidia-smi topo -m` may take, seconds
MAX_CANDIDATE_SETS = 20000  # TP sets scored at most (bounds the time on a large host)

# `nvidia-smi topo -m` link kinds, best first (NV# = NVLink with # links, scored above all).
_LINK_SCORE = {"X": 100, "NVS": 90, "PIX": 50, "PXB": 40, "PHB": 30, "NODE": 20, "SYS": 10}


@dataclass(frozen=True)
class Gpu:
    """One GPU of the host.

    Attributes:
        index: NVML index (``nvidia-smi -i``).
        uuid: ``GPU-...`` (what ``CUDA_VISIBLE_DEVICES`` is given).
        name: the model name (``NVIDIA H200``), ``stand-in`` for a declared one.
        memory_bytes: total memory, bytes (None when unknown).
    """

    index: int
    uuid: str
    name: str = "stand-in"
    memory_bytes: int | None = None


@dataclass(frozen=True)
class Slot:
    """Where one job runs: its number (1, 2, ... in start order) and its GPUs."""

    number: int
    gpus: tuple[Gpu, ...]

    @property
    def uuids(self) -> list[str]:
        """Return the slot's GPU UUIDs (``CUDA_VISIBLE_DEVICES``)."""
        return [g.uuid for g in self.gpus]


def _probe_devices(timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Return the NVML devices of gpudoctor's GPU probe (``nvml`` stage only), [] without."""
    import sys

    from gpudoctor.facts.gpu import parse_probe_output, probe_source

    try:
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", probe_source(), "nvml"],
                              capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    stage = parse_probe_output(proc.stdout).get("nvml")
    return list(stage.data.get("devices", [])) if stage is not None else []


def declared_uuids() -> list[str] | None:
    """Return the stand-in GPU UUIDs of ``$GPUDOCTOR_FAKE_GPUS`` (None when unset)."""
    text = os.environ.get(FAKE_GPUS, "").strip()
    if not text:
        return None
    return [u.strip() for u in text.split(",") if u.strip()]


def discover_gpus() -> tuple[list[Gpu], str]:
    """Return the GPUs this launch may use and where they came from (``nvml`` or
    ``GPUDOCTOR_FAKE_GPUS``), narrowed to ``$CUDA_VISIBLE_DEVICES`` when the launcher was
    given some (a Slurm task gets ``CUDA_VISIBLE_DEVICES=2,3`` for its ``--gres=gpu:2``)."""
    declared = declared_uuids()
    if declared is not None:
        gpus, source = [Gpu(i, u) for i, u in enumerate(declared)], FAKE_GPUS
    else:
        gpus = [
            Gpu(int(d["index"]), str(d["uuid"]), str(d.get("name") or "GPU"), d.get("memory_total"))
            for d in _probe_devices()
            if d.get("uuid") and "error" not in d
        ]
        source = "nvml"
    return narrow_to_visible(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")), source


def narrow_to_visible(gpus: list[Gpu], visible: str | None) -> list[Gpu]:
    """Return the GPUs ``CUDA_VISIBLE_DEVICES`` lets this process use: by UUID, or by
    index (indices when the list is as long as ``gpus`` are taken as already renumbered,
    as under a device cgroup); unset: all of them; set but empty: none."""
    if visible is None:
        return gpus
    words = [w.strip() for w in visible.split(",") if w.strip()]
    if all(w.isdigit() for w in words):
        if len(words) == len(gpus):
            return gpus
        wanted = [int(w) for w in words]
        return [g for i in wanted for g in gpus if g.index == i]
    return [g for w in words for g in gpus if g.uuid == w or g.uuid.startswith(w)]


def gpu_fault(dev: dict[str, Any]) -> str | None:
    """Return why an NVML device record is unfit for a cell, or None when it is fit:
    an NVML error on the device, uncorrected ECC errors, pages pending retirement, or a
    row remap failure (``nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER``). Throttling
    and PCIe width are warnings of ``gpu.health``, not reasons to leave a GPU idle."""
    if "error" in dev:
        return f"NVML error {dev.get('error_name') or dev['error']}"
    if dev.get("ecc_uncorrected_volatile"):
        return f"{dev['ecc_uncorrected_volatile']} uncorrected ECC error(s) since the driver loaded"
    if dev.get("retired_pages_pending") == 1:
        return "pages pending retirement (reset the GPU)"
    rows = dev.get("remapped_rows") or {}
    if rows.get("failure"):
        return "row remapping failed (the GPU needs service)"
    if rows.get("pending"):
        return "a row remap is pending (reset the GPU)"
    return None


def check_gpus(gpus: list[Gpu]) -> dict[str, str]:
    """Return ``{uuid: reason}`` for each of ``gpus`` that fails its check right now (a GPU
    that NVML no longer lists fails too). Stand-ins read ``$GPUDOCTOR_FAKE_GPU_FAULTS``."""
    if declared_uuids() is not None:
        faults: dict[str, str] = {}
        path = os.environ.get(FAKE_FAULTS)
        if path and Path(path).is_file():
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                uuid, _, reason = line.strip().partition(" ")
                if uuid:
                    faults[uuid] = reason.strip() or "declared faulty"
        return {g.uuid: faults[g.uuid] for g in gpus if g.uuid in faults}
    by_uuid = {str(d.get("uuid")): d for d in _probe_devices()}
    out = {}
    for gpu in gpus:
        dev = by_uuid.get(gpu.uuid)
        reason = (
            "not listed by NVML any more (fallen off the bus?)" if dev is None else gpu_fault(dev)
        )
        if reason:
            out[gpu.uuid] = reason
    return out


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """Return the link kind between GPU pairs of ``nvidia-smi topo -m`` output
    (``{(0, 1): "NV18", (0, 2): "SYS", ...}``, both orders); ``{}`` when unreadable."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    cols = [int(h[3:]) for h in header if re.fullmatch(r"GPU\d+", h)]
    links: dict[tuple[int, int], str] = {}
    for line in lines[1:]:
        words = line.split()
        if not words or not re.fullmatch(r"GPU\d+", words[0]):
            continue
        row = int(words[0][3:])
        for col, kind in zip(cols, words[1 : 1 + len(cols)], strict=False):
            links[(row, col)] = kind
    return links


def link_score(kind: str) -> int:
    """Return how good a link is (NVLink NV# > NVSwitch > PIX > PXB > PHB > NODE > SYS)."""
    if re.fullmatch(r"NV\d+", kind):
        return 60 + int(kind[2:])
    return _LINK_SCORE.get(kind, 0)


def read_topology() -> dict[tuple[int, int], str]:
    """Return the GPU links (``nvidia-smi topo -m``; a stand-in's from ``$GPUDOCTOR_FAKE_GPU_TOPO``)."""
    if declared_uuids() is not None:
        path = os.environ.get(FAKE_TOPO)
        return parse_topo(Path(path).read_text(encoding="utf-8")) if path else {}
    try:
        proc = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_topo(proc.stdout) if proc.returncode == 0 else {}


def cap_gpus(gpus: list[Gpu], indices: tuple[int, ...] | None, count: int | None) -> list[Gpu]:
    """Return the GPUs ``[hardware]`` allows: those ``indices`` (ValueError naming one the
    host lacks), then at most ``count`` of them (lowest index first)."""
    if indices is not None:
        by_index = {g.index: g for g in gpus}
        missing = [i for i in indices if i not in by_index]
        if missing:
            have = ", ".join(str(g.index) for g in gpus) or "none"
            raise ValueError(f"[hardware] gpus names GPU {missing[0]}, but this host has {have}")
        gpus = [by_index[i] for i in indices]
    return gpus[:count] if count is not None else list(gpus)


def best_set(free: list[Gpu], n: int, links: dict[tuple[int, int], str]) -> list[Gpu] | None:
    """Return the ``n`` free GPUs with the best links among them (the weakest pair link
    first, then the sum; lowest indices on a tie), or None when fewer are free. Only the
    first :data:`MAX_CANDIDATE_SETS` sets (lowest indices first) are scored."""
    if n > len(free):
        return None
    if n == 1 or not links:
        return free[:n]

    def score(group: tuple[Gpu, ...]) -> tuple[int, int]:
        pairs = [
            link_score(links.get((a.index, b.index), ""))
            for a, b in itertools.combinations(group, 2)
        ]
        return (min(pairs), sum(pairs))

    candidates = itertools.islice(itertools.combinations(free, n), MAX_CANDIDATE_SETS)
    return list(max(candidates, key=score))


class GpuPool:
    """The GPUs a campaign may use, each free, held by one slot, or out (failed its check).

    Thread-safe: the launcher's slot threads give GPUs back while its loop takes them."""

    def __init__(self, gpus: list[Gpu], links: dict[tuple[int, int], str] | None = None) -> None:
        self.gpus = list(gpus)
        self.links = links or {}
        self.held: dict[str, int] = {}  # uuid -> slot number
        self.out: dict[str, str] = {}  # uuid -> why it left the pool
        self._lock = threading.Lock()

    @property
    def usable(self) -> int:
        """Return how many GPUs are still in the pool (free or held)."""
        return len(self.gpus) - len(self.out)

    def free(self) -> list[Gpu]:
        """Return the free GPUs, lowest index first."""
        with self._lock:
            return [g for g in self.gpus if g.uuid not in self.held and g.uuid not in self.out]

    def take(self, n: int, slot: int) -> list[Gpu] | None:
        """Hold the best-connected ``n`` free GPUs for ``slot``; return them (None: not enough)."""
        with self._lock:
            free = [g for g in self.gpus if g.uuid not in self.held and g.uuid not in self.out]
            chosen = best_set(free, n, self.links)
            if chosen is not None:
                for g in chosen:
                    self.held[g.uuid] = slot
            return chosen

    def give_back(self, gpus: list[Gpu]) -> None:
        """Free ``gpus`` (a slot ended; its server is stopped)."""
        with self._lock:
            for g in gpus:
                self.held.pop(g.uuid, None)

    def remove(self, gpu: Gpu, reason: str) -> None:
        """Take ``gpu`` out of the pool for the rest of the campaign (failed its check)."""
        with self._lock:
            self.held.pop(gpu.uuid, None)
            self.out[gpu.uuid] = reason


def visible_devices(gpus: list[Gpu]) -> str:
    """Return the ``CUDA_VISIBLE_DEVICES`` value of a slot (its UUIDs, comma-separated)."""
    return ",".join(g.uuid for g in gpus)
