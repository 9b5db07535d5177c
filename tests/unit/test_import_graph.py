"""The package imports downwards only: no module imports a package above its own layer,
and no two modules import each other, through any number of steps (no circle).

LAYERS below is the list of docs/architecture.md ("Layers"): the floor of shared types,
hosts, facts, context and registry, the libraries the checks read with (weights, pve),
the checks, the runner, output, then bench, fleet, service and the command line on top.
Inside bench the subpackages are layered too (the floor of shared types, results, load,
engines, plan, launch). A module may import its own layer and the layers below it.

The graph counts lazy (function-level) imports too: they run as surely as top-level ones,
only later. Imports under ``if TYPE_CHECKING:`` are left out (annotations only, never run)
of the layer check; the circle check is run both without and with them (a lower module
should not name a higher one even for its types).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import gpudoctor

PACKAGE = Path(gpudoctor.__file__).parent
# the repo's checks/ (gpudoctor.checks in a checkout, gpudoctor/checks in the wheel)
CATALOGUE = Path(importlib.import_module("gpudoctor.checks").__file__).parent

# Lowest first. A module's layer is that of the longest prefix that names it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the floor: shared types and helpers
    (
        "gpudoctor",  # the package's __init__ (__version__, the catalogue alias)
        "gpudoctor.exit_codes",
        "gpudoctor.errors",
        "gpudoctor.fsio",
        "gpudoctor.fsio_root",  # fsio inside a root (chroot-like)
        "gpudoctor.model",
        "gpudoctor.terminal",
        "gpudoctor.redact",  # secrets and identities out of any text (stdlib only)
        "gpudoctor.credentials",
        "gpudoctor.probes",  # stdlib only: it runs in a CT with nothing installed
        "gpudoctor.early_probe",
    ),
    ("gpudoctor.hosts",),  # the only side-effect layer
    ("gpudoctor.facts",),  # pure parsers over what a Host read
    ("gpudoctor.context", "gpudoctor.registry"),
    # libraries the checks read with: the model check parses weights' manifests and
    # records, the ct check explains with pve's config parser and planner
    ("gpudoctor.weights", "gpudoctor.pve"),
    ("gpudoctor.checks",),  # the catalogue: Findings from what ctx.host reads
    ("gpudoctor.runner",),  # -> Report
    ("gpudoctor.output",),  # Report -> human, JSON, Prometheus
    # the fixer's run (write, restart, then the re-check inside the CT runs the runner),
    # and --follow-driver, which runs the fixer on every CT of a node
    ("gpudoctor.pve.fixer", "gpudoctor.pve.inside", "gpudoctor.pve.follow"),
    # bench, bottom to top
    # the floor of bench: shared types (the plan's model types too: the engines name them)
    (
        "gpudoctor.bench",
        "gpudoctor.bench.cell_spec",
        "gpudoctor.bench.request_record",
        "gpudoctor.bench.plan_model",
    ),
    ("gpudoctor.bench.results",),  # run directory, reader, metrics (pure), report, compare
    ("gpudoctor.bench.load",),  # the load generator (computes with results.metrics)
    ("gpudoctor.bench.engines",),  # the ENGINES table and the adapters
    ("gpudoctor.bench.plan",),  # the parser accepts the names of engines.ENGINES
    ("gpudoctor.bench.launch",),  # the campaign: plan + engines + load + results
    ("gpudoctor.fleet",),
    ("gpudoctor.service",),
    ("gpudoctor.support",),  # the support bundle: gathers through hosts, reads bench runs
    # the command line
    ("gpudoctor.cli",),
    ("gpudoctor.commands",),
    ("gpudoctor.entry", "gpudoctor.__main__"),
)

# Named exceptions: (importer, imported) pairs that point upwards on purpose.
ALLOWED_UPWARD: frozenset[tuple[str, str]] = frozenset(
    {
        # the registry loads the catalogue it validates (load_checks imports the shipped
        # modules by name, lazily); the catalogue imports the registry's @check decorator
        ("gpudoctor.registry", "gpudoctor.checks"),
    }
)


def _module_name(path: Path, root: Path, package: str) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(root: Path, package: str) -> dict[str, Path]:
    """Return every module of the package ``package`` whose folder is ``root`` -> its file."""
    return {_module_name(p, root, package): p for p in root.rglob("*.py")}


def package_modules() -> dict[str, Path]:
    """Return every module of gpudoctor (and its catalogue, gpudoctor.checks) -> its file."""
    modules = modules_under(PACKAGE, "gpudoctor")
    if CATALOGUE.parent != PACKAGE:  # a checkout: checks/ beside gpudoctor/
        modules |= modules_under(CATALOGUE, "gpudoctor.checks")
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, typing_too: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Return the import statements of ``tree``, those under ``if TYPE_CHECKING:`` left out
    unless ``typing_too``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not typing_too:
            for child in node.orelse:  # the else branch does run
                walk(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


def _targets(
    node: ast.Import | ast.ImportFrom, name: str, is_pkg: bool, modules: set[str]
) -> list[str]:
    """Return the absolute module names one import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = name.split(".") if is_pkg else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    # `from gpudoctor import fsio` imports the module gpudoctor.fsio, not only gpudoctor
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
    return subs if len(subs) == len(node.names) else [base, *subs]


def import_graph(
    modules: dict[str, Path] | None = None, typing_too: bool = False
) -> dict[str, set[str]]:
    """Return module -> the package modules it imports (lazy ones too, TYPE_CHECKING ones
    only with ``typing_too``)."""
    modules = modules if modules is not None else package_modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for node in _imports(tree, typing_too):
            for target in _targets(node, name, path.name == "__init__.py", names):
                # importing a.b.c runs a and a.b too; a module's own packages are no edge
                own = _with_parents(name)
                edges |= {t for t in _with_parents(target) if t in names and t not in own}
        graph[name] = edges
    return graph


def _with_parents(target: str) -> list[str]:
    """Return ``a.b.c``'s packages that an import runs: ``a``, ``a.b``, ``a.b.c``."""
    parts = target.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def layer_of(module: str) -> int:
    """Return the index in LAYERS of ``module``'s longest matching prefix (KeyError if none)."""
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise KeyError(module)
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Return "importer -> imported" for every import of a higher layer, not allowed by name."""
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module) and (module, target) not in ALLOWED_UPWARD:
                bad.append(f"{module} -> {target}")
    return bad


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one import cycle as a list of modules, or None (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in package_modules():
        try:
            layer_of(module)
        except KeyError:
            unplaced.append(module)
    assert unplaced == []


def test_no_module_imports_a_layer_above_it() -> None:
    assert upward_imports(import_graph()) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    low = tmp_path / "low.py"
    low.write_text("def f():\n    from gpudoctor.commands import check\n", encoding="utf-8")
    typed = tmp_path / "typed.py"
    typed.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpudoctor.cli import main\n",
        encoding="utf-8",
    )
    via_parent = tmp_path / "parent.py"
    via_parent.write_text("from gpudoctor.bench import launch\n", encoding="utf-8")
    modules = {
        "gpudoctor.fsio": low,
        "gpudoctor.model": typed,
        "gpudoctor.bench.results.metrics": via_parent,
        "gpudoctor.commands.check": low,
        "gpudoctor.cli": low,
        "gpudoctor.bench": low,
        "gpudoctor.bench.launch": low,
    }
    graph = import_graph(modules)
    assert graph["gpudoctor.model"] == set()  # TYPE_CHECKING only
    bad = upward_imports(graph)
    assert "gpudoctor.fsio -> gpudoctor.commands.check" in bad  # a lazy import counts
    assert "gpudoctor.bench.results.metrics -> gpudoctor.bench.launch" in bad
    assert not any(b.startswith("gpudoctor.model ") for b in bad)


def test_graph_sees_a_cycle_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_any_modules() -> None:
    assert find_cycle(import_graph()) is None


def test_no_import_cycle_even_through_type_only_imports() -> None:
    assert find_cycle(import_graph(typing_too=True)) is None


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """Write the package ``pkg`` (name -> source) under ``root``; return its modules."""
    for name, source in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return modules_under(root / "pkg", "pkg")


def test_the_cycle_check_fails_on_a_planted_circle(tmp_path: Path) -> None:
    """A circle of siblings (top-level, relative and lazy imports) is found; the same tree
    with the way back under TYPE_CHECKING has a circle only with typing_too."""
    files = {
        "__init__.py": "",
        "a.py": "from pkg import b\n",
        "b.py": "from .sub import c\n",
        "sub/__init__.py": "",
        "sub/c.py": "def later():\n    from pkg.a import thing\n",  # the lazy way back
        "d.py": "import pkg.a\n",  # reaches the circle, is not on it
    }
    circle = ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    assert find_cycle(import_graph(_tree(tmp_path / "lazy", files))) == circle
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import thing\n"
    modules = _tree(tmp_path / "typed", {**files, "sub/c.py": typed})
    assert find_cycle(import_graph(modules)) is None
    assert find_cycle(import_graph(modules, typing_too=True)) == circle
    cut = _tree(tmp_path / "cut", {**files, "sub/c.py": "def later():\n    pass\n"})
    assert find_cycle(import_graph(cut)) is None


def test_the_plan_modules_import_one_way() -> None:
    graph = import_graph(typing_too=True)
    assert "gpudoctor.bench.plan.parser" in graph["gpudoctor.bench.plan"]
    assert "gpudoctor.bench.plan_model" in graph["gpudoctor.bench.plan.parser"]
    assert "gpudoctor.bench.plan.parser" not in graph["gpudoctor.bench.plan_model"]
    assert "gpudoctor.bench.engines" in graph["gpudoctor.bench.plan.parser"]  # ENGINES
    engines = [m for m in graph if m.startswith("gpudoctor.bench.engines")]
    assert all("gpudoctor.bench.plan" not in graph[m] for m in engines)  # even for types


def test_the_campaign_flows_one_way() -> None:
    """Strategies ask the cell runner; nothing below a strategy imports one (or campaign)."""
    graph = import_graph(typing_too=True)
    launch = "gpudoctor.bench.launch."
    above = {launch + m for m in ("campaign", "dry_run", "serial", "packed", "searching")}
    below = ("cell_runner", "config_sweep", "server_lifecycle", "run_writer", "live_state")
    for module in (launch + m for m in below):
        assert graph[module] & above == set(), module
    for strategy in ("serial", "packed", "searching"):
        assert launch + "campaign" not in graph[launch + strategy]


@pytest.mark.parametrize(
    "order",
    [
        ("gpudoctor.bench.plan", "gpudoctor.bench.plan.parser"),
        ("gpudoctor.bench.plan.parser", "gpudoctor.bench.plan"),
        ("gpudoctor.bench.plan_model", "gpudoctor.bench.plan.parser"),
        ("gpudoctor.bench.engines", "gpudoctor.bench.plan"),
        ("gpudoctor.bench.engines.base", "gpudoctor.bench.plan.parser"),
    ],
)
def test_each_order_imports_in_a_fresh_interpreter(order: tuple[str, str]) -> None:
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in order)
    code += "from gpudoctor.bench.plan import parse_plan\n"
    code += 'print(parse_plan(\'[model]\\npath = "/m"\\n[engine]\\nname = "vllm"\\n\').name)'
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "plan"
