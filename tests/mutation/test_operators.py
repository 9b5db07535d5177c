"""Each of gpudoctor's own mutation operators (tests/mutation/operators.py) on a tiny
source: the exact rewrite it makes, and what it leaves alone."""

from __future__ import annotations

import ast

from tests.mutation.operators import mutants


def only(source: str, operator: str) -> list[str]:
    """Return the mutated sources of ``operator``, each checked to parse."""
    found = [m.source for m in mutants(source) if m.operator == operator]
    for text in found:
        ast.parse(text)
    return found


def test_sort_key_swaps_a_key_functions_tuple_and_both_sides_of_a_rank_comparison() -> None:
    src = (
        "def best(xs):\n"
        "    def score(x):\n"
        "        return (min(x), sum(x))\n"
        "    return max(xs, key=score)\n"
        "def order(xs):\n"
        "    return sorted(xs, key=lambda r: (r.tp, r.name))\n"
        "def better(new, old):\n"
        "    rank = (new.status, new.at)\n"
        "    return rank > (old.status, old.at)\n"
        "def plain():\n"
        "    return (1, 2)\n"
    )
    assert only(src, "sort_key") == [
        src.replace("(min(x), sum(x))", "(sum(x), min(x))"),
        src.replace("(r.tp, r.name)", "(r.name, r.tp)"),
        src.replace("(new.status, new.at)", "(new.at, new.status)").replace(
            "(old.status, old.at)", "(old.at, old.status)"
        ),
    ]  # a tuple that ranks nothing (plain) is left alone


def test_boundary_flips_the_strictness_of_one_comparison() -> None:
    src = "def f(a, g, n, m):\n    return a >= g, n < 3, m > 0, n <= m\n"
    assert only(src, "boundary") == [
        src.replace("a >= g", "a > g"),
        src.replace("n < 3", "n <= 3"),
        src.replace("m > 0", "m >= 0"),
        src.replace("n <= m", "n < m"),
    ]
    assert only("ok = a == b\nboth = 1 < x < 3\n", "boundary") == []


def test_drop_release_removes_a_statement_that_gives_a_resource_back() -> None:
    src = (
        "def use(pool, fd, lock):\n"
        "    gpus = pool.take(2)\n"
        "    pool.give_back(gpus)\n"
        "    os.close(fd)\n"
        "    lock.release()\n"
    )
    assert only(src, "drop_release") == [
        src.replace("pool.give_back(gpus)", "pass"),
        src.replace("os.close(fd)", "pass"),
        src.replace("lock.release()", "pass"),
    ]  # taking is not releasing


def test_durable_order_moves_a_durable_write_after_the_next_one() -> None:
    src = (
        "def drop(self, gone, kept):\n"
        "    self._append_lines(self.saved, gone)\n"
        "    text = ''.join(kept)\n"
        "    write_atomic(self.results, text)\n"
        "    log('done')\n"
    )
    (mutant,) = only(src, "durable_order")
    assert mutant == (
        "def drop(self, gone, kept):\n"
        "    text = ''.join(kept)\n"
        "    write_atomic(self.results, text)\n"
        "    self._append_lines(self.saved, gone)\n"
        "    log('done')\n"
    )
    assert only("def f(p):\n    if p: p.write_text('a')\n    p.unlink()\n", "durable_order") == []


def test_text_bytes_swaps_characters_and_utf8_bytes() -> None:
    src = "def size(text, items):\n    a = len(text.encode('utf-8'))\n    b = len(text)\n    return a + b + len(items)\n"
    assert only(src, "text_bytes") == [
        src.replace("len(text.encode('utf-8'))", "len(text)"),
        src.replace("b = len(text)", "b = len(text.encode())"),
    ]  # len(items): not text, left alone


def test_non_ascii_source_is_spliced_at_the_right_bytes() -> None:
    src = "# é ü\ndef f(x):\n    return 'ü' if x >= 1 else 'é'\n"
    assert only(src, "boundary") == [src.replace("x >= 1", "x > 1")]


def test_functions_limit_the_mutants_to_those_functions() -> None:
    src = "def a(x):\n    return x > 1\nclass C:\n    def b(self, x):\n        return x > 2\n"
    assert [m.function for m in mutants(src, {"C.b"})] == ["C.b"]
    assert [m.function for m in mutants(src)] == ["a", "C.b"]


def test_mutmut_patterns_name_the_functions_own_operators_mutate() -> None:
    from tests.mutation.own import functions_of

    assert functions_of(()) is None
    assert functions_of(("gpudoctor.fsio.x_kind_of__mutmut_*",
                         "gpudoctor.pve.config.xǁConfigǁmake_line__mutmut_*")) == {
        "kind_of", "Config.make_line"}  # fmt: skip
