"""gpudoctor/bench/load/telemetry.py: what the GPU sampler reads from NVML, what it leaves
out when NVML cannot say, the Xid events it waits for between samples, and the summary a
cell records. NVML with GPUs cannot exist on this CPU machine: :class:`FakePynvml` stands
for nvidia-ml-py's ``pynvml`` module on a host with a few GPUs (only the calls the sampler
makes, with NVML's shapes: bytes UUIDs, milliwatts, bytes of memory, NVMLError subclasses)."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from gpudoctor.bench.load.telemetry import (
    GpuSampler,
    decode_throttle,
    open_nvml,
    summarize_samples,
)


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class FakePynvml:
    """``pynvml`` on a host whose GPUs are ``gpus`` (dicts of what each call returns; a
    missing key raises NVMLError_NotSupported). ``calls`` records the calls made."""

    NVMLError = NVMLError
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[dict[str, Any]], events: bool = True) -> None:
        self.gpus = gpus
        self.handles = [SimpleNamespace(index=i) for i in range(len(gpus))]
        self.calls: list[tuple] = []
        self.events = events
        self.event_queue: list[Any] = []
        self.waited = threading.Event()

    def _value(self, handle: Any, key: str) -> Any:
        gpu = self.gpus[handle.index]
        if key not in gpu:
            raise NVMLError_NotSupported(key)
        return gpu[key]

    def nvmlInit(self) -> None:
        self.calls.append(("init",))

    def nvmlShutdown(self) -> None:
        self.calls.append(("shutdown",))

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: Any) -> Any:
        return self._value(h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return SimpleNamespace(gpu=self._value(h, "util"), memory=99)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        return SimpleNamespace(used=self._value(h, "mem_bytes"), total=1 << 40)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._value(h, "milliwatts")

    def nvmlDeviceGetClockInfo(self, h: Any, kind: int) -> int:
        assert kind == self.NVML_CLOCK_SM
        return self._value(h, "sm_mhz")

    def nvmlDeviceGetTemperature(self, h: Any, kind: int) -> int:
        assert kind == self.NVML_TEMPERATURE_GPU
        return self._value(h, "temp")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._value(h, "reasons")

    def nvmlEventSetCreate(self) -> str:
        if not self.events:
            raise NVMLError_NotSupported("events")
        return "event-set"

    def nvmlEventSetFree(self, s: str) -> None:
        self.calls.append(("free", s))

    def nvmlDeviceRegisterEvents(self, h: Any, kind: int, s: str) -> None:
        if self.gpus[h.index].get("no_events"):
            raise NVMLError_NotSupported("events")
        self.calls.append(("register", h.index, kind, s))

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        self.calls.append(("wait", s, timeout_ms))
        self.waited.set()
        if self.event_queue:
            event = self.event_queue.pop(0)
            if isinstance(event, Exception):
                raise event
            return event
        raise NVMLError_Timeout("no event")  # pynvml's text: "Timeout"; the class is enough


@pytest.fixture
def nvml(monkeypatch):
    """Install a FakePynvml with the given GPUs as ``pynvml``; return it."""

    def install(*gpus: dict[str, Any], events: bool = True) -> FakePynvml:
        fake = FakePynvml(list(gpus), events)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install


H200 = {"uuid": b"GPU-aaa", "util": 0, "mem_bytes": 3 * 2**30, "milliwatts": 312500,
        "sm_mhz": 1980, "temp": 41, "reasons": 0x4}  # fmt: skip


# ---------------------------------------------------------------------------- reading NVML


def test_a_sample_holds_each_value_in_its_unit_and_zero_is_a_value(nvml):
    nvml(H200)
    reader = open_nvml()
    assert reader is not None
    assert reader.sample(0, 1.5) == {
        "gpu": 0,
        "t": 1.5,
        "util_pct": 0,
        "mem_used_mib": 3072.0,
        "power_w": 312.5,
        "sm_clock_mhz": 1980,
        "temp_c": 41,
        "throttle": 0x4,
    }


def test_a_value_nvml_cannot_give_is_absent_never_zero(nvml):
    nvml({"uuid": "GPU-b", "temp": 50})
    reader = open_nvml()
    assert reader is not None
    assert reader.sample(0, 0.0) == {"gpu": 0, "t": 0.0, "temp_c": 50}


def test_an_older_pynvml_gives_the_throttle_reasons_by_their_old_name(nvml):
    fake = nvml(H200)
    fake.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40
    del FakePynvml.nvmlDeviceGetCurrentClocksEventReasons
    try:
        assert open_nvml().sample(0, 0.0)["throttle"] == 0x40
        del fake.nvmlDeviceGetCurrentClocksThrottleReasons
        assert "throttle" not in open_nvml().sample(0, 0.0)
    finally:
        FakePynvml.nvmlDeviceGetCurrentClocksEventReasons = _event_reasons


_event_reasons = FakePynvml.nvmlDeviceGetCurrentClocksEventReasons


def test_every_gpu_is_sampled_unless_a_slots_uuids_are_given(nvml):
    nvml(H200, {**H200, "uuid": "GPU-bbb"}, {**H200, "uuid": b"GPU-ccc"}, {"util": 1})
    assert open_nvml().indices == [0, 1, 2, 3]
    assert open_nvml(["GPU-ccc", "GPU-aaa"]).indices == [0, 2]
    assert open_nvml([]) is None


def test_no_gpu_of_the_slot_means_no_telemetry_and_nvml_shut_down(nvml):
    fake = nvml(H200)
    assert open_nvml(["GPU-zzz"]) is None
    assert fake.calls == [("init",), ("shutdown",)]


def test_without_nvml_there_is_no_telemetry(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert open_nvml() is None
    with GpuSampler(interval_s=0.01) as sampler:
        pass
    assert sampler.summary() == {}


def test_a_call_that_fails_otherwise_than_nvml_is_not_hidden(nvml):
    fake = nvml(H200)
    fake.nvmlDeviceGetTemperature = lambda h, kind: 1 / 0
    with pytest.raises(ZeroDivisionError):
        open_nvml().sample(0, 0.0)


# ---------------------------------------------------------------------------- Xid events


def test_xid_events_are_registered_for_the_sampled_gpus(nvml):
    fake = nvml(H200, {**H200, "uuid": "GPU-bbb"})
    reader = open_nvml(["GPU-bbb"])
    assert reader.open_xid_events() == "event-set"
    assert [c for c in fake.calls if c[0] == "register"] == [("register", 1, 0x8, "event-set")]
    fake.nvmlEventTypeXidCriticalError = 0x10
    reader.open_xid_events()
    assert fake.calls[-1] == ("register", 1, 0x10, "event-set")


def test_events_no_gpu_accepts_are_given_back(nvml):
    fake = nvml({**H200, "no_events": True}, {**H200, "no_events": True})
    assert open_nvml().open_xid_events() is None
    assert fake.calls[-1] == ("free", "event-set")
    partly = nvml({**H200, "no_events": True}, H200)
    assert open_nvml().open_xid_events() == "event-set"
    assert ("free", "event-set") not in partly.calls
    assert open_nvml() is not None
    nvml(H200, events=False)
    assert open_nvml().open_xid_events() is None


def test_waiting_gives_the_gpu_and_xid_or_none_at_the_timeout(nvml):
    fake = nvml(H200, {**H200, "uuid": "GPU-bbb"})
    reader = open_nvml()
    fake.event_queue.append(SimpleNamespace(device=fake.handles[1], eventData=79.0))
    assert reader.wait_xid("event-set", 2.0) == (1, 79)
    assert fake.calls[-1] == ("wait", "event-set", 2000)
    assert reader.wait_xid("event-set", 0.0001) is None  # NVMLError_Timeout
    assert fake.calls[-1] == ("wait", "event-set", 1)  # never 0: that would not wait


def test_an_event_of_a_gpu_not_sampled_has_no_index(nvml):
    fake = nvml(H200, {**H200, "uuid": "GPU-bbb"})
    reader = open_nvml(["GPU-bbb"])
    fake.event_queue.append(SimpleNamespace(device=fake.handles[0], eventData=48))
    assert reader.wait_xid("event-set", 1) == (None, 48)


def test_a_timeout_named_only_in_the_message_is_a_timeout(nvml):
    fake = nvml(H200)
    reader = open_nvml()
    fake.event_queue.append(NVMLError("Timeout waiting"))
    assert reader.wait_xid("event-set", 1) is None
    fake.event_queue.append(NVMLError_NotSupported("no"))
    with pytest.raises(NVMLError):
        reader.wait_xid("event-set", 1)


def test_an_older_pynvml_waits_with_nvmlEventSetWait(nvml):
    fake = nvml(H200)
    del FakePynvml.nvmlEventSetWait_v2
    try:
        fake.nvmlEventSetWait = lambda s, ms: SimpleNamespace(device=fake.handles[0], eventData=13)
        assert open_nvml().wait_xid("event-set", 1) == (0, 13)
    finally:
        FakePynvml.nvmlEventSetWait_v2 = _wait_v2


_wait_v2 = FakePynvml.nvmlEventSetWait_v2


# ---------------------------------------------------------------------------- the sampler


def test_the_sampler_records_an_xid_between_samples_and_shuts_nvml_down(nvml):
    fake = nvml(H200, {**H200, "uuid": "GPU-bbb", "util": 55})
    fake.event_queue.append(SimpleNamespace(device=fake.handles[1], eventData=79))
    began = time.perf_counter()
    with GpuSampler(interval_s=0.01) as sampler:
        assert fake.waited.wait(30)
        thread = sampler._thread
        assert thread.name == "gpu-sampler" and thread.daemon  # never keeps the process alive
    took = time.perf_counter() - began
    summary = sampler.summary()
    assert [(x["gpu"], x["xid"]) for x in summary["xids"]] == [(1, 79)]
    (xid,) = summary["xids"]
    assert isinstance(xid["t"], float) and 0 <= xid["t"] <= took and xid["t"] == round(xid["t"], 3)
    assert summary["gpus"] == 2 and summary["samples"] >= 1 and summary["interval_s"] == 0.01
    assert summary["util_pct"]["max"] == 55
    times = [s["t"] for s in sampler.samples]
    assert all(0 <= t <= took for t in times) and times == sorted(times)  # seconds into the cell
    assert {c[1] for c in fake.calls if c[0] == "wait"} == {"event-set"}
    assert fake.calls[-1] == ("shutdown",)
    assert not sampler._thread.is_alive()


def test_the_sampler_takes_five_samples_a_second_by_default():
    assert GpuSampler().interval_s == 0.2  # nvidia-smi -lms 200


def test_the_sampler_of_a_slot_samples_only_its_gpus(nvml):
    fake = nvml(H200, {**H200, "uuid": "GPU-bbb"})
    with GpuSampler(interval_s=0.01, gpus=["GPU-bbb"]) as sampler:
        assert fake.waited.wait(30)
    assert {s["gpu"] for s in sampler.samples} == {1}
    assert sampler.summary()["gpus"] == 1 and "xids" not in sampler.summary()


def test_when_waiting_for_events_fails_the_sampler_goes_on_sampling(nvml):
    fake = nvml(H200)
    fake.event_queue.append(NVMLError_NotSupported("wait"))
    with GpuSampler(interval_s=0.001) as sampler:
        assert fake.waited.wait(30)
        while len(sampler.samples) < 3:  # sampling goes on without events
            threading.Event().wait(0.001)
    assert len([c for c in fake.calls if c[0] == "wait"]) == 1
    assert "xids" not in sampler.summary()


def test_a_disabled_sampler_never_opens_nvml(nvml):
    fake = nvml(H200)
    with GpuSampler(enabled=False) as sampler:
        pass
    assert fake.calls == [] and sampler.summary() == {}


# ---------------------------------------------------------------------------- the summary


def test_throttle_reasons_are_named_with_unknown_bits_in_hex():
    assert decode_throttle(0) == []
    assert decode_throttle(0x1 | 0x100 | 0x8) == [
        "gpu_idle",
        "hw_slowdown",
        "display_clock_setting",
    ]
    assert decode_throttle(0x2 | 0x10 | 0x20 | 0x80) == [
        "applications_clocks_setting",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]
    assert decode_throttle(0x200 | 0x4000) == ["0x4200"]


def test_the_summary_counts_samples_per_gpu_and_lists_gpus_by_index():
    samples = [
        {"gpu": 3, "t": 0.0, "temp_c": 50},
        {"gpu": 1, "t": 0.0, "temp_c": 30},
        {"gpu": 3, "t": 0.1, "temp_c": 70},
        {"gpu": 3, "t": 0.2, "temp_c": 60},
    ]
    s = summarize_samples(samples, 0.1)
    assert (s["gpus"], s["samples"], s["interval_s"]) == (2, 3, 0.1)
    assert s["temp_c"] == {"mean": 52.5, "max": 70}
    assert s["per_gpu"] == [
        {"index": 1, "temp_c": {"mean": 30.0, "max": 30}},
        {"index": 3, "temp_c": {"mean": 60.0, "max": 70}},
    ]
    assert "throttle_reasons" not in s and "util_pct" not in s


def test_zero_values_count_in_the_mean_and_an_idle_mask_in_the_fractions():
    samples = [
        {"gpu": 0, "util_pct": 0, "power_w": None, "throttle": 0},
        {"gpu": 0, "util_pct": 90, "throttle": 0x1},
        {"gpu": 0, "util_pct": 30, "throttle": 0x8 | 0x4},
        {"gpu": 0, "util_pct": 0, "throttle": 0x4},
    ]
    s = summarize_samples(samples, 0.2)
    assert s["util_pct"] == {"mean": 30.0, "max": 90}
    assert "power_w" not in s
    assert s["throttle_reasons"] == {"hw_slowdown": 0.25, "sw_power_cap": 0.5}
    assert list(s["throttle_reasons"]) == ["hw_slowdown", "sw_power_cap"]  # by name
