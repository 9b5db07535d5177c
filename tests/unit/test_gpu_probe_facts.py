"""gpudoctor/facts/gpu.py: running the GPU probe on a host and reading what it printed.

A GPU cannot exist here, so the probe's interpreter is a real executable in tmp_path that
prints what the real probe prints on a GPU machine (JSON lines, one per stage) and records
the arguments it was given; the recorded machine (tests/fakes/recorded_host.py) stands for a
remote host."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gpudoctor import early_probe
from gpudoctor.facts.gpu import (
    NO_PYTHON,
    STAGES,
    GpuProbe,
    StageResult,
    adopt_early_probe,
    parse_probe_output,
    probe_source,
    python_missing,
    run_gpu_probe,
)
from gpudoctor.hosts.local import LocalHost
from tests.fakes.recorded_host import RecordedHost

PROBE_FILE = Path(__file__).resolve().parents[2] / "gpudoctor" / "probes" / "gpu_probe.py"


@pytest.fixture(autouse=True)
def no_leftover_child():
    """Every test leaves no early probe child behind."""
    yield
    early_probe.discard()


def gpu_python(tmp_path: Path, exit_code: int = 0, stderr: str = "") -> Path:
    """Write an executable standing for ``python3`` on a GPU machine: it prints the probe's
    stages (``cuda`` carries $WHO, the environment it ran in), writes its flags, the probe's
    source and the arguments after it to flags.txt, source.txt and args.txt and ``stderr`` to stderr, then exits ``exit_code``."""
    script = tmp_path / "python3"
    (tmp_path / "stderr.txt").write_text(stderr)
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s" "$1 $2 $3" > {tmp_path}/flags.txt\n'
        f'printf "%s" "$4" > {tmp_path}/source.txt\n'
        "shift 4\n"
        f'printf "%s\\n" "$@" > {tmp_path}/args.txt\n'
        'echo \'{"stage": "env", "env": {}}\'\n'
        'echo \'{"stage": "nvml", "started": true}\'\n'
        'echo "{\\"stage\\": \\"cuda\\", \\"init\\": 0, \\"who\\": \\"$WHO\\"}"\n'
        f"cat {tmp_path}/stderr.txt >&2\n"
        f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


# ---------------------------------------------------------------------------- parsing


def test_each_stage_line_becomes_a_finished_stage_with_its_data():
    stdout = (
        '{"stage": "env", "env": {"CUDA_VISIBLE_DEVICES": "0"}}\n'
        '{"stage": "cuda", "init": 0, "device_count": 2}\n'
    )
    stages = parse_probe_output(stdout)
    assert stages == {
        "env": StageResult("env", {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, True, True),
        "cuda": StageResult("cuda", {"init": 0, "device_count": 2}, True, True),
    }


def test_a_stage_that_only_announced_its_start_is_started_not_finished():
    stages = parse_probe_output('{"stage": "cuda", "started": true}\n')
    assert stages == {"cuda": StageResult("cuda", {}, started=True, finished=False)}


def test_a_later_line_of_a_stage_replaces_its_start():
    stdout = '{"stage": "cuda", "started": true}\n{"stage": "cuda", "init": 3}\n'
    assert parse_probe_output(stdout)["cuda"] == StageResult("cuda", {"init": 3}, True, True)


@pytest.mark.parametrize(
    "line",
    [
        '{"stage": "nvml", "started": false}',  # not a start: a result saying so
        '{"stage": "nvml", "started": true, "init": 0}',  # a result that also says started
        '{"stage": "nvml", "started": 1}',  # not the JSON true a start line carries
    ],
)
def test_a_line_with_more_than_a_start_is_a_result(line):
    stage = parse_probe_output(line + "\n")["nvml"]
    assert stage.started and stage.finished
    assert stage.data == {k: v for k, v in json.loads(line).items() if k != "stage"}


def test_lines_that_are_not_stage_objects_are_skipped():
    stdout = (
        "Traceback (most recent call last):\n"
        "[1, 2]\n"
        '"text"\n'
        '{"init": 0}\n'
        "{broken\n"
        '{"stage": 7, "x": 1}\n'
    )
    assert parse_probe_output(stdout) == {"7": StageResult("7", {"x": 1}, True, True)}


def test_an_absent_stage_is_an_empty_one_that_never_started():
    probe = GpuProbe(stages={"env": StageResult("env", {"a": 1}, True, True)})
    assert probe.stage("cuda") == StageResult("cuda", {}, started=False, finished=False)
    assert probe.stage("env").data == {"a": 1}


# ---------------------------------------------------------------------------- how it ran


def privilege(data: dict) -> GpuProbe:
    return GpuProbe(stages={"privilege": StageResult("privilege", data, True, True)})


def test_ran_as_nobody_says_root_was_dropped_before_the_driver_loaded():
    probe = privilege({"uid": 65534, "groups": [0, 195], "dropped": True})
    assert probe.ran_as() == (
        "the CUDA/NVML probe ran as uid 65534 (nobody) with groups 0,195: root dropped "
        "before the driver library loaded, so it cannot rewrite device nodes"
    )


def test_ran_as_nobody_without_groups_says_none():
    assert "with groups none:" in privilege({"uid": 65534, "dropped": True}).ran_as()
    assert "with groups none:" in privilege({"uid": 1, "groups": [], "dropped": 1}).ran_as()


def test_ran_as_root_says_why_the_drop_failed():
    probe = privilege({"uid": 0, "groups": [0], "dropped": False, "error": "EPERM"})
    assert probe.ran_as() == (
        "the CUDA/NVML probe ran as root (dropping to nobody failed: EPERM): the driver "
        "library may rewrite device nodes"
    )
    assert "(dropping to nobody failed: ?)" in privilege({"uid": 0}).ran_as()


def test_ran_as_another_user_names_its_uid_and_groups():
    probe = privilege({"uid": 1000, "groups": [44, 1000]})
    assert probe.ran_as() == "the CUDA/NVML probe ran as uid 1000 with groups 44,1000"
    assert privilege({"uid": 1000}).ran_as().endswith("with groups none")


def test_ran_as_is_empty_when_the_probe_did_not_say():
    assert GpuProbe(stages={}).ran_as() == ""
    assert privilege({}).ran_as() == ""


def test_hung_in_names_the_first_stage_started_and_not_finished():
    stages = parse_probe_output(
        '{"stage": "env", "env": {}}\n{"stage": "nvml", "started": true}\n'
        '{"stage": "cuda", "started": true}\n'
    )
    assert GpuProbe(stages=stages, timed_out=True).hung_in() == "nvml"
    assert GpuProbe(stages=stages, timed_out=False).hung_in() is None


def test_hung_in_is_none_when_every_stage_finished():
    stages = parse_probe_output('{"stage": "env", "env": {}}\n')
    assert GpuProbe(stages=stages, timed_out=True).hung_in() is None


# ---------------------------------------------------------------------------- running it


def test_probe_source_is_the_probe_script():
    assert probe_source() == PROBE_FILE.read_text()


def test_a_host_without_python_is_not_probed():
    host = RecordedHost(probe_lines=[{"stage": "cuda", "init": 0}])
    host.has_python = False
    assert python_missing(host)
    assert not python_missing(RecordedHost())
    assert run_gpu_probe(host, 12.5) == GpuProbe(
        stages={}, returncode=127, stderr=NO_PYTHON, timeout_s=12.5
    )
    assert NO_PYTHON == "python3 not found in the CT"


def test_the_probe_runs_isolated_with_its_stages_and_reports_how_it_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("WHO", "here")
    monkeypatch.delenv(early_probe.KEEP_ROOT_ENV, raising=False)
    host = LocalHost(python=str(gpu_python(tmp_path, exit_code=3, stderr="e" * 10 + "x" * 2000)))
    probe = run_gpu_probe(host, 30)
    assert (tmp_path / "flags.txt").read_text() == "-I -S -c"
    assert (tmp_path / "source.txt").read_text() == PROBE_FILE.read_text()
    assert (tmp_path / "args.txt").read_text().split() == list(STAGES)
    assert probe.stage("cuda").data == {"init": 0, "who": "here"}
    assert probe.stage("nvml") == StageResult("nvml", {}, started=True, finished=False)
    assert probe.returncode == 3 and probe.timed_out is False
    assert probe.stderr == "x" * 2000  # the tail: the last 2000 characters
    assert probe.timeout_s == 30 and probe.duration_s > 0


def test_a_probe_killed_at_its_timeout_says_so(tmp_path):
    script = tmp_path / "python3"
    script.write_text('#!/bin/sh\necho \'{"stage": "cuda", "started": true}\'\nexec sleep 60\n')
    script.chmod(0o755)
    probe = run_gpu_probe(LocalHost(python=str(script)), 0.5)
    assert probe.timed_out is True
    assert probe.hung_in() == "cuda"


def test_a_remote_host_runs_the_probe_with_its_own_python():
    host = RecordedHost(probe_lines=[{"stage": "cuda", "init": 0, "device_count": 1}])
    host.python = "/usr/bin/python3.11"
    probe = run_gpu_probe(host, 5)
    assert probe.stage("cuda").data == {"init": 0, "device_count": 1}
    assert (probe.returncode, probe.duration_s, probe.timed_out) == (0, 0.2, False)


def test_the_child_started_at_process_start_is_adopted_instead_of_a_second_run(
    tmp_path, monkeypatch
):
    """``gpudoctor check`` starts the probe before parsing its options (early_probe); the
    check then reads that child's output rather than running the probe again."""
    host = LocalHost(python=str(gpu_python(tmp_path)))
    argv = [host.python, "-I", "-S", "-c", probe_source(), *early_probe.probe_stages()]
    monkeypatch.setenv("WHO", "early")
    early_probe._PENDING.append(early_probe.spawn(argv))
    monkeypatch.setenv("WHO", "late")
    assert run_gpu_probe(host, 30).stage("cuda").data["who"] == "early"
    assert run_gpu_probe(host, 30).stage("cuda").data["who"] == "late"  # adopted once


def test_a_remote_host_never_adopts_the_local_early_child(tmp_path, monkeypatch):
    script = str(gpu_python(tmp_path))
    argv = [script, "-I", "-S", "-c", probe_source(), *early_probe.probe_stages()]
    monkeypatch.setenv("WHO", "early")
    early_probe._PENDING.append(early_probe.spawn(argv))
    remote = RecordedHost(probe_lines=[{"stage": "cuda", "init": 0, "who": "remote"}])
    remote.python = script
    assert adopt_early_probe(remote, argv, 30) is None
    assert run_gpu_probe(remote, 30).stage("cuda").data["who"] == "remote"
    assert len(early_probe._PENDING) == 1  # still there for the local check


def test_adopting_gives_the_early_childs_exit_status_and_output(tmp_path, monkeypatch):
    host = LocalHost(python=str(gpu_python(tmp_path, exit_code=4, stderr="boom")))
    argv = [host.python, "-I", "-S", "-c", probe_source(), *early_probe.probe_stages()]
    monkeypatch.setenv("WHO", "early")
    early_probe._PENDING.append(early_probe.spawn(argv))
    result = adopt_early_probe(host, argv, 30)
    assert result is not None
    assert result.argv == tuple(argv)
    assert (result.returncode, result.stderr, result.timed_out) == (4, "boom", False)
    assert '"who": "early"' in result.stdout
