"""Run mutmut over the core modules, one module at a time, and print each module's score.

Called by tests/mutation/run.sh (which makes the fresh clone and the virtual environment);
see docs/testing.md. For each module of tests/mutation/modules.toml it writes the clone's
``setup.cfg`` ``[mutmut]`` section (that module only; its fast unit tests only), runs
``mutmut run --max-children 1`` under a time cap, reads ``mutmut results --all true`` and
prints ``NAME: killed N of M (P %)``, where M leaves out the mutants that
tests/mutation/equivalent.toml shows equivalent (each with its one-line reason). A
survivor that is neither killed nor listed there is printed with its diff (``mutmut show``).
Exit status: 0 when every module that ran reached its goal, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
KILLED = {"killed", "timeout", "caught by type check", "segfault"}


@dataclass(frozen=True)
class Module:
    """One core module: the file mutmut mutates and the fast tests that must kill it."""

    name: str
    source: str
    tests: tuple[str, ...]
    mutants: tuple[str, ...] = ()  # fnmatch patterns of the mutant names scored (default all)
    cap_s: int = 900


@dataclass
class Score:
    """What mutmut made of one module."""

    name: str
    statuses: dict[str, str] = field(default_factory=dict)
    equivalent: dict[str, str] = field(default_factory=dict)
    capped: bool = False
    seconds: float = 0.0
    broken: bool = False  # its tests fail on the unmutated code: no score

    @property
    def counted(self) -> dict[str, str]:
        return {
            k: s
            for k, s in self.statuses.items()
            if k not in self.equivalent and s != "not checked"
        }

    @property
    def killed(self) -> int:
        return sum(s in KILLED for s in self.counted.values())

    @property
    def survivors(self) -> list[str]:
        return sorted(k for k, s in self.counted.items() if s not in KILLED)

    def line(self) -> str:
        if self.broken:
            return f"{self.name}: NOT SCORED: its tests fail on the unmutated code (see its log)"
        total = len(self.counted)
        pct = 100.0 * self.killed / total if total else 100.0
        unchecked = sum(s == "not checked" for s in self.statuses.values())
        extra = f", {len(self.equivalent)} equivalent"
        extra += f", {unchecked} not checked (time cap)" if unchecked or self.capped else ""
        return (
            f"{self.name}: killed {self.killed} of {total} ({pct:.1f} %)"
            f"  [{len(self.statuses)} mutants{extra}; {self.seconds:.0f} s]"
        )

    @property
    def percent(self) -> float:
        total = len(self.counted)
        return 100.0 * self.killed / total if total else 100.0


def load_modules(path: Path) -> list[Module]:
    """Return the modules of modules.toml, in file order."""
    data = tomllib.loads(path.read_text())
    return [
        Module(
            m["name"],
            m["source"],
            tuple(m["tests"]),
            tuple(m.get("mutants", ())),
            m.get("cap_s", 900),
        )
        for m in data["module"]
    ]


def load_equivalent(path: Path) -> dict[str, str]:
    """Return ``{mutant name: why it cannot change behaviour}`` from equivalent.toml."""
    data = tomllib.loads(path.read_text())
    return {name: why for table in data.values() for name, why in table.items()}


def setup_cfg(module: Module) -> str:
    """Return the ``[mutmut]`` section that mutates ``module.source`` under its tests."""
    tests = "\n".join(f"    {t}" for t in module.tests)
    return (
        "[mutmut]\n"
        "source_paths =\n    gpudoctor\n"
        f"only_mutate = {module.source}\n"
        "also_copy =\n    checks\n    README.md\n    docs\n    benchmarks\n"
        f"pytest_add_cli_args_test_selection =\n{tests}\n"
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -m\n    not lab and not slow and not gpu\n"
        "    --timeout=300\n"
    )


def results(mutmut: str, clone: Path) -> dict[str, str]:
    """Return ``{mutant name: status}`` from ``mutmut results --all true``."""
    out = subprocess.run(
        [mutmut, "results", "--all", "true"], cwd=clone, capture_output=True, text=True, check=False
    ).stdout
    found = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("gpudoctor."):
            found[name] = status
    return found


def run_module(
    module: Module, clone: Path, mutmut: str, equivalent: dict[str, str], log: Path
) -> Score:
    """Mutate one module in ``clone`` (``nice -n 19``, one process, at most ``cap_s``)."""
    (clone / "setup.cfg").write_text(setup_cfg(module))
    subprocess.run(["rm", "-rf", str(clone / "mutants")], check=True)
    began = time.monotonic()
    argv = ["timeout", str(module.cap_s), "nice", "-n", "19", mutmut, "run", "--max-children", "1"]
    with log.open("w") as out:
        done = subprocess.run(
            [*argv, *module.mutants], cwd=clone, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    score = Score(module.name, capped=done.returncode == 124, seconds=time.monotonic() - began)
    score.broken = "failed to collect stats" in log.read_text(errors="replace")
    statuses = results(mutmut, clone)
    if module.mutants:
        statuses = {
            k: s for k, s in statuses.items() if any(fnmatch.fnmatch(k, p) for p in module.mutants)
        }
    score.statuses = statuses
    score.equivalent = {k: why for k, why in equivalent.items() if k in statuses}
    return score


def main(argv: list[str] | None = None) -> int:
    """Run the selected modules; print one score line each and the unexplained survivors."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", type=Path, required=True, help="a fresh clone to mutate in")
    parser.add_argument("--mutmut", default="mutmut", help="the mutmut executable")
    parser.add_argument("--goal", type=float, default=90.0, help="percent killed per module")
    parser.add_argument("--logs", type=Path, help="folder for each module's mutmut output")
    parser.add_argument("--cap", type=int, help="time cap per module in seconds (overrides)")
    parser.add_argument("--engine", choices=("mutmut", "own", "both"), default="mutmut",
                        help="mutmut's operators, gpudoctor's own (tests/mutation/operators.py), "
                        "or both, scored side by side")  # fmt: skip
    parser.add_argument("--modules-file", type=Path, default=HERE / "modules.toml",
                        help="the module list (default: modules.toml, the core CI scores)")  # fmt: skip
    parser.add_argument("modules", nargs="*", help="module names (default: all of the file)")
    args = parser.parse_args(argv)
    modules = load_modules(args.modules_file)
    unknown = set(args.modules) - {m.name for m in modules}
    if unknown:
        print(f"unknown module(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    chosen = [m for m in modules if not args.modules or m.name in args.modules]
    equivalent = load_equivalent(HERE / "equivalent.toml")
    logs = args.logs or args.clone / "mutation-logs"
    logs.mkdir(parents=True, exist_ok=True)
    scores = []
    for module in chosen:
        if args.cap:
            module = Module(module.name, module.source, module.tests, module.mutants, args.cap)
        if args.engine in ("own", "both"):
            import own

            own_log = logs / f"{module.name}.own.log"
            mine = own.run_module(module, args.clone, equivalent, own_log, Score)
            scores.append(mine)
            print(mine.line(), flush=True)
            for name in mine.survivors:
                print(f"  survived: {name}"[:300])
            if args.engine == "own":
                continue
        score = run_module(module, args.clone, args.mutmut, equivalent, logs / f"{module.name}.log")
        scores.append(score)
        print(score.line(), flush=True)
        for name in score.survivors:
            shown = subprocess.run(
                [args.mutmut, "show", name],
                cwd=args.clone,
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            diff = [
                ln
                for ln in shown.splitlines()
                if ln.startswith(("-", "+")) and ln[:3] not in ("---", "+++")
            ]
            print(f"  survived ({score.statuses[name]}): {name}: {' | '.join(diff)[:300]}")
        stale = [k for k in score.equivalent if score.statuses[k] in KILLED]
        for name in stale:
            print(f"  listed equivalent but killed (remove it from equivalent.toml): {name}")
    print()
    for score in scores:
        print(score.line())
    return 0 if all(s.percent >= args.goal and not (s.capped or s.broken) for s in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
