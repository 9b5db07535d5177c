"""GPU telemetry during a cell: an NVML sampler thread and its mean/max summary.

Every NVML call is wrapped once: a value NVML cannot give ("not supported", no GPU)
is simply absent, never a zero. Without NVML or without GPUs the summary is ``{}``.

Fields (per sample, per GPU; the equivalent ``nvidia-smi --query-gpu=`` name):
``util_pct`` (utilization.gpu, %), ``mem_used_mib`` (memory.used, MiB), ``power_w``
(power.draw, W), ``sm_clock_mhz`` (clocks.sm, MHz), ``temp_c`` (temperature.gpu, °C),
``throttle`` (clocks_event_reasons.active bitmask, decoded by ``THROTTLE_REASONS``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

# nvmlClocksEventReason* bits (nvml.h); "gpu_idle" is not a slowdown but is reported.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NUMERIC_FIELDS = ("util_pct", "mem_used_mib", "power_w", "sm_clock_mhz", "temp_c")


def decode_throttle(mask: int) -> list[str]:
    """Return the names of the clock-event reasons set in ``mask`` (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(hex(unknown))
    return names


def _mean_max(values: Sequence[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "max": max(values)}


def summarize_samples(samples: Sequence[dict[str, Any]], interval_s: float) -> dict[str, Any]:
    """Return the telemetry summary of per-GPU samples (``{}`` when there are none).

    Each sample is ``{"gpu": index, "t": seconds, <NUMERIC_FIELDS...>, "throttle": mask}``
    with absent keys for values NVML did not give. The summary holds ``gpus``, ``samples``
    (per GPU), ``interval_s``, for each field present ``{"mean", "max"}`` over all GPUs and
    samples, ``throttle_reasons`` (every reason seen, except gpu_idle, with the fraction
    of samples it was active in) and ``per_gpu`` (the same per GPU index).
    """
    if not samples:
        return {}
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        by_gpu.setdefault(sample["gpu"], []).append(sample)
    summary: dict[str, Any] = {
        "gpus": len(by_gpu),
        "samples": max(len(v) for v in by_gpu.values()),
        "interval_s": interval_s,
    }
    summary.update(_field_summary(samples))
    summary["per_gpu"] = [
        {"index": gpu, **_field_summary(rows)} for gpu, rows in sorted(by_gpu.items())
    ]
    return summary


def _field_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in NUMERIC_FIELDS:
        values = [row[name] for row in rows if row.get(name) is not None]
        if values:
            out[name] = _mean_max(values)
    masks = [row["throttle"] for row in rows if row.get("throttle") is not None]
    if masks:
        seen: dict[str, int] = {}
        for mask in masks:
            for reason in decode_throttle(mask):
                if reason != "gpu_idle":
                    seen[reason] = seen.get(reason, 0) + 1
        out["throttle_reasons"] = {k: v / len(masks) for k, v in sorted(seen.items())}
    return out


class _Nvml:
    """The NVML calls the sampler needs, each returning None when NVML cannot answer."""

    def __init__(self, uuids: Sequence[str] | None = None) -> None:
        import pynvml  # nvidia-ml-py; fails cleanly without libnvidia-ml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self.handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        self.indices = list(range(len(self.handles)))
        if uuids is not None:  # a slot's GPUs only (their NVML indices)
            wanted = set(uuids)
            self.indices = [
                i for i, h in enumerate(self.handles)
                if _text(self._get(pynvml.nvmlDeviceGetUUID, h)) in wanted
            ]  # fmt: skip

    def _get(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self, index: int, t: float) -> dict[str, Any]:
        """Return one sample of GPU ``index`` (keys absent where NVML gave nothing)."""
        nv, handle = self.nvml, self.handles[index]
        row: dict[str, Any] = {"gpu": index, "t": t}
        util = self._get(nv.nvmlDeviceGetUtilizationRates, handle)
        mem = self._get(nv.nvmlDeviceGetMemoryInfo, handle)
        power = self._get(nv.nvmlDeviceGetPowerUsage, handle)
        values = {
            "util_pct": util.gpu if util is not None else None,
            "mem_used_mib": mem.used / 2**20 if mem is not None else None,
            "power_w": power / 1000.0 if power is not None else None,
            "sm_clock_mhz": self._get(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
            "temp_c": self._get(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
        }
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        values["throttle"] = self._get(reasons_fn, handle) if reasons_fn else None
        row.update({k: v for k, v in values.items() if v is not None})
        return row

    def open_xid_events(self) -> Any:
        """Register the sampled GPUs for Xid (critical error) events; return the NVML event
        set, None when NVML cannot (an old driver, a container without the right)."""
        nv = self.nvml
        event_set = self._get(nv.nvmlEventSetCreate)
        if event_set is None:
            return None
        kind = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        registered = 0
        for i in self.indices:
            try:
                nv.nvmlDeviceRegisterEvents(self.handles[i], kind, event_set)
                registered += 1
            except nv.NVMLError:
                pass  # this GPU (or this container) gives no events
        if not registered:
            self._get(nv.nvmlEventSetFree, event_set)
            return None
        return event_set

    def wait_xid(self, event_set: Any, timeout_s: float) -> tuple[int | None, int] | None:
        """Wait up to ``timeout_s`` for an Xid event; return (GPU index, Xid) or None on a
        timeout. Raises NVMLError when waiting itself fails (events are then unusable)."""
        nv = self.nvml
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        try:
            data = wait(event_set, max(int(timeout_s * 1000), 1))
        except nv.NVMLError as exc:
            if "timeout" in type(exc).__name__.lower() or "timeout" in str(exc).lower():
                return None
            raise
        index = next((i for i in self.indices if self.handles[i] == data.device), None)
        return index, int(data.eventData)

    def close(self) -> None:
        self._get(self.nvml.nvmlShutdown)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml(uuids: Sequence[str] | None = None) -> _Nvml | None:
    """Return an initialised NVML wrapper (sampling only the GPUs of ``uuids`` when given),
    or None when NVML or those GPUs are absent."""
    try:
        nvml = _Nvml(uuids)
    except Exception:  # ImportError, NVMLError_LibraryNotFound, driver errors: no telemetry
        return None
    if not nvml.indices:
        nvml.close()
        return None
    return nvml


class GpuSampler:
    """Samples every GPU (or a slot's ``gpus``, by UUID) in a daemon thread while in use:
    ``with GpuSampler() as s: ...``.

    ``summary()`` after the block returns ``summarize_samples`` of what was collected
    (``{}`` without GPUs). Equivalent shell: ``nvidia-smi --query-gpu=utilization.gpu,
    memory.used,power.draw,clocks.sm,temperature.gpu,clocks_event_reasons.active
    --format=csv -lms 200``.
    """

    def __init__(
        self, interval_s: float = 0.2, enabled: bool = True, gpus: Sequence[str] | None = None
    ) -> None:
        self.interval_s = interval_s
        self.enabled = enabled
        self.gpus = gpus  # a slot's GPU UUIDs (None: every GPU of the host)
        self.samples: list[dict[str, Any]] = []
        self.xids: list[dict[str, Any]] = []  # Xid events during the cell
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: _Nvml | None = None

    def __enter__(self) -> GpuSampler:
        self._nvml = open_nvml(self.gpus) if self.enabled else None
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            self._nvml.close()

    def _loop(self) -> None:
        assert self._nvml is not None
        nvml = self._nvml
        t0 = time.perf_counter()
        events = nvml.open_xid_events()
        while True:
            now = time.perf_counter() - t0
            for index in nvml.indices:
                self.samples.append(nvml.sample(index, now))
            if events is not None:  # wait for an Xid between samples (nvmlEventSetWait)
                try:
                    seen = nvml.wait_xid(events, self.interval_s)
                except nvml.nvml.NVMLError:
                    events = None  # cannot wait on events here: plain sampling
                    continue
                if seen is not None:
                    self.xids.append({"gpu": seen[0], "xid": seen[1],
                                      "t": round(time.perf_counter() - t0, 3)})  # fmt: skip
                if self._stop.is_set():
                    break
            elif self._stop.wait(self.interval_s):
                break

    def summary(self) -> dict[str, Any]:
        """Return the summary of the samples taken (``{}`` when no GPU was sampled), with
        ``xids`` (``[{"gpu", "xid", "t"}]``, seconds into the cell) when an Xid event
        arrived during the cell (NVML ``nvmlEventTypeXidCriticalError``)."""
        summary = summarize_samples(self.samples, self.interval_s)
        if self.xids:
            summary["xids"] = list(self.xids)
        return summary
