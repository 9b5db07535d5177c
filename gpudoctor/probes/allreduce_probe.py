"""All-reduce probe: one process per GPU, a small NCCL all-reduce through torch.distributed.

Runs as a CHILD process (``python3 -c SOURCE launch --world-size N --timeout S``), never in
gpudoctor's own process: torch is imported only by the rank processes this launcher starts.
The launcher starts ``N`` ranks (``python3 -c SOURCE rank --rank K ...``), forwards their JSON
lines, kills them all at its deadline and prints a final ``launcher`` line saying how each
rank ended. Rendezvous is a FileStore in a private temp directory (no port, no network).

Each rank prints ``{"stage": "rankK", "step": STEP}`` as it goes (``import``, ``init``,
``allreduce``, ``bandwidth``) and a final ``{"stage": "rankK", "result": {...}}`` with:

* ``sum_ok``: an int32 all-reduce of ``arange(n) + rank`` equals ``N * arange(n) + N(N-1)/2``
  on every element (a path that corrupts data fails here, not only one that hangs);
* ``busbw_gbps``: nccl-tests' bus bandwidth of a 64 MiB float all-reduce
  (``algbw * 2(N-1)/N``);
* the NCCL version and the seconds spent in init and in the first all-reduce.

The ranks run with NVLink multicast OFF, whatever the caller's environment:
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (a program
using multicast can take a shared host's GPUs out of service). NCCL_DEBUG=INFO with
NCCL_DEBUG_SUBSYS=INIT is set so the launcher can report which transport NCCL chose
(``via P2P/CUMEM``, ``via SHM``, ...) and any ``NCCL WARN`` line.

``--backend gloo`` runs the same protocol on CPU tensors (how the launcher itself is tested
on a machine with no GPU). Equivalent shell command: ``torchrun --nproc-per-node N`` of a
script calling ``dist.all_reduce``, or nccl-tests' ``all_reduce_perf -g N``.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
CHECK_ELEMS = 1 << 20
BW_BYTES = 64 << 20
BW_BYTES_CPU = 4 << 20
BW_WARMUP = 2
BW_ITERS = 5
TRANSPORT = re.compile(r"via (\S+)")
GRACE_S = 3.0


def emit(obj, lock=None):
    line = json.dumps(obj, sort_keys=True) + "\n"
    if lock is None:
        sys.stdout.write(line)
        sys.stdout.flush()
        return
    with lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def own_source():
    """Return this script's source, whether it runs as a file or through ``-c``."""
    argv = getattr(sys, "orig_argv", None)
    if argv and "-c" in argv:
        return argv[argv.index("-c") + 1]
    if "__file__" in globals():
        with open(__file__) as fh:
            return fh.read()
    with open("/proc/self/cmdline", "rb") as fh:
        parts = fh.read().split(b"\0")
    return parts[parts.index(b"-c") + 1].decode()


def options(argv):
    opts = {
        "mode": argv[0] if argv else "launch",
        "world_size": 2,
        "timeout": 60.0,
        "backend": "nccl",
        "rank": 0,
        "store": "",
        "env": [],
    }
    it = iter(argv[1:])
    for arg in it:
        key = arg.lstrip("-").replace("-", "_")
        if key == "env":
            opts["env"].append(next(it))
        elif key in ("world_size", "rank"):
            opts[key] = int(next(it))
        elif key == "timeout":
            opts[key] = float(next(it))
        elif key in ("backend", "store"):
            opts[key] = next(it)
    return opts


# ---------------------------------------------------------------- rank side (imports torch)


def run_rank(opts):
    rank, world, backend = opts["rank"], opts["world_size"], opts["backend"]
    stage = f"rank{rank}"
    emit({"stage": stage, "step": "import"})
    import datetime

    import torch
    import torch.distributed as dist

    gpu = backend == "nccl"
    if gpu:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    emit({"stage": stage, "step": "init"})
    started = time.monotonic()
    kwargs = {
        "backend": backend,
        "init_method": "file://" + opts["store"],
        "rank": rank,
        "world_size": world,
        "timeout": datetime.timedelta(seconds=opts["timeout"]),
    }
    try:
        dist.init_process_group(device_id=device if gpu else None, **kwargs)
    except TypeError:  # torch < 2.3 has no device_id: the communicator starts lazily
        dist.init_process_group(**kwargs)
    init_s = time.monotonic() - started
    emit({"stage": stage, "step": "allreduce"})
    started = time.monotonic()
    x = torch.arange(CHECK_ELEMS, dtype=torch.int32, device=device) + rank
    dist.all_reduce(x)
    if gpu:
        torch.cuda.synchronize()
    first_s = time.monotonic() - started
    expected = torch.arange(CHECK_ELEMS, dtype=torch.int32, device=device) * world
    expected += world * (world - 1) // 2
    wrong = int((x != expected).sum().item())
    result = {
        "sum_ok": wrong == 0,
        "wrong_elements": wrong,
        "elements": CHECK_ELEMS,
        "first_value": int(x[0].item()),
        "expected_first": int(expected[0].item()),
        "init_s": round(init_s, 3),
        "allreduce_s": round(first_s, 4),
        "device": str(device),
        "torch": torch.__version__,
    }
    if gpu:
        version = torch.cuda.nccl.version()
        result["nccl_version"] = (
            ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        )
        result["gpu_name"] = torch.cuda.get_device_name(rank)
    emit({"stage": stage, "step": "bandwidth", "checked": result})
    result.update(bus_bandwidth(torch, dist, device, world, gpu))
    dist.destroy_process_group()
    emit({"stage": stage, "result": result})


def bus_bandwidth(torch, dist, device, world, gpu):
    """Return {"busbw_gbps", "algbw_gbps", "bw_bytes"} of a timed float all-reduce."""
    nbytes = BW_BYTES if gpu else BW_BYTES_CPU
    y = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    for _ in range(BW_WARMUP):
        dist.all_reduce(y)
    if gpu:
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BW_ITERS):
            dist.all_reduce(y)
        stop.record()
        stop.synchronize()
        seconds = start.elapsed_time(stop) / 1000.0 / BW_ITERS
    else:
        began = time.perf_counter()
        for _ in range(BW_ITERS):
            dist.all_reduce(y)
        seconds = (time.perf_counter() - began) / BW_ITERS
    algbw = nbytes / max(seconds, 1e-9) / 1e9
    return {
        "algbw_gbps": round(algbw, 2),
        "busbw_gbps": round(algbw * 2 * (world - 1) / world, 2),
        "bw_bytes": nbytes,
    }


# ---------------------------------------------------------------- launcher side (no torch)


class Rank:
    """One rank process: its Popen, its stderr file and the last step it announced."""

    def __init__(self, index, proc, stderr_path):
        self.index, self.proc, self.stderr_path = index, proc, stderr_path
        self.step, self.result = "start", None
        self.reader = None

    def stderr_text(self):
        try:
            with open(self.stderr_path, errors="replace") as fh:
                return fh.read()
        except OSError:
            return ""


def forward(rank, lock):
    for raw in rank.proc.stdout:
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("stage") == f"rank{rank.index}":
            rank.step = obj.get("step", rank.step)
            if "result" in obj:
                rank.step, rank.result = "done", obj["result"]
            emit(obj, lock)


def rank_env(opts):
    env = dict(os.environ)
    env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"})
    for item in opts["env"]:
        key, _, value = item.partition("=")
        env[key] = value
    env.update(MULTICAST_OFF)
    return env


def wait_all(ranks, deadline):
    """Wait until every rank exits, one crashes (then a short grace) or the deadline passes."""
    crashed_at = None
    while True:
        codes = [r.proc.poll() for r in ranks]
        if all(c is not None for c in codes):
            return False
        now = time.monotonic()
        if crashed_at is None and any(c not in (None, 0) for c in codes):
            crashed_at = now
        if now >= deadline or (crashed_at is not None and now - crashed_at > GRACE_S):
            return now >= deadline
        time.sleep(0.05)


def summarize(ranks):
    """Return what the ranks' NCCL logs say: transports used, WARN lines, the stderr tail."""
    transports, warns, tails = set(), [], {}
    for r in ranks:
        text = r.stderr_text()
        for line in text.splitlines():
            if "NCCL INFO Channel" in line:
                transports.update(TRANSPORT.findall(line))
            if "NCCL WARN" in line or "Error" in line or "error" in line:
                warns.append(line.strip()[-300:])
        tails[f"rank{r.index}"] = text[-1500:]
    return {"transports": sorted(transports), "warnings": warns[:20], "stderr_tail": tails}


def launch(opts):
    world, timeout = opts["world_size"], opts["timeout"]
    lock = threading.Lock()
    emit({"stage": "launcher", "started": True}, lock)
    started = time.monotonic()
    try:
        import importlib.util

        have_torch = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        have_torch = False
    if not have_torch:
        emit(
            {
                "stage": "launcher",
                "error": "no_torch",
                "python": sys.executable,
                "detail": f"torch is not importable by {sys.executable}",
            },
            lock,
        )
        return
    workdir = tempfile.mkdtemp(prefix="gpudoctor-allreduce-")
    source, env = own_source(), rank_env(opts)
    ranks = []
    try:
        for k in range(world):
            argv = [
                sys.executable,
                "-c",
                source,
                "rank",
                "--rank",
                str(k),
                "--world-size",
                str(world),
                "--backend",
                opts["backend"],
                "--timeout",
                str(timeout),
                "--store",
                os.path.join(workdir, "store"),
            ]
            err_path = os.path.join(workdir, f"rank{k}.stderr")
            with open(err_path, "w") as err:
                proc = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
            rank = Rank(k, proc, err_path)
            rank.reader = threading.Thread(target=forward, args=(rank, lock), daemon=True)
            rank.reader.start()
            ranks.append(rank)
        timed_out = wait_all(ranks, started + timeout)
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGKILL)
            r.proc.wait()
        for r in ranks:  # the forwarders drain what the ranks printed last, up to EOF
            r.reader.join(5.0)
        summary = summarize(ranks)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    emit(
        dict(
            summary,
            stage="launcher",
            world_size=world,
            backend=opts["backend"],
            timed_out=timed_out,
            timeout_s=timeout,
            elapsed_s=round(time.monotonic() - started, 3),
            env={k: v for k, v in env.items() if k.startswith(("NCCL_", "TORCH_", "NVSHMEM_"))},
            ranks=[
                {
                    "rank": r.index,
                    "returncode": r.proc.returncode,
                    "step": r.step,
                    "finished": r.result is not None,
                }
                for r in ranks
            ],
        ),
        lock,
    )


def main(argv):
    opts = options(argv)
    if opts["mode"] == "rank":
        run_rank(opts)
    else:
        launch(opts)


if __name__ == "__main__":
    main(sys.argv[1:])
