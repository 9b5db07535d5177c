"""Issue 31: a cell is ok only when its requests are. Real campaigns through the CLI
against tests/bench/stream_server.py (a real HTTP server process on loopback) that
rejects every request (HTTP 422, transformers serve's message), streams no token, or
fails every second request: each cell FAILED with the server's reason, exit 3, and
the reports saying so; a clean server stays ok, exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write

WORKLOAD = "input_len = 32\noutput_len = 8\nnum_prompts = 6\nwarmup = 1\nignore_eos = true"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=180, env=env)  # fmt: skip


def _run(tmp_path: Path, model: Path, server_args: str, workload: str = WORKLOAD) -> tuple:
    plan = write(tmp_path, stub_plan(model, configs='[[configs]]\nname = "a"\n',
                                     concurrency="[1, 2]", workload=workload,
                                     server_args=server_args))  # fmt: skip
    out = tmp_path / "run"
    result = _bench("run", str(plan), "--out", str(out), "--no-preflight")
    return result, out, read_records(out / "results.jsonl")[0]


def test_a_server_that_rejects_every_request_fails_fast_with_its_message(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    result, out, records = _run(tmp_path, tiny_model_dir, "reject-status = 422")
    assert result.returncode == 3, result.stderr
    assert [r["status"] for r in records] == ["failed", "failed"]
    for r in records:
        assert "rejected the warmup" in r["reason"]
        assert "Unexpected fields in the request: {'ignore_eos'}" in r["reason"]
        assert r["measurement"]["client"]["warmup"]["rejected"] is True
        assert r["measurement"]["metrics"]["completed"] == 0  # nothing measured
    assert "FAILED (the server rejected the warmup request" in result.stderr
    # one line for the configuration, naming the field to change
    assert "a (TP1), all 2 cells: every cell failed the same way" in result.stderr
    assert "change ignore_eos in [workload]" in result.stderr
    status = _bench("status", str(out))
    assert "2 failed" in status.stdout, status.stdout
    report = _bench("report", str(out))
    assert report.returncode == 0, report.stderr
    md = (out / "report.md").read_text()
    assert "0 ok, 2 failed" in md and "Unexpected fields in the request" in md
    page = (out / "report.html").read_text()
    assert "2 failed" in page and "Unexpected fields in the request" in page


def test_a_server_that_streams_nothing_is_failed_not_ok(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    result, _, records = _run(tmp_path, tiny_model_dir, "stream-nothing = true")
    assert result.returncode == 3, result.stderr
    assert [r["status"] for r in records] == ["failed", "failed"]
    verdict = records[0]["verdict"]
    assert verdict["errors"] == {"empty": 6}
    assert records[0]["measurement"]["metrics"]["empty_replies"] == 6
    assert "the stream ended without any content token" in records[0]["reason"]


def test_half_failed_requests_fail_the_cell_and_a_retry_reruns_only_it(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    result, out, records = _run(tmp_path, tiny_model_dir, "fail-every = 2")
    assert result.returncode == 3, result.stderr
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert "requests failed" in records[0]["reason"] and "injected failure" in records[0]["reason"]
    again = _bench("run", str(out / "plan.toml"), "--out", str(out), "--no-preflight")
    assert again.returncode == 3  # resumed: the failed cells are kept once, not rerun
    assert len(read_records(out / "results.jsonl")[0]) == 2
    plan = str(out / "plan.toml")
    dry = _bench("run", plan, "--out", str(out), "--dry-run", "--no-validate", "--json")
    assert {c["action"] for c in json.loads(dry.stdout)["cells"]} == {"done"}
    dry = _bench("run", plan, "--out", str(out), "--dry-run", "--no-validate", "--json",
                 "--retry-failed")  # fmt: skip
    assert {c["action"] for c in json.loads(dry.stdout)["cells"]} == {"run"}
    retry = _bench("run", plan, "--out", str(out), "--no-preflight", "--retry-failed")
    assert retry.returncode == 3 and "2 cells: 0 done before" in retry.stdout
    assert len(read_records(out / "results.jsonl")[0]) == 2  # still once each
    assert len(read_records(out / "superseded.jsonl")[0]) == 2  # the earlier records kept


def test_a_tolerated_failure_fraction_keeps_the_cell_ok_with_the_count(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    workload = WORKLOAD + "\n[limits]\nmax_failed_fraction = 0.6"
    result, _, records = _run(tmp_path, tiny_model_dir, "fail-every = 2", workload)
    assert result.returncode == 0, result.stderr
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert "3 of 6 requests failed (http_5xx 3)" in records[0]["reason"]


def test_a_clean_server_is_ok_with_exit_0(tmp_path: Path, tiny_model_dir: Path) -> None:
    result, _, records = _run(tmp_path, tiny_model_dir, "")
    assert result.returncode == 0, result.stderr
    assert [r["status"] for r in records] == ["ok", "ok"]
    m = records[0]["measurement"]
    assert m["metrics"]["token_count_mismatches"] == 0 and m["metrics"]["empty_replies"] == 0
    assert records[0]["verdict"]["failed"] == 0
