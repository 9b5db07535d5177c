"""What a campaign does before its servers, in-process and fast: ``gpudoctor check`` as
the preflight (the real catalogue on this machine, which has no NVIDIA driver), its
verdict recorded and its FAILs in one line, ``--no-preflight``; the weights step without
a repo; the engine inspected (flags against a real ``--help``, a plan's running server,
the quirks table); the GPU pool (the product's ``GPUDOCTOR_FAKE_GPUS`` stand-ins: this
machine has no GPU)."""

from __future__ import annotations

import calendar
import io
import re
import stat
import time
from pathlib import Path

import pytest

from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch import prep
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.slots import Gpu
from gpudoctor.bench.launch.steps import CampaignError, EngineMissing
from gpudoctor.bench.plan import Plan
from tests.bench.launch.runner_support import REPO, REVISION, write_mirror, write_plan

DRIVER_REMEDY = "On the host: `modprobe nvidia && nvidia-modprobe -u -c=0`"


def _plan(tmp_path: Path, body: str = "", tp: str = "", args: str = "") -> Plan:
    conf = '[[configs]]\nname = "a"\n' + (f"tp = {tp}\n" if tp else "") + args
    return write_plan(tmp_path, body + conf, command=[str(tmp_path / "server"), "--port", "{port}"])


def _preflight(plan: Plan, arch: str = "cpu", model_ready: bool = True) -> tuple[list, str]:
    records: list[dict] = []
    shown = io.StringIO()
    try:
        prep.preflight(
            plan, arch, "config a@tp1", model_ready, PlainReporter(shown), records.append
        )
    except CampaignError as exc:
        return records, f"error: {exc}\n{shown.getvalue()}"
    return records, shown.getvalue()


def test_a_failing_check_stops_with_every_fail_and_its_remedy(tmp_path: Path, asked: list) -> None:
    plan = _plan(tmp_path, '[preflight]\nonly = ["driver"]\n')
    records, shown = _preflight(plan)
    error, note = shown.splitlines()[:2]
    assert error.startswith(
        "error: preflight (config a@tp1) failed: driver.loaded [kernel module]: No NVIDIA kernel"
    )
    assert f" -> {DRIVER_REMEDY}" in error
    assert note.startswith("bench: preflight FAIL: driver.loaded [kernel module]: No NVIDIA")
    [record] = records
    assert record["when"] == "config a@tp1" and record["status"] == "FAIL"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["at"])
    assert isinstance(record["duration_s"], float) and record["duration_s"] >= 0
    assert round(record["duration_s"], 3) == record["duration_s"]  # milliseconds
    assert [f["check"] for f in record["findings"]] == ["driver.loaded", "driver.userspace_match"]
    assert asked[0].only == ("driver",)


def test_a_fail_without_a_remedy_has_no_arrow_and_two_fails_are_joined(tmp_path: Path) -> None:
    model = tmp_path / "m"
    plan = _plan(tmp_path, '[preflight]\nonly = ["driver", "model"]\n')
    _, shown = _preflight(plan)
    error = shown.splitlines()[0]
    assert error.count("; model.present [") == 1
    assert error.endswith(
        f"model.present [{model}]: {model} is incomplete: config.json missing; no safetensors"
        f" weights and no index. -> gpudoctor weights ensure <org/model> --to {model}"
    )
    assert [line.split(":")[0] for line in shown.splitlines()[1:]] == ["bench"] * 2


PLUGIN = """
from gpudoctor.model import Severity
from gpudoctor.registry import check

@check(id="widgetry.present", title="The widget is there", severity=Severity.HIGH,
       proves="the widget is there", remediation="Install the widget.")
def widget_present(ctx):
    yield ctx.fail("widget", "the widget is missing")
"""


def test_a_fail_whose_finding_names_no_remedy_is_shown_without_an_arrow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real installed plug-in distribution (``gpudoctor.checks`` entry point) whose
    check FAILs with no remedy of its own in the finding."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "launch_a_widgetry.py").write_text(PLUGIN)
    dist = site / "launch_a_widgetry-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: launch-a-widgetry\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.checks]\nwidgetry = launch_a_widgetry\n")
    monkeypatch.syspath_prepend(str(site))
    plan = _plan(tmp_path, '[preflight]\nonly = ["widgetry"]\n')
    _, shown = _preflight(plan)
    assert shown.splitlines()[0] == (
        "error: preflight (config a@tp1) failed: widgetry.present [widget]: the widget is missing"
    )


def test_a_model_about_to_be_restored_is_left_out_of_the_checks(
    tmp_path: Path, asked: list
) -> None:
    plan = _plan(tmp_path, '[preflight]\nonly = ["model"]\n')
    records, shown = _preflight(plan, model_ready=False)
    assert shown == "" and records[0]["status"] != "FAIL"
    assert [f["status"] for f in records[0]["findings"]] == ["SKIP"]
    assert asked[0].model_dirs == ()
    _preflight(plan, model_ready=True)
    assert asked[1].model_dirs == (str(tmp_path / "m"),)


def test_a_passing_preflight_records_its_verdict_without_passes(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[preflight]\nonly = ["proc"]\n')
    records, shown = _preflight(plan)
    assert shown == "" and records[0]["status"] == "PASS" and records[0]["findings"] == []


def test_the_gpus_expected_are_the_largest_tp_unless_set_or_on_a_cpu(
    tmp_path: Path, asked: list
) -> None:
    plan = _plan(tmp_path, '[preflight]\nonly = ["proc"]\n', tp="[1, 2]")
    _preflight(plan, arch="sm_90")
    _preflight(plan, arch="cpu")
    assert [o.expect_gpus for o in asked] == [2, None]
    plan = _plan(tmp_path, '[preflight]\nonly = ["proc"]\nexpect_gpus = 8\n', tp="[1, 2]")
    _preflight(plan, arch="sm_90")
    _preflight(plan, arch="cpu")
    assert [o.expect_gpus for o in asked[2:]] == [8, 8]


def test_no_preflight_runs_nothing(tmp_path: Path, asked: list) -> None:
    records: list[dict] = []
    plan = _plan(tmp_path, '[preflight]\nonly = ["driver"]\n')
    reporter = PlainReporter(io.StringIO())
    prep.Preflight(plan, "cpu", False, reporter, records.append)("campaign")
    off = _plan(tmp_path, '[preflight]\nenabled = false\nonly = ["driver"]\n')
    prep.Preflight(off, "cpu", True, reporter, records.append)("campaign")
    assert records == [] and asked == []
    arch_of_plan = _plan(tmp_path, '[preflight]\nonly = ["proc"]\n', tp="[2]")
    prep.Preflight(arch_of_plan, "cpu", True, reporter, records.append)("campaign")
    prep.Preflight(arch_of_plan, "sm_90", True, reporter, records.append)("campaign")
    assert [o.expect_gpus for o in asked] == [None, 2]  # no GPU count asked on a CPU host
    del asked[:], records[:]
    with pytest.raises(CampaignError, match=r"^preflight \(campaign\) failed: driver.loaded"):
        prep.Preflight(plan, "cpu", True, reporter, records.append)("campaign")
    with pytest.raises(CampaignError, match=r"^preflight \(config b\) failed: driver.loaded"):
        prep.Preflight(plan, "cpu", True, reporter, records.append)("config b", False)
    assert [r["when"] for r in records] == ["campaign", "config b"]
    assert [o.model_dirs for o in asked] == [(plan.model.local_dir,), ()]


def test_a_plan_without_a_repo_has_no_weights_step(tmp_path: Path) -> None:
    shown = io.StringIO()
    assert prep.ensure_weights(_plan(tmp_path), PlainReporter(shown)) is None
    assert shown.getvalue() == ""


# --- the engine ----------------------------------------------------------------------------


def _server_program(tmp_path: Path) -> None:
    program = tmp_path / "server"
    program.write_text("#!/bin/sh\necho 'usage: server [--port P] [--threads N]'\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)


def test_the_engine_is_inspected_before_anything_runs(tmp_path: Path) -> None:
    _server_program(tmp_path)
    cache = tmp_path / "help-cache"
    plain = _plan(tmp_path)  # no args: nothing to check against a --help, none is run
    found = prep.inspect_engine(plain, engine_for(plain.engine), cache, tmp_path / "q.toml")
    assert found.help_text == "" and not cache.exists()
    plan = _plan(tmp_path, args="args = { threads = 2 }\n")
    found = prep.inspect_engine(plan, engine_for(plan.engine), cache, tmp_path / "quirks.toml")
    assert found.help_text == "usage: server [--port P] [--threads N]\n"
    [cached] = cache.iterdir()  # the next launch reads it instead of running --help
    assert cached.read_text() == found.help_text and cached.name.startswith("command-v7-")
    assert (found.version, found.arch) == ("v7", "cpu")
    assert [q.source for q in found.quirks] == ["shipped"] * len(found.quirks)
    (tmp_path / "quirks.toml").write_text(
        '[[quirk]]\nid = "mine"\narch = "*"\nengine = "*"\nreason = "hangs"\n'
    )
    found = prep.inspect_engine(plan, engine_for(plan.engine), None, tmp_path / "quirks.toml")
    assert "mine" in [q.id for q in found.quirks]


def test_an_unreadable_quirks_table_or_a_missing_engine_stops_in_one_line(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    with pytest.raises(EngineMissing, match="not found"):
        prep.inspect_engine(plan, engine_for(plan.engine), None, tmp_path / "quirks.toml")
    _server_program(tmp_path)
    (tmp_path / "quirks.toml").write_text("[[quirk]\n")
    with pytest.raises(CampaignError, match=re.escape(str(tmp_path / "quirks.toml"))):
        prep.inspect_engine(plan, engine_for(plan.engine), None, tmp_path / "quirks.toml")


def _running_server_plan(tmp_path: Path, version: str = "") -> Plan:
    (tmp_path / "m").mkdir(exist_ok=True)
    path = tmp_path / "attach.toml"
    path.write_text(
        'name = "attach"\n[model]\npath = "m"\n[engine]\nname = "vllm"\n'
        'server_url = "http://127.0.0.1:9"\n'
        + (f'version = "{version}"\n' if version else "")
        + '[axes]\nconcurrency = [1]\n[hardware]\ngpus = 2\n[[configs]]\nname = "a"\n'
    )
    from gpudoctor.bench.plan import load_plan

    return load_plan(path)


def test_a_running_server_has_nothing_to_check_nor_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPUS", "GPU-a,GPU-b,GPU-c")
    plan = _running_server_plan(tmp_path, "0.9.1")
    found = prep.inspect_engine(plan, engine_for(plan.engine), None, tmp_path / "quirks.toml")
    assert (found.help_text, found.version, found.arch) == ("", "0.9.1", "cpu")
    assert (
        prep.inspect_engine(
            _running_server_plan(tmp_path), engine_for(plan.engine), None, tmp_path / "q.toml"
        ).version
        is None
    )
    assert prep.gpu_pool(plan) == (None, None)


# --- the GPU pool --------------------------------------------------------------------------


@pytest.fixture
def no_stand_ins(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("GPUDOCTOR_FAKE_GPUS", "GPUDOCTOR_FAKE_GPU_TOPO", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_without_a_gpu_the_campaign_runs_one_server_at_a_time(
    tmp_path: Path, no_stand_ins: pytest.MonkeyPatch
) -> None:
    assert prep.gpu_pool(_plan(tmp_path)) == (None, None)
    for hardware in ("gpus = 2", "gpus = [0]"):
        plan = _plan(tmp_path, f"[hardware]\n{hardware}\n")
        with pytest.raises(CampaignError) as caught:
            prep.gpu_pool(plan)
        assert str(caught.value) == "[hardware] gpus is set, but no GPU was found (NVML)"


def test_the_pool_is_the_host_gpus_capped_by_the_plan(
    tmp_path: Path, no_stand_ins: pytest.MonkeyPatch
) -> None:
    no_stand_ins.setenv("GPUDOCTOR_FAKE_GPUS", "GPU-a,GPU-b,GPU-c")
    topo = tmp_path / "topo.txt"
    topo.write_text(
        "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4\tSYS\nGPU1\tNV4\t X \tSYS\nGPU2\tSYS\tSYS\t X \n"
    )
    no_stand_ins.setenv("GPUDOCTOR_FAKE_GPU_TOPO", str(topo))
    pool, source = prep.gpu_pool(_plan(tmp_path))
    assert source == "GPUDOCTOR_FAKE_GPUS" and pool is not None
    assert [g.uuid for g in pool.gpus] == ["GPU-a", "GPU-b", "GPU-c"]
    assert pool.links[(0, 1)] == "NV4"
    pool, _ = prep.gpu_pool(_plan(tmp_path, "[hardware]\ngpus = [2, 0]\n"))
    assert pool is not None and [g.uuid for g in pool.gpus] == ["GPU-c", "GPU-a"]
    pool, _ = prep.gpu_pool(_plan(tmp_path, "[hardware]\ngpus = 2\n"))
    assert pool is not None and [g.uuid for g in pool.gpus] == ["GPU-a", "GPU-b"]
    plan = _plan(tmp_path, "[hardware]\ngpus = [1, 5]\n")
    with pytest.raises(CampaignError) as caught:
        prep.gpu_pool(plan)
    assert (
        str(caught.value)
        == f"{plan.source}: [hardware] gpus names GPU 5, but this host has 0, 1, 2"
    )
    assert isinstance(pool.gpus[0], Gpu)


# --- the weights step ----------------------------------------------------------------------


def _repo_plan(tmp_path: Path, target: Path, revision: str = REVISION, mirror: bool = True) -> Plan:
    where = f'mirror = "{tmp_path / "mirror"}"\n' if mirror else ""
    (tmp_path / "plan.toml").write_text(
        f'name = "w"\n[model]\nrepo = "{REPO}"\ndir = "{target}"\nrevision = "{revision}"\n'
        f'{where}[engine]\nname = "vllm"\n'
        '[axes]\nconcurrency = [1]\n[[configs]]\nname = "a"\n'
    )
    from gpudoctor.bench.plan import load_plan

    return load_plan(tmp_path / "plan.toml")


def test_the_weights_step_restores_the_model_from_the_mirror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_mirror(tmp_path / "mirror")
    target = tmp_path / "shm" / "tiny"
    shown = io.StringIO()
    monkeypatch.setenv("TZ", "XST-9")  # nine hours east of UTC: the stamp stays UTC
    time.tzset()
    try:
        before = time.time()
        done = prep.ensure_weights(_repo_plan(tmp_path, target), PlainReporter(shown))
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert done is not None
    at = calendar.timegm(time.strptime(done["at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert int(before) <= at <= time.time()  # UTC, not nine hours ahead
    assert done is not None
    assert {k: done[k] for k in ("repo", "dir", "action", "source", "files")} == {
        "repo": REPO, "dir": str(target), "action": "restored", "source": "mirror", "files": 2
    }  # fmt: skip
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", done["at"])
    assert (target / "model.safetensors").read_bytes() == bytes(range(256)) * 64
    assert shown.getvalue().splitlines() == [
        f"bench: weights: ensuring {REPO} in {target}",
        "bench: weights: restored (mirror, 2 files)",
    ]
    again = prep.ensure_weights(_repo_plan(tmp_path, target), PlainReporter(io.StringIO()))
    assert again is not None and (again["action"], again["source"]) == ("none", "local")


def test_a_failed_weights_step_is_one_campaign_error(tmp_path: Path) -> None:
    write_mirror(tmp_path / "mirror")
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CampaignError, match=r"^weights: ") as caught:
        prep.ensure_weights(
            _repo_plan(tmp_path, tmp_path / "file" / "tiny"), PlainReporter(io.StringIO())
        )
    assert str(tmp_path / "file") in str(caught.value)


def test_the_preflight_time_is_utc_whatever_the_local_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, '[preflight]\nonly = ["proc"]\n')
    monkeypatch.setenv("TZ", "XST-9")  # nine hours east of UTC
    time.tzset()
    try:
        before = time.time()
        records, _ = _preflight(plan)
        after = time.time()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    at = calendar.timegm(time.strptime(records[0]["at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert int(before) <= at <= after


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the Hub client offline (``HF_HUB_OFFLINE=1``; this machine has no network), its
    endpoint a closed loopback port besides; return the start of the error it gives."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return "weights: offline (HF_HUB_OFFLINE is set) and no complete local copy or mirror of"


def test_a_revision_the_mirror_lacks_is_asked_of_the_hub(tmp_path: Path, no_hub: str) -> None:
    write_mirror(tmp_path / "mirror")
    plan = _repo_plan(tmp_path, tmp_path / "tiny", revision="d" * 40)
    with pytest.raises(CampaignError) as caught:
        prep.ensure_weights(plan, PlainReporter(io.StringIO()))
    assert str(caught.value).startswith(no_hub)
    assert not (tmp_path / "tiny").exists()


def test_without_a_mirror_the_weights_come_from_the_hub(tmp_path: Path, no_hub: str) -> None:
    plan = _repo_plan(tmp_path, tmp_path / "tiny", mirror=False)
    with pytest.raises(CampaignError) as caught:
        prep.ensure_weights(plan, PlainReporter(io.StringIO()))
    assert str(caught.value) == f"{no_hub} {REPO}"
