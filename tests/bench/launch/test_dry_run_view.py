"""`bench run --dry-run`, in-process and fast: every cell's decision, every server's exact
command, the notes and problems a user reads before a campaign, and the schedule the
packed strategy would follow (GPUs, waves, expected, ideal and serial lengths).

GPUs: the product's stand-ins (``GPUDOCTOR_FAKE_GPUS``; this machine has none). The plan's
engine is a program that does not exist: nothing is started (``--no-validate``), or the
SGLang engine on this interpreter, where SGLang is not installed (validation's note).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.launch.dry_run import dry_run, dumps, schedule_preview
from gpudoctor.bench.launch.schedule import Estimates
from gpudoctor.bench.launch.slots import Gpu, GpuPool
from gpudoctor.bench.launch.steps import CampaignError, Decision, LaunchOptions
from gpudoctor.bench.plan import Cell, Plan, ServerConfig, load_plan

PLAN = """\
name = "dry"
[model]
path = "m"
[engine]
name = "command"
command = ["/nonexistent/server", "--model", "{model}", "--port", "{port}"]
version = "v9"
[axes]
concurrency = [1, 2]
[[configs]]
name = "a"
[[configs]]
name = "w"
tp = [2]
"""


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPUS", "GPU-a,GPU-b,GPU-c")
    for name in ("GPUDOCTOR_FAKE_GPU_TOPO", "GPUDOCTOR_FAKE_GPU_FAULTS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


def plan_at(tmp_path: Path, text: str = PLAN, model: bool = True) -> Plan:
    if model:
        (tmp_path / "m").mkdir(exist_ok=True)
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return load_plan(path)


def options(tmp_path: Path, **kw: Any) -> LaunchOptions:
    return LaunchOptions(out=tmp_path / "run", quirks_path=tmp_path / "quirks.toml", **kw)


def _config(name: str, tp: int) -> ServerConfig:
    return ServerConfig(name, tp, (), (), (1, 2), name)


def _run(config: ServerConfig, *conc: int) -> list[Decision]:
    return [Decision(Cell(config, c, f"{config.name}{c}"), "run") for c in conc]


# --- the schedule -----------------------------------------------------------------------


def test_without_gpus_one_server_at_a_time_in_plan_order() -> None:
    a, w, z = _config("a", 1), _config("w", 2), _config("z", 1)
    decisions = [*_run(a, 1, 2), *_run(w, 1), Decision(Cell(z, 1, "z1"), "done", "ok"),
                 Decision(Cell(z, 2, "z2"), "skip", "quirk q1")]  # fmt: skip
    out = schedule_preview(None, None, decisions, Estimates({1: 10.0, 2: 50.0}, 5.0))
    assert out == {
        "gpus": [], "source": None, "packed": False,
        "placements": [
            {"label": "a@tp1", "gpus": [], "wave": 1, "start_s": 0.0, "end_s": 25.0, "cells": 2},
            {"label": "w@tp2", "gpus": [], "wave": 2, "start_s": 25.0, "end_s": 80.0, "cells": 1},
        ],
        "expected_s": 80.0, "ideal_s": 80.0, "serial_s": 80.0,
    }  # fmt: skip


def test_on_a_pool_the_servers_are_placed_in_waves_on_named_gpus() -> None:
    pool = GpuPool([Gpu(0, "GPU-a", "NVIDIA H200"), Gpu(1, "GPU-b", "NVIDIA H200")])
    a, b, w, huge = _config("a", 1), _config("b", 1), _config("w", 2), _config("huge", 4)
    decisions = [*_run(a, 1), *_run(b, 1, 2), *_run(w, 1), *_run(huge, 1)]
    out = schedule_preview(pool, "nvml", decisions, Estimates({1: 10.0, 2: 20.0, 4: 1.0}, 0.0))
    assert out["gpus"] == [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H200"},
                           {"index": 1, "uuid": "GPU-b", "name": "NVIDIA H200"}]  # fmt: skip
    assert out["source"] == "nvml" and out["packed"] is True
    assert out["not_runnable"] == ["huge@tp4"]
    rows = [(p["label"], p["gpus"], p["gpu_indices"], p["wave"], p["start_s"], p["end_s"],
             p["cells"]) for p in out["placements"]]  # fmt: skip
    assert rows == [
        ("w@tp2", ["GPU-a", "GPU-b"], [0, 1], 1, 0.0, 20.0, 1),
        ("b@tp1", ["GPU-a"], [0], 2, 20.0, 40.0, 2),
        ("a@tp1", ["GPU-b"], [1], 2, 20.0, 30.0, 1),
    ]
    assert out["expected_s"] == 40.0
    assert out["ideal_s"] == 35.0  # (20 x 2 + 20 + 10) GPU-s over 2 GPUs; huge left out
    assert out["serial_s"] == 51.0  # every job one after another, huge too


# --- the dry run ------------------------------------------------------------------------


def test_a_fresh_plan_runs_every_cell_and_shows_each_servers_command(
    tmp_path: Path, stand_ins: None
) -> None:
    out = dry_run(plan_at(tmp_path), options(tmp_path), validate=False)
    assert (out["plan"], out["engine"], out["engine_version"]) == ("dry", "command", "v9")
    assert out["validated"] is False and out["problems"] == [] and out["shard"] is None
    assert out["notes"] == ["flags not validated (--no-validate): no program of the plan was run"]
    assert [(c["label"], c["concurrency"], c["action"]) for c in out["cells"]] == [
        ("a@tp1", 1, "run"), ("a@tp1", 2, "run"), ("w@tp2", 1, "run"), ("w@tp2", 2, "run")
    ]  # fmt: skip
    (a, w) = out["configs"]
    assert a["command"] == ["/nonexistent/server", "--model", str(tmp_path / "m"), "--port", "0"]
    assert (
        a["label"] == "a@tp1"
        and a["concurrencies"] == [1, 2]
        and a["env"]["PYTHONUNBUFFERED"] == "1"
    )
    assert w["label"] == "w@tp2" and a["key"] != w["key"]
    assert out["workload"]["input_len"] == 1024 and set(out["cells"][0]) == {
        "key", "label", "concurrency", "action", "reason"}  # fmt: skip
    assert out["search"] is None and out["repeats"] == 1
    sched = out["schedule"]
    assert sched["source"] == "GPUDOCTOR_FAKE_GPUS" and len(sched["gpus"]) == 3
    assert [(p["label"], p["gpu_indices"]) for p in sched["placements"]] == [
        ("w@tp2", [0, 1]), ("a@tp1", [2])
    ]  # fmt: skip
    assert sched["expected_s"] == 180.0 and sched["serial_s"] == 360.0  # 60 s estimates
    assert json.loads(dumps(out)) == json.loads(json.dumps(out, default=str))
    assert dumps({"p": tmp_path}) == json.dumps({"p": str(tmp_path)}, indent=2)


def test_a_resumed_run_shows_what_is_done_and_what_is_run_again(
    tmp_path: Path, stand_ins: None
) -> None:
    plan = plan_at(tmp_path)
    first = dry_run(plan, options(tmp_path), validate=False)
    key = {(c["label"], c["concurrency"]): c["key"] for c in first["cells"]}
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"key": key[("a@tp1", 1)], "status": "ok", "tp": 1, "timings": {"cell_s": 100.0}},
            {"key": key[("a@tp1", 2)], "status": "failed", "reason": "x"},
            {"key": key[("w@tp2", 1)], "status": "crashed", "tp": 2},
            {"status": "ok"}]  # fmt: skip
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "servers.jsonl").write_text(json.dumps({"startup_s": 20.0}) + "\n")
    actions = lambda out: [(c["action"], c["reason"]) for c in out["cells"]]  # noqa: E731
    out = dry_run(plan, options(tmp_path), validate=False)
    assert actions(out) == [("done", "ok"), ("done", "failed"), ("done", "crashed"), ("run", "")]
    # learnt: TP1 cells take 100 s (the only measured one), a server 20 s to start
    assert out["schedule"]["serial_s"] == 120.0 and out["schedule"]["placements"][0]["cells"] == 1
    out = dry_run(plan, options(tmp_path, retry_failed=True), validate=False)
    assert actions(out)[:3] == [("done", "ok"), ("run", ""), ("done", "crashed")]
    out = dry_run(plan, options(tmp_path, retry_crashed=True), validate=False)
    assert actions(out)[:3] == [("done", "ok"), ("done", "failed"), ("run", "")]
    out = dry_run(plan, options(tmp_path, resume=False), validate=False)
    assert [a for a, _ in actions(out)] == ["run"] * 4


def test_a_shard_shows_only_its_cells(tmp_path: Path, stand_ins: None) -> None:
    from gpudoctor.bench.launch.schedule import in_shard

    plan = plan_at(tmp_path)
    every = [c["key"] for c in dry_run(plan, options(tmp_path), validate=False)["cells"]]
    out = dry_run(plan, options(tmp_path, shard=(2, 2)), validate=False)
    assert out["shard"] == [2, 2]
    assert [c["key"] for c in out["cells"]] == [k for k in every if in_shard(k, (2, 2))]


def test_ports_a_running_server_and_a_missing_model_are_said(
    tmp_path: Path, stand_ins: None
) -> None:
    text = PLAN.replace('version = "v9"', 'version = "v9"\nport_range = "30000-30009"')
    out = dry_run(plan_at(tmp_path, text, model=False), options(tmp_path), validate=False)
    assert (
        out["notes"][1] == "each server listens on a free port of 30000-30009 (engine.port_range)"
    )
    assert out["problems"] == [f"{tmp_path / 'plan.toml'}: model.path {tmp_path / 'm'} does not "
                               "exist; fix the path (relative paths are relative to the plan file)"]  # fmt: skip
    external = (
        PLAN.split("[[configs]]")[0]
        .replace(
            'command = ["/nonexistent/server", "--model", "{model}", "--port", "{port}"]',
            'server_url = "http://127.0.0.1:30000"',
        )
        .replace('name = "command"', 'name = "sglang"')
        + '[[configs]]\nname = "live"\n'
    )
    out = dry_run(plan_at(tmp_path, external), options(tmp_path), validate=False)
    assert out["notes"][1] == ("no server is started: every cell is measured against the running"
                               " server at http://127.0.0.1:30000 (engine.server_url)")  # fmt: skip
    assert out["configs"][0]["command"] == [] and out["configs"][0]["env"] == {}
    assert out["schedule"]["packed"] is False  # nobody places a running server


def test_hardware_the_host_lacks_is_a_note_not_a_failure(tmp_path: Path, stand_ins: None) -> None:
    text = PLAN.replace("[axes]", "[hardware]\ngpus = [0, 7]\n[axes]")
    out = dry_run(plan_at(tmp_path, text), options(tmp_path), validate=False)
    assert out["notes"][1].startswith("no GPU pool: ")
    assert "[hardware] gpus names GPU 7, but this host has 0, 1, 2" in out["notes"][1]
    assert out["schedule"]["packed"] is False


def test_an_out_that_is_a_link_is_refused_in_one_line(tmp_path: Path, stand_ins: None) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CampaignError) as err:
        dry_run(plan_at(tmp_path), options(tmp_path), validate=False)
    assert "\n" not in str(err.value) and "run" in str(err.value)


def test_validation_of_an_engine_not_installed_is_a_note(tmp_path: Path, stand_ins: None) -> None:
    text = PLAN.replace('name = "command"', f'name = "sglang"\npython = "{sys.executable}"')
    text = text.replace(
        'command = ["/nonexistent/server", "--model", "{model}", "--port", "{port}"]\n', ""
    )
    out = dry_run(plan_at(tmp_path, text), options(tmp_path), validate=True)
    assert out["validated"] is True and out["engine_version"] is None
    assert out["notes"] == [f"flags not validated: sglang is not installed for {sys.executable}"
                            " (pip install sglang)"]  # fmt: skip
    assert out["gpu_arch"] == "cpu"


def test_repeated_cells_show_their_repeat(tmp_path: Path, stand_ins: None) -> None:
    out = dry_run(plan_at(tmp_path, "repeats = 2\n" + PLAN), options(tmp_path), validate=False)
    assert out["repeats"] == 2 and len(out["cells"]) == 8
    assert [(c["label"], c["concurrency"], c["repeat"]) for c in out["cells"][:4]] == [
        ("a@tp1", 1, 0), ("a@tp1", 1, 1), ("a@tp1", 2, 0), ("a@tp1", 2, 1)
    ]  # fmt: skip
    assert out["cells"][0]["group"] == out["cells"][1]["group"] != out["cells"][2]["group"]


def test_validation_of_a_command_not_there_is_a_note(tmp_path: Path, stand_ins: None) -> None:
    """A `command` engine whose program is missing: the dry run still shows the matrix, and
    its note names the program (no empty package name), as for an engine not installed."""
    out = dry_run(plan_at(tmp_path), options(tmp_path), validate=True)
    assert out["notes"] == ["flags not validated: command: /nonexistent/server not found"]
    assert out["engine_version"] is None and len(out["cells"]) == 4
