"""Quirk tables: the shipped table, and a local crash quirk recorded and found again."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.bench.plan import load_plan, parse_plan
from gpudoctor.bench.plan.quirks import find_quirk, load_quirks, load_table, record_crash

EXAMPLES = Path(__file__).parents[3] / "docs" / "examples"
SEED = (EXAMPLES / "qwen36-dflash-ddtree.toml").read_text()


def _ddtree(budget: int):
    plan = parse_plan(SEED.replace("[15, 16, 32, 64]", f"[{budget}]"))
    return next(c for c in plan.configs if c.name.startswith("ddtree"))


@pytest.mark.parametrize(("budget", "arch", "hit"), [(8, "sm_120", True), (12, "sm_120", True),
                                                    (16, "sm_120", False), (8, "sm_90", False)])  # fmt: skip
def test_shipped_ddtree_quirk(budget: int, arch: str, hit: bool, local_quirks: Path) -> None:
    quirk = find_quirk(load_quirks(local_quirks), arch, "sglang", "0.5.23", _ddtree(budget))
    assert (quirk is not None) == hit
    if hit:
        assert "SM120" in quirk.reason and quirk.source == "shipped"


def test_local_crash_quirk_round_trip(local_quirks: Path) -> None:
    plan = load_plan(EXAMPLES / "qwen36-dflash-ddtree.toml")
    crashed, other = plan.configs[1], plan.configs[2]
    record_crash(
        local_quirks, "sm_90", "sglang", "0.5.23", crashed, 'server exited with code -6 "abort"'
    )
    record_crash(local_quirks, "sm_90", "sglang", "0.5.23", other, "second")
    table = load_table(local_quirks, str(local_quirks))
    assert [q.id for q in table] == [f"crash-{crashed.key}", f"crash-{other.key}"]
    quirks = load_quirks(local_quirks)
    assert (
        find_quirk(quirks, "sm_90", "sglang", "0.5.23", crashed).reason
        == 'server exited with code -6 "abort"'
    )
    assert find_quirk(quirks, "sm_90", "sglang", "0.5.24", crashed) is None  # another version
    assert find_quirk(quirks, "sm_120", "sglang", "0.5.23", crashed) is None  # another GPU
    assert find_quirk(quirks, "sm_90", "sglang", "0.5.23", plan.configs[0]) is None
