"""Run gpudoctor's own mutation operators (tests/mutation/operators.py) over one module of
tests/mutation/modules.toml: each mutant written into the clone in turn, that module's fast
tests run against it (``pytest -x``, ``nice -n 19``, one process), killed when they fail.
Called by tests/mutation/run.py (``--engine own`` or ``both``), which prints the score
beside mutmut's. Mutant names: ``own:MODULE_FILE:FUNCTION:OPERATOR:WHAT``; the equivalent
ones are listed in tests/mutation/equivalent.toml like mutmut's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

try:
    from operators import mutants  # run.py's folder is on sys.path (run as a script)
except ImportError:  # imported as tests.mutation.own (its unit test)
    from tests.mutation.operators import mutants

PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m",
          "not lab and not slow and not gpu", "--timeout=300"]  # fmt: skip


def functions_of(patterns: tuple[str, ...]) -> set[str] | None:
    """Return the qualified function names that mutmut's mutant-name patterns select
    (``gpudoctor.fsio.x_kind_of__mutmut_*`` -> ``kind_of``; ``xǁConfigǁmake_line`` ->
    ``Config.make_line``), None for the whole file."""
    if not patterns:
        return None
    names = set()
    for pattern in patterns:
        method = re.search(r"xǁ(\w+)ǁ(\w+?)__mutmut", pattern)
        plain = re.search(r"\.x_(\w+?)__mutmut", pattern)
        if method:
            names.add(f"{method.group(1)}.{method.group(2)}")
        elif plain:
            names.add(plain.group(1))
    return names


def _tests_fail(clone: Path, tests: tuple[str, ...], log, timeout_s: float) -> bool:
    # the clone's gpudoctor first; no .pyc: a mutant of the same size written within the
    # same second as the last one would otherwise run the last one's cached bytecode
    env = {**os.environ, "PYTHONPATH": str(clone), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(["nice", "-n", "19", sys.executable, *PYTEST, *tests], cwd=clone,
                              env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout_s, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return True  # a hang is a kill, as mutmut counts a timeout
    return done.returncode not in (0, 5)  # 5: no tests collected is not a kill


def run_module(module, clone: Path, equivalent: dict[str, str], log_path: Path, score_cls):
    """Mutate ``module.source`` in ``clone`` with every own operator; return its Score
    (statuses ``killed`` / ``survived`` / ``not checked`` when the cap ran out)."""
    path = clone / module.source
    original = path.read_text(encoding="utf-8")
    score = score_cls(f"{module.name} [own]")
    began = time.monotonic()
    found = mutants(original, functions_of(module.mutants))
    if not found:
        return score  # no own mutant in this module: nothing to run (0 of 0)
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink()
    with log_path.open("w") as log:
        if _tests_fail(clone, module.tests, log, module.cap_s):
            score.broken = True
            return score
        try:
            for mutant in found:
                base = name = f"own:{module.source}:{mutant.name}"
                for n in range(2, 1000):  # the same text twice in one function: #2, #3, ...
                    if name not in score.statuses:
                        break
                    name = f"{base}#{n}"
                if time.monotonic() - began > module.cap_s:
                    score.statuses[name] = "not checked"
                    score.capped = True
                    continue
                path.write_text(mutant.source, encoding="utf-8")
                log.write(f"\n=== {name}\n")
                log.flush()
                killed = _tests_fail(clone, module.tests, log, module.cap_s)
                score.statuses[name] = "killed" if killed else "survived"
        finally:
            path.write_text(original, encoding="utf-8")
    score.equivalent = {k: why for k, why in equivalent.items() if k in score.statuses}
    score.seconds = time.monotonic() - began
    return score
