"""Pin each equivalent mutant to the mutation it names, so a renumbering cannot move its reason.

mutmut names a mutant by its function and a counter (``gpudoctor.pve.uvm_unit.x_run__mutmut_110``).
When the function's source changes, the counters shift: the name in equivalent.toml then
names another mutation, and its reason ("the flavor is read by nothing") silently excuses a
survivor it was never written for. tests/mutation/equivalent_pins.toml holds, for every
listed name, the mutation it was shown for (the lines mutmut removes and adds, as
``mutmut show NAME`` prints them). run.py scores a listed mutant as equivalent only while
its pin still matches, and this script checks and writes the pins:

    python tests/mutation/pins.py --check   # exit 1 naming each stale entry and where it went
    python tests/mutation/pins.py --write   # pin the entries not pinned yet; drop pins of
                                            # entries removed (a stale pin is never rewritten)

It needs mutmut (tests/mutation/requirements.txt); it reads the working tree's sources.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PINS = HERE / "equivalent_pins.toml"


def source_of(name: str) -> str:
    """Return the source file (relative to the repository) of a mutmut mutant name."""
    return name.rsplit(".", 1)[0].replace(".", "/") + ".py"  # a mangled function has no dot


def _mutated(path: str, code: str) -> str:
    """Return mutmut's trampolined text of ``code`` (every mutant of the file as a function)."""
    from mutmut import configuration
    from mutmut.mutation.file_mutation import mutate_file_contents

    with tempfile.TemporaryDirectory() as scratch:  # mutmut reads its config from the cwd
        Path(scratch, "setup.cfg").write_text("[mutmut]\nsource_paths = gpudoctor\n")
        Path(scratch, "gpudoctor").mkdir()
        before = os.getcwd()
        os.chdir(scratch)
        try:
            configuration.reset_config()
            return mutate_file_contents(path, code).code
        finally:
            os.chdir(before)
            configuration.reset_config()


def mutations(path: str, code: str) -> dict[str, str]:
    """Return ``{mutant name: its mutation}`` for one file's ``code``: each mutation is the
    function's lines mutmut removes (``-``) and adds (``+``), stripped, one per line."""
    module = path.removesuffix(".py").replace("/", ".")
    functions: dict[str, str] = {}
    for node in ast.walk(ast.parse(_mutated(path, code))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            name, node.name = node.name, "f"
            functions[name] = ast.unparse(node)
    found = {}
    for name, text in functions.items():
        original = functions.get(name.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
        if name.endswith("__mutmut_orig") or original is None:
            continue
        changed = difflib.unified_diff(original.splitlines(), text.splitlines(), lineterm="", n=0)
        found[f"{module}.{name}"] = "\n".join(
            ln[0] + ln[1:].strip()
            for ln in changed
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
        )
    return found


def current(names: Iterable[str], root: Path = REPO) -> dict[str, str]:
    """Return the current mutations of every file ``names`` (mutant names) lie in."""
    found: dict[str, str] = {}
    for path in sorted({source_of(n) for n in names}):
        if (root / path).is_file():
            found.update(mutations(path, (root / path).read_text()))
    return found


def load_pins(path: Path = PINS) -> dict[str, str]:
    """Return ``{mutant name: the mutation it was shown equivalent for}``."""
    return tomllib.loads(path.read_text()) if path.exists() else {}


def stale(listed: Iterable[str], pins: dict[str, str], now: dict[str, str]) -> dict[str, str]:
    """Return ``{name: why}`` for each listed name that no longer names its pinned mutation
    (unpinned, gone, or renumbered; the why names the mutant that now has it, if one does)."""
    out = {}
    for name in listed:
        if name not in pins:
            out[name] = "not pinned (python tests/mutation/pins.py --write)"
        elif now.get(name) != pins[name]:
            function = name.rsplit("__mutmut_", 1)[0] + "__mutmut_"
            moved = [n for n, m in now.items() if m == pins[name] and n.startswith(function)]
            out[name] = (f"its mutation is now {', '.join(moved)}" if moved
                         else "its mutation is gone (the code changed)")  # fmt: skip
    return out


def write_pins(pins: dict[str, str], path: Path = PINS) -> None:
    """Write ``pins`` as TOML, one ``"name" = "mutation"`` per line, sorted."""
    head = "# Written by tests/mutation/pins.py --write: the mutation each equivalent.toml name means.\n"
    lines = [f"{json.dumps(k, ensure_ascii=False)} = {json.dumps(v, ensure_ascii=False)}"
             for k, v in sorted(pins.items())]  # fmt: skip
    path.write_text(head + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Check (exit 1 on a stale entry) or write the pins of equivalent.toml's mutmut names."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="pin the entries not pinned yet")
    parser.add_argument("--check", action="store_true", help="fail on a stale entry")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from run import load_equivalent

    listed = [n for n in load_equivalent(HERE / "equivalent.toml") if not n.startswith("own:")]
    pins, now = load_pins(), current(listed)
    bad = stale(listed, pins, now)
    if args.write:
        kept = {n: pins[n] for n in listed if n in pins}
        fresh = {n: now[n] for n in listed if n not in pins and n in now}
        write_pins({**kept, **fresh})
        print(f"pinned {len(fresh)} new entr{'y' if len(fresh) == 1 else 'ies'}; {PINS}")
        bad = {n: why for n, why in bad.items() if n not in fresh}
    for name, why in sorted(bad.items()):
        print(f"equivalent.toml: {name}: {why}")
    print(f"{len(listed)} entries, {len(bad)} stale")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
