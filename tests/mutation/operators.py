"""gpudoctor's own mutation operators: the kinds of bug a developer really writes that
mutmut's operators (one token at a time) do not make. Pure: a module's source in, its
mutants out (each the whole mutated source, spliced at the mutated node so the rest of the
file keeps its bytes). tests/mutation/own.py runs them; tests/mutation/test_operators.py
shows each rewrite on a tiny source.

- ``sort_key``: swap the first two elements of a tuple that ranks things (the body of a
  ``key=`` lambda, what a function passed as ``key=`` returns, or both sides of an ordering
  comparison of tuples such as ``(status, time) > (old_status, old_time)``);
- ``boundary``: ``>=`` <-> ``>`` and ``<=`` <-> ``<`` in a comparison with one operator;
- ``drop_release``: drop a statement that gives a resource back (``close``, ``release``,
  ``unlink``, ``give_back``, ``rmtree``, ``kill``, ...);
- ``durable_order``: move a statement that writes durable state (a file write, append,
  rename, fsync, unlink) to just after the next one in its block;
- ``text_bytes``: ``len(x.encode(...))`` <-> ``len(x)`` (characters instead of bytes).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

OPERATORS = ("sort_key", "boundary", "drop_release", "durable_order", "text_bytes")

RELEASES = {"close", "release", "unlink", "give_back", "rmtree", "rmdir", "kill", "terminate",
            "shutdown", "cancel", "discard", "cleanup", "unregister"}  # fmt: skip
DURABLE = {"write_atomic", "atomic_replace", "durable_append", "_append_lines", "write_text", "write_bytes", "write", "rename", "replace", "fsync", "_fsync",
           "fsync_dir", "unlink", "rmtree", "truncate", "write_output", "write_manifest",
           "append_preflight", "write_run_json", "copytree", "move", "symlink", "link",
           "mkdir", "makedirs"}  # fmt: skip
TEXTUAL = re.compile(r"(text|line|msg|message|body|title|label|word|name|value|data|^s)$")
_FLIP = {ast.GtE: ast.Gt, ast.Gt: ast.GtE, ast.LtE: ast.Lt, ast.Lt: ast.LtE}
_ORDER = (ast.Gt, ast.GtE, ast.Lt, ast.LtE)


@dataclass(frozen=True)
class Mutant:
    """One mutant: which operator, in which function, at which line, what changed."""

    operator: str
    function: str  # ``Class.method``, ``function``, or ``<module>``
    line: int
    col: int
    description: str
    source: str

    @property
    def name(self) -> str:
        """Return a name stable while the function's mutated line text does not change."""
        return f"{self.function}:{self.operator}:{self.description}"


class _Source:
    """The source text with (line, col) -> offset, for splicing replacements."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0]
        for line in text.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line.encode()))
        self.raw = text.encode()

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col  # ast columns are UTF-8 byte offsets

    def splice(self, edits: list[tuple[ast.AST, str]]) -> str:
        """Return the text with each node's segment replaced (edits must not overlap)."""
        out = self.raw
        spans = [(self.offset(n.lineno, n.col_offset), self.offset(n.end_lineno, n.end_col_offset), new)
                 for n, new in edits]  # fmt: skip
        for start, end, new in sorted(spans, reverse=True):
            out = out[:start] + new.encode() + out[end:]
        return out.decode()

    def segment(self, node: ast.AST) -> str:
        start = self.offset(node.lineno, node.col_offset)
        return self.raw[start : self.offset(node.end_lineno, node.end_col_offset)].decode()

    def lines(self, first: int, last: int) -> str:
        return self.raw[self.starts[first - 1] : self.starts[last]].decode()


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Yield (qualified name, node) of every function, and ``<module>`` for the module."""
    yield "<module>", tree

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield name, child
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def _own_nodes(func: ast.AST) -> Iterator[ast.AST]:
    """Yield the nodes of ``func`` that are not inside a nested function or class."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _call_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return ""


def _swapped(src: _Source, tup: ast.Tuple) -> str:
    parts = [src.segment(e) for e in tup.elts]
    parts[0], parts[1] = parts[1], parts[0]
    return "(" + ", ".join(parts) + ")"


def _rank_tuples(tree: ast.Module, funcs: dict[str, ast.AST]) -> Iterator[list[ast.Tuple]]:
    """Yield each group of tuples that rank together (one mutant swaps them all)."""
    key_funcs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "key" and isinstance(kw.value, ast.Lambda):
                    if isinstance(kw.value.body, ast.Tuple) and len(kw.value.body.elts) > 1:
                        yield [kw.value.body]
                elif kw.arg == "key" and isinstance(kw.value, ast.Name):
                    key_funcs.add(kw.value.id)
    for qual, func in funcs.items():
        if qual.rsplit(".", 1)[-1] in key_funcs:
            returned = [n.value for n in _own_nodes(func) if isinstance(n, ast.Return)]
            tuples = [t for t in returned if isinstance(t, ast.Tuple) and len(t.elts) > 1]
            if tuples:
                yield tuples
        assigned: dict[str, list[ast.AST]] = {}
        for node in _own_nodes(func):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
        for node in _own_nodes(func):
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
                continue
            if not isinstance(node.ops[0], _ORDER):
                continue
            sides = []
            for side in (node.left, node.comparators[0]):
                if isinstance(side, ast.Name) and len(assigned.get(side.id, [])) == 1:
                    side = assigned[side.id][0]
                sides.append(side)
            tuples = [s for s in sides if isinstance(s, ast.Tuple) and len(s.elts) > 1]
            if len(tuples) == 2 and len(tuples[0].elts) == len(tuples[1].elts):
                yield tuples


def mutants(text: str, functions: set[str] | None = None) -> list[Mutant]:
    """Return every mutant of ``text`` by :data:`OPERATORS`, in source order; only those in
    ``functions`` (qualified names, ``Class.method``) when given."""
    tree = ast.parse(text)
    src = _Source(text)
    funcs = dict(_functions(tree))
    owner: dict[int, str] = {}
    for qual, func in funcs.items():
        for node in _own_nodes(func):
            owner[id(node)] = qual
    found: list[Mutant] = []

    def add(op: str, node: ast.AST, what: str, new: str) -> None:
        qual = owner.get(id(node), "<module>")
        if functions is None or qual in functions:
            found.append(
                Mutant(op, qual, node.lineno, node.col_offset, " ".join(what.split()), new)
            )

    for group in _rank_tuples(tree, funcs):
        what = " & ".join(src.segment(t) for t in group)
        add("sort_key", group[0], what, src.splice([(t, _swapped(src, t)) for t in group]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            flipped = ast.Compare(node.left, [_FLIP[type(node.ops[0])]()], node.comparators)
            add("boundary", node, src.segment(node), src.splice([(node, ast.unparse(flipped))]))
        if _call_name(node) == "len" and len(node.args) == 1 and not node.keywords:
            arg = node.args[0]
            if _call_name(arg) == "encode" and isinstance(arg.func, ast.Attribute):
                new = f"len({src.segment(arg.func.value)})"
                add("text_bytes", node, src.segment(node), src.splice([(node, new)]))
            elif isinstance(arg, (ast.Name, ast.Attribute)):
                last = arg.id if isinstance(arg, ast.Name) else arg.attr
                if TEXTUAL.search(last):
                    new = f"len({src.segment(arg)}.encode())"
                    add("text_bytes", node, src.segment(node), src.splice([(node, new)]))
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                continue
            _block_mutants(src, block, add)
    found.sort(key=lambda m: (m.line, m.col, m.operator, m.description))
    return found


def _own_lines(src: _Source, stmt: ast.stmt) -> bool:
    """Return True when ``stmt`` starts its line (nothing but indentation before it)."""
    before = src.raw[src.starts[stmt.lineno - 1] : src.offset(stmt.lineno, stmt.col_offset)]
    return not before.strip()


def _block_mutants(src: _Source, block: list[ast.stmt], add) -> None:
    """Add the drop_release and durable_order mutants of one statement block."""
    durable = [
        i for i, s in enumerate(block)
        if isinstance(s, ast.Expr) and _call_name(s.value) in DURABLE and _own_lines(src, s)
    ]  # fmt: skip
    for stmt in block:
        if isinstance(stmt, ast.Expr) and _call_name(stmt.value) in RELEASES:
            new = src.splice([(stmt, "pass")])
            add("drop_release", stmt, src.segment(stmt), new)
    for a, b in itertools.pairwise(durable):
        first, second = block[a], block[b]
        moved = src.lines(first.lineno, first.end_lineno)
        between = src.lines(first.end_lineno + 1, second.end_lineno)
        head = src.raw[: src.starts[first.lineno - 1]].decode()
        tail = src.raw[src.starts[second.end_lineno] :].decode()
        what = f"{src.segment(first)} after {src.segment(second)}"
        add("durable_order", first, what, head + between + moved + tail)
