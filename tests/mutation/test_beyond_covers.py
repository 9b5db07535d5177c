"""Issue 37's list of packages is mutated whole: every source file of bench/launch,
bench/results, bench/plan, bench/load, facts, pve, weights and hosts/ssh (and fsio.py) is in
exactly one module of tests/mutation/beyond.toml or modules.toml (the core), so CI's
``--changed-only`` sees a change to any of them; and every test path a module names exists
(a renamed test file would leave its mutants to no test, silently)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.mutation import run

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bench/launch", "bench/results", "bench/plan", "bench/load", "facts", "pve",
            "weights", "hosts/ssh")  # fmt: skip


def all_modules() -> list[run.Module]:
    return run.load_modules(run.HERE / "modules.toml") + run.load_modules(run.HERE / "beyond.toml")


def test_every_file_of_the_listed_packages_is_in_exactly_one_module() -> None:
    wanted = {
        str(p.relative_to(ROOT))
        for pkg in PACKAGES
        for p in (ROOT / "gpudoctor" / pkg).glob("*.py")
        if p.name != "__init__.py"
    }
    whole = Counter(f for m in all_modules() if not m.mutants for f in m.files(ROOT))
    partial = {f for m in all_modules() if m.mutants for f in m.files(ROOT)}  # some functions
    missing = sorted(f for f in wanted if not whole[f] and f not in partial)
    twice = sorted(f for f, n in whole.items() if n > 1)
    assert not missing, f"in no mutation module: {missing}"
    assert not twice, f"in more than one mutation module: {twice}"
    assert "gpudoctor/fsio.py" in partial  # fsio.trust (core) and fsio.io (beyond)


def test_every_test_path_a_module_names_exists() -> None:
    absent = sorted({t for m in all_modules() for t in m.tests if not (ROOT / t).exists()})
    assert not absent, f"named as a module's tests but not there: {absent}"
