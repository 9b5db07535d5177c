"""A ``[search]`` in one launch, in-process and fast: the probes it measures and in which
order, its one result line in results.jsonl, what a resume replays instead of measuring
again, and what it records when its server does not start, crashes, or a quirk skips it.

The launcher's real parts (run directory, writer, cell runner, server lifecycle) in this
process (tests/bench/launch/inproc_launch.py); the server is a real loopback HTTP server
(a thread here, or ``python -m http.server`` the launcher starts); the load generator is
:class:`ScriptedLoad` (a server of known capacity)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.launch.searching import SearchRun, replay, search_key
from gpudoctor.bench.launch.steps import Decision
from gpudoctor.bench.plan import Plan
from tests.bench.launch.inproc_launch import (
    Launch,
    ScriptedLoad,
    ServedDir,
    http_server_engine,
    load,
    plan_text,
    served_dir,
)

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
SEARCH = '[search]\nover = "request_rate"\nslo = { ttft_ms = 500 }\ngoodput = 0.9\nlow = 1\nhigh = 9\ntolerance = 1\n'  # fmt: skip


@pytest.fixture
def url(tmp_path: Path) -> Any:
    """A server the user started (answers /health and /v1/models), on loopback."""
    with ServedDir(served_dir(tmp_path / "served")) as address:
        yield address


def _plan(tmp_path: Path, url: str, search: str = SEARCH, **kw: str) -> Plan:
    return load(tmp_path, plan_text(tmp_path, f'server_url = "{url}"\n', extra=search, **kw))


def _search(launch: Launch, plan: Plan, decisions: list | None = None) -> SearchRun:
    run = SearchRun(plan, launch.servers, launch.runner)
    bisection = run.pending(plan.configs[0], decisions or [])
    if bisection is not None:
        run.run(plan.configs[0], [], bisection)
    return run


def _line(launch: Launch) -> dict[str, Any]:
    (line,) = [r for r in launch.records() if r.get("record") == "search"]
    return line


def test_a_search_bisects_to_the_highest_load_that_meets_the_slo(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url)
    load_gen = ScriptedLoad(capacity=4.2)
    launch = Launch(plan, tmp_path / "run", load_gen)
    _search(launch, plan)
    launch.close()

    assert load_gen.loads == [1.0, 9.0, 5.0, 3.0, 4.0]  # low, high, then midpoints
    probes = [r for r in launch.records() if r.get("search") == "request_rate"]
    assert [r["request_rate"] for r in probes] == load_gen.loads
    assert all(r["concurrency"] == 4 and r["status"] == "ok" for r in probes)
    line = _line(launch)
    config = plan.configs[0]
    assert line.pop("recorded_at") and STAMP.fullmatch(_line(launch)["recorded_at"])
    search = line.pop("search")
    assert line == {"key": search_key(plan, config), "record": "search", "config": "a",
                    "tp": 1, "label": "a@tp1", "config_key": config.key, "status": "done",
                    "reason": "", "plan": "inproc"}  # fmt: skip
    assert search == {
        "over": "request_rate", "slo": {"ttft_ms": 500.0, "tpot_ms": None, "e2el_ms": None},
        "goodput": 0.9, "low": 1.0, "high": 9.0, "tolerance": 1.0, "concurrency": 4,
        "met": 4.0, "failed": 5.0,
        "probes": [{"load": r["request_rate"], "passed": r["measurement"]["metrics"]
                    ["slo_attainment"] == 1.0, "key": r["key"]} for r in probes],
    }  # fmt: skip
    assert [p["passed"] for p in search["probes"]] == [True, False, False, True, True]
    assert launch.said().endswith(
        "bench: a@tp1: search over request_rate: met 4, first failing 5 (5 probes, done)\n"
    )


def test_a_finished_search_is_never_run_again(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url)
    first = Launch(plan, tmp_path / "run", ScriptedLoad(capacity=4.2))
    _search(first, plan)
    first.close()
    again = ScriptedLoad(capacity=4.2)
    second = Launch(plan, tmp_path / "run", again, done=first.writer.done)
    assert SearchRun(plan, second.servers, second.runner).pending(plan.configs[0], []) is None
    second.close()
    assert again.loads == [] and len(second.records()) == 6  # nothing measured, nothing added
    assert second.servers_lines() == first.servers_lines()  # no server attached again


def test_a_resumed_search_measures_only_the_probes_it_lacks(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url)
    whole = Launch(plan, tmp_path / "whole", ScriptedLoad(capacity=4.2))
    _search(whole, plan)
    whole.close()
    first_three = {r["key"]: r for r in whole.records()[:3]}  # killed after the third probe

    resumed_gen = ScriptedLoad(capacity=4.2)
    resumed = Launch(plan, tmp_path / "resumed", resumed_gen, done=first_three)
    _search(resumed, plan)
    resumed.close()

    assert resumed_gen.loads == [3.0, 4.0]
    assert _line(resumed)["search"] == _line(whole)["search"]


def test_a_search_whose_probes_are_all_recorded_writes_its_line_without_a_server(
    tmp_path: Path, url: str
) -> None:
    plan = _plan(tmp_path, url)
    whole = Launch(plan, tmp_path / "whole", ScriptedLoad(capacity=4.2))
    _search(whole, plan)
    whole.close()
    probes = {r["key"]: r for r in whole.records() if r.get("record") != "search"}

    again = ScriptedLoad(capacity=4.2)
    resumed = Launch(plan, tmp_path / "resumed", again, done=probes)
    run = SearchRun(plan, resumed.servers, resumed.runner)
    assert run.pending(plan.configs[0], []) is None
    resumed.close()
    assert again.loads == [] and resumed.servers_lines() == []
    assert _line(resumed)["search"] == _line(whole)["search"]
    assert replay(plan, plan.configs[0], probes)[1] is False
    assert replay(plan, plan.configs[0], {})[1] is True


def test_a_probe_whose_requests_all_failed_does_not_meet_the_slo(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url)
    load_gen = ScriptedLoad(capacity=100, fail_at=frozenset({9.0, 5.0}))
    launch = Launch(plan, tmp_path / "run", load_gen)
    _search(launch, plan)
    launch.close()
    search = _line(launch)["search"]
    assert load_gen.loads == [1.0, 9.0, 5.0, 3.0, 4.0]
    assert (search["met"], search["failed"], _line(launch)["status"]) == (4.0, 5.0, "done")


def test_a_probe_recorded_as_crashed_ends_the_search_as_crashed(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url)
    whole = Launch(plan, tmp_path / "whole", ScriptedLoad(capacity=4.2))
    _search(whole, plan)
    whole.close()
    records = whole.records()
    done = {r["key"]: r for r in records[:1]}
    done[records[1]["key"]] = {**records[1], "status": "crashed"}  # high: its server died

    load_gen = ScriptedLoad(capacity=4.2)
    resumed = Launch(plan, tmp_path / "resumed", load_gen, done=done)
    assert SearchRun(plan, resumed.servers, resumed.runner).pending(plan.configs[0], []) is None
    resumed.close()
    line = _line(resumed)
    assert load_gen.loads == []
    assert (line["status"], line["reason"]) == (
        "crashed", "a probe was not measured (crashed or skipped)",
    )  # fmt: skip
    assert [(p["load"], p["passed"]) for p in line["search"]["probes"]] == [(1, True), (9, None)]
    assert resumed.said().endswith(
        "search over request_rate: met 1, first failing none (2 probes, crashed)\n"
    )


def test_nothing_meets_the_slo_says_none_met(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url)
    launch = Launch(plan, tmp_path / "run", ScriptedLoad(capacity=0.5))
    _search(launch, plan)
    launch.close()
    search = _line(launch)["search"]
    assert (search["met"], search["failed"]) == (None, 1.0)
    assert launch.said().endswith("met none, first failing 1 (1 probes, done)\n")


def test_a_configuration_skipped_by_a_quirk_records_its_search_as_skipped(
    tmp_path: Path, url: str
) -> None:
    plan = _plan(tmp_path, url, concurrency="[2, 4]")
    cells = [plan.probe(plan.configs[0], v) for v in (1, 2)]
    decisions = [Decision(cells[0], "run", "first"), Decision(cells[1], "skip", "quirk q1"),
                 Decision(cells[1], "skip", "quirk q2")]  # fmt: skip
    load_gen = ScriptedLoad(capacity=4.2)
    launch = Launch(plan, tmp_path / "run", load_gen)
    run = SearchRun(plan, launch.servers, launch.runner)
    assert run.pending(plan.configs[0], decisions) is None
    launch.close()
    line = _line(launch)
    assert (line["status"], line["reason"]) == ("skipped", "quirk q1")
    assert line["search"]["probes"] == [] and line["search"]["met"] is None
    assert load_gen.loads == [] and launch.servers_lines() == []


def test_a_concurrency_search_reuses_the_sweeps_cells_and_uses_the_plans_slo(
    tmp_path: Path, url: str
) -> None:
    search = '[slo]\ne2el_ms = 900\n[search]\nover = "concurrency"\nlow = 1\nhigh = 8\n'
    plan = _plan(tmp_path, url, search, concurrency="[1, 8]")
    config = plan.configs[0]
    load_gen = ScriptedLoad(capacity=3, over="concurrency")
    launch = Launch(plan, tmp_path / "run", load_gen)
    run = SearchRun(plan, launch.servers, launch.runner)
    bisection = run.pending(config, [])
    assert bisection is not None
    run.run(config, list(plan.cells()), bisection)
    launch.close()
    assert load_gen.loads == [1.0, 8.0, 4.0, 2.0, 3.0]  # 1 and 8 measured once, by the sweep
    search = _line(launch)["search"]
    assert search["slo"] == {"ttft_ms": None, "tpot_ms": None, "e2el_ms": 900.0}
    assert (search["concurrency"], search["met"], search["failed"]) == (None, 3.0, 4.0)


def test_finish_without_a_search_writes_nothing(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url, "")
    launch = Launch(plan, tmp_path / "run", ScriptedLoad(capacity=1))
    run = SearchRun(plan, launch.servers, launch.runner)
    assert run.pending(plan.configs[0], []) is None
    run.finish(plan.configs[0], None, "done")  # type: ignore[arg-type]
    launch.close()
    assert launch.records() == []


def test_the_search_key_names_what_the_search_measured(tmp_path: Path) -> None:
    """A results.jsonl written today is recognised by a later launch (the key is stable),
    and a search of another SLO, workload, load or configuration is another search."""
    base = plan_text(Path("/models/tiny"), 'command = ["srv", "{port}"]\n',
                     concurrency="[2, 8]", extra=SEARCH)  # fmt: skip
    plan = load(tmp_path, base)
    key = search_key(plan, plan.configs[0])
    assert key == "search-3de32f7fc6cbc61e", key  # the config key names the program (45.2)
    changed = [base.replace("goodput = 0.9", "goodput = 0.8"),
               base.replace("input_len = 16", "input_len = 17"),
               base.replace("[2, 8]", "[2, 16]"),
               base.replace('name = "a"', 'name = "a"\nargs = { x = 1 }')]  # fmt: skip
    keys = {search_key(p, p.configs[0]) for p in (load(tmp_path, t) for t in changed)}
    assert len(keys | {key}) == 5


def test_a_concurrency_search_key_names_the_first_request_rate(tmp_path: Path) -> None:
    text = plan_text(Path("/models/tiny"), 'server_url = "http://127.0.0.1:1"\n',
                     concurrency="[2, 8]",
                     extra='[slo]\nttft_ms = 1\n[search]\nover = "concurrency"\nlow = 1\nhigh = 8\n')  # fmt: skip
    rates = text.replace("[axes]\n", "[axes]\nrequest_rate = [1, 2]\n")
    other = text.replace("[axes]\n", "[axes]\nrequest_rate = [1, 3]\n")
    plans = [load(tmp_path, t) for t in (rates, other)]
    assert search_key(plans[0], plans[0].configs[0]) == search_key(plans[1], plans[1].configs[0])


def test_a_server_that_does_not_start_records_the_search_as_crashed(tmp_path: Path) -> None:
    engine = (
        'command = ["python3", "-c", "import sys; sys.exit(3)", "{port}"]\nstartup_timeout_s = 30\n'
    )
    plan = load(tmp_path, plan_text(tmp_path, engine, extra=SEARCH))
    load_gen = ScriptedLoad(capacity=4.2)
    launch = Launch(plan, tmp_path / "run", load_gen)
    config = plan.configs[0]
    run = SearchRun(plan, launch.servers, launch.runner)
    bisection = run.pending(config, [])
    assert bisection is not None
    run.run(config, [plan.probe(config, 2)], bisection)
    launch.close()
    line = _line(launch)
    assert line["status"] == "crashed"
    assert line["reason"] == "server failed to start: server exited with code 3 during startup"
    assert load_gen.loads == [] and line["search"]["probes"] == []
    assert [r["status"] for r in launch.records()] == ["crashed", "crashed"]


def _killer(launch: Launch) -> Any:
    def kill() -> None:  # the server dies in the middle of a cell
        (process,) = launch.servers.live.values()
        os.killpg(process.pid, signal.SIGKILL)
        process.proc.wait(timeout=30)

    return kill


def test_a_server_crash_at_a_probe_ends_the_search_there(tmp_path: Path) -> None:
    served = served_dir(tmp_path / "served")
    plan = load(tmp_path, plan_text(tmp_path, http_server_engine(served), extra=SEARCH))
    config = plan.configs[0]
    load_gen = ScriptedLoad(capacity=4.2, crash_at=frozenset({5.0}))
    launch = Launch(plan, tmp_path / "run", load_gen)
    load_gen.during = _killer(launch)
    _search(launch, plan)
    launch.close()
    line = _line(launch)
    assert (line["status"], line["reason"]) == ("crashed", "the server crashed at probe 5")
    assert load_gen.loads == [1.0, 9.0, 5.0]
    assert [(p["load"], p["passed"]) for p in line["search"]["probes"]] == [(1, True), (9, False)]
    assert [r["status"] for r in launch.records()[:3]] == ["ok", "ok", "crashed"]
    quirks = (tmp_path / "local-quirks.toml").read_text()
    assert f'config_key = "{config.key}"' in quirks  # the crash is remembered, and why
    assert 'reason = "server exited with code -9 during the cell"' in quirks
    assert launch.servers_lines()[0]["exit_code"] == -signal.SIGKILL


def test_a_server_crash_in_the_sweep_records_the_search_as_crashed(tmp_path: Path) -> None:
    served = served_dir(tmp_path / "served")
    plan = load(tmp_path, plan_text(tmp_path, http_server_engine(served), extra=SEARCH))
    config = plan.configs[0]
    load_gen = ScriptedLoad(capacity=4.2, crash_at=frozenset({2.0}))
    launch = Launch(plan, tmp_path / "run", load_gen)
    load_gen.during = _killer(launch)
    run = SearchRun(plan, launch.servers, launch.runner)
    bisection = run.pending(config, [])
    assert bisection is not None
    run.run(config, [plan.probe(config, 2), plan.probe(config, 3)], bisection)
    launch.close()
    line = _line(launch)
    assert line["status"] == "crashed"
    assert line["reason"] == "not run: the server of a@tp1 crashed at concurrency 4"
    assert load_gen.loads == [2.0] and line["search"]["probes"] == []
    assert [r["status"] for r in launch.records()] == ["crashed", "skipped", "crashed"]


def test_cells_that_run_leave_the_search_to_run(tmp_path: Path, url: str) -> None:
    plan = _plan(tmp_path, url, concurrency="[2, 4]")
    cells = [plan.probe(plan.configs[0], v) for v in (1, 2)]
    launch = Launch(plan, tmp_path / "run", ScriptedLoad(capacity=4.2))
    run = SearchRun(plan, launch.servers, launch.runner)
    bisection = run.pending(plan.configs[0], [Decision(c, "run") for c in cells])
    launch.close()
    assert bisection is not None and bisection.next_probe() == 1.0
    assert launch.records() == []  # nothing decided yet


def test_the_result_line_is_stamped_in_utc(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # a launcher nine hours ahead of UTC
    time.tzset()
    try:
        plan = _plan(tmp_path, url)
        launch = Launch(plan, tmp_path / "run", ScriptedLoad(capacity=0.5))
        before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        _search(launch, plan)
        after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        launch.close()
    finally:
        monkeypatch.undo()
        time.tzset()
    assert before <= _line(launch)["recorded_at"] <= after
