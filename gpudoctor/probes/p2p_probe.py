"""Self-contained GPU peer-to-peer probe: CUDA driver API through ctypes, one JSON line per stage.

Runs as a CHILD process (``python3 -I -S -c SOURCE [--size-mib N] [--reps N]``) so that a copy
that never completes (P2P writes dropped by an IOMMU or PCIe ACS) cannot hang gpudoctor, and the
parent never creates a CUDA context. Stdlib only: it also runs inside a container that has
nothing of gpudoctor installed.

For every ordered GPU pair (src, dst) it:

1. asks ``cuDeviceCanAccessPeer(src, dst)``;
2. enables peer access from src's primary context to dst's (``cuCtxEnablePeerAccess``);
3. fills a buffer on dst with a filler byte, copies a buffer of random bytes from src to dst
   (``cuMemcpyPeer``, which goes over NVLink/PCIe P2P when peer access is enabled), reads dst
   back to the host and compares every byte (an IOMMU fault can leave zeros, silently);
4. times ``reps`` further copies with CUDA events (``cuMemcpyPeerAsync``), giving GB/s (1e9).

Each stage prints ``{"stage": NAME, "started": true}`` first and its result when done, so a
parent that kills a hung probe still knows which pair hung. Equivalent shell commands:
``nvidia-smi topo -p2p rw`` (peer capability) and CUDA's sample ``p2pBandwidthLatencyTest``
(bandwidth). Never calls cuMulticastCreate: NVLink multicast is left alone.
"""

import ctypes
import json
import os
import sys
import time

CU_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
FILLER = 0xA5
CHUNK = 4096

u64 = ctypes.c_uint64
vp = ctypes.c_void_p
i32 = ctypes.c_int
P = ctypes.POINTER

SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (P(i32),),
    "cuDeviceGetCount": (P(i32),),
    "cuDeviceGet": (P(i32), i32),
    "cuDeviceGetName": (ctypes.c_char_p, i32, i32),
    "cuDeviceGetPCIBusId": (ctypes.c_char_p, i32, i32),
    "cuDeviceCanAccessPeer": (P(i32), i32, i32),
    "cuDevicePrimaryCtxRetain": (P(vp), i32),
    "cuCtxSetCurrent": (vp,),
    "cuCtxSynchronize": (),
    "cuCtxEnablePeerAccess": (vp, ctypes.c_uint),
    "cuMemAlloc_v2": (P(u64), ctypes.c_size_t),
    "cuMemFree_v2": (u64,),
    "cuMemsetD8_v2": (u64, ctypes.c_ubyte, ctypes.c_size_t),
    "cuMemcpyHtoD_v2": (u64, vp, ctypes.c_size_t),
    "cuMemcpyDtoH_v2": (vp, u64, ctypes.c_size_t),
    "cuMemcpyPeer": (u64, vp, u64, vp, ctypes.c_size_t),
    "cuMemcpyPeerAsync": (u64, vp, u64, vp, ctypes.c_size_t, vp),
    "cuEventCreate": (P(vp), ctypes.c_uint),
    "cuEventRecord": (vp, vp),
    "cuEventSynchronize": (vp,),
    "cuEventElapsedTime": (P(ctypes.c_float), vp, vp),
    "cuEventDestroy_v2": (vp,),
    "cuGetErrorName": (i32, P(ctypes.c_char_p)),
}


def emit(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


class CudaError(Exception):
    def __init__(self, call, rc, name):
        super().__init__(f"{call} returned {rc} {name}")
        self.call, self.rc, self.name = call, rc, name


class Driver:
    """The few libcuda entry points the probe needs, with exact C signatures."""

    def __init__(self, lib):
        self.lib = lib
        for name, argtypes in SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = list(argtypes)
                fn.restype = i32

    def error_name(self, rc):
        out = ctypes.c_char_p()
        try:
            self.lib.cuGetErrorName(rc, ctypes.byref(out))
        except Exception:
            return None
        return (out.value or b"").decode() or None

    def call(self, name, *args, ok=(0,)):
        rc = getattr(self.lib, name)(*args)
        if rc not in ok:
            raise CudaError(name, rc, self.error_name(rc))
        return rc


def open_driver():
    """Return (Driver, init stage result); the result carries load/init errors."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, {"load_error": str(exc)}
    drv = Driver(lib)
    version = i32()
    result = {}
    if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        result["driver_version"] = version.value
    rc = lib.cuInit(0)
    result["init"] = rc
    result["init_name"] = drv.error_name(rc)
    return drv, result


def describe_devices(drv):
    count = i32()
    drv.call("cuDeviceGetCount", ctypes.byref(count))
    devices = []
    for k in range(count.value):
        dev = i32()
        drv.call("cuDeviceGet", ctypes.byref(dev), k)
        name, bus = ctypes.create_string_buffer(128), ctypes.create_string_buffer(32)
        drv.lib.cuDeviceGetName(name, 128, dev)
        drv.lib.cuDeviceGetPCIBusId(bus, 32, dev)
        devices.append(
            {
                "index": k,
                "name": name.value.decode(errors="replace"),
                "pci_bus_id": bus.value.decode(errors="replace"),
            }
        )
    return devices


class Gpu:
    """One device's primary context and its two buffers (random source, destination)."""

    def __init__(self, drv, index, size, pattern):
        self.drv, self.index, self.size = drv, index, size
        self.ctx = vp()
        drv.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), index)
        self.use()
        self.src, self.dst = u64(), u64()
        drv.call("cuMemAlloc_v2", ctypes.byref(self.src), size)
        drv.call("cuMemAlloc_v2", ctypes.byref(self.dst), size)
        drv.call("cuMemcpyHtoD_v2", self.src, pattern, size)
        drv.call("cuCtxSynchronize")

    def use(self):
        self.drv.call("cuCtxSetCurrent", self.ctx)


def compare(want, got, size):
    """Return None when the ``size`` bytes at ``got`` equal ``want`` (bytes), else what the
    destination holds instead."""
    data = ctypes.string_at(got, size)
    if data == want:
        return None
    bad = [k for k in range(0, size, CHUNK) if data[k : k + CHUNK] != want[k : k + CHUNK]]
    if data.count(0) == size:
        looks = "zeros"
    elif data.count(FILLER) == size:
        looks = "unchanged"
    else:
        looks = "partly wrong"
    return {
        "bad_chunks": len(bad),
        "chunks": (size + CHUNK - 1) // CHUNK,
        "first_bad_offset": bad[0] if bad else None,
        "dst_looks": looks,
    }


def probe_pair(drv, gpus, s, d, size, reps, pattern, readback):
    """Return the result dict of one ordered pair (src=s, dst=d); ``pattern``: the source
    buffers' bytes, ``readback``: a host buffer for the destination's."""
    src, dst = gpus[s], gpus[d]
    result = {"src": s, "dst": d, "bytes": size}
    can = i32()
    drv.call("cuDeviceCanAccessPeer", ctypes.byref(can), s, d)
    result["can_access_peer"] = can.value
    src.use()
    if can.value:
        rc = drv.lib.cuCtxEnablePeerAccess(dst.ctx, 0)
        result["enable_rc"] = rc
        result["enable_name"] = drv.error_name(rc)
        if rc not in (0, CU_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            return result
    dst.use()
    drv.call("cuMemsetD8_v2", dst.dst, FILLER, size)
    drv.call("cuCtxSynchronize")
    src.use()
    started = time.monotonic()
    drv.call("cuMemcpyPeer", dst.dst, dst.ctx, src.src, src.ctx, size)
    drv.call("cuCtxSynchronize")
    result["copy_s"] = round(time.monotonic() - started, 4)
    dst.use()
    drv.call("cuMemcpyDtoH_v2", readback, dst.dst, size)
    mismatch = compare(pattern, readback, size)
    result["copy_ok"] = mismatch is None
    if mismatch:
        result["mismatch"] = mismatch
    src.use()
    result.update(time_copies(drv, src, dst, size, reps))
    return result


def time_copies(drv, src, dst, size, reps):
    """Return {"gbps", "timed_ms", "reps"} for ``reps`` peer copies timed with CUDA events."""
    start, stop = vp(), vp()
    drv.call("cuEventCreate", ctypes.byref(start), 0)
    drv.call("cuEventCreate", ctypes.byref(stop), 0)
    try:
        drv.call("cuMemcpyPeerAsync", dst.dst, dst.ctx, src.src, src.ctx, size, None)
        drv.call("cuEventRecord", start, None)
        for _ in range(reps):
            drv.call("cuMemcpyPeerAsync", dst.dst, dst.ctx, src.src, src.ctx, size, None)
        drv.call("cuEventRecord", stop, None)
        drv.call("cuEventSynchronize", stop)
        ms = ctypes.c_float()
        drv.call("cuEventElapsedTime", ctypes.byref(ms), start, stop)
    finally:
        drv.lib.cuEventDestroy_v2(start)
        drv.lib.cuEventDestroy_v2(stop)
    seconds = max(ms.value, 1e-6) / 1000.0
    return {
        "gbps": round(size * reps / seconds / 1e9, 2),
        "timed_ms": round(ms.value, 4),
        "reps": reps,
    }


TOPOLOGY_LEVELS = {0: "SAME", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2}


def nvml_topology(devices):
    """Return {"links": {"a-b": {...}}} from NVML for every unordered pair (``nvidia-smi topo
    -m`` levels, ``nvidia-smi topo -p2p rw``/``n`` statuses), or {"error": ...}."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        return {"error": str(exc)}
    rc = lib.nvmlInit_v2()
    if rc != 0:
        return {"error": f"nvmlInit_v2 returned {rc}"}
    try:
        handles = {}
        for dev in devices:
            handle = vp()
            bus = dev["pci_bus_id"].encode()
            if (
                lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(handle))
                == 0
            ):
                handles[dev["index"]] = handle
        links = {}
        for a in handles:
            for b in handles:
                if a >= b:
                    continue
                link = {}
                level = ctypes.c_uint()
                fn = lib.nvmlDeviceGetTopologyCommonAncestor
                if fn(handles[a], handles[b], ctypes.byref(level)) == 0:
                    link["level"] = TOPOLOGY_LEVELS.get(level.value, str(level.value))
                for name, index in P2P_CAPS.items():
                    status = ctypes.c_uint()
                    fn = lib.nvmlDeviceGetP2PStatus
                    if fn(handles[a], handles[b], index, ctypes.byref(status)) == 0:
                        link[name] = P2P_STATUS.get(status.value, str(status.value))
                links[f"{a}-{b}"] = link
        return {"links": links, "nvml_devices": len(handles)}
    finally:
        lib.nvmlShutdown()


def parse_args(argv):
    opts = {"size_mib": 32, "reps": 5}
    it = iter(argv)
    for arg in it:
        if arg == "--size-mib":
            opts["size_mib"] = max(1, int(next(it)))
        elif arg == "--reps":
            opts["reps"] = max(1, int(next(it)))
    return opts


def main(argv):
    opts = parse_args(argv)
    size = opts["size_mib"] << 20
    emit({"stage": "init", "started": True})
    started = time.monotonic()
    drv, init = open_driver()
    if drv is None or init.get("init") != 0:
        emit(dict(init, stage="init"))
        return
    try:
        devices = describe_devices(drv)
    except CudaError as exc:
        emit(dict(init, stage="init", error=str(exc), error_name=exc.name))
        return
    init.update(
        stage="init",
        device_count=len(devices),
        devices=devices,
        size_bytes=size,
        reps=opts["reps"],
        init_s=round(time.monotonic() - started, 4),
    )
    emit(init)
    if len(devices) < 2:
        emit({"stage": "done", "pairs": 0})
        return
    emit({"stage": "topology", "started": True})
    try:
        topology = nvml_topology(devices)
    except Exception as exc:  # a driver without one of these NVML calls: topology unknown
        topology = {"error": f"{type(exc).__name__}: {exc}"}
    emit(dict(topology, stage="topology"))
    random_bytes = os.urandom(size)
    pattern = ctypes.create_string_buffer(random_bytes, size)
    readback = ctypes.create_string_buffer(size)
    emit({"stage": "setup", "started": True})
    gpus = {}
    try:
        for dev in devices:
            gpus[dev["index"]] = Gpu(drv, dev["index"], size, pattern)
    except CudaError as exc:
        emit({"stage": "setup", "error": str(exc), "error_name": exc.name, "gpu": len(gpus)})
        return
    emit({"stage": "setup", "gpus": len(gpus)})
    pairs = 0
    for s in gpus:
        for d in gpus:
            if s == d:
                continue
            name = f"pair:{s}-{d}"
            emit({"stage": name, "started": True})
            pair_started = time.monotonic()
            try:
                result = probe_pair(drv, gpus, s, d, size, opts["reps"], random_bytes, readback)
            except CudaError as exc:
                result = {
                    "src": s,
                    "dst": d,
                    "error": str(exc),
                    "error_call": exc.call,
                    "error_rc": exc.rc,
                    "error_name": exc.name,
                }
            result["pair_s"] = round(time.monotonic() - pair_started, 4)
            emit(dict(result, stage=name))
            pairs += 1
    emit({"stage": "done", "pairs": pairs, "elapsed_s": round(time.monotonic() - started, 3)})


if __name__ == "__main__":
    main(sys.argv[1:])
