"""Ctrl-C during a mirror restore: how long after SIGINT the `weights ensure` process is
gone, beside the reference (GNU ``cp`` of the same file interrupted the same way: the
kernel's default action, the floor) and the goal (0.5 s, issue 26.2).

Usage: ``python benchmarks/interrupt_latency.py [--size-gb 2] [--trials 5]
[--workdir /var/tmp/gpudoctor-interrupt-bench] [--json OUT]``. It writes a random model
(one shard of --size-gb and a config) as a mirror under --workdir, then per trial starts
``ensure --mirror`` (or ``cp``) into --workdir/dest (on /dev/shm when it has room),
waits until 128 MiB of the shard are written, sends SIGINT to the process group (what
Ctrl-C does) and times the exit. Also printed: the share of the shard written at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from weights_restore import gpudoctor_cmd, write_random  # noqa: E402

from gpudoctor.weights.copier import temp_path  # noqa: E402
from gpudoctor.weights.localfs import write_manifest  # noqa: E402
from gpudoctor.weights.manifest import Manifest, ManifestFile  # noqa: E402

REPO = "bench/interrupt"
SHARD = "model-00001-of-00001.safetensors"
GOAL_S = 0.5
STARTED = 128 << 20


def allocated(path: Path) -> int:
    """Return the bytes allocated to ``path`` (``du -B1``), 0 when absent."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def make_mirror(root: Path, size: int) -> Path:
    """Write the mirror (``root/bench/interrupt``); return the shard's path."""
    model = root / "bench" / "interrupt"
    model.mkdir(parents=True)
    write_random(model / SHARD, size)
    (model / "config.json").write_text("{}\n")
    files = (ManifestFile("config.json", 3), ManifestFile(SHARD, size))
    write_manifest(model, Manifest(REPO, "c" * 40, files, "2026-12-03T00:00:00Z"))
    return model / SHARD


def interrupt(command: list[str], watch: Path, env: dict[str, str]) -> tuple[float, int, int]:
    """Start ``command``, SIGINT it once ``watch`` has STARTED bytes; return (seconds from
    the signal to the exit, bytes of ``watch`` at exit, exit status)."""
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    while allocated(watch) < STARTED and proc.poll() is None:
        time.sleep(0.002)
    if proc.poll() is not None:
        raise RuntimeError(f"{command[0]} finished before it could be interrupted")
    start = time.perf_counter()
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait()
    return time.perf_counter() - start, allocated(watch), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/gpudoctor-interrupt-bench"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = int(args.size_gb * 1e9) // 4096 * 4096
    shutil.rmtree(args.workdir, ignore_errors=True)
    source = make_mirror(args.workdir / "mirror", size)
    shm = Path("/dev/shm")
    st = os.statvfs(shm)
    dest_root = (
        shm / "gpudoctor-interrupt-bench"
        if st.f_bavail * st.f_frsize > 2 * size
        else args.workdir / "dest"
    )
    env = {**os.environ, "GPUDOCTOR_STATE_DIR": str(args.workdir / "state")}
    runs: dict[str, list[tuple[float, int, int]]] = {"ensure": [], "cp": []}
    try:
        for _ in range(args.trials):
            for name in runs:
                shutil.rmtree(dest_root, ignore_errors=True)
                dest_root.mkdir(parents=True)
                if name == "cp":
                    command = ["cp", str(source), str(dest_root / SHARD)]
                    watch = dest_root / SHARD
                else:
                    target = dest_root / "model"
                    command = gpudoctor_cmd("ensure", REPO, "--to", str(target), "--mirror",
                                            str(args.workdir / "mirror"), "-q")  # fmt: skip
                    watch = temp_path(target.with_name("model.partial"), SHARD)
                runs[name].append(interrupt(command, watch, env))
    finally:
        shutil.rmtree(dest_root, ignore_errors=True)
        shutil.rmtree(args.workdir, ignore_errors=True)
    result = {"size_bytes": size, "goal_s": GOAL_S}
    for name, trials in runs.items():
        latency = statistics.median(t for t, _, _ in trials)
        result[name] = {
            "latency_s": latency,
            "max_s": max(t for t, _, _ in trials),
            "written_at_exit": statistics.median(b for _, b, _ in trials) / size,
            "exit_codes": sorted({c for _, _, c in trials}),
            "trials": [t for t, _, _ in trials],
        }
    ens, cp = result["ensure"], result["cp"]
    print(f"shard {size / 1e9:.2f} GB, {args.trials} trials, dest {dest_root.parent}")
    print(f"ensure: SIGINT -> exit {ens['latency_s'] * 1000:.0f} ms median"
          f" (max {ens['max_s'] * 1000:.0f} ms), {ens['written_at_exit']:.0%} of the shard"
          f" written, exit {ens['exit_codes']}")  # fmt: skip
    print(
        f"cp (reference): {cp['latency_s'] * 1000:.0f} ms median, {cp['written_at_exit']:.0%} written"
    )
    print(f"ratio ensure / goal {GOAL_S} s: {ens['max_s'] / GOAL_S:.2f} (max; <= 1 passes);"
          f" ensure / cp: {ens['latency_s'] / max(cp['latency_s'], 1e-6):.1f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
