#!/usr/bin/env python3
"""Stands for Slurm's client commands (``sbatch``, ``squeue``, ``scontrol``, ``sacct``) in
the fast tests of gpudoctor/bench/launch/slurm.py, where no Slurm controller runs (the
real one-node cluster of tests/lab/slurm.py is a lab test, minutes per run).

Linked under each client's name into a ``bin/`` directory put first on ``PATH``. Each
call appends ``{"argv": [...], "stdin": "..."}`` to ``$FAKE_SLURM_DIR/calls.jsonl`` and
answers what the test left for it: ``NAME.N.out`` (the N-th call of NAME, from 1) or
``NAME.out`` as its stdout, ``NAME.err`` as its stderr, ``NAME.rc`` as its exit code
(0 when absent). The answers are real Slurm's output (tests/bench/data/slurm/).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    """Record the call and answer it; return the exit code."""
    here = Path(os.environ["FAKE_SLURM_DIR"])
    name = Path(sys.argv[0]).name
    stdin = "" if sys.stdin.isatty() else sys.stdin.read()
    with open(here / "calls.jsonl", "a", encoding="utf-8") as calls:
        calls.write(json.dumps({"argv": [name, *sys.argv[1:]], "stdin": stdin}) + "\n")
    count = sum(1 for line in (here / "calls.jsonl").read_text().splitlines()
                if json.loads(line)["argv"][0] == name)  # fmt: skip
    for candidate in (here / f"{name}.{count}.out", here / f"{name}.out"):
        if candidate.exists():
            sys.stdout.write(candidate.read_text())
            break
    err = here / f"{name}.err"
    if err.exists():
        sys.stderr.write(err.read_text())
    rc = here / f"{name}.rc"
    return int(rc.read_text()) if rc.exists() else 0


if __name__ == "__main__":
    sys.exit(main())
