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
