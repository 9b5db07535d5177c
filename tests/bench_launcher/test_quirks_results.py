"""Quirk tables, the run directory (exactly-once records), and context clamping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.launch.campaign import clamp_workload
from gpudoctor.bench.plan import Limits, load_plan, parse_plan
from gpudoctor.bench.plan.quirks import find_quirk, load_quirks, load_table, record_crash
from gpudoctor.bench.results.run_dir import RunDir, RunDirError, read_records, scan_records

EXAMPLES = Path(__file__).parents[2] / "docs" / "examples"
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


PLAN_A = '[model]\npath = "/m"\n[engine]\nname = "vllm"\n[axes]\nconcurrency = [1, 2]\n'


def test_rundir_repairs_a_torn_tail_and_resumes(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
        assert not opened.resumed and (tmp_path / "plan.toml").read_text() == PLAN_A
        rd.append({"key": "k1", "status": "ok"})
        rd.append({"key": "k2", "status": "crashed"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k3", "sta')  # the launcher was killed mid-write
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
        assert set(opened.done) == {"k1", "k2"} and opened.dropped_bytes == 18
        rd.append({"key": "k3", "status": "ok"})
    records, dropped = read_records(tmp_path / "results.jsonl")
    assert [r["key"] for r in records] == ["k1", "k2", "k3"] and dropped == 0


def test_rundir_plan_changes_and_archives(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k1", "status": "ok"})
    with RunDir(tmp_path) as rd, pytest.raises(RunDirError, match="holds a different plan"):
        rd.open(PLAN_A + "# changed\n", None)
    with RunDir(tmp_path) as rd:
        assert set(rd.open(PLAN_A + "# changed\n", True).done) == {"k1"}
    assert next(iter(tmp_path.glob("plan-before-*.toml"))).read_text() == PLAN_A
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, False)
        assert opened.done == {} and opened.archived
    assert json.loads((Path(opened.archived) / "results.jsonl").read_text())["key"] == "k1"


def test_rundir_is_exclusive_and_drops_retried_records(tmp_path: Path) -> None:
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        with pytest.raises(RunDirError, match="another gpudoctor bench"), RunDir(tmp_path):
            pass
        for key, status in (("a", "ok"), ("b", "crashed"), ("c", "ok")):
            rd.append({"key": key, "status": status})
        assert rd.drop_records({"b"}) == 1
    assert [r["key"] for r in read_records(tmp_path / "results.jsonl")[0]] == ["a", "c"]
    assert json.loads((tmp_path / "superseded.jsonl").read_text())["key"] == "b"


@pytest.mark.parametrize(
    ("input_len", "output_len", "max_ctx", "expect_input", "clamped"),
    [(1000, 100, 2048, 1000, False), (3000, 100, 2048, 1916, True), (30000, 512, 30720, 30000, False),
     (32000, 512, 30720, 30176, True), (100, 2030, 2048, None, False), (100, 10, None, 100, False)],
)  # fmt: skip
def test_clamp(input_len: int, output_len: int, max_ctx, expect_input, clamped: bool) -> None:
    w = WorkloadSpec(input_len=input_len, output_len=output_len)
    fitted, facts = clamp_workload(w, max_ctx, Limits(template_overhead=32, min_input_len=16))
    if expect_input is None:
        assert fitted is None and "leaves" in facts["note"]
        return
    assert fitted.input_len == expect_input and facts["clamped"] is clamped
    assert facts["requested_input_len"] == input_len
    if max_ctx:
        assert fitted.input_len + output_len + 32 <= max_ctx


def test_rundir_keeps_the_records_after_a_corrupt_middle_line(tmp_path: Path) -> None:
    """Fault: a corrupt line in the middle of results.jsonl (disk error, a torn write
    followed by a later launch's appends) used to be taken for the torn tail: open()
    truncated the file there, losing every finished cell after it."""
    with RunDir(tmp_path) as rd:
        rd.open(PLAN_A, None)
        rd.append({"key": "k1", "status": "ok"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k2", "sta\n')  # torn, then a later launch appended after it
    with RunDir(tmp_path) as rd:
        rd.append({"key": "k3", "status": "ok"})
        rd.append({"key": "k4", "status": "crashed"})
    with open(tmp_path / "results.jsonl", "ab") as fh:
        fh.write(b'{"key": "k5"')  # and a torn tail
    with RunDir(tmp_path) as rd:
        opened = rd.open(PLAN_A, None)
    assert set(opened.done) == {"k1", "k3", "k4"}
    assert opened.corrupt_lines == (2,) and opened.dropped_bytes == 12
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[3])["key"] == "k4"  # nothing after line 2 cut
    scan = scan_records(tmp_path / "results.jsonl")
    assert [r["key"] for r in scan.records] == ["k1", "k3", "k4"] and scan.corrupt_lines == (2,)
