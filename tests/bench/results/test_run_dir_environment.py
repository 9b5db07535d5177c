"""run.json's environment: the GPUs and driver NVML reports, and what is recorded when
NVML fails (no driver, no GPU)."""

from __future__ import annotations

import calendar
import os
import platform
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpudoctor.bench.results.run_dir import _cpu_model, environment_facts


class FakeNvml:
    """Stands for nvidia-ml-py's ``pynvml`` on a host with two GPUs (this CPU-only machine
    has no NVIDIA driver): only the calls environment_facts makes, with the real shapes
    (strings as bytes from older bindings, as str from newer; memory info with ``total``).
    ``fail`` names a call that raises ``error`` instead."""

    def __init__(self, fail: str = "", error: Exception | None = None) -> None:
        self.fail = fail
        self.error = error or RuntimeError("NVML Shared Library Not Found")
        self.calls: list[str] = []
        self.gpus = {
            "h0": ("NVIDIA H200", b"GPU-aaaa", 150_754_820_096, (9, 0)),
            "h1": (b"NVIDIA A100-SXM4-80GB", "GPU-bbbb", 85_899_345_920, (8, 0)),
        }

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise self.error

    def nvmlInit(self) -> None:
        self._call("init")

    def nvmlShutdown(self) -> None:
        self._call("shutdown")

    def nvmlSystemGetDriverVersion(self) -> bytes:
        self._call("driver")
        return b"550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        self._call("count")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return ["h0", "h1"][index]

    def nvmlDeviceGetName(self, handle: str) -> str | bytes:
        return self.gpus[handle][0]

    def nvmlDeviceGetUUID(self, handle: str) -> str | bytes:
        return self.gpus[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(total=self.gpus[handle][2], free=0, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: str) -> tuple[int, int]:
        return self.gpus[handle][3]


def _with_nvml(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml


@pytest.fixture
def far_timezone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time 5 h 45 min ahead of UTC (POSIX TZ string: no tzdata needed)."""
    monkeypatch.setenv("TZ", "XYZ-5:45")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_every_gpu_and_the_driver_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _with_nvml(monkeypatch, FakeNvml())
    facts = environment_facts("vllm", "0.6.0", "hopper")
    assert facts["driver"] == "550.54.15"
    assert facts["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaaa",
         "memory_bytes": 150_754_820_096, "compute_capability": "9.0"},
        {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-bbbb",
         "memory_bytes": 85_899_345_920, "compute_capability": "8.0"},
    ]  # fmt: skip
    assert "gpu_error" not in facts
    assert nvml.calls == ["init", "driver", "count", "shutdown"]


def test_a_failing_gpu_query_is_recorded_and_nvml_shut_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = _with_nvml(monkeypatch, FakeNvml(fail="count", error=RuntimeError("GPU is lost")))
    facts = environment_facts("vllm", None, "hopper")
    assert (facts["driver"], facts["gpus"], facts["gpu_error"]) == ("550.54.15", [], "GPU is lost")
    assert nvml.calls[-1] == "shutdown"


def test_no_driver_is_recorded_by_message_or_by_error_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_nvml(monkeypatch, FakeNvml(fail="init"))
    facts = environment_facts("sglang", "0.4", "cpu")
    assert facts["gpu_error"] == "NVML Shared Library Not Found"
    assert (facts["gpus"], facts["driver"]) == ([], None)

    class NVMLError_DriverNotLoaded(Exception):
        """pynvml's error class for "driver not loaded"; its str() can be empty."""

        def __str__(self) -> str:
            return ""

    _with_nvml(monkeypatch, FakeNvml(fail="init", error=NVMLError_DriverNotLoaded()))
    assert environment_facts("sglang", "0.4", "cpu")["gpu_error"] == "NVMLError_DriverNotLoaded"


@pytest.mark.usefixtures("far_timezone")
def test_the_start_time_is_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_nvml(monkeypatch, FakeNvml(fail="init"))
    before = int(time.time())
    facts = environment_facts("vllm", None, "cpu")
    after = time.time()
    started = calendar.timegm(time.strptime(facts["started_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert before <= started <= after


def test_the_cpu_and_its_load_are_recorded() -> None:
    """A benchmarker reads the client machine beside the GPUs: its CPU model (as
    ``grep -m1 'model name' /proc/cpuinfo`` shows it), its CPU count and the load average
    at the start (others' work slows the load generator)."""
    cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    named = re.search(r"^model name\s*: (.*)$", cpuinfo, re.M)
    facts = environment_facts("sglang", None, "sm_90")
    assert facts["cpu_model"] == (named.group(1).strip() if named else platform.processor() or None)
    assert facts["cpus"] == os.cpu_count()
    assert len(facts["load_avg"]) == 3
    assert all(x == round(x, 2) and x >= 0 for x in facts["load_avg"])


def test_the_cpu_model_is_read_whole_and_undecodable_bytes_do_not_stop_it(tmp_path: Path) -> None:
    """The first ``model name`` line's value, colons in the name kept; bytes that are not
    UTF-8 become U+FFFD; a file with no such line falls back to ``platform.processor()``."""
    info = tmp_path / "cpuinfo"
    info.write_bytes(
        b"processor\t: 0\nvendor_id\t: X\xff\nmodel name\t: Vendor CPU: rev 2 @ 3.00GHz \n"
        b"model name\t: second\n"
    )
    assert _cpu_model(str(info)) == "Vendor CPU: rev 2 @ 3.00GHz"
    info.write_bytes(b"processor\t: 0\nModel Name: not this\n")
    assert _cpu_model(str(info)) == (platform.processor() or None)
    assert _cpu_model(str(tmp_path / "missing")) == (platform.processor() or None)


def test_load_averages_are_rounded_to_hundredths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.23456, 0.005, 12.0))
    assert environment_facts("sglang", None, "sm_90")["load_avg"] == [1.23, 0.01, 12.0]
