"""A whole campaign, in-process and fast: ``run_campaign`` on the real tiny server
(runner_support.TINY_SERVER, one process per configuration, its flags checked against its
real ``--help``), the run directory a user reads afterwards (results.jsonl, run.json,
state.json, servers.jsonl), a resume that measures nothing twice, the retries, a shard,
a quirked configuration, the leftovers of an earlier launch, a stop (a failed preflight,
Ctrl-C) written to run.json, and a busy directory. The load generator is
:class:`~tests.bench.launch.runner_support.RecordedMeasure`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, Summary, run_campaign
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.server import TAG_VAR, tagged_processes
from gpudoctor.bench.launch.steps import CampaignError, run_id
from gpudoctor.bench.plan import Plan
from gpudoctor.bench.plan.quirks import load_quirks
from gpudoctor.bench.results.run_dir import RunDir, read_records
from tests.bench.launch.runner_support import (
    REPO,
    RecordedMeasure,
    configs,
    measurement,
    write_mirror,
    write_plan,
)

TWO = configs("a") + configs("b", args="threads = 2")


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no GPU: one server at a time (no stand-ins declared)."""
    for name in ("GPUDOCTOR_FAKE_GPUS", "GPUDOCTOR_FAKE_GPU_TOPO", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


def _plan(tmp_path: Path, body: str = TWO) -> Plan:
    return write_plan(tmp_path, "[preflight]\nenabled = false\n" + body)


def _run(
    plan: Plan, tmp_path: Path, measure: RecordedMeasure, **options: Any
) -> tuple[Summary, str]:
    shown = io.StringIO()
    options.setdefault("help_cache", tmp_path / "help-cache")
    opts = LaunchOptions(out=tmp_path / "run", quirks_path=tmp_path / "quirks.toml", **options)
    summary = run_campaign(plan, opts, PlainReporter(shown), measure)
    return summary, shown.getvalue()


def _guardians(tag: str) -> list[psutil.Process]:
    """Return this process's children that guard the launch ``tag`` (``--guard TAG``)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and tag in child.cmdline():
                found.append(child)
    return found


def _records(tmp_path: Path) -> list[dict]:
    return read_records(tmp_path / "run" / "results.jsonl")[0]


def _run_json(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "run.json").read_text())


def test_a_campaign_measures_every_cell_once_and_says_so(tmp_path: Path, asked: list) -> None:
    plan = write_plan(tmp_path, '[preflight]\nonly = ["proc"]\n' + TWO)
    measure = RecordedMeasure([measurement(4)] * 4)
    summary, shown = _run(plan, tmp_path, measure)
    assert summary == Summary(total=4, already_done=0, ok=4, crashed=0, skipped=0,
                              server_starts=2, failed=0)  # fmt: skip
    assert [(r["config"], r["concurrency"], r["status"]) for r in _records(tmp_path)] == [
        ("a", 1, "ok"), ("a", 2, "ok"), ("b", 1, "ok"), ("b", 2, "ok")
    ]  # fmt: skip
    facts = _run_json(tmp_path)
    out = tmp_path / "run"
    assert re.fullmatch(re.escape(run_id(out)) + r":[0-9a-f]{8}", facts["tag"])
    assert (facts["plan"], facts["plan_dir"], facts["shard"]) == ("fast", str(tmp_path), None)
    assert (facts["engine"], facts["engine_version"], facts["gpu_arch"]) == ("command", "v7", "cpu")
    assert (out / "plan.toml").read_text() == plan.text  # the plan the results belong to
    assert "stopped" not in facts and "weights" not in facts
    state = json.loads((out / "state.json").read_text())
    assert state["finished"] is True and state["running"] == [] and state["tag"] == facts["tag"]
    assert [s["label"] for s in read_records(out / "servers.jsonl")[0]] == ["a@tp1", "b@tp1"]
    assert tagged_processes(run_id(out)) == []  # its servers are gone
    assert _guardians(facts["tag"]) == []  # and so is its guardian
    assert shown.splitlines()[0] == "bench: 4 cells, 0 already done"
    [cached] = (tmp_path / "help-cache").iterdir()  # the engine's --help, for the next launch
    assert "--threads" in cached.read_text()
    assert "GPU pool" not in shown and "left by an earlier launch" not in shown
    # gpudoctor check before the campaign, then before each configuration's server
    whens = [v["when"] for v in read_records(out / "preflight.jsonl")[0]]
    assert whens == ["campaign", "config a@tp1", "config b@tp1"]
    assert all("gpus" not in r for r in _records(tmp_path))
    # the model is checked from the first preflight on; no GPU count is asked of a CPU host
    assert [(o.model_dirs, o.expect_gpus) for o in asked] == [((str(tmp_path / "m"),), None)] * 3
    for record in _records(tmp_path):
        assert record["engine"] == {"name": "command", "version": "v7"}
        assert record["gpu_arch"] == "cpu"


def test_with_gpus_each_configuration_gets_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPUS", "GPU-a,GPU-b")
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed: nothing needs it
    plan = _plan(tmp_path)
    summary, shown = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 4))
    assert (summary.ok, summary.server_starts) == (4, 2)
    assert "bench: GPU pool: 2 GPU(s) from GPUDOCTOR_FAKE_GPUS: 0=GPU-a, 1=GPU-b" in (
        shown.splitlines()
    )
    records = _records(tmp_path)
    assert sorted(r["key"] for r in records) == sorted(c.key for c in plan.cells())
    assert all(len(r["gpus"]) == 1 and r["gpus"][0] in ("GPU-a", "GPU-b") for r in records)


def test_a_search_runs_its_probes_on_each_configuration_server_after_its_preflight(
    tmp_path: Path,
) -> None:
    body = '[preflight]\nonly = ["proc"]\n[slo]\nttft_ms = 100\n[search]\nhigh = 8\n' + TWO
    plan = write_plan(tmp_path, body)
    good = measurement(4, metrics={"total_output_tokens": 64, "slo_attainment": 1.0})
    measure = RecordedMeasure([good] * 40)
    summary, _ = _run(plan, tmp_path, measure)
    lines = _records(tmp_path)
    searches = [r for r in lines if r.get("record") == "search"]
    assert [(r["config"], r["status"]) for r in searches] == [("a", "done"), ("b", "done")]
    assert summary.server_starts == 2 and summary.ok == len(lines) - 2
    whens = [v["when"] for v in read_records(tmp_path / "run" / "preflight.jsonl")[0]]
    assert whens == ["campaign", "config a@tp1", "config b@tp1"]


def test_a_resume_measures_nothing_twice(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 4))
    again = RecordedMeasure([])
    summary, shown = _run(plan, tmp_path, again)
    assert summary == Summary(4, 4, 0, 0, 0, 0)
    assert again.calls == [] and len(_records(tmp_path)) == 4
    assert shown.splitlines()[0] == "bench: 4 cells, 4 already done"


def test_retry_failed_measures_the_failed_cells_again_and_keeps_the_old_records(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path)
    bad = measurement(0, {"http_500": 4})
    first, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4), bad, measurement(4), bad]))
    assert (first.ok, first.failed) == (2, 2)
    summary, _ = _run(plan, tmp_path, RecordedMeasure([]), retry_crashed=True)
    assert summary.already_done == 4  # --retry-crashed leaves failed cells alone
    measure = RecordedMeasure([measurement(4)] * 2)
    summary, _ = _run(plan, tmp_path, measure, retry_failed=True)
    assert (summary.already_done, summary.ok, summary.failed) == (2, 2, 0)
    assert [c.concurrency for c in measure.calls] == [2, 2]
    records = _records(tmp_path)
    assert sorted(r["status"] for r in records) == ["ok"] * 4
    superseded = read_records(tmp_path / "run" / "superseded.jsonl")[0]
    assert [r["status"] for r in superseded] == ["failed", "failed"]


def test_a_quirked_configuration_is_skipped_until_retry_crashed(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    (tmp_path / "quirks.toml").write_text(
        '[[quirk]]\nid = "b-hangs"\narch = "cpu"\nengine = "command"\nengine_version = "v7"\n'
        'reason = "hangs"\nmatch = { threads = 2 }\n'
    )
    summary, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 2))
    assert (summary.ok, summary.skipped, summary.server_starts) == (2, 2, 1)
    skipped = [r for r in _records(tmp_path) if r["status"] == "skipped"]
    why = f"quirk b-hangs (in {tmp_path / 'quirks.toml'}; --retry-crashed runs it anyway): hangs"
    assert [(r["config"], r["reason"], r["retryable"]) for r in skipped] == [("b", why, True)] * 2
    measure = RecordedMeasure([measurement(4)] * 2)
    summary, _ = _run(plan, tmp_path, measure, retry_crashed=True)
    assert (summary.already_done, summary.ok, summary.server_starts) == (2, 2, 1)
    assert sorted(r["status"] for r in _records(tmp_path)) == ["ok"] * 4


def test_a_shard_runs_only_its_cells_and_says_which(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, "[preflight]\nenabled = false\n" + TWO, concurrency="[1, 2, 3, 4]")
    first, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 8), shard=(1, 2))
    mine = {r["key"] for r in _records(tmp_path)}
    assert first.total == first.ok == len(mine)
    assert all(r["shard"] == "1/2" for r in _records(tmp_path))
    assert _run_json(tmp_path)["shard"] == [1, 2]
    second, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 8), shard=(2, 2))
    # the two shards split the cells: none twice, none left out
    assert second.total == second.ok == 8 - len(mine) and second.already_done == 0
    assert {r["key"] for r in _records(tmp_path)} == {c.key for c in plan.cells()}
    assert {r["shard"] for r in _records(tmp_path) if r["key"] not in mine} <= {"2/2"}


def test_a_torn_or_corrupt_results_file_is_named_and_its_cells_run_again(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 4))
    results = tmp_path / "run" / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    results.write_text(lines[0] + "not json\n" * 11 + "".join(lines[2:]) + '{"key": "tor')
    measure = RecordedMeasure([measurement(4)])
    summary, shown = _run(plan, tmp_path, measure)
    assert "bench: cut off a torn last line (12 bytes) of results.jsonl" in shown.splitlines()
    assert (
        "bench: warning: skipped 11 corrupt line(s) of results.jsonl (line 2, 3, 4, 5, 6, 7, 8,"
        " 9, 10, 11); their cells, if any, run again" in shown.splitlines()
    )
    assert summary.already_done == 3 and len(measure.calls) == 1
    assert "cut off" not in _run(plan, tmp_path, RecordedMeasure([]))[1]


def test_the_servers_an_earlier_launch_left_are_stopped_first(tmp_path: Path) -> None:
    plan = _plan(tmp_path, configs("a"))
    out = tmp_path / "run"
    env = {**os.environ, TAG_VAR: f"{run_id(out)}:0ld00000"}
    left = subprocess.Popen(["sleep", "300"], env=env)
    try:
        _, shown = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 2))
        assert left.wait(timeout=30) is not None
    finally:
        left.kill()
        left.wait()
    assert "bench: stopped 1 server process(es) left by an earlier launch" in shown.splitlines()


def test_a_missing_model_is_refused_before_the_run_directory_is_touched(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    os.rmdir(tmp_path / "m")
    with pytest.raises(CampaignError, match=r"model.path .* does not exist; fix the path"):
        _run(plan, tmp_path, RecordedMeasure([]))
    assert not (tmp_path / "run").exists()
    text = plan.text.replace('path = "m"\n', 'path = "m"\ntokenizer = "tok"\n')
    (tmp_path / "plan.toml").write_text(text)
    from gpudoctor.bench.plan import load_plan

    with pytest.raises(CampaignError) as caught:
        _run(load_plan(tmp_path / "plan.toml"), tmp_path, RecordedMeasure([]))
    first, second = str(caught.value).split(
        "; fix the path (relative paths are relative to the plan file); "
    )
    assert first.endswith(f"model.path {tmp_path / 'm'} does not exist")
    assert second.startswith(
        f"{tmp_path / 'plan.toml'}: model.tokenizer {tmp_path / 'tok'} does not"
    )


def test_a_stop_is_written_to_run_json_and_every_server_is_gone(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, '[preflight]\nonly = ["driver"]\n' + TWO)
    with pytest.raises(CampaignError, match=r"^preflight \(campaign\) failed: driver.loaded"):
        _run(plan, tmp_path, RecordedMeasure([]))
    assert _run_json(tmp_path)["stopped"].startswith("preflight (campaign) failed: driver.loaded")

    def ctrl_c(_target: Any) -> None:
        raise KeyboardInterrupt

    plan = _plan(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        _run(plan, tmp_path, RecordedMeasure([], during=ctrl_c), resume=False)
    facts = _run_json(tmp_path)
    assert facts["stopped"] == "interrupted" and facts["plan"] == "fast"
    assert "weights" not in facts  # no weights step without a repo
    assert tagged_processes(run_id(tmp_path / "run")) == []
    assert json.loads((tmp_path / "run" / "state.json").read_text())["finished"] is True


def test_a_busy_run_directory_is_one_campaign_error(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    with RunDir(tmp_path / "run"), pytest.raises(CampaignError) as caught:
        _run(plan, tmp_path, RecordedMeasure([]))
    run = tmp_path / "run"
    assert str(caught.value) == (
        f"{run}: another gpudoctor bench is running on this directory; follow it with:"
        f" gpudoctor bench status {run}, or stop it first (Ctrl-C in its terminal)"
    )
    assert caught.value.__cause__ is not None


def test_the_weights_are_restored_before_the_servers_and_noted_in_run_json(
    tmp_path: Path,
) -> None:
    write_mirror(tmp_path / "mirror")
    target = tmp_path / "shm" / "tiny"
    plan = _plan(tmp_path, configs("a"))
    text = plan.text.replace(
        "[preflight]\nenabled = false\n", '[preflight]\nonly = ["model"]\n'
    ).replace(
        'path = "m"\n',
        f'repo = "{REPO}"\ndir = "{target}"\nrevision = "{"c" * 40}"\n'
        f'mirror = "{tmp_path / "mirror"}"\n',
    )
    (tmp_path / "plan.toml").write_text(text)
    from gpudoctor.bench.plan import load_plan

    plan = load_plan(tmp_path / "plan.toml")
    summary, shown = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 2))
    assert summary.ok == 2
    weights = _run_json(tmp_path)["weights"]
    assert (weights["repo"], weights["action"], weights["source"]) == (REPO, "restored", "mirror")
    # the first preflight leaves the model out (not restored yet); the next checks it
    verdicts = read_records(tmp_path / "run" / "preflight.jsonl")[0]
    assert [(v["when"], v["status"]) for v in verdicts] == [
        ("campaign", "SKIP"), ("config a@tp1", "PASS")
    ]  # fmt: skip
    lines = shown.splitlines()
    assert lines.index(f"bench: weights: ensuring {REPO} in {target}") < next(
        i for i, line in enumerate(lines) if "starting server" in line
    )


def test_a_stop_after_the_weights_step_keeps_it_in_run_json(tmp_path: Path) -> None:
    write_mirror(tmp_path / "mirror")
    plan = _plan(tmp_path, configs("a"))
    text = plan.text.replace(
        'path = "m"\n',
        f'repo = "{REPO}"\ndir = "{tmp_path / "tiny"}"\nrevision = "{"c" * 40}"\n'
        f'mirror = "{tmp_path / "mirror"}"\n',
    )
    (tmp_path / "plan.toml").write_text(text)
    from gpudoctor.bench.plan import load_plan

    def ctrl_c(_target: Any) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(load_plan(tmp_path / "plan.toml"), tmp_path, RecordedMeasure([], during=ctrl_c))
    facts = _run_json(tmp_path)
    assert facts["stopped"] == "interrupted" and facts["weights"]["action"] == "restored"


def test_a_server_that_cannot_start_is_crashed_and_quirked_for_this_engine(tmp_path: Path) -> None:
    plan = _plan(tmp_path, configs("a") + configs("b", args="fail-start = true"))
    summary, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 2))
    assert (summary.ok, summary.crashed, summary.server_starts) == (2, 2, 2)
    crashed = [r for r in _records(tmp_path) if r["status"] == "crashed"]
    assert {r["config"] for r in crashed} == {"b"}
    [quirk] = [q for q in load_quirks(tmp_path / "quirks.toml") if q.source != "shipped"]
    assert (quirk.arch, quirk.engine, quirk.engine_version) == ("cpu", "command", "v7")


def test_a_search_whose_server_cannot_start_is_a_crashed_search(tmp_path: Path) -> None:
    body = "[slo]\nttft_ms = 100\n[search]\nhigh = 8\n" + configs("b", args="fail-start = true")
    summary, _ = _run(_plan(tmp_path, body), tmp_path, RecordedMeasure([]))
    [search] = [r for r in _records(tmp_path) if r.get("record") == "search"]
    assert search["status"] == "crashed" and search["config"] == "b"
    assert search["reason"].startswith("server failed to start: ")
    assert summary.crashed == len(_records(tmp_path)) - 1


def test_a_shard_without_any_cell_of_a_configuration_starts_no_server_for_it(
    tmp_path: Path,
) -> None:
    plan = write_plan(tmp_path, "[preflight]\nenabled = false\n" + TWO, concurrency="[1]")
    first, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 2), shard=(1, 2))
    second, _ = _run(plan, tmp_path, RecordedMeasure([measurement(4)] * 2), shard=(2, 2))
    # two cells, two shards: some shard lacks a configuration's only cell
    assert (first.ok + second.ok, first.server_starts + second.server_starts) == (2, 2)
    assert {r["config"] for r in _records(tmp_path)} == {"a", "b"}


def test_a_search_added_to_a_finished_matrix_runs_its_probes(tmp_path: Path) -> None:
    slo = "[slo]\nttft_ms = 100\n"
    _run(_plan(tmp_path, slo + configs("a")), tmp_path, RecordedMeasure([measurement(4)] * 2))
    plan = _plan(tmp_path, slo + "[search]\nhigh = 8\n" + configs("a"))
    good = measurement(4, metrics={"total_output_tokens": 64, "slo_attainment": 1.0})
    measure = RecordedMeasure([good] * 20)
    summary, _ = _run(plan, tmp_path, measure, resume=True)
    assert summary.already_done == 2 and measure.calls  # the matrix kept, the probes run
    [search] = [r for r in _records(tmp_path) if r.get("record") == "search"]
    assert search["status"] == "done" and search["config"] == "a"
