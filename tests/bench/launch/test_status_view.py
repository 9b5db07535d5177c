"""`bench status RUN` read in-process from run directories written by hand, file by file as
the launcher writes them (plan.toml, results.jsonl, state.json, run.json, preflight.jsonl,
gpus.jsonl): what a user reads of a finished, a live, a sharded and a damaged run, and the
time left counted in GPU time (issue 37: a TP2 cell holds two GPUs).

The "launcher" of a live run is this test's own process (its pid in state.json). Slurm's
``squeue``/``scontrol``/``sacct`` are stood in by :func:`fake_task_states`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.launch import slurm
from gpudoctor.bench.launch.schedule import shard_of
from gpudoctor.bench.launch.status import campaign_status, render, run_status
from gpudoctor.bench.plan import parse_plan

PLAN = """\
name = "view"
[model]
path = "models/tiny"
[engine]
name = "command"
command = ["true", "{port}"]
[axes]
concurrency = [1, 2, 4]
[[configs]]
name = "a"
[[configs]]
name = "w"
tp = [2]
"""


def keys(run: Path, base: Path | None = None) -> dict[tuple[str, int], str]:
    """Return the launcher's cell keys of the run's plan ({(label, concurrency): key})."""
    plan = parse_plan((run / "plan.toml").read_text(), str(run / "plan.toml"), base_dir=base or run)
    return {(c.config.label, c.concurrency): c.key for c in plan.cells()}


def record(run: Path, label: str, c: int, status: str, cell_s: float | None = None,
           base: Path | None = None, **extra: Any) -> dict[str, Any]:  # fmt: skip
    """Return a results.jsonl record as the cell runner writes it."""
    r = {"key": keys(run, base)[(label, c)], "config": label, "concurrency": c,
         "tp": 2 if label.startswith("w") else 1, "status": status, **extra}  # fmt: skip
    if cell_s is not None:
        r["timings"] = {"cell_s": cell_s}
    return r


def jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(tmp_path: Path, name: str = "run", plan: str = PLAN) -> Path:
    run = tmp_path / name
    run.mkdir(parents=True)
    (run / "plan.toml").write_text(plan)
    return run


def finished_run(tmp_path: Path) -> Path:
    """A stopped run: TP1 all three finished (ok, failed, crashed), TP2 one skipped, two
    pending; one GPU of four still usable."""
    run = make_run(tmp_path)
    jsonl(run / "results.jsonl", [
        record(run, "a@tp1", 1, "ok", 10.0),
        record(run, "a@tp1", 2, "failed", 20.0, reason="2 of 4 requests failed"),
        record(run, "a@tp1", 4, "crashed", 60.0, reason="server exited 1",
               server_log_tail=["loading", "CUDA error: out of memory"]),
        record(run, "w@tp2", 1, "skipped", reason="needs 2 GPU(s); the pool has 1 usable of 4"),
    ])  # fmt: skip
    pool = {"gpus": [{"index": i, "uuid": f"GPU-{i}"} for i in range(4)],
            "out": {"GPU-1": "ECC", "GPU-2": "ECC", "GPU-3": "gone"}}  # fmt: skip
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "finished": True, "pool": pool,
                                                "updated_at": "2026-12-04T10:00:00Z"}))  # fmt: skip
    (run / "run.json").write_text(json.dumps({
        "plan": "view", "stopped": "SIGTERM at 2026-12-04T10:00:00Z",
        "weights": {"action": "restored", "source": "s3://bucket/tiny", "dir": "/srv/tiny",
                    "at": "2026-12-04T09:00:00Z"}}))  # fmt: skip
    jsonl(run / "preflight.jsonl", [
        {"status": "FAIL", "when": "before", "at": "2026-12-04T08:00:00Z"},
        {"status": "WARN", "when": "before", "at": "2026-12-04T08:30:00Z"},
    ])  # fmt: skip
    jsonl(run / "gpus.jsonl", [{"index": 3, "uuid": "GPU-3", "reason": "not listed by NVML"}])
    return run


def test_a_finished_run_is_counted_per_tp_with_each_cells_reason(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    status = run_status(run)
    assert status["plan"] == "view" and status["live"] is False
    assert status["launcher_pid"] is None and status["updated_at"] == "2026-12-04T10:00:00Z"
    assert status["progress"] == {"recorded": 4, "total": 6}
    assert status["shard"] is None and status["unreadable"] == []
    assert status["preflight"] == {"status": "WARN", "when": "before",
                                   "at": "2026-12-04T08:30:00Z", "checks": 2}  # fmt: skip
    tp1, tp2 = status["groups"]
    assert tp1 == {
        "tp": 1, "total": 3, "done": 1, "running": [], "pending": 0, "skipped": [], "starting": [],
        "failed": [{"config": "a@tp1", "concurrency": 2, "reason": "2 of 4 requests failed"}],
        "crashed": [{"config": "a@tp1", "concurrency": 4, "reason": "server exited 1",
                     "log_line": "CUDA error: out of memory"}],
    }  # fmt: skip
    assert tp2 == {
        "tp": 2, "total": 3, "done": 0, "running": [], "pending": 2, "failed": [], "crashed": [],
        "starting": [], "skipped": [{"config": "w@tp2", "concurrency": 1,
                     "reason": "needs 2 GPU(s); the pool has 1 usable of 4"}],
    }  # fmt: skip
    assert status["gpus_out"] == [{"index": 3, "uuid": "GPU-3", "reason": "not listed by NVML"}]


def test_the_time_left_is_gpu_time_over_the_usable_gpus(tmp_path: Path) -> None:
    """Issue 37: each pending cell at the median measured time of its tp (here none at TP2:
    the median of all, 20 s), times its tp (2 GPUs), over the GPUs still usable (1 of 4):
    2 cells x 20 s x 2 GPUs / 1 GPU = 80 s."""
    run = finished_run(tmp_path)
    assert run_status(run)["eta_s"] == 80.0
    state = json.loads((run / "state.json").read_text())
    state["pool"]["out"] = {"GPU-3": "gone"}  # three usable: 80 GPU-seconds over 3
    (run / "state.json").write_text(json.dumps(state))
    assert run_status(run)["eta_s"] == pytest.approx(80.0 / 3)
    state["pool"] = {}  # no pool written yet: one GPU assumed, never a division by 0
    (run / "state.json").write_text(json.dumps(state))
    assert run_status(run)["eta_s"] == 80.0
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    rows[3] = {**rows[3], "status": "ok", "timings": {"cell_s": 100.0}}  # TP2 measured: its own
    rows.append(record(run, "w@tp2", 2, "ok", 300.0))  # median (100, 300) = 200 s, x 2 GPUs
    jsonl(run / "results.jsonl", rows)
    assert run_status(run)["eta_s"] == 400.0
    jsonl(run / "results.jsonl", [record(run, "w@tp2", 1, "skipped", reason="x")])
    assert run_status(run)["eta_s"] is None  # nothing measured yet: no guess


def test_a_finished_run_reads_as_a_todo_list(tmp_path: Path) -> None:
    text = render(run_status(finished_run(tmp_path)))
    run = tmp_path / "run"
    assert text.splitlines() == [
        f"{run}: plan view, not running; 4/6 cells",  # no time left shown: nothing runs
        "  [x] preflight: WARN (before, 2026-12-04T08:30:00Z)",
        "  [x] weights: restored from s3://bucket/tiny into /srv/tiny (2026-12-04T09:00:00Z)",
        "  [!] GPU 3 GPU-3 out of the pool: not listed by NVML",
        "  [!] TP1: 1 done, 1 failed, 0 running, 0 pending, 0 skipped, 1 crashed (of 3)",
        "        FAILED a@tp1 c=2: 2 of 4 requests failed",
        "        crashed a@tp1 c=4: server exited 1 | CUDA error: out of memory",
        "  [>] TP2: 0 done, 0 failed, 0 running, 2 pending, 1 skipped, 0 crashed (of 3)",
        "        skipped w@tp2 c=1: needs 2 GPU(s); the pool has 1 usable of 4",
        "  stopped: SIGTERM at 2026-12-04T10:00:00Z",
    ]


def test_a_run_not_started_shows_empty_boxes(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    jsonl(run / "preflight.jsonl", [{"status": "FAIL", "when": "before", "at": "T"}])
    status = run_status(run)
    assert status["preflight"]["status"] == "FAIL" and status["eta_s"] is None
    assert status["weights"] is None and status["plan"] == "view"
    assert render(status).splitlines() == [
        f"{run}: plan view, not running; 0/6 cells",
        "  [ ] preflight: FAIL (before, T)",
        "  [-] weights: none to restore (a local model path)",
        "  [ ] TP1: 0 done, 0 failed, 0 running, 3 pending, 0 skipped, 0 crashed (of 3)",
        "  [ ] TP2: 0 done, 0 failed, 0 running, 3 pending, 0 skipped, 0 crashed (of 3)",
    ]
    (run / "preflight.jsonl").unlink()
    assert run_status(run)["preflight"] is None
    assert "  [ ] preflight: not run" in render(run_status(run)).splitlines()


def test_a_live_run_shows_the_one_cell_each_server_measures(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    jsonl(run / "results.jsonl", [record(run, "w@tp2", 1, "ok", 30.0)])
    running = {"label": "w@tp2", "slot": 2, "gpus": ["GPU-0", "GPU-1"], "gpu_indices": [0, 1],
               "concurrency": 2, "since": "2026-12-04T10:00:00Z",
               "cell_since": "2026-12-04T10:05:00Z"}  # fmt: skip
    state = {"pid": os.getpid(), "running": [running], "updated_at": "U",
             "pool": {"gpus": [{"uuid": "GPU-0"}, {"uuid": "GPU-1"}], "out": {}}}  # fmt: skip
    (run / "state.json").write_text(json.dumps(state))
    (run / "run.json").write_text(json.dumps({"stopped": "an earlier launch"}))
    status = run_status(run)
    assert status["live"] is True and status["launcher_pid"] == os.getpid()
    tp1, tp2 = status["groups"]
    assert tp1["pending"] == 3 and tp1["running"] == []  # the plan's other server: waiting
    assert tp2["running"] == [{"config": "w@tp2", "concurrency": 2, "gpus": ["GPU-0", "GPU-1"],
                               "gpu_indices": [0, 1], "slot": 2,
                               "since": "2026-12-04T10:05:00Z"}]  # fmt: skip
    assert (tp2["done"], tp2["pending"]) == (1, 1)
    # pending: a@tp1 x3 (the median of all, 30 s, x 1 GPU) + w@tp2 x2 (30 s x 2 GPUs) over 2 GPUs
    assert status["eta_s"] == (3 * 30 + 2 * 30 * 2) / 2
    assert render(status).splitlines()[0] == (
        f"{run}: plan view, running, launcher pid {os.getpid()}; 1/6 cells, ~1.8 min left"
    )
    lines = render(status).splitlines()
    assert "  [>] TP2: 1 done, 0 failed, 1 running, 1 pending, 0 skipped, 0 crashed (of 3)" in lines
    assert "        running w@tp2 c=2 on GPU 0,1 (slot 2) since 2026-12-04T10:05:00Z" in lines
    assert not any(line.startswith("  stopped") for line in lines)  # it runs again
    # a server between cells (no cell_since yet): its start time, no GPU index known
    running.update(cell_since=None, gpu_indices=[], concurrency=4)
    (run / "state.json").write_text(json.dumps(state))
    lines = render(run_status(run)).splitlines()
    assert "        running w@tp2 c=4 (slot 2) since 2026-12-04T10:00:00Z" in lines  # issue 47
    assert "  [>] TP2: 1 done, 0 failed, 1 running, 1 pending, 0 skipped, 0 crashed (of 3)" in lines


def test_a_launcher_that_ended_runs_nothing(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    entry = {"label": "a@tp1", "slot": 1, "concurrency": 1, "since": "S"}
    for state in ({"pid": os.getpid(), "finished": True, "running": [entry]},
                  {"pid": str(os.getpid()), "running": [entry]},
                  {"pid": os.getpid(), "pid_started": 1.0, "running": [entry]}):  # fmt: skip
        (run / "state.json").write_text(json.dumps(state))
        status = run_status(run)
        assert status["live"] is False and status["launcher_pid"] is None
        assert status["groups"][0]["running"] == [] and status["groups"][0]["pending"] == 3


def test_a_shard_counts_only_its_own_cells(tmp_path: Path) -> None:
    from gpudoctor.bench.launch.schedule import in_shard

    run = make_run(tmp_path, plan=PLAN.replace('"models/tiny"', '"/srv/models/llm"'))
    every = keys(run)  # an absolute model path: the same keys in every test run
    mine = {k for k in every.values() if in_shard(k, (2, 2))}
    assert len(mine) == 3  # the plan's cells fall in both shards
    (run / "run.json").write_text(json.dumps({"shard": [2, 2]}))
    status = run_status(run)
    assert status["shard"] == [2, 2] and status["progress"] == {"recorded": 0, "total": len(mine)}
    assert f"{run} (shard 2/2): plan view" in render(status)
    assert run_status(run, (1, 2))["progress"]["total"] == 6 - len(mine)  # asked: that shard
    (run / "run.json").write_text(json.dumps({"shard": [2, 2, 9]}))  # not a shard: every cell
    assert run_status(run)["progress"]["total"] == 6 and run_status(run)["shard"] is None


def test_a_moved_run_keeps_its_keys_through_the_recorded_plan_dir(tmp_path: Path) -> None:
    """Issue 34.2: the model path is relative to the plan's directory (plan_dir in
    run.json, else merge.json); resolved against the run dir instead, no key matches."""
    project = tmp_path / "project"
    project.mkdir()
    run = make_run(project, "out")
    rows = [record(run, "a@tp1", c, "ok", 5.0, base=project) for c in (1, 2, 4)]
    jsonl(run / "results.jsonl", rows)
    (run / "run.json").write_text(json.dumps({"plan_dir": str(project)}))
    moved = tmp_path / "elsewhere"
    shutil.copytree(run, moved)
    assert run_status(moved)["progress"] == {"recorded": 3, "total": 6}
    (moved / "run.json").write_text(json.dumps({"plan_dir": "project"}))  # not absolute: ignored
    assert run_status(moved)["progress"] == {"recorded": 0, "total": 6}
    (moved / "run.json").unlink()
    (moved / "merge.json").write_text(json.dumps({"plan_dir": str(project)}))
    assert run_status(moved)["progress"] == {"recorded": 3, "total": 6}


def test_without_a_readable_plan_the_records_alone_are_shown(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    rows.append({"key": "0123456789abcdef", "config": "x@tp1", "concurrency": 8, "status": "ok"})
    rows.append({"config": "no key", "status": "ok"})  # no key: not a cell's record
    rows[2]["server_log_tail"] = []
    jsonl(run / "results.jsonl", rows)
    (run / "plan.toml").write_text("name = [broken\n")
    status = run_status(run)
    assert status["plan"] == "view"  # from run.json
    assert status["progress"] == {"recorded": 5, "total": 5}
    tp1, tp2 = status["groups"]
    assert (tp1["total"], tp1["done"], tp1["pending"]) == (4, 2, 0)
    assert tp1["failed"] == [{"config": "a@tp1", "concurrency": 2,
                              "reason": "2 of 4 requests failed"}]  # fmt: skip
    assert tp1["crashed"] == [{"config": "a@tp1", "concurrency": 4, "reason": "server exited 1",
                               "log_line": None}]  # fmt: skip
    assert tp2["total"] == 1 and tp2["skipped"][0]["concurrency"] == 1
    assert "        crashed a@tp1 c=4: server exited 1" in render(status).splitlines()
    (run / "plan.toml").unlink()
    assert run_status(run)["progress"] == {"recorded": 5, "total": 5}


def test_files_that_are_links_or_not_json_objects_are_listed_not_trusted(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    (run / "run.json").write_text("[1, 2]")  # JSON, but not an object
    (run / "state.json").write_text("{not json")
    elsewhere = tmp_path / "secret.jsonl"
    elsewhere.write_text(json.dumps({"index": 0, "uuid": "GPU-x", "reason": "planted"}) + "\n")
    (run / "gpus.jsonl").unlink()
    (run / "gpus.jsonl").symlink_to(elsewhere)
    status = run_status(run)
    assert status["plan"] == "view" and status["weights"] is None and status["stopped"] is None
    assert status["gpus_out"] == [] and status["live"] is False
    assert len(status["unreadable"]) == 1 and "gpus.jsonl" in status["unreadable"][0]
    assert render(status).splitlines()[-1] == f"  [!] not read: {status['unreadable'][0]}"
    (run / "plan.toml").unlink()
    (run / "plan.toml").symlink_to(elsewhere)
    status = run_status(run)
    assert len(status["unreadable"]) == 2 and status["progress"]["total"] == 4


def fake_task_states(monkeypatch: pytest.MonkeyPatch, answer: dict | Exception) -> list:
    """Stand in for Slurm's ``squeue``/``scontrol``/``sacct`` (slurm.task_states): return
    ``answer`` (or raise it); the job ids asked are appended to the returned list."""
    asked: list = []

    def task_states(jobs: list[str]) -> dict:
        asked.append(jobs)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(slurm, "task_states", task_states)
    return asked


def test_a_directory_of_shards_is_shown_shard_by_shard_with_slurms_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign = tmp_path / "campaign"
    (campaign / "shards").mkdir(parents=True)
    (campaign / "slurm").mkdir()
    jsonl(campaign / "slurm" / "submissions.jsonl", [
        {"array_job": "100", "shards": 3}, {"array_job": "101", "shards": 2},
    ])  # fmt: skip
    # An absolute model path: the same keys in every shard and in every test run (a path
    # under tmp_path changed the keys per run, and 1 run in 32 put all six in one shard);
    # one whose keys (they name the program since issue 45.2) fall three in each shard.
    plan = PLAN.replace('"models/tiny"', '"/srv/models/llm"')
    runs = {i: make_run(campaign / "shards", str(i), plan) for i in (2, 1)}
    assert sorted(shard_of(k, 2) for k in keys(runs[1]).values()) == [1, 1, 1, 2, 2, 2]
    for i in (1, 2):  # shard i of 2 records a cell of its own, measured in 10 x i s
        own = next(k for k in keys(runs[i]).items() if shard_of(k[1], 2) == i)
        (label, c), _ = own
        jsonl(runs[i] / "results.jsonl", [record(runs[i], label, c, "ok", 10.0 * i)])
    (campaign / "shards" / "notes").mkdir()  # not a shard
    (campaign / "shards" / "3").symlink_to(runs[1])  # a link: not followed
    asked = fake_task_states(monkeypatch, {"100": {}, "101": {2: "RUNNING", 1: "COMPLETED"}})
    status = campaign_status(campaign)
    assert asked == [["100", "101"]]
    assert [s["run"] for s in status["shards"]] == [str(runs[1]), str(runs[2])]
    assert [s["shard"] for s in status["shards"]] == [[1, 2], [2, 2]]  # the latest submission
    totals = [s["progress"]["total"] for s in status["shards"]]
    assert sum(totals) == 6 and status["progress"] == {"recorded": 2, "total": 6}
    etas = [s["eta_s"] for s in status["shards"]]
    assert status["eta_s"] == max(etas) and None not in etas
    assert status["merged"] is None and status["unreadable"] == []
    assert status["slurm"]["tasks"] == {"100": {}, "101": {"1": "COMPLETED", "2": "RUNNING"}}
    assert [s["array_job"] for s in status["slurm"]["submissions"]] == ["100", "101"]
    lines = render(status).splitlines()
    assert lines[0] == (f"{campaign}: 2 shard(s), 2/6 cells recorded, "
                        f"~{status['eta_s'] / 60:.1f} min left")  # fmt: skip
    assert lines[1:3] == ["slurm array 100: no task known to Slurm any more",
                          "slurm array 101: 1=COMPLETED, 2=RUNNING"]  # fmt: skip
    assert lines[3] == "" and lines[4].startswith(f"{runs[1]} (shard 1/2): plan view")
    # merged results: counted under merged/
    merged = make_run(campaign, "merged", plan)
    jsonl(merged / "results.jsonl", [record(merged, "a@tp1", 1, "ok", 1.0)])
    status = campaign_status(campaign)
    assert status["merged"]["progress"] == {"recorded": 1, "total": 6}
    shown = render(status).splitlines()
    assert shown[-2:] == ["", f"merged: 1 cells in {campaign}/merged"]
    assert shown[0].startswith(f"{campaign}: 2 shard(s), 2/6 cells recorded")


def test_shards_without_slurm_or_submissions_still_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign = tmp_path / "campaign"
    make_run(campaign / "shards", "1")
    asked = fake_task_states(monkeypatch, {})
    status = campaign_status(campaign)  # no submissions: the shards as they say
    assert asked == [] and status["slurm"] is None and status["shards"][0]["shard"] is None
    assert status["eta_s"] is None and status["progress"] == {"recorded": 0, "total": 6}
    assert render(status).splitlines()[0] == f"{campaign}: 1 shard(s), 0/6 cells recorded"
    (campaign / "slurm").mkdir()
    jsonl(campaign / "slurm" / "submissions.jsonl", [{"array_job": "7", "shards": 1}])
    fake_task_states(monkeypatch, slurm.SlurmError("squeue: command not found"))
    status = campaign_status(campaign)
    assert status["slurm"] == {"submissions": [{"array_job": "7", "shards": 1}],
                               "error": "squeue: command not found"}  # fmt: skip
    assert render(status).splitlines()[1] == "slurm: squeue: command not found"
    (campaign / "slurm" / "submissions.jsonl").unlink()
    (campaign / "slurm" / "submissions.jsonl").symlink_to(tmp_path)
    status = campaign_status(campaign)
    assert status["slurm"] is None and len(status["unreadable"]) == 1
    assert "submissions.jsonl" in status["unreadable"][0]
    assert render(status).splitlines()[-1].startswith("  [!] not read: ")


def test_strings_of_the_run_reach_the_terminal_escaped(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
    rows[2]["server_log_tail"] = ["\x1b]52;c;cm0gLXJmIH4=\x07 oom\x85next\u2028line"]
    jsonl(run / "results.jsonl", rows)
    text = render(run_status(run))
    assert not any(c in text for c in "\x1b\x07\x85\u2028")
    assert r"| \x1b]52;c;cm0gLXJmIH4=\x07 oom\x85next\u2028line" in text


def test_odd_but_harmless_files_are_read_as_far_as_they_make_sense(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    rows = [record(run, "a@tp1", 1, "ok", 10.0),
            {**record(run, "a@tp1", 2, "ok"), "timings": None},
            {**record(run, "a@tp1", 4, "ok"), "timings": {"cell_s": "n/a"}},
            {k: v for k, v in record(run, "w@tp2", 1, "ok", 50.0).items() if k != "tp"}]  # fmt: skip
    jsonl(run / "results.jsonl", rows)
    # run.json: a byte that is no UTF-8, a plan_dir that is no path, a shard that is no pair
    (run / "run.json").write_bytes(b'{"stopped": "by \xff", "plan_dir": 5, "shard": "12"}')
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "pool": {"gpus": [1, 2]}}))
    status = run_status(run)
    assert status["stopped"] == "by \ufffd" and status["shard"] is None
    assert status["progress"] == {"recorded": 4, "total": 6}  # keys resolved against the run
    assert status["live"] is True and status["groups"][1]["running"] == []  # nothing running
    # a record without tp counts as TP1: the TP1 median is (10, 50) = 30 s; the two pending
    # TP2 cells: no TP2 measurement, the median of all (30 s) x 2 GPUs each, over 2 GPUs
    assert status["eta_s"] == 2 * 30 * 2 / 2


def test_a_state_json_too_large_to_be_the_launchers_is_not_read(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    state = {"pid": os.getpid(), "running": [], "pad": "x" * (5 << 20)}
    (run / "state.json").write_text(json.dumps(state))
    status = run_status(run)
    assert status["live"] is False and len(status["unreadable"]) == 1
    assert "state.json" in status["unreadable"][0]


def test_a_server_starting_its_first_cell_marks_its_group_started(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    entry = {"label": "w@tp2", "slot": 1, "concurrency": 1, "since": "S"}
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "running": [entry]}))
    status = run_status(run)
    assert status["groups"][1]["running"] == [{"config": "w@tp2", "concurrency": 1, "gpus": [],
                                               "gpu_indices": [], "slot": 1, "since": "S"}]  # fmt: skip
    lines = render(status).splitlines()
    assert "  [ ] TP1: 0 done, 0 failed, 0 running, 3 pending, 0 skipped, 0 crashed (of 3)" in lines
    assert "  [>] TP2: 0 done, 0 failed, 1 running, 2 pending, 0 skipped, 0 crashed (of 3)" in lines
    (run / "state.json").write_text(json.dumps({"pid": os.getpid()}))  # nothing runs yet
    assert run_status(run)["groups"][1]["pending"] == 3


def test_shards_are_listed_in_number_order_and_only_directories_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    campaign = tmp_path / "campaign"
    for name in ("2", "10", "1"):
        make_run(campaign / "shards", name)
    (campaign / "shards" / "4").write_text("a file, not a shard\n")
    fake_task_states(monkeypatch, {})
    status = campaign_status(campaign)
    assert [Path(s["run"]).name for s in status["shards"]] == ["1", "2", "10"]


def test_a_plain_run_directory_is_one_runs_status(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    assert campaign_status(run) == run_status(run)


def test_a_passed_preflight_is_ticked(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    jsonl(run / "preflight.jsonl", [{"status": "PASS", "when": "before", "at": "T"}])
    assert "  [x] preflight: PASS (before, T)" in render(run_status(run)).splitlines()


def test_skipped_cells_finish_a_group_and_each_done_cell_counts(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    jsonl(run / "results.jsonl", [
        record(run, "a@tp1", 1, "ok", 1.0), record(run, "a@tp1", 2, "ok", 1.0),
        record(run, "a@tp1", 4, "skipped", reason="quirk q1"),
    ])  # fmt: skip
    status = run_status(run)
    assert status["groups"][0]["done"] == 2
    assert "  [x] TP1: 2 done, 0 failed, 0 running, 0 pending, 1 skipped, 0 crashed (of 3)" in (
        render(status).splitlines()
    )


def test_the_first_of_two_shards_is_read_from_run_json(tmp_path: Path) -> None:
    from gpudoctor.bench.launch.schedule import in_shard

    run = make_run(tmp_path)
    (run / "run.json").write_text(json.dumps({"shard": [1, 2]}))
    status = run_status(run)
    assert status["shard"] == [1, 2]
    assert status["progress"]["total"] == sum(in_shard(k, (1, 2)) for k in keys(run).values())


def test_every_file_that_is_a_link_is_listed_and_the_rest_still_shown(tmp_path: Path) -> None:
    run = finished_run(tmp_path)
    target = tmp_path / "target.json"
    target.write_text("{}\n")
    for name in ("run.json", "merge.json", "results.jsonl", "preflight.jsonl"):
        (run / name).unlink(missing_ok=True)
        (run / name).symlink_to(target)
    status = run_status(run)
    listed = " ".join(status["unreadable"])
    assert all(name in listed for name in ("run.json", "merge.json", "results.jsonl",
                                           "preflight.jsonl"))  # fmt: skip
    assert status["progress"] == {"recorded": 0, "total": 6} and status["preflight"] is None


def test_a_group_whose_cells_all_failed_is_not_ticked_as_done(tmp_path: Path) -> None:
    """Issue 47: `bench status` of a run whose cells all FAILED showed the group box [x]:
    done and fine. A finished group with a failed or crashed cell reads [!]."""
    run = make_run(tmp_path)
    jsonl(run / "results.jsonl", [record(run, "a@tp1", c, "failed", 1.0, reason="HTTP 500")
                                  for c in (1, 2, 4)])  # fmt: skip
    lines = render(run_status(run)).splitlines()
    assert "  [!] TP1: 0 done, 3 failed, 0 running, 0 pending, 0 skipped, 0 crashed (of 3)" in lines
    jsonl(run / "results.jsonl", [record(run, "a@tp1", 1, "crashed", 1.0, reason="exit 1"),
                                  record(run, "a@tp1", 2, "ok", 1.0),
                                  record(run, "a@tp1", 4, "ok", 1.0)])  # fmt: skip
    lines = render(run_status(run)).splitlines()
    assert "  [!] TP1: 2 done, 0 failed, 0 running, 0 pending, 0 skipped, 1 crashed (of 3)" in lines


def test_a_server_still_loading_is_shown_starting(tmp_path: Path) -> None:
    """Issue 47: while a server loads (no cell measured yet) `bench status` showed nothing;
    "starting server X" is there now, on its GPUs when it has some."""
    run = make_run(tmp_path)
    entry = {"label": "w@tp2", "slot": 1, "gpu_indices": [2, 3], "since": "S"}
    other = {"label": "gone@tp9", "slot": 2, "since": "S"}  # not in the plan: not shown
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "running": [entry, other]}))
    status = run_status(run)
    assert status["groups"][1]["starting"] == [
        {"config": "w@tp2", "slot": 1, "gpu_indices": [2, 3], "since": "S"}
    ]
    assert status["groups"][0]["starting"] == []
    lines = render(status).splitlines()
    assert "  [>] TP2: 0 done, 0 failed, 0 running, 3 pending, 0 skipped, 0 crashed (of 3)" in lines
    assert "        starting server w@tp2 on GPU 2,3 (slot 1) since S" in lines
    assert "  [ ] TP1: 0 done, 0 failed, 0 running, 3 pending, 0 skipped, 0 crashed (of 3)" in lines
    entry.pop("gpu_indices")
    (run / "state.json").write_text(json.dumps({"pid": os.getpid(), "running": [entry]}))
    assert "        starting server w@tp2 (slot 1) since S" in render(run_status(run)).splitlines()
