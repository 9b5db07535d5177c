"""Benchmark `gpudoctor weights ensure` against the obvious tools, side by side, in one run.

1. restore: disk mirror -> tmpfs, `gpudoctor weights ensure --mirror` vs `cp -r` of the
   same tree; cold page cache (after a reboot: the case that matters) and warm.
2. download: from a Hub stand-in on 127.0.0.1 (tests/weights/hub_server.py, sendfile)
   into tmpfs, `ensure` vs huggingface_hub's own `hf download --local-dir`.
3. complete-check: `ensure` on an already complete 50-shard directory (in-process call
   and whole CLI process), and the requests it makes (goal: none, < 100 ms).

The model is generated: shard sizes of a 27B BF16 checkpoint (11 shards, last one
smaller, real-sized tokenizer files) scaled to --total-gb. Everything lives under
--workdir (disk) and one tmpfs mount sized for one copy; all is removed at the end.
Needs root (mount, drop_caches). Run: `.venv/bin/python benchmarks/weights_restore.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpudoctor.weights.manifest import (  # noqa: E402
    Manifest,
    ManifestFile,
    utc_now_iso,
)
from tests.weights.hub_server import HubServer  # noqa: E402

REPO = "bench/qwen-27b-scaled"
SMALL_FILES = {  # real sizes of a Qwen-style checkpoint's small files
    "config.json": 1_500,
    "generation_config.json": 250,
    "tokenizer_config.json": 5_400,
    "tokenizer.json": 11_400_000,
    "vocab.json": 2_770_000,
    "merges.txt": 1_670_000,
    "model.safetensors.index.json": 33_000,
}


def shard_sizes(total_bytes: int, shards: int = 11) -> list[int]:
    """Return shard sizes like a 27B checkpoint: equal shards, the last ~60% of one."""
    unit = int(total_bytes / (shards - 1 + 0.6))
    return [unit] * (shards - 1) + [total_bytes - unit * (shards - 1)]


def write_random(path: Path, size: int) -> str:
    """Write ``size`` random bytes to ``path``; return their sha256."""
    digest = hashlib.sha256()
    block = os.urandom(16 << 20)
    with open(path, "wb") as handle:
        left = size
        while left:
            piece = block[: min(left, len(block))]
            # vary blocks cheaply so no two shards share content
            piece = (
                hashlib.sha256(path.name.encode() + left.to_bytes(8, "little")).digest()
                + piece[32:]
            )
            handle.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def make_model(directory: Path, total_bytes: int, shards: int = 11) -> list[ManifestFile]:
    """Generate the model under ``directory``; return its files (sha256 for LFS-like files)."""
    directory.mkdir(parents=True)
    files = []
    sizes = shard_sizes(total_bytes, shards)
    for i, size in enumerate(sizes):
        name = f"model-{i + 1:05d}-of-{len(sizes):05d}.safetensors"
        files.append(ManifestFile(name, size, write_random(directory / name, size)))
    for name, size in SMALL_FILES.items():
        digest = write_random(directory / name, size)
        files.append(ManifestFile(name, size, digest if size >= 10_000_000 else None))
    return sorted(files, key=lambda f: f.path)


def drop_caches() -> None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches`` (a cold page cache, as after a reboot)."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def timed(command: list[str], env: dict[str, str] | None = None) -> float:
    """Run ``command``; return its wall time in seconds (raises if it fails)."""
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed: {proc.stderr[-2000:]}")
    return elapsed


def timed_ensure(command: list[str], work: list[float], env: dict[str, str] | None = None) -> float:
    """Run an ``ensure --json`` command; return its wall time, append its own ``seconds``."""
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed: {proc.stderr[-2000:]}")
    work.append(json.loads(proc.stdout)["seconds"])
    return elapsed


def gpudoctor_cmd(*args: str) -> list[str]:
    """The CLI as a user runs it: ``gpudoctor weights ...`` (``python -m gpudoctor``)."""
    if (ROOT / "gpudoctor" / "__main__.py").exists():
        return [sys.executable, "-m", "gpudoctor", "weights", *args]
    return [sys.executable, "-m", "gpudoctor.commands.weights", *args]


def alternate(trials: int, runs: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Run each callable ``trials`` times, interleaved (A B A B ...); return the times."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(trials):
        for name, run in runs.items():
            times[name].append(run())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-gb", type=float, default=2.0, help="model size (GB)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/gpudoctor-weights-bench"))
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (mount -t tmpfs, drop_caches)")
    total = int(args.total_gb * 1e9)
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    shm = work / "shm"
    shm.mkdir(parents=True)
    tmpfs_size = int((total + sum(SMALL_FILES.values())) * 1.15) + (64 << 20)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={tmpfs_size}", "tmpfs", str(shm)], check=True
    )
    hub = HubServer(work / "hub-storage")
    results: dict[str, object] = {}
    try:
        results = run_all(args, work, shm, total, hub)
    finally:
        hub.stop()
        subprocess.run(["umount", str(shm)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print_report(results)
    if args.json:
        print(json.dumps(results, indent=1))


def run_all(args: argparse.Namespace, work: Path, shm: Path, total: int, hub: HubServer) -> dict:
    print(f"generating a {total / 1e9:.1f} GB model under {work} ...", file=sys.stderr)
    mirror_root = work / "mirror"
    model_dir = mirror_root.joinpath(*REPO.split("/"))
    files = make_model(model_dir, total)
    model_bytes = sum(f.size for f in files)
    (model_dir / ".gpudoctor-manifest.json").write_text(
        Manifest(REPO, "0" * 40, tuple(files), utc_now_iso()).to_json()
    )
    results: dict[str, object] = {
        "model_bytes": model_bytes,
        "files": len(files),
        "cpus": os.cpu_count(),
        "trials": args.trials,
    }

    # 1. restore from the disk mirror into tmpfs
    def cp_run(cold: bool) -> float:
        shutil.rmtree(shm / "cp", ignore_errors=True)
        if cold:
            drop_caches()
        elapsed = timed(["cp", "-r", str(model_dir), str(shm / "cp")])
        shutil.rmtree(shm / "cp")
        return elapsed

    work_s: dict[str, list[float]] = {"cold": [], "warm": [], "download": []}

    def restore_run(cold: bool) -> float:
        target = shm / "gd"
        if cold:
            drop_caches()
        command = gpudoctor_cmd(
            "ensure", REPO, "--to", str(target), "--mirror", str(mirror_root), "--json"
        )
        elapsed = timed_ensure(command, work_s["cold" if cold else "warm"])
        shutil.rmtree(target)
        return elapsed

    for label, cold in (("cold", True), ("warm", False)):
        print(f"restore ({label} page cache) ...", file=sys.stderr)
        if not cold:
            cp_run(False)  # warm the cache
        times = alternate(
            args.trials, {"cp": lambda c=cold: cp_run(c), "ensure": lambda c=cold: restore_run(c)}
        )
        results[f"restore_{label}"] = summarize(times, model_bytes, "cp", "ensure")
        results[f"restore_{label}"]["ensure_work"] = work_summary(work_s[label], model_bytes)

    # 2. download from the loopback Hub stand-in
    print("download ...", file=sys.stderr)
    repo = hub.add_repo(REPO)
    repo.commit({f.path: model_dir / f.path for f in files})
    endpoint = hub.start()

    def hf_env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        home = tempfile.mkdtemp(prefix="hf-home-", dir=work)
        env.update(
            HF_ENDPOINT=endpoint,
            HF_HOME=home,
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_UPDATE_CHECK="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            PYTHONPATH=str(ROOT),
        )
        return env

    hf_bin = str(Path(sys.executable).with_name("hf"))

    def hf_run() -> float:
        target = shm / "hf"
        elapsed = timed([hf_bin, "download", REPO, "--local-dir", str(target)], env=hf_env())
        shutil.rmtree(target)
        return elapsed

    def ensure_download() -> float:
        target = shm / "gd"
        command = gpudoctor_cmd("ensure", REPO, "--to", str(target), "--json")
        elapsed = timed_ensure(command, work_s["download"], env=hf_env())
        shutil.rmtree(target)
        return elapsed

    times = alternate(args.trials, {"hf download": hf_run, "ensure": ensure_download})
    results["download"] = summarize(times, model_bytes, "hf download", "ensure")
    results["download"]["ensure_work"] = work_summary(work_s["download"], model_bytes)

    # 3. ensure on a complete 50-shard directory
    print("complete-check on 50 shards ...", file=sys.stderr)
    fifty_src = work / "fifty-src"
    fifty_src.mkdir()
    fifty = {f"model-{i:05d}-of-00050.safetensors": fifty_src / f"s{i}" for i in range(1, 51)}
    for path in fifty.values():
        path.write_bytes(os.urandom(64 << 10))
    (fifty_src / "config.json").write_text("{}")
    fifty["config.json"] = fifty_src / "config.json"
    hub.add_repo("bench/fifty").commit(fifty)
    target = work / "fifty"
    env = hf_env()
    timed(gpudoctor_cmd("ensure", "bench/fifty", "--to", str(target), "-q"), env=env)
    hub.clear_log()
    cli_times = [
        timed(gpudoctor_cmd("ensure", "bench/fifty", "--to", str(target), "-q"), env=env)
        for _ in range(7)
    ]
    requests = len(hub.requests)
    help_times = [timed(gpudoctor_cmd("--help"), env=env) for _ in range(7)]
    inproc = in_process_noop(target, env)
    results["complete_check"] = {
        "cli_process_ms_median": round(statistics.median(cli_times) * 1000, 1),
        "in_process_ms_median": round(statistics.median(inproc) * 1000, 2),
        "python_startup_ms": round(python_startup_ms(), 1),
        "cli_help_ms_median": round(statistics.median(help_times) * 1000, 1),
        "requests_during_noop": requests,
    }
    return results


def in_process_noop(target: Path, env: dict[str, str]) -> list[float]:
    """Time ``ensure()`` itself on the complete directory (no interpreter start-up)."""
    from gpudoctor.weights.ensure import EnsureRequest, ensure
    from gpudoctor.weights.progress import Progress

    times = []
    for _ in range(20):
        start = time.perf_counter()
        result = ensure(EnsureRequest("bench/fifty", target), Progress())
        times.append(time.perf_counter() - start)
        assert result.action == "none"
    return times


def python_startup_ms() -> float:
    """Return the median wall time of ``python -c pass`` (the floor of any CLI run)."""
    return statistics.median(timed([sys.executable, "-c", "pass"]) for _ in range(5)) * 1000


def work_summary(seconds: list[float], nbytes: int) -> dict:
    """Return the median of ensure's own ``seconds`` (no interpreter start-up) and its rate."""
    med = statistics.median(seconds)
    return {"median_s": round(med, 3), "MB_per_s": round(nbytes / med / 1e6)}


def summarize(times: dict[str, list[float]], nbytes: int, base: str, ours: str) -> dict:
    """Return medians, throughputs and the speed ratio ours/base (> 1: ours is faster)."""
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        "seconds": {name: [round(v, 3) for v in values] for name, values in times.items()},
        "median_s": {name: round(v, 3) for name, v in med.items()},
        "MB_per_s": {name: round(nbytes / v / 1e6) for name, v in med.items()},
        "ratio": round(med[base] / med[ours], 3),
        "baseline": base,
    }


def print_report(results: dict) -> None:
    if not results:
        return
    print(
        f"\nmodel: {results['files']} files, {results['model_bytes'] / 1e9:.2f} GB;"
        f" {results['cpus']} CPUs; median of {results['trials']} interleaved trials\n"
    )
    header = f"{'case':<26}{'baseline':>22}{'ensure':>22}{'ratio':>9}  goal"
    print(header)
    print("-" * len(header))
    goals = {"restore_cold": ">= 0.9", "restore_warm": ">= 0.9", "download": ">= 0.95"}
    for case, goal in goals.items():
        r = results[case]
        base = r["baseline"]
        left = f"{base} {r['median_s'][base]:.2f}s {r['MB_per_s'][base]}MB/s"
        right = f"{r['median_s']['ensure']:.2f}s {r['MB_per_s']['ensure']}MB/s"
        print(f"{case:<26}{left:>22}{right:>22}{r['ratio']:>8.2f}x  {goal}")
        w = r["ensure_work"]
        inner = f"{w['median_s']:.2f}s {w['MB_per_s']}MB/s"
        print(f"{'':<26}{'(ensure minus start-up)':>22}{inner:>22}")
    c = results["complete_check"]
    print(
        f"{'complete-check (50 shards)':<26}{'in-process':>22}{c['in_process_ms_median']:>20.2f}ms"
        f"{'':>9}  < 100 ms"
    )
    print(
        f"{'':<26}{'whole CLI process':>22}{c['cli_process_ms_median']:>20.1f}ms"
        f"   (requests: {c['requests_during_noop']})"
    )
    print(
        f"{'':<26}{'floor: weights --help':>22}{c['cli_help_ms_median']:>20.1f}ms"
        f"   (python -c pass: {c['python_startup_ms']} ms)"
    )


if __name__ == "__main__":
    main()
