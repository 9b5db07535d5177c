"""The plan modules import one way (plan -> plan_toml -> plan_model): no import cycle.

A cycle between plan.py and plan_toml.py worked only because one side imported lazily;
importing plan_toml first, or a new top-level import, would hit a partly initialised
module. The graph below counts lazy (function-level) imports too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gpudoctor.bench

BENCH = Path(gpudoctor.bench.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(BENCH.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Return gpudoctor.bench's module -> imported gpudoctor.bench modules (lazy ones too)."""
    modules = {_module_name(p): p for p in BENCH.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


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


def test_graph_sees_a_cycle_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_plan_modules_import_one_way() -> None:
    graph = import_graph()
    assert "gpudoctor.bench.plan_toml" in graph["gpudoctor.bench.plan"]
    assert "gpudoctor.bench.plan" not in graph["gpudoctor.bench.plan_toml"]
    assert "gpudoctor.bench.plan_toml" not in graph["gpudoctor.bench.plan_model"]
    plan_modules = {k: v for k, v in graph.items() if k.startswith("gpudoctor.bench.plan")}
    assert find_cycle(plan_modules) is None


def test_no_import_cycle_in_bench() -> None:
    assert find_cycle(import_graph()) is None


@pytest.mark.parametrize(
    "order",
    [
        ("gpudoctor.bench.plan", "gpudoctor.bench.plan_toml"),
        ("gpudoctor.bench.plan_toml", "gpudoctor.bench.plan"),
        ("gpudoctor.bench.plan_model", "gpudoctor.bench.plan_toml"),
    ],
)
def test_each_order_imports_in_a_fresh_interpreter(order: tuple[str, str]) -> None:
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in order)
    code += "from gpudoctor.bench.plan import parse_plan\n"
    code += 'print(parse_plan(\'[model]\\npath = "/m"\\n[engine]\\nname = "vllm"\\n\').name)'
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "plan"
