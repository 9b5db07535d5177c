"""The campaign loop against a real (small) streaming server: matrix, crashes, quirks,
flag validation, clamping, preflight and signals. See stream_server.py for the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.launch.server import free_port
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import STREAM_SERVER, stub_plan, wait_no_leftovers, write
from tests.support.signals import default_signals


def _records(out: Path) -> list[dict]:
    return read_records(out / "results.jsonl")[0]


def _servers(out: Path) -> list[dict]:
    path = out / "servers.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _cli(
    *args: str, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip


def test_matrix_runs_each_cell_once_with_one_server_per_config(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = load_plan(write(tmp_path, stub_plan(tiny_model_dir)))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    assert (summary.ok, summary.crashed, summary.skipped, summary.server_starts) == (6, 0, 0, 2)
    records = _records(out)
    assert sorted(r["key"] for r in records) == sorted(c.key for c in plan.cells())
    assert [(r["config"], r["concurrency"]) for r in records] == [
        (c, n) for c in "ab" for n in (1, 2, 3)
    ]
    for r in records:
        assert r["status"] == "ok" and r["tp"] == 1
        assert r["measurement"]["completed"] == 4 and sum(r["measurement"]["errors"].values()) == 0
        assert (out / r["raw"]).read_text().count("\n") == 4
    servers = _servers(out)
    assert [s["label"] for s in servers] == ["a@tp1", "b@tp1"]
    assert all(s["max_context"] == 2048 and s["log_ready_s"] is not None for s in servers)
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["engine_version"] == "stub-1" and run_json["gpu_arch"] == "cpu"
    assert wait_no_leftovers(out) == []
    again = run_campaign(plan, LaunchOptions(out=out))  # resume: nothing left to do
    assert (again.already_done, again.ok, again.server_starts) == (6, 0, 0)
    assert len(_records(out)) == 6


def test_prompts_per_concurrency_sends_the_same_waves_in_every_cell(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`prompts_per_concurrency = 2`: 2 requests at concurrency 1, 6 at 3 (num_prompts is
    ignored), each in flight up to the concurrency: what keeps a GPU sweep up to 64 short."""
    workload = (
        "input_len = 32\noutput_len = 8\nnum_prompts = 50\nprompts_per_concurrency = 2\nwarmup = 0"
    )
    plan = load_plan(write(tmp_path, stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                                               concurrency="[1, 3]", workload=workload)))  # fmt: skip
    out = tmp_path / "run"
    run_campaign(plan, LaunchOptions(out=out))
    sent = {r["concurrency"]: r["measurement"]["completed"] for r in _records(out)}
    assert sent == {1: 2, 3: 6}
    assert all(
        (out / r["raw"]).read_text().count("\n") == 2 * r["concurrency"] for r in _records(out)
    )


def test_server_that_cannot_start_is_crashed_and_quirked(
    tmp_path: Path, tiny_model_dir: Path, local_quirks: Path
) -> None:
    configs = (
        '[[configs]]\nname = "bad"\nargs = { fail-start = true }\n[[configs]]\nname = "good"\n'
    )
    plan = load_plan(
        write(tmp_path, stub_plan(tiny_model_dir, configs=configs, concurrency="[1, 2]"))
    )
    out = tmp_path / "run1"
    summary = run_campaign(plan, LaunchOptions(out=out))
    assert (summary.ok, summary.crashed) == (2, 2)
    bad = [r for r in _records(out) if r["config"] == "bad"]
    assert [r["status"] for r in bad] == ["crashed", "crashed"]
    assert "server failed to start: server exited with code 1" in bad[0]["reason"]
    assert any("fatal: --fail-start" in line for line in bad[0]["server_log_tail"])
    assert 0 < len(bad[0]["server_log_tail"]) <= 50
    assert f"crash-{plan.configs[0].key}" in local_quirks.read_text()
    # a rerun in another directory skips the known-bad config without starting it
    out2 = tmp_path / "run2"
    summary2 = run_campaign(plan, LaunchOptions(out=out2))
    assert (summary2.ok, summary2.skipped, summary2.server_starts) == (2, 2, 1)
    skipped = [r for r in _records(out2) if r["status"] == "skipped"]
    assert all(r["reason"].startswith(f"quirk crash-{plan.configs[0].key}") for r in skipped)
    # --retry-crashed tries it again (and it crashes again); still one record per cell
    summary3 = run_campaign(plan, LaunchOptions(out=out2, retry_crashed=True))
    assert (summary3.crashed, summary3.server_starts) == (2, 1)
    assert sorted(r["key"] for r in _records(out2)) == sorted(c.key for c in plan.cells())
    assert len((out2 / "superseded.jsonl").read_text().splitlines()) == 2
    assert wait_no_leftovers(out2) == []


def test_server_dying_mid_cell_is_crashed_and_the_rest_of_its_sweep_skipped(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    configs = '[[configs]]\nname = "dies"\nargs = { exit-after-requests = 5 }\n'
    plan = load_plan(write(tmp_path, stub_plan(tiny_model_dir, configs=configs)))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    statuses = [(r["concurrency"], r["status"]) for r in _records(out)]
    assert statuses == [(1, "ok"), (2, "crashed"), (3, "skipped")]
    crashed = _records(out)[1]
    assert "server exited with code 3 during the cell" in crashed["reason"]
    assert any("injected crash" in line for line in crashed["server_log_tail"])
    assert crashed["measurement"]["completed"] < 4  # the partial measurement is kept
    assert summary.server_starts == 1 and wait_no_leftovers(out) == []


def test_misspelled_flag_is_refused_before_any_server_starts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan_path = write(tmp_path, stub_plan(tiny_model_dir, server_args="token-delay-msec = 1"))
    out = tmp_path / "run"
    proc = _cli(str(plan_path), "--out", str(out))
    assert proc.returncode == 1
    assert (
        "unknown flag --token-delay-msec (did you mean --token-delay-ms?), used by a@tp1, b@tp1"
        in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not out.exists()  # nothing was started, not even the run directory


def test_overlong_input_is_clamped_and_never_overflows(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    port = free_port()
    stub = subprocess.Popen([sys.executable, str(STREAM_SERVER), "--model", str(tiny_model_dir),
                             "--port", str(port), "--max-model-len", "256"], stdout=subprocess.DEVNULL)  # fmt: skip
    try:  # the server really refuses an overlong request ...
        for _ in range(100):
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                                   json={"prompt": "word " * 300, "max_tokens": 8}, timeout=5)  # fmt: skip
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert reply.status_code == 400 and "maximum context length is 256" in reply.text
    finally:
        stub.kill()
        stub.wait()
    workload = "input_len = 1000\noutput_len = 16\nnum_prompts = 3\nwarmup = 0"
    plan = load_plan(write(tmp_path, stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                                               concurrency="[1, 3]", workload=workload,
                                               server_args="max-model-len = 256")))  # fmt: skip
    out = tmp_path / "run"
    run_campaign(plan, LaunchOptions(out=out))
    for r in _records(out):
        assert r["status"] == "ok"
        assert r["clamp"] == {"clamped": True, "input_len": 208, "max_context": 256, "output_len": 16,
                              "requested_input_len": 1000, "template_overhead": 32}  # fmt: skip
        assert (
            r["measurement"]["errors"]["context_overflow"] == 0
            and r["measurement"]["completed"] == 3
        )
        for line in (out / r["raw"]).read_text().splitlines():
            raw = json.loads(line)
            assert raw["usage_prompt_tokens"] + 16 <= 256


def test_dataset_prompts_are_cut_to_the_real_context(tmp_path: Path, tiny_model_dir: Path) -> None:
    """JSONL prompts longer than the server's real context (256 here) are cut per prompt
    (the seed's 30k overflow came from real prompts); the record says how many were cut
    and the server (which answers 400 to an overflow) never overflows."""
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "word " * 400}, {"prompt": "a short prompt"}, {"prompt": "word " * 300}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = (f'kind = "jsonl"\ndataset_path = "{data}"\noutput_len = 16\nnum_prompts = 3\n'
                "warmup = 0\nignore_eos = false")  # fmt: skip
    plan = load_plan(write(tmp_path, stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                                               concurrency="[1]", workload=workload,
                                               server_args="max-model-len = 256")))  # fmt: skip
    out = tmp_path / "run"
    run_campaign(plan, LaunchOptions(out=out))
    (record,) = _records(out)
    assert record["status"] == "ok" and record["clamp"]["max_total_tokens"] == 256 - 32
    assert record["clamp"]["prompts_cut"] == 2 == record["measurement"]["prompts_cut"]
    assert record["measurement"]["errors"]["context_overflow"] == 0
    assert record["measurement"]["completed"] == 3
    for line in (out / record["raw"]).read_text().splitlines():
        assert json.loads(line)["usage_prompt_tokens"] + 16 <= 256 - 32


def test_preflight_fail_stops_the_campaign_with_the_diagnosis(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    text = stub_plan(tiny_model_dir).replace(
        "[preflight]\nenabled = false", '[preflight]\nonly = ["driver"]'
    )
    out = tmp_path / "run"
    proc = _cli(str(write(tmp_path, text)), "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    assert "preflight (campaign) failed: driver.loaded" in proc.stderr
    verdicts = [json.loads(line) for line in (out / "preflight.jsonl").read_text().splitlines()]
    assert (
        verdicts[0]["status"] == "FAIL" and verdicts[0]["findings"][0]["check"] == "driver.loaded"
    )
    assert _records(out) == [] and not (out / "logs").exists()
    assert "preflight (campaign) failed" in json.loads((out / "run.json").read_text())["stopped"]


@pytest.mark.signals
def test_sigterm_stops_every_server(tmp_path: Path, tiny_model_dir: Path) -> None:
    workload = "input_len = 32\noutput_len = 400\nnum_prompts = 50\nwarmup = 0"
    plan_path = write(
        tmp_path, stub_plan(tiny_model_dir, workload=workload, server_args="token-delay-ms = 20")
    )
    out = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "gpudoctor", "bench", str(plan_path), "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_signals)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list((out / "raw").glob("*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)  # a cell is under way: its server is up and serving
        assert list((out / "raw").glob("*.jsonl")), "no cell started"
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130 and "interrupted" in err, err
    assert wait_no_leftovers(out, timeout_s=0.5) == []  # gone at once, not by the guardian
    assert _servers(out)[0]["exit_code"] is not None


def test_dry_run_lists_cells_skips_and_commands(
    tmp_path: Path, tiny_model_dir: Path, local_quirks: Path
) -> None:
    local_quirks.write_text(
        '[[quirk]]\nid = "slow-b"\narch = "*"\nengine = "command"\nmatch = { token-delay-ms = 7 }\nreason = "known slow"\n'
    )
    configs = '[[configs]]\nname = "a"\n[[configs]]\nname = "b"\nargs = { token-delay-ms = 7 }\n'
    plan_path = write(tmp_path, stub_plan(tiny_model_dir, configs=configs))
    proc = _cli(str(plan_path), "--dry-run", "--json", "--out", str(tmp_path / "none"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert [c["action"] for c in result["cells"]] == ["run"] * 3 + ["skip"] * 3
    assert result["cells"][3]["reason"] == (
        f"quirk slow-b (in {local_quirks}; --retry-crashed runs it anyway): known slow"
    )
    assert result["configs"][1]["command"][-2:] == ["--token-delay-ms", "7"]
    human = _cli(str(plan_path), "--dry-run", "--out", str(tmp_path / "none"))
    assert "--port <free> --token-delay-ms 7" in human.stdout and "skip" in human.stdout
    assert not (tmp_path / "none").exists()
    helptext = _cli("--help").stdout
    assert "report" in helptext and "compare" in helptext and "run" in helptext


def test_port_taken_at_start_is_retried_once_on_another_port(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        # the stub's last --port wins: it always binds the busy port, as if another
        # process had grabbed the free port between gpudoctor's choice and the bind
        text = stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n', concurrency="[1]")
        text = text.replace('"{port}"]', f'"{{port}}", "--port", "{busy}"]')
        plan = load_plan(write(tmp_path, text))
        out = tmp_path / "run"
        summary = run_campaign(plan, LaunchOptions(out=out))
    assert (summary.crashed, summary.server_starts) == (1, 2)
    assert [s["attempt"] for s in _servers(out)] == [1, 2]
    assert any("Address already in use" in line for line in _records(out)[0]["server_log_tail"])


def test_weights_are_ensured_before_any_server(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A plan with a Hub repo runs `gpudoctor weights ensure` first; an unreachable Hub
    (a closed loopback port here) stops the campaign before any server starts."""
    text = stub_plan(tiny_model_dir).replace(
        f'path = "{tiny_model_dir}"', f'repo = "org/tiny"\ndir = "{tmp_path / "shm" / "tiny"}"'
    )  # the dir does not exist yet: the first preflight must not FAIL model.present for it
    text = text.replace("[preflight]\nenabled = false", '[preflight]\nonly = ["proc", "model"]')
    out = tmp_path / "run"
    proc = _cli(
        str(write(tmp_path, text)), "--out", str(out), env={"HF_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert proc.returncode == 1
    assert "error: weights: cannot reach the Hub at http://127.0.0.1:9" in proc.stderr
    assert not (out / "servers.jsonl").exists() and _records(out) == []
    assert "weights: cannot reach the Hub" in json.loads((out / "run.json").read_text())["stopped"]
    verdict = json.loads((out / "preflight.jsonl").read_text())
    assert verdict["when"] == "campaign" and verdict["status"] != "FAIL"
