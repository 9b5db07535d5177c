"""docs/fix.md's closure table: every check ``gpudoctor check --ct`` runs for a CT has a row
saying whether ``fix`` cures its FAILs (with the lab test that proves it) or why not
(issue 32). A new check id without a row fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudoctor.registry import load_catalogue

REPO = Path(__file__).resolve().parents[2]
HEADING = "## Closure: every FAIL about a CT"


def table_rows() -> dict[str, tuple[str, str, str]]:
    """Return ``{check id: (cures, how or why not, proof)}`` from docs/fix.md."""
    text = (REPO / "docs/fix.md").read_text()
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
    return rows


def ct_check_ids() -> list[str]:
    """Return every shipped check id a CT check runs (all but the node's own ``host.*``)."""
    return [s.id for s in load_catalogue(include_plugins=False) if s.scope != "node"]


def test_every_check_about_a_ct_has_a_row() -> None:
    rows = table_rows()
    assert rows, f"no table under {HEADING!r} in docs/fix.md"
    missing = [i for i in ct_check_ids() if i not in rows]
    assert not missing, f"docs/fix.md closure table has no row for {missing}"
    unknown = [i for i in rows if i not in ct_check_ids()]
    assert not unknown, f"rows for checks that do not exist (or are host.*): {unknown}"


@pytest.mark.parametrize("check_id", ct_check_ids())
def test_each_row_is_proved_or_says_why_not(check_id: str) -> None:
    cures, how, proof = table_rows()[check_id]
    assert cures in ("yes", "no", "partly"), (check_id, cures)
    assert len(how) > 20, f"{check_id}: say how fix cures it, or why it cannot"
    tests = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", proof)
    if cures == "no":
        assert not tests, f"{check_id}: a 'no' row cites no cure"
        return
    assert tests, f"{check_id}: a cured row names the test that proves it"
    for path, name in tests:
        source = (REPO / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} does not exist"


def test_a_check_fix_cannot_cure_offers_no_fix_command() -> None:
    """The remedies hold: a check whose row says fix cannot cure it has no ``fix=``
    metadata (gpudoctor list and the docs pages would offer the command)."""
    rows = table_rows()
    offering = [s.id for s in load_catalogue(include_plugins=False)
                if s.id in rows and rows[s.id][0] == "no" and s.fix]  # fmt: skip
    assert not offering, f"fix offered for checks it cannot cure: {offering}"
