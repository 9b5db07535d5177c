"""Self-contained GPU probe: NVML and CUDA driver API through ctypes, one JSON line per stage.

Runs as a CHILD process (``python3 -I -S gpu_probe.py``, or, for a local ``gpudoctor
check``, a fork of the just-started gpudoctor that runs this source: gpudoctor/early_probe.py)
so that a hung driver can never hang gpudoctor, and the parent never creates a CUDA context.
Stdlib only, so it also runs inside a container that has nothing of gpudoctor installed (its
source is sent over stdin/argv). Each stage prints ``{"stage": NAME, "started": true}`` before it starts
and ``{"stage": NAME, ...result}`` when done, flushed at once: when the probe is killed
at its timeout, the parent still knows which stage hung.

Equivalent shell commands: ``nvidia-smi -q`` (NVML stage), ``python -c "from cuda.bindings
import driver; print(driver.cuInit(0))"`` (CUDA stage).
"""

import ctypes
import json
import os
import sys
import threading
import time

NVML_OK = 0
THROTTLE_NAMES = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
}


EMIT_LOCK = threading.Lock()


def emit(obj):
    line = json.dumps(obj, sort_keys=True) + "\n"
    with EMIT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def loaded_path(fragment):
    """Return the real path of a loaded shared library (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if fragment in line and "/" in line:
                    return os.path.realpath(line.split(None, 5)[-1].strip())
    except OSError:
        return None
    return None


class Nvml:
    def __init__(self, lib):
        self.lib = lib

    def value(self, name, handle, ctype, *pre):
        """Call nvmlX(handle, *pre, &out); return out's value or None (N/A) on any error."""
        fn = getattr(self.lib, name, None)
        if fn is None:
            return None
        out = ctype()
        args = ([handle] if handle is not None else []) + list(pre) + [ctypes.byref(out)]
        return out.value if fn(*args) == NVML_OK else None

    def text(self, name, handle=None, size=96):
        fn = getattr(self.lib, name, None)
        if fn is None:
            return None
        buf = ctypes.create_string_buffer(size)
        args = ([handle] if handle is not None else []) + [buf, ctypes.c_uint(size)]
        return buf.value.decode(errors="replace") if fn(*args) == NVML_OK else None

    def error_string(self, rc):
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        try:
            return self.lib.nvmlErrorString(rc).decode()
        except Exception:
            return None


class MemoryInfo(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def nvml_device(nvml, index):
    handle = ctypes.c_void_p()
    rc = nvml.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
    if rc != NVML_OK:
        return {"index": index, "error": rc, "error_name": nvml.error_string(rc)}
    u, ull, i = ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_int
    dev = {
        "index": index,
        "name": nvml.text("nvmlDeviceGetName", handle),
        "uuid": nvml.text("nvmlDeviceGetUUID", handle),
        "minor": nvml.value("nvmlDeviceGetMinorNumber", handle, u),
        "persistence_mode": nvml.value("nvmlDeviceGetPersistenceMode", handle, i),
        "ecc_uncorrected_volatile": nvml.value("nvmlDeviceGetTotalEccErrors", handle, ull, 1, 0),
        "ecc_uncorrected_aggregate": nvml.value("nvmlDeviceGetTotalEccErrors", handle, ull, 1, 1),
        "retired_pages_pending": nvml.value("nvmlDeviceGetRetiredPagesPendingStatus", handle, i),
        "clocks_event_reasons": nvml.value("nvmlDeviceGetCurrentClocksEventReasons", handle, ull),
        "pcie_gen_current": nvml.value("nvmlDeviceGetCurrPcieLinkGeneration", handle, u),
        "pcie_gen_max": nvml.value("nvmlDeviceGetMaxPcieLinkGeneration", handle, u),
        "pcie_width_current": nvml.value("nvmlDeviceGetCurrPcieLinkWidth", handle, u),
        "pcie_width_max": nvml.value("nvmlDeviceGetMaxPcieLinkWidth", handle, u),
        "temperature_c": nvml.value("nvmlDeviceGetTemperature", handle, u, 0),
        "power_mw": nvml.value("nvmlDeviceGetPowerUsage", handle, u),
    }
    if dev["clocks_event_reasons"] is None:
        dev["clocks_event_reasons"] = nvml.value(
            "nvmlDeviceGetCurrentClocksThrottleReasons", handle, ull
        )
    reasons = dev["clocks_event_reasons"]
    if reasons is not None:
        dev["clocks_event_names"] = [
            n for bit, n in sorted(THROTTLE_NAMES.items()) if reasons & bit
        ]
    cc_major, cc_minor = ctypes.c_int(), ctypes.c_int()
    if (
        nvml.lib.nvmlDeviceGetCudaComputeCapability(
            handle, ctypes.byref(cc_major), ctypes.byref(cc_minor)
        )
        == 0
    ):
        dev["compute_capability"] = [cc_major.value, cc_minor.value]
    mem = MemoryInfo()
    if nvml.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == NVML_OK:
        dev["memory_total"], dev["memory_used"] = mem.total, mem.used
    corr, unc, pending, failure = u(), u(), u(), u()
    fn = getattr(nvml.lib, "nvmlDeviceGetRemappedRows", None)
    if (
        fn is not None
        and fn(handle, *(ctypes.byref(x) for x in (corr, unc, pending, failure))) == 0
    ):
        dev["remapped_rows"] = {
            "correctable": corr.value,
            "uncorrectable": unc.value,
            "pending": pending.value,
            "failure": failure.value,
        }
    count = u(64)
    infos = (ProcessInfo * 64)()
    fn = getattr(nvml.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None)
    if fn is not None and fn(handle, ctypes.byref(count), infos) == NVML_OK:
        dev["processes"] = [
            {
                "pid": infos[k].pid,
                "used_memory": infos[k].usedGpuMemory,
                "visible": os.path.exists(f"/proc/{infos[k].pid}"),
            }
            for k in range(min(count.value, 64))
        ]
    return dev


def open_stage(name, soname):
    """Announce stage ``name`` and load its library; None (load_error printed) if missing."""
    emit({"stage": name, "started": True})
    try:
        return ctypes.CDLL(soname)
    except OSError as exc:
        emit({"stage": name, "load_error": str(exc)})
        return None


def stage_nvml():
    started = time.monotonic()
    lib = open_stage("nvml", "libnvidia-ml.so.1")
    if lib is None:
        return
    nvml = Nvml(lib)
    rc = lib.nvmlInit_v2()
    result = {"stage": "nvml", "init": rc, "lib_path": loaded_path("libnvidia-ml")}
    if rc != NVML_OK:
        result["error_name"] = nvml.error_string(rc)
    else:
        result["driver_version"] = nvml.text("nvmlSystemGetDriverVersion")
        result["nvml_version"] = nvml.text("nvmlSystemGetNVMLVersion")
        result["cuda_driver_version"] = nvml.value(
            "nvmlSystemGetCudaDriverVersion_v2", None, ctypes.c_int
        )
        count = nvml.value("nvmlDeviceGetCount_v2", None, ctypes.c_uint) or 0
        result["devices"] = [nvml_device(nvml, k) for k in range(count)]
        lib.nvmlShutdown()
    result["elapsed_s"] = time.monotonic() - started
    emit(result)


def cu_error(lib, rc):
    name, desc = ctypes.c_char_p(), ctypes.c_char_p()
    try:
        lib.cuGetErrorName(rc, ctypes.byref(name))
        lib.cuGetErrorString(rc, ctypes.byref(desc))
    except Exception:
        return None, None
    return (name.value or b"").decode() or None, (desc.value or b"").decode() or None


def stage_cuda():
    started = time.monotonic()
    lib = open_stage("cuda", "libcuda.so.1")
    if lib is None:
        return
    version = ctypes.c_int()
    result = {"stage": "cuda", "lib_path": loaded_path("libcuda")}
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        result["driver_version"] = version.value
    rc = lib.cuInit(0)
    result["init"] = rc
    result["init_name"], result["init_desc"] = cu_error(lib, rc)
    result["init_s"] = time.monotonic() - started
    if rc == 0:
        count = ctypes.c_int()
        lib.cuDeviceGetCount(ctypes.byref(count))
        devices = []
        for k in range(count.value):
            dev, buf = ctypes.c_int(), ctypes.create_string_buffer(128)
            lib.cuDeviceGet(ctypes.byref(dev), k)
            lib.cuDeviceGetName(buf, 128, dev)
            ccmaj, ccmin, mem = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
            lib.cuDeviceGetAttribute(ctypes.byref(ccmaj), 75, dev)
            lib.cuDeviceGetAttribute(ctypes.byref(ccmin), 76, dev)
            lib.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
            devices.append(
                {
                    "index": k,
                    "name": buf.value.decode(errors="replace"),
                    "compute_capability": [ccmaj.value, ccmin.value],
                    "total_memory": mem.value,
                }
            )
        result["device_count"] = count.value
        result["devices"] = devices
    result["elapsed_s"] = time.monotonic() - started
    emit(result)


def stage_env():
    keys = (
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "LD_LIBRARY_PATH",
    )
    emit(
        {
            "stage": "env",
            "env": {k: os.environ[k] for k in keys if k in os.environ},
            "proc_self": os.path.exists("/proc/self/status"),
        }
    )


NOBODY = 65534


def node_groups():
    """Return the sorted gids of the NVIDIA nodes (``stat -c %g /dev/nvidia*
    /dev/nvidia-caps/*``): the groups an unprivileged probe needs to open 0660 nodes."""
    gids = set()
    paths = []
    for directory in ("/dev", "/dev/nvidia-caps"):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        paths += [os.path.join(directory, n) for n in names if n.startswith("nvidia")]
    for path in paths:
        try:
            gids.add(os.stat(path).st_gid)
        except OSError:
            continue
    return sorted(gids)


def stage_privilege():
    """Drop root before any driver library is loaded: as root, libcuda/libnvidia-ml (the
    module's ModifyDeviceFiles, on by default) remove a node whose numbers they think wrong
    and mknod another, which a CT's cgroup may deny: the check would leave the CT without
    the node. As uid/gid 65534 (nobody) with the nodes' groups (0660 nodes still open) the
    library cannot touch /dev (``setpriv --reuid=65534 --regid=65534 --groups=G,...``)."""
    uid = os.geteuid()
    if uid != 0:
        emit({"stage": "privilege", "uid": uid, "dropped": False, "groups": os.getgroups()})
        return
    groups = node_groups()
    try:
        os.setgroups(groups)
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    except OSError as exc:  # no CAP_SETUID (a locked-down CT): say so, go on as root
        emit({"stage": "privilege", "uid": uid, "dropped": False, "groups": groups,
              "error": str(exc)})  # fmt: skip
        return
    emit({"stage": "privilege", "uid": os.geteuid(), "dropped": True, "groups": groups})


def main(stages):
    """Run the stages; NVML runs in a thread beside cuInit (ctypes releases the GIL), so the
    probe costs about one cuInit."""
    funcs = {"privilege": stage_privilege, "env": stage_env, "nvml": stage_nvml,
             "cuda": stage_cuda}  # fmt: skip
    threads = []
    for name in stages:
        if name == "nvml" and "cuda" in stages:
            thread = threading.Thread(target=stage_nvml, daemon=True)
            thread.start()
            threads.append(thread)
        else:
            funcs[name]()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main(sys.argv[1:] or ["privilege", "env", "nvml", "cuda"])
