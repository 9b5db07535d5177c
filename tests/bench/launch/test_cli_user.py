"""`gpudoctor bench` as a user runs it, in real subprocesses: the trust warning, a dry run
that runs nothing, a missing model path, unwritable outputs, the closing table."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write

TRUST = "a plan runs the programs it names: run only plans you trust"


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip


def _flat(text: str) -> str:
    return " ".join(text.split()).lower()


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines, proc.stdout
    return lines[-1]


def test_help_says_a_plan_is_code() -> None:
    assert TRUST in _flat(_cli("--help").stdout)
    run_help = _flat(_cli("run", "--help").stdout)
    assert TRUST in run_help and "--no-validate" in run_help


def _marker_engine(tmp_path: Path, marker: Path) -> Path:
    """Return a program that creates ``marker`` whenever it runs (any arguments)."""
    script = tmp_path / "engine-bin"
    script.write_text(f"#!/bin/sh\ntouch {marker}\necho '--some-flag  a flag'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize("engine", ["command", "sglang"])
def test_dry_run_no_validate_runs_no_program_of_the_plan(
    tmp_path: Path, tiny_model_dir: Path, engine: str
) -> None:
    """Attack: a plan from someone else names a program (the engine command, or
    `engine.python`); `bench --dry-run` ran it (`--help`, the version query) to validate
    flags. With --no-validate nothing of the plan runs: the marker never appears."""
    marker = tmp_path / "ran"
    program = _marker_engine(tmp_path, marker)
    if engine == "command":
        text = stub_plan(tiny_model_dir).replace(f'"{sys.executable}", ', f'"{program}", ', 1)
    else:
        text = (f'[model]\npath = "{tiny_model_dir}"\n[engine]\nname = "sglang"\n'
                f'python = "{program}"\n[[configs]]\nname = "a"\nargs = {{ some-flag = 1 }}\n')  # fmt: skip
    plan = write(tmp_path, text)
    proc = _cli(str(plan), "--dry-run", "--no-validate", "--json", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert not marker.exists()
    assert result["cells"] and all(c["action"] == "run" for c in result["cells"])
    assert str(program) in result["configs"][0]["command"][0]
    assert any("no program of the plan was run" in n for n in result["notes"])
    _cli(str(plan), "--dry-run", "--json", "--out", str(tmp_path / "o"))  # validates
    assert marker.exists()  # the same plan without --no-validate does run it


def test_no_validate_does_not_call_an_unchecked_engine_not_installed(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Issue 26.11: `--dry-run --no-validate` said "transformers (not installed)" although
    it is installed: without validation the version is not asked, and it says so."""
    text = f'[model]\npath = "{tiny_model_dir}"\n[engine]\nname = "transformers"\n'
    plan = write(tmp_path, text)
    proc = _cli(str(plan), "--dry-run", "--no-validate", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert "not installed" not in first and "version not checked (--no-validate)" in first
    as_json = json.loads(_cli(str(plan), "--dry-run", "--no-validate", "--json").stdout)
    assert as_json["validated"] is False and as_json["engine_version"] is None


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("args = { port = 8000 }", "engine.args.port: --port is set by gpudoctor"),
        ('[[configs]]\nname = "a"\nargs = { model = "x" }', "configs[0].args.model: --model is set by gpudoctor"),
        ("[axes]\nconcurrency = [1000000000000000000000000000000]", "axes.concurrency: must be at most 65536, got 1e+30"),
        ("[axes]\nconcurrency = { 1 = [100000] }", "axes.concurrency.1: must be at most 65536, got 100000"),
        ("[workload]\nnum_prompts = 100000000000", "workload.num_prompts: must be at most 10000000"),
        ("[workload]\nrequest_rate = nan", "workload.request_rate: must be a number between 0 and inf, got nan"),
        ("[limits]\ncell_timeout_s = inf", "limits.cell_timeout_s: must be at most 2592000, got inf"),
        ("[slo]\nttft_ms = -1", "slo.ttft_ms: must be > 0, got -1"),
    ],
)  # fmt: skip
def test_static_plan_checks_run_with_and_without_validation(
    tmp_path: Path, tiny_model_dir: Path, body: str, needle: str
) -> None:
    """Issue 26.9: a plan setting `port` or `model` in `args`, `concurrency = [1e30]`-like
    numbers, nan and inf were accepted by `--dry-run --no-validate` (and the reserved flag
    read "did you mean (set by gpudoctor; remove it)?" with validation). Every static check
    runs when the plan is read, in both modes, with one line naming the key."""
    plan = write(
        tmp_path, f'[model]\npath = "{tiny_model_dir}"\n[engine]\nname = "transformers"\n{body}\n'
    )
    for mode in (("--no-validate",), ()):
        proc = _cli(str(plan), "--dry-run", *mode, "--out", str(tmp_path / "o"))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        line = _one_line_error(proc)
        assert needle in line and "did you mean" not in line, line


def test_a_named_file_that_does_not_exist_is_an_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Issue 26.9: `--quirks /nonexistent` was ignored (a typo meant the local table was not
    read); a plan's dataset_path that does not exist is a problem in both dry-run modes."""
    plan = write(tmp_path, f'[model]\npath = "{tiny_model_dir}"\n[engine]\nname = "transformers"\n')
    for mode in (("--no-validate",), ()):
        proc = _cli(str(plan), "--dry-run", *mode, "--quirks", str(tmp_path / "nonexistent"))
        assert proc.returncode == 2, proc.stderr
        assert "nonexistent" in _one_line_error(proc) and "does not exist" in proc.stderr
    data = write(tmp_path, f'[model]\npath = "{tiny_model_dir}"\n[engine]\nname = "transformers"\n'
                 f'[workload]\nkind = "jsonl"\ndataset_path = "{tmp_path}/gone.jsonl"\n', "data.toml")  # fmt: skip
    proc = _cli(str(data), "--dry-run", "--no-validate")
    assert proc.returncode == 1 and "workload.dataset_path" in _one_line_error(proc)


def test_no_validate_needs_dry_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    proc = _cli(str(write(tmp_path, stub_plan(tiny_model_dir))), "--no-validate")
    assert proc.returncode == 2 and "--no-validate only goes with --dry-run" in proc.stderr


def test_dry_run_flags_a_model_path_that_does_not_exist(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    missing = tmp_path / "no-such-model"
    plan = write(tmp_path, stub_plan(tiny_model_dir).replace(str(tiny_model_dir), str(missing)))
    proc = _cli(str(plan), "--dry-run", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert f"PROBLEM: {plan}: model.path {missing} does not exist" in proc.stdout
    assert "does not exist" in _one_line_error(proc)
    proc = _cli(str(plan), "--dry-run", "--json", "--out", str(tmp_path / "o"))
    as_json = json.loads(proc.stdout)  # one document
    assert proc.returncode == 1 and as_json["ok"] is False and str(missing) in as_json["error"]
    assert as_json["problems"] and str(missing) in as_json["problems"][0]
    real = _cli(str(plan), "--out", str(tmp_path / "o"))  # a real run refuses before starting
    assert real.returncode == 1 and "does not exist" in _one_line_error(real)
    assert not (tmp_path / "o").exists()


def test_unwritable_out_is_one_line_before_any_work(tmp_path: Path, tiny_model_dir: Path) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir))
    for args in ((str(plan), "--out", "/proc/x"), ("run", str(plan), "--out", "/proc/x/y")):
        proc = _cli(*args)
        assert proc.returncode == 1, proc.stderr  # the house's OutputNotWritable
        assert "cannot write --out /proc/x" in _one_line_error(proc)
        assert "bench:" not in proc.stderr  # no campaign step started
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("")
    proc = _cli("report", str(run), "--out", "/proc/x")
    assert proc.returncode == 1 and "cannot write --out /proc/x" in _one_line_error(proc)


def test_run_ends_with_a_table_of_its_numbers(tmp_path: Path, tiny_model_dir: Path) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                                     concurrency="[1, 2]"))  # fmt: skip
    out = tmp_path / "run"
    proc = _cli(str(plan), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    # issue 26.11: the time left after 1 of 2 cells is in seconds, never "~0 min left"
    progress = next(line for line in proc.stderr.splitlines() if "[1/2 done" in line)
    assert re.search(r", ~[1-9]\d* (s|min) left\]", progress), progress
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("config "))
    assert lines[header].split() == ["config", "TP", "c", "status", "out", "tok/s", "TTFT", "p50",
                                     "TTFT", "p99", "TPOT", "p50", "TPOT", "p99", "errors"]  # fmt: skip
    rows = [line.split() for line in lines[header + 2 : header + 4]]
    records = read_records(out / "results.jsonl")[0]
    for row, record in zip(rows, records, strict=True):
        metrics = record["measurement"]["metrics"]
        assert row[:4] == ["a", "1", str(record["concurrency"]), "ok"]
        assert row[4] == f"{metrics['output_throughput']:.1f}"
        assert row[5:7] == [f"{metrics['median_ttft_ms']:.1f}", f"{metrics['p99_ttft_ms']:.1f}"]
        assert row[7:9] == [f"{metrics['median_tpot_ms']:.2f}", f"{metrics['p99_tpot_ms']:.2f}"]
        assert row[9] == "0"
