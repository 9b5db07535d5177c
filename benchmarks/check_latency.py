"""How long `gpudoctor check` takes next to the bare cuInit process it must rival.

Runs, interleaved and repeated (these machines are noisy), side by side in one run:
  1. `gpudoctor check` (the whole catalogue, as a user runs it: the probe is a fork started
     first thing), the same with GPUDOCTOR_EARLY_PROBE=spawn (the probe a new interpreter,
     as on 2026-12-02) and with GPUDOCTOR_EARLY_PROBE=0 (the probe started by the runner,
     after the imports, as before that)
  2. `python -c "from cuda.bindings import driver; driver.cuInit(0)"` (the reference)
  3. `nvidia-smi -L` (where present)
  4. `gpudoctor --help` (start-up time; goal < 150 ms)
  5. `python -c pass` (the interpreter's own start-up, which both 1 and 2 pay)
and prints medians and the ratio of 1 to 2 (goal: <= 1.1x on a GPU machine, issue 21).

Usage: python benchmarks/check_latency.py [--runs N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

PY = sys.executable
NO_EARLY = {"GPUDOCTOR_EARLY_PROBE": "0"}
COMMANDS = {
    "gpudoctor check": [PY, "-m", "gpudoctor", "check", "--json"],
    "check, probe spawned": [PY, "-m", "gpudoctor", "check", "--json"],
    "check, early probe off": [PY, "-m", "gpudoctor", "check", "--json"],
    "bare cuInit (cuda.bindings)": [PY, "-c", "from cuda.bindings import driver; driver.cuInit(0)"],
    "nvidia-smi -L": ["nvidia-smi", "-L"],
    "gpudoctor --help": [PY, "-m", "gpudoctor", "--help"],
    "python -c pass": [PY, "-c", "pass"],
}


ENV = {  # the probe as a new interpreter; started by the runner, as before
    "check, probe spawned": {"GPUDOCTOR_EARLY_PROBE": "spawn"},
    "check, early probe off": NO_EARLY,
}


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Return the wall time of one run of ``argv`` in seconds (output discarded)."""
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env={**os.environ, **env} if env else None)  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    commands = {k: v for k, v in COMMANDS.items() if shutil.which(v[0]) or v[0] == PY}
    for name, argv in commands.items():  # warm the page cache once
        timed(argv, ENV.get(name))
    samples: dict[str, list[float]] = {k: [] for k in commands}
    for _ in range(args.runs):
        for name, argv in commands.items():
            samples[name].append(timed(argv, ENV.get(name)))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ref = medians["bare cuInit (cuda.bindings)"]
    print(f"{'command':<30} {'median ms':>10} {'min ms':>8} {'vs bare cuInit':>15}")
    for name, values in samples.items():
        print(
            f"{name:<30} {medians[name] * 1000:>10.1f} {min(values) * 1000:>8.1f} "
            f"{medians[name] / ref:>14.2f}x"
        )
    ratio = medians["gpudoctor check"] / ref
    print(
        f"\ngpudoctor check / bare cuInit = {ratio:.2f}x (goal <= 1.1x on a GPU machine); "
        f"--help = {medians['gpudoctor --help'] * 1000:.0f} ms (goal < 150 ms); runs = {args.runs}"
    )
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(
                {
                    "runs": args.runs,
                    "median_s": medians,
                    "samples_s": samples,
                    "check_vs_cuinit": ratio,
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
