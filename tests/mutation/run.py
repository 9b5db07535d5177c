"""Run mutmut over the core modules, one module at a time, and print each module's score.

Called by tests/mutation/run.sh (which makes the fresh clone and the virtual environment);
see docs/testing.md. For each module of tests/mutation/modules.toml it writes the clone's
``setup.cfg`` ``[mutmut]`` section (that module only; its fast unit tests only), runs
``mutmut run --max-children 1`` under a time cap, reads ``mutmut results --all true`` and
prints ``NAME: killed N of M (P %)``, where M leaves out the mutants that
tests/mutation/equivalent.toml shows equivalent (each with its one-line reason). A
survivor that is neither killed nor listed there is printed with its diff (``mutmut show``).
A module's ``source`` may be a glob (``gpudoctor/bench/launch/*.py``, less ``exclude``):
one mutmut run then mutates every file of it under the module's tests, and each file is
scored on its own (``bench.launch/slots.py: killed N of M``). ``--changed-only`` measures
only the files whose bytes differ from their entry in tests/mutation/measured.toml (what CI
does beyond the core), ``--record`` writes the entries of the files it measured.
``--budget-s N`` bounds the whole run: a module whose turn comes after N seconds is not
mutated, and one that would run past it gets only what is left as its cap; the files not
scored so are listed ("not re-measured: the run's budget ... is spent"), as unmeasured
files are, and do not fail the run (CI's 90 minutes; record them with ``--record``).
Exit status: 0 when every module that ran reached its goal, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
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
    exclude: tuple[str, ...] = ()  # files a glob source leaves out (scored elsewhere, or no logic)

    def files(self, root: Path) -> list[str]:
        """Return the source files this module mutates, relative to ``root`` (sorted)."""
        if not any(c in self.source for c in "*?["):
            return [self.source]
        return sorted(
            str(p.relative_to(root))
            for p in root.glob(self.source)
            if not any(fnmatch.fnmatch(str(p.relative_to(root)), x) for x in self.exclude)
        )


@dataclass
class Score:
    """What mutmut made of one module."""

    name: str
    statuses: dict[str, str] = field(default_factory=dict)
    equivalent: dict[str, str] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)  # listed, but renumbered (pins.py)
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
            tuple(m.get("exclude", ())),
        )
        for m in data["module"]
    ]


def dotted(path: str) -> str:
    """Return the import name of a source file (``gpudoctor/pve/hooks.py`` -> ``gpudoctor.pve.hooks``)."""
    return path.removesuffix(".py").replace("/", ".")


def fingerprint(path: Path) -> str:
    """Return the sha256 of a source file's bytes (``sha256sum PATH``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_measured(path: Path) -> dict[str, dict]:
    """Return ``{source file: {sha256, killed, total, ...}}`` from measured.toml ({} if absent)."""
    return tomllib.loads(path.read_text()) if path.exists() else {}


def write_measured(path: Path, measured: dict[str, dict]) -> None:
    """Write measured.toml: one table per source file, sorted (the clone's copy is returned)."""
    lines = [
        "# Written by `tests/mutation/run.py --record` (run.sh --record): each file's sha256 when",
        "# its mutation score was measured, and that score. `--changed-only` (CI beyond the core)",
        "# measures again only the files whose bytes differ; docs/testing.md.",
    ]
    for name in sorted(measured):
        entry = measured[name]
        lines.append(f'\n["{name}"]')
        for key in ("sha256", "killed", "total", "equivalent", "engine", "measured"):
            value = entry[key]
            lines.append(f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"')
    path.write_text("\n".join(lines) + "\n")


def load_equivalent(path: Path) -> dict[str, str]:
    """Return ``{mutant name: why it cannot change behaviour}`` from equivalent.toml."""
    data = tomllib.loads(path.read_text())
    return {name: why for table in data.values() for name, why in table.items()}


def setup_cfg(module: Module, files: list[str]) -> str:
    """Return the ``[mutmut]`` section that mutates ``files`` under ``module``'s tests."""
    tests = "\n".join(f"    {t}" for t in module.tests)
    only = "\n".join(f"    {f}" for f in files)
    return (
        "[mutmut]\n"
        "source_paths =\n    gpudoctor\n"
        f"only_mutate =\n{only}\n"
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
    module: Module,
    clone: Path,
    mutmut: str,
    equivalent: dict[str, str],
    log: Path,
    files: list[str] | None = None,
    children: int = 1,
) -> list[Score]:
    """Mutate ``files`` (default: all of the module's) in ``clone`` (``nice -n 19``, one
    process, at most ``cap_s``); return one Score per file (the module's name for one file)."""
    files = files if files is not None else module.files(clone)
    (clone / "setup.cfg").write_text(setup_cfg(module, files))
    subprocess.run(["rm", "-rf", str(clone / "mutants")], check=True)
    began = time.monotonic()
    argv = ["timeout", str(module.cap_s), "nice", "-n", "19", mutmut, "run"]
    argv += ["--max-children", str(children)]
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
    score.statuses = unchecked_as_untested(statuses, score.capped)
    score.equivalent, score.stale = pinned_equivalents(equivalent, statuses, clone)
    if files == [module.source]:
        return [score]
    return [split(score, module.name, f) for f in files]


def pinned_equivalents(
    equivalent: dict[str, str], statuses: dict[str, str], clone: Path
) -> tuple[dict[str, str], dict[str, str]]:
    """Return (the listed equivalents among ``statuses`` whose pin still matches their
    mutation, ``{name: why}`` for those that no longer name it): see tests/mutation/pins.py."""
    import pins

    listed = [k for k in equivalent if k in statuses]
    moved = pins.stale(listed, pins.load_pins(clone / "tests/mutation/equivalent_pins.toml"),
                       pins.current(listed, clone))  # fmt: skip
    return {k: equivalent[k] for k in listed if k not in moved}, moved


def unchecked_as_untested(statuses: dict[str, str], capped: bool) -> dict[str, str]:
    """Return ``statuses`` with "not checked" read as "no tests" when the time cap did not
    stop the run: mutmut then left them unchecked because no selected test covers them
    ("Stopping early, because we could not find any test case for any mutant"), and a
    file none of whose mutants was run must score 0, never "0 of 0 (100 %)"."""
    if capped:
        return statuses
    return {k: "no tests" if s == "not checked" else s for k, s in statuses.items()}


def split(score: Score, group: str, path: str) -> Score:
    """Return the part of a glob module's Score that belongs to the file ``path``."""
    prefix = dotted(path) + ".x"
    part = Score(f"{group}/{Path(path).name}", capped=score.capped, seconds=score.seconds)
    part.broken = score.broken
    part.statuses = {k: s for k, s in score.statuses.items() if k.startswith(prefix)}
    part.equivalent = {k: w for k, w in score.equivalent.items() if k in part.statuses}
    part.stale = {k: w for k, w in score.stale.items() if k in part.statuses}
    return part


def show_survivors(score: Score, mutmut: str, clone: Path) -> None:
    """Print each unexplained survivor of a mutmut score with its diff (``mutmut show NAME``)."""
    for name in score.survivors:
        shown = subprocess.run(
            [mutmut, "show", name], cwd=clone, capture_output=True, text=True, check=False
        ).stdout
        diff = [
            ln
            for ln in shown.splitlines()
            if ln.startswith(("-", "+")) and ln[:3] not in ("---", "+++")
        ]
        print(f"  survived ({score.statuses[name]}): {name}: {' | '.join(diff)[:300]}")
    for name, why in sorted(score.stale.items()):
        print(
            f"  listed equivalent, scored as any mutant: the name no longer means the"
            f" mutation its reason is for ({why}; tests/mutation/pins.py): {name}"
        )
    for name in (k for k in score.equivalent if score.statuses[k] in KILLED):
        print(f"  listed equivalent but killed (remove it from equivalent.toml): {name}")


def record_entry(score: Score, source: Path, engine: str) -> dict:
    """Return measured.toml's entry for one file's score (its sha256 and today's date)."""
    return {
        "sha256": fingerprint(source),
        "killed": score.killed,
        "total": len(score.counted),
        "equivalent": len(score.equivalent),
        "engine": engine,
        "measured": time.strftime("%Y-%m-%d"),
    }


def goal_of(path: str, measured: dict[str, dict], goal: float) -> float:
    """Return the score (percent) a file must reach: ``goal``, or for a file recorded below
    it, its recorded score (a ratchet: a change may not make a file's tests catch less).
    ``path`` is the file (mutmut's score) or ``own:`` and the file (the own operators')."""
    entry = measured.get(path)
    if not entry or not entry["total"]:
        return goal
    return min(goal, 100.0 * entry["killed"] / entry["total"])


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
    parser.add_argument("--changed-only", action="store_true",
                        help="only the files whose sha256 differs from measured.toml")  # fmt: skip
    parser.add_argument("--record", type=Path,
                        help="write the measured files' sha256 and scores into this toml")  # fmt: skip
    parser.add_argument("--only", metavar="GLOB",
                        help="only the files of the chosen modules that match (e.g. '*/search.py')")  # fmt: skip
    parser.add_argument("--children", type=int, default=1,
                        help="mutants tested at once (more where tests wait on servers, not CPU)")  # fmt: skip
    parser.add_argument("--budget-s", type=int,
                        help="seconds for the whole run; files not reached are listed, not failed")  # fmt: skip
    parser.add_argument("modules", nargs="*", help="module names (default: all of the file)")
    args = parser.parse_args(argv)
    modules = load_modules(args.modules_file)
    unknown = set(args.modules) - {m.name for m in modules}
    if unknown:
        print(f"unknown module(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    chosen = [m for m in modules if not args.modules or m.name in args.modules]
    equivalent = load_equivalent(HERE / "equivalent.toml")
    measured = load_measured(HERE / "measured.toml")
    logs = args.logs or args.clone / "mutation-logs"
    logs.mkdir(parents=True, exist_ok=True)
    scores: list[tuple[Score, float]] = []  # (score, the goal it must reach)
    recorded: dict[str, dict] = {}
    not_yet = 0  # --changed-only: files never measured (listed, not mutated: hours each)
    over_budget: list[str] = []  # --budget-s: changed files the run had no time left for
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    for module in chosen:
        if args.cap:
            module = Module(module.name, module.source, module.tests, module.mutants, args.cap,
                            module.exclude)  # fmt: skip
        files = module.files(args.clone)
        if args.only:
            files = [f for f in files if fnmatch.fnmatch(f, args.only)]
            if not files:
                continue
        if args.changed_only:
            same = [
                f for f in files
                if measured.get(f, {}).get("sha256") == fingerprint(args.clone / f)
            ]  # fmt: skip
            for f in same:
                m = measured[f]
                print(f"{module.name}/{Path(f).name}: unchanged since measured"
                      f" (killed {m['killed']} of {m['total']}, {m['measured']})")  # fmt: skip
            unmeasured = [f for f in files if f not in measured]
            for f in unmeasured:
                print(f"{module.name}/{Path(f).name}: not measured yet (no entry in measured.toml)")
            not_yet += len(unmeasured)
            files = [f for f in files if f not in same and f not in unmeasured]
            if not files:
                continue
        budget_cut = False
        if deadline is not None:
            left = int(deadline - time.monotonic())
            if left <= 0:
                over_budget += files
                continue
            if left < module.cap_s:
                module = Module(module.name, module.source, module.tests, module.mutants, left,
                                module.exclude)  # fmt: skip
                budget_cut = True
        if args.engine in ("own", "both"):
            import own

            for f in files:
                one = Module(module.name if len(files) == 1 and f == module.source
                             else f"{module.name}/{Path(f).name}",
                             f, module.tests, module.mutants, module.cap_s)  # fmt: skip
                mine = own.run_module(one, args.clone, equivalent,
                                      logs / f"{one.name.replace('/', '.')}.own.log", Score)  # fmt: skip
                if budget_cut and mine.capped:
                    over_budget.append(f"own:{f}")
                    continue
                scores.append((mine, goal_of(f"own:{f}", measured, args.goal)))
                print(mine.line(), flush=True)
                for name in mine.survivors:
                    print(f"  survived: {name}"[:300])
                if not (mine.capped or mine.broken):
                    recorded[f"own:{f}"] = record_entry(mine, args.clone / f, "own")
        if args.engine == "own":
            continue
        found = run_module(module, args.clone, args.mutmut, equivalent,
                           logs / f"{module.name}.log", files, args.children)  # fmt: skip
        for f, score in zip(files, found, strict=True):
            if budget_cut and score.capped:
                over_budget.append(f)
                continue
            scores.append((score, goal_of(f, measured, args.goal)))
            print(score.line(), flush=True)
            show_survivors(score, args.mutmut, args.clone)
            if not (score.capped or score.broken):
                recorded[f] = record_entry(score, args.clone / f, "mutmut")
    print()
    for score, goal in scores:
        below = "" if score.percent >= goal else f"  BELOW ITS GOAL ({goal:.1f} %)"
        print(score.line() + below)
    if not_yet:
        print(f"{not_yet} file(s) not measured yet: docs/testing.md lists them")
    for f in over_budget:
        print(f"{f}: changed, not re-measured: the run's budget ({args.budget_s} s) is spent;"
              " record it with --record tests/mutation/measured.toml")  # fmt: skip
    if args.record:
        write_measured(args.record, {**load_measured(args.record), **recorded})
        print(f"recorded {len(recorded)} file(s) in {args.record}")
    return 0 if all(s.percent >= g and not (s.capped or s.broken) for s, g in scores) else 1


if __name__ == "__main__":
    sys.exit(main())
