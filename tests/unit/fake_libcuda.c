/*
 * A fake libcuda.so.1 for the P2P probe's tests: it stands for the NVIDIA driver of a
 * machine with several GPUs, which this CPU-only CI machine cannot have.
 *
 * It implements only the CUDA driver API entry points that gpudoctor/probes/p2p_probe.py
 * calls, with their real C signatures (64-bit CUdeviceptr, so a probe that passed device
 * pointers as C ints would break here as it would on a GPU). "Device memory" is host
 * memory; copies are memcpy. Faults seen on real machines are injected through env vars:
 *
 *   FAKE_CUDA_INIT_RC=999        cuInit's return code
 *   FAKE_CUDA_INIT_MS=170        cuInit's duration (a real one takes 170-250 ms on an H200)
 *   FAKE_CUDA_INIT_LOG=FILE      cuInit appends the calling pid to FILE (counts the probes)
 *   FAKE_CUDA_MODIFY_NODES=/dev/nvidia-uvm:238,...
 *                                cuInit does what the real libcuda does as root with the
 *                                module's ModifyDeviceFiles=1 (issue 21): it removes each
 *                                PATH that is not a char node of MAJOR and mknods PATH
 *                                c MAJOR MINOR (the old minor), mode 0666; where mknod is
 *                                denied (a CT's cgroup) nothing takes the old node's place
 *   FAKE_CUDA_MKNOD_EPERM=1      that mknod fails with EPERM (a cgroup's denial, outside a CT)
 *   FAKE_CUDA_CHMOD_NODES=/dev/nvidia0:0600:0:44,...
 *                                cuInit sets each PATH's mode and owner uid:gid (octal mode),
 *                                as the real driver does with ModifyDeviceFiles=1 when a
 *                                node differs from NVreg_DeviceFileMode/UID/GID
 *   FAKE_CUDA_DEVICES=4          number of GPUs (default 2)
 *   FAKE_CUDA_NO_PEER=0-2,1-3    pairs (both directions) where cuDeviceCanAccessPeer = 0
 *   FAKE_CUDA_ZERO_COPY=0-1      directed pairs whose peer copy lands as zeros (IOMMU fault)
 *   FAKE_CUDA_ENABLE_RC=0-1:217  directed pairs whose cuCtxEnablePeerAccess fails with a code
 *   FAKE_CUDA_HANG=1-0           directed pairs whose peer copy never completes
 *   FAKE_CUDA_OOM_DEVICE=1       cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY on this GPU
 *   FAKE_CUDA_FAULT=0-1          the peer copy of this directed pair fails with 700
 *                                (CUDA_ERROR_ILLEGAL_ADDRESS), sticky: every later copy fails
 *   FAKE_CUDA_GBPS=370           peer-enabled copy bandwidth in GB/s (default 370)
 *   FAKE_CUDA_HOST_GBPS=20       bandwidth of pairs without peer access (staged through host)
 *   FAKE_CUDA_SLOW=2-3:18.5      pairs (both directions) with their own bandwidth
 *
 * The same file, built as libnvidia-ml.so.1, answers the NVML topology calls the probe makes
 * (nvmlDeviceGetTopologyCommonAncestor, nvmlDeviceGetP2PStatus): pairs in FAKE_CUDA_NO_PEER
 * report TNS (topology not supported) on a SYS path, the others OK on FAKE_NVML_LEVEL (an NVML
 * level number, default 10 = PIX), with NVLink OK when FAKE_NVML_NVLINK=1.
 *
 * Event times come from a virtual clock advanced by bytes / bandwidth, so the measured
 * bandwidth is deterministic and no test depends on wall time.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <unistd.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define MAXDEV 16

typedef struct { int dev; } ctx_t;
typedef struct { double t_ms; } event_t;

static ctx_t contexts[MAXDEV];
static __thread ctx_t *current = NULL;
static int peer_enabled[MAXDEV][MAXDEV];
static double clock_ms = 0.0;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static double env_double(const char *name, double dflt) {
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

/* Return 1 when "s-d" (or "d-s" if symmetric) is listed in env var `name`; *value gets ":X". */
static int pair_listed(const char *name, int s, int d, int symmetric, double *value) {
    const char *v = getenv(name);
    if (!v) return 0;
    char buf[1024];
    strncpy(buf, v, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int a, b;
        double x = 0;
        int n = sscanf(tok, "%d-%d:%lf", &a, &b, &x);
        if (n < 2) continue;
        if ((a == s && b == d) || (symmetric && a == d && b == s)) {
            if (value) *value = x;
            return 1;
        }
    }
    return 0;
}

static void modify_device_files(void) {
    const char *spec = getenv("FAKE_CUDA_MODIFY_NODES");
    if (!spec || !*spec) return;
    char buf[4096], *save = NULL;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(item, ':');
        if (!colon) continue;
        *colon = 0;
        unsigned want = (unsigned)atoi(colon + 1);
        struct stat st;
        if (stat(item, &st) != 0) continue;
        if (S_ISCHR(st.st_mode) && major(st.st_rdev) == want) continue;
        unsigned minor_no = S_ISCHR(st.st_mode) ? minor(st.st_rdev) : 0;
        if (unlink(item) != 0) continue;
        if (getenv("FAKE_CUDA_MKNOD_EPERM")) { errno = EPERM; continue; }
        if (mknod(item, S_IFCHR | 0666, makedev(want, minor_no)) == 0) chmod(item, 0666);
    }
}

static void chmod_device_files(void) {
    const char *spec = getenv("FAKE_CUDA_CHMOD_NODES");
    if (!spec || !*spec) return;
    char buf[4096], *save = NULL;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char path[1024];
        unsigned mode, uid, gid;
        if (sscanf(item, "%1023[^:]:%o:%u:%u", path, &mode, &uid, &gid) != 4) continue;
        if (chmod(path, mode) == 0) (void)chown(path, uid, gid);
    }
}

int cuInit(unsigned flags) {
    (void)flags;
    modify_device_files();
    chmod_device_files();
    const char *log = getenv("FAKE_CUDA_INIT_LOG");
    if (log && *log) {
        FILE *f = fopen(log, "a");
        if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
    }
    if (env_int("FAKE_CUDA_INIT_MS", 0) > 0) usleep(env_int("FAKE_CUDA_INIT_MS", 0) * 1000);
    return env_int("FAKE_CUDA_INIT_RC", 0);
}
int cuDeviceGetAttribute(int *v, int attr, int dev) { (void)dev; *v = attr == 75 ? 9 : 0; return 0; }
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)141 << 30; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = env_int("FAKE_CUDA_DEVICES", 2); return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }

int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    snprintf(name, len, "NVIDIA H200");
    return 0;
}

int cuDeviceGetPCIBusId(char *bus, int len, int dev) {
    snprintf(bus, len, "0000:%02X:00.0", 0x18 + dev * 0x10);
    return 0;
}

int cuDeviceCanAccessPeer(int *can, int dev, int peer) {
    *can = dev != peer && !pair_listed("FAKE_CUDA_NO_PEER", dev, peer, 1, NULL);
    return 0;
}

int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    contexts[dev].dev = dev;
    *ctx = &contexts[dev];
    return 0;
}

int cuCtxSetCurrent(void *ctx) { current = (ctx_t *)ctx; return 0; }
int cuCtxSynchronize(void) { return current ? 0 : 201; }

int cuCtxEnablePeerAccess(void *peer, unsigned flags) {
    (void)flags;
    int s = current->dev, d = ((ctx_t *)peer)->dev;
    double rc = 0;
    if (pair_listed("FAKE_CUDA_ENABLE_RC", s, d, 0, &rc)) return (int)rc;
    if (pair_listed("FAKE_CUDA_NO_PEER", s, d, 1, NULL)) return 217;
    if (peer_enabled[s][d]) return 704;
    peer_enabled[s][d] = 1;
    return 0;
}

int cuMemAlloc_v2(uint64_t *ptr, size_t size) {
    if (current && current->dev == env_int("FAKE_CUDA_OOM_DEVICE", -1)) return 2;
    void *p = malloc(size);
    if (!p) return 2;
    *ptr = (uint64_t)(uintptr_t)p;
    return 0;
}

int cuMemFree_v2(uint64_t ptr) { free((void *)(uintptr_t)ptr); return 0; }

int cuMemsetD8_v2(uint64_t ptr, unsigned char value, size_t n) {
    memset((void *)(uintptr_t)ptr, value, n);
    return 0;
}

int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
    memcpy(dst, (void *)(uintptr_t)src, n);
    return 0;
}

static int sticky = 0;

static int peer_copy(uint64_t dst, void *dctx, uint64_t src, void *sctx, size_t n) {
    int s = ((ctx_t *)sctx)->dev, d = ((ctx_t *)dctx)->dev;
    if (sticky || pair_listed("FAKE_CUDA_FAULT", s, d, 0, NULL)) return sticky = 700;
    if (pair_listed("FAKE_CUDA_HANG", s, d, 0, NULL))
        for (;;) pause();
    if (peer_enabled[s][d] && pair_listed("FAKE_CUDA_ZERO_COPY", s, d, 0, NULL))
        memset((void *)(uintptr_t)dst, 0, n);
    else
        memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
    double gbps = peer_enabled[s][d] ? env_double("FAKE_CUDA_GBPS", 370.0)
                                     : env_double("FAKE_CUDA_HOST_GBPS", 20.0);
    double slow = 0;
    if (pair_listed("FAKE_CUDA_SLOW", s, d, 1, &slow) && slow > 0) gbps = slow;
    clock_ms += (double)n / (gbps * 1e9) * 1e3;
    return 0;
}

int cuMemcpyPeer(uint64_t dst, void *dctx, uint64_t src, void *sctx, size_t n) {
    return peer_copy(dst, dctx, src, sctx, n);
}

int cuMemcpyPeerAsync(uint64_t dst, void *dctx, uint64_t src, void *sctx, size_t n, void *stream) {
    (void)stream;
    return peer_copy(dst, dctx, src, sctx, n);
}

int cuEventCreate(void **ev, unsigned flags) {
    (void)flags;
    *ev = calloc(1, sizeof(event_t));
    return 0;
}

int cuEventRecord(void *ev, void *stream) {
    (void)stream;
    ((event_t *)ev)->t_ms = clock_ms;
    return 0;
}

int cuEventSynchronize(void *ev) { (void)ev; return 0; }

int cuEventElapsedTime(float *ms, void *a, void *b) {
    *ms = (float)(((event_t *)b)->t_ms - ((event_t *)a)->t_ms);
    return 0;
}

int cuEventDestroy_v2(void *ev) { free(ev); return 0; }

int cuGetErrorName(int rc, const char **name) {
    switch (rc) {
    case 0: *name = "CUDA_SUCCESS"; break;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 100: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case 217: *name = "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"; break;
    case 700: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case 704: *name = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED"; break;
    case 999: *name = "CUDA_ERROR_UNKNOWN"; break;
    default: *name = NULL; return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ NVML (libnvidia-ml.so.1) */

typedef struct { int dev; } nvml_dev_t;
static nvml_dev_t nvml_devs[MAXDEV];

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }

int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **handle) {
    unsigned domain, busno;
    if (sscanf(bus, "%x:%x", &domain, &busno) != 2) return 2;
    int dev = (int)(busno - 0x18) / 0x10;
    if (dev < 0 || dev >= MAXDEV) return 6;
    nvml_devs[dev].dev = dev;
    *handle = &nvml_devs[dev];
    return 0;
}

int nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, unsigned *level) {
    int s = ((nvml_dev_t *)a)->dev, d = ((nvml_dev_t *)b)->dev;
    *level = pair_listed("FAKE_CUDA_NO_PEER", s, d, 1, NULL) ? 50 : env_int("FAKE_NVML_LEVEL", 10);
    return 0;
}

int nvmlDeviceGetP2PStatus(void *a, void *b, int index, unsigned *status) {
    int s = ((nvml_dev_t *)a)->dev, d = ((nvml_dev_t *)b)->dev;
    if (pair_listed("FAKE_CUDA_NO_PEER", s, d, 1, NULL))
        *status = 3;
    else if (index == 2)
        *status = env_int("FAKE_NVML_NVLINK", 0) ? 0 : 5;
    else
        *status = 0;
    return 0;
}
