"""GPU telemetry: the summary on hand-made samples, and no fields at all without a GPU."""

from __future__ import annotations

import pytest

from gpudoctor.bench.load.telemetry import GpuSampler, decode_throttle, open_nvml, summarize_samples


def _has_gpu() -> bool:
    nvml = open_nvml()
    if nvml is None:
        return False
    nvml.close()
    return True


def test_summary_mean_max_and_missing_values() -> None:
    samples = [
        {"gpu": 0, "t": 0.0, "util_pct": 50, "mem_used_mib": 1000.0, "power_w": 300.0,
         "sm_clock_mhz": 1900, "temp_c": 60, "throttle": 0x1},
        {"gpu": 0, "t": 0.2, "util_pct": 100, "mem_used_mib": 3000.0, "power_w": 500.0,
         "sm_clock_mhz": 1700, "temp_c": 70, "throttle": 0x4},
        {"gpu": 1, "t": 0.0, "util_pct": 0, "mem_used_mib": 2000.0, "temp_c": 40, "throttle": 0x0},
        {"gpu": 1, "t": 0.2, "util_pct": 10, "mem_used_mib": 2000.0, "temp_c": 42,
         "throttle": 0x4 | 0x40},
    ]  # fmt: skip
    s = summarize_samples(samples, 0.2)
    assert s["gpus"] == 2 and s["samples"] == 2 and s["interval_s"] == 0.2
    assert s["util_pct"] == {"mean": 40.0, "max": 100}
    assert s["mem_used_mib"] == {"mean": 2000.0, "max": 3000.0}
    assert s["power_w"] == {"mean": 400.0, "max": 500.0}  # GPU 1 gave no power: not a zero
    assert s["temp_c"]["max"] == 70
    # fraction of samples each reason was active (gpu_idle is not a slowdown)
    assert s["throttle_reasons"] == {"hw_thermal_slowdown": 0.25, "sw_power_cap": 0.5}
    gpu1 = s["per_gpu"][1]
    assert gpu1["index"] == 1 and "power_w" not in gpu1 and "sm_clock_mhz" not in gpu1
    assert gpu1["util_pct"] == {"mean": 5.0, "max": 10}


def test_decode_throttle() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x4 | 0x80) == ["sw_power_cap", "hw_power_brake_slowdown"]
    assert decode_throttle(0x1000 | 0x1) == ["gpu_idle", "0x1000"]


def test_no_samples_no_fields() -> None:
    assert summarize_samples([], 0.2) == {}


def test_sampler_without_gpu_gives_no_fields() -> None:
    if _has_gpu():
        pytest.skip("this machine has a GPU; see test_sampler_on_a_real_gpu")
    with GpuSampler(interval_s=0.01) as sampler:
        pass
    assert sampler.samples == [] and sampler.summary() == {}


def test_disabled_sampler_reads_nothing() -> None:
    with GpuSampler(enabled=False) as sampler:
        pass
    assert sampler.summary() == {}


@pytest.mark.gpu
def test_sampler_on_a_real_gpu() -> None:
    if not _has_gpu():
        pytest.skip("no NVIDIA GPU here")
    import time

    with GpuSampler(interval_s=0.05) as sampler:
        time.sleep(0.5)
    s = sampler.summary()
    assert s["gpus"] >= 1 and s["samples"] >= 2
    assert 0 <= s["util_pct"]["mean"] <= s["util_pct"]["max"] <= 100
    assert s["mem_used_mib"]["max"] > 0 and s["power_w"]["max"] > 0
    assert s["sm_clock_mhz"]["max"] > 0 and 0 < s["temp_c"]["max"] < 120


class _FakeXidNvml:
    """Stands for nvidia-ml-py's ``pynvml`` on a host with one GPU that raises Xid 79 (this
    CPU machine has no NVIDIA driver, and a real Xid cannot be provoked on purpose): only
    the calls the sampler makes, with NVML's shapes (``nvmlEventSetWait_v2`` raising
    ``NVMLError_Timeout`` when no event arrived, the event's ``device`` and ``eventData``)."""

    nvmlEventTypeXidCriticalError = 0x8
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    class NVMLError_Timeout(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, xid_after_waits: int = 2, events: bool = True) -> None:
        self.handle = object()
        self.waits = 0
        self.xid_after_waits = xid_after_waits
        self.events = events

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
        return self.handle

    def nvmlDeviceGetUtilizationRates(self, h: object) -> object:
        raise self.NVMLError_NotSupported()

    nvmlDeviceGetMemoryInfo = nvmlDeviceGetPowerUsage = nvmlDeviceGetUtilizationRates

    def nvmlDeviceGetClockInfo(self, h: object, kind: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, h: object, kind: int) -> int:
        return 40

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, s: str) -> None:
        pass

    def nvmlDeviceRegisterEvents(self, h: object, kind: int, s: str) -> None:
        if not self.events:
            raise self.NVMLError_NotSupported()

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> object:
        import time
        from types import SimpleNamespace

        self.waits += 1
        if self.waits == self.xid_after_waits:
            return SimpleNamespace(device=self.handle, eventData=79)
        time.sleep(timeout_ms / 1000)
        raise self.NVMLError_Timeout()


def _sample_with(monkeypatch: pytest.MonkeyPatch, nvml: _FakeXidNvml) -> dict:
    import sys
    import time

    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GpuSampler(interval_s=0.01) as sampler:
        deadline = time.monotonic() + 30
        while nvml.waits < 4 and len(sampler.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    return sampler.summary()


def test_an_xid_during_the_cell_is_recorded_and_marks_it_suspect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpudoctor.bench.results.verdict import suspect

    summary = _sample_with(monkeypatch, _FakeXidNvml())
    assert [(x["gpu"], x["xid"]) for x in summary["xids"]] == [(0, 79)]
    why = suspect({"telemetry": summary})
    assert why is not None and why.startswith("Xid 79 on GPU 0 at ") and "during the cell" in why


def test_without_event_support_the_sampler_still_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    summary = _sample_with(monkeypatch, _FakeXidNvml(events=False))
    assert "xids" not in summary and summary["samples"] >= 1 and summary["temp_c"]["max"] == 40
