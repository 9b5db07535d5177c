"""What CUDA driver API and NVML return codes mean, and their usual cause in containers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorMeaning:
    """A return code decoded: its name, what it means, and the likely cause."""

    code: int
    name: str
    meaning: str
    likely_cause: str


CU_RESULTS: dict[int, ErrorMeaning] = {
    e.code: e
    for e in (
        ErrorMeaning(0, "CUDA_SUCCESS", "success", ""),
        ErrorMeaning(3, "CUDA_ERROR_NOT_INITIALIZED", "the driver is not initialised", ""),
        ErrorMeaning(
            100,
            "CUDA_ERROR_NO_DEVICE",
            "no CUDA-capable device is visible",
            "no /dev/nvidiaN passed through, or CUDA_VISIBLE_DEVICES hides them all",
        ),
        ErrorMeaning(
            101,
            "CUDA_ERROR_INVALID_DEVICE",
            "invalid device ordinal",
            "CUDA_VISIBLE_DEVICES names a GPU that is not there",
        ),
        ErrorMeaning(
            304,
            "CUDA_ERROR_OPERATING_SYSTEM",
            "an OS call failed",
            "an unusable /proc (no /proc/self, or /proc/driver/nvidia masked), or a denied syscall",
        ),
        ErrorMeaning(
            801,
            "CUDA_ERROR_NOT_SUPPORTED",
            "operation not supported",
            "a GPU in a mode CUDA cannot use (vGPU without licence, MIG misconfigured)",
        ),
        ErrorMeaning(
            802,
            "CUDA_ERROR_SYSTEM_NOT_READY",
            "the system is not ready",
            "NVSwitch systems (HGX): nvidia-fabricmanager is not running or its version differs "
            "from the driver's",
        ),
        ErrorMeaning(
            803,
            "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
            "the user-space driver and the kernel module versions differ",
            "libcuda in the container is not the host module's version",
        ),
        ErrorMeaning(
            804,
            "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
            "forward-compatibility libraries are not supported on this GPU",
            "a cuda-compat libcuda on LD_LIBRARY_PATH for a non-datacenter GPU",
        ),
        ErrorMeaning(
            999,
            "CUDA_ERROR_UNKNOWN",
            "an unknown error",
            "in containers, almost always a device node that cannot be opened "
            "(/dev/nvidia-uvm denied by the cgroup device policy after its major changed)",
        ),
    )
}

NVML_RESULTS: dict[int, ErrorMeaning] = {
    e.code: e
    for e in (
        ErrorMeaning(0, "NVML_SUCCESS", "success", ""),
        ErrorMeaning(4, "NVML_ERROR_NO_PERMISSION", "no permission", "device nodes not accessible"),
        ErrorMeaning(
            9,
            "NVML_ERROR_DRIVER_NOT_LOADED",
            "the NVIDIA driver is not loaded",
            "no kernel module on the host, or /dev/nvidiactl missing",
        ),
        ErrorMeaning(12, "NVML_ERROR_LIBRARY_NOT_FOUND", "a needed library was not found", ""),
        ErrorMeaning(
            15,
            "NVML_ERROR_GPU_IS_LOST",
            "the GPU fell off the bus",
            "hardware/PCIe fault: check dmesg for Xid 79 on the host",
        ),
        ErrorMeaning(
            17, "NVML_ERROR_OPERATING_SYSTEM", "an OS call failed", "unusable /proc or /dev"
        ),
        ErrorMeaning(
            18,
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
            "Driver/library version mismatch",
            "the user-space libraries differ from the loaded kernel module (driver upgraded "
            "without reboot, or a container with other libraries than the host)",
        ),
        ErrorMeaning(
            999,
            "NVML_ERROR_UNKNOWN",
            "an unknown error",
            "in containers: /dev/nvidiactl or a GPU node denied by the cgroup policy",
        ),
    )
}


def cu_meaning(code: int, name: str | None = None, desc: str | None = None) -> ErrorMeaning:
    """Return the meaning of a CUresult (the table's, else the driver's own name/description)."""
    known = CU_RESULTS.get(code)
    if known is not None:
        return known
    return ErrorMeaning(code, name or f"CUresult {code}", desc or "unknown code", "")


def nvml_meaning(code: int, text: str | None = None) -> ErrorMeaning:
    """Return the meaning of an nvmlReturn_t (the table's, else NVML's own error string)."""
    known = NVML_RESULTS.get(code)
    if known is not None:
        return known
    return ErrorMeaning(code, f"NVML error {code}", text or "unknown code", "")
