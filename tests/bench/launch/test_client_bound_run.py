"""A cell whose load generator fell behind its schedule, run as a user runs it (issue 45.9).

A request rate no loopback client holds against ``tests/bench/stream_server.py`` at
concurrency 1 (each request takes ~20 ms, the schedule asks one every 0.5 ms): before, the
run said "1 ok, 0 failed", exited 0, and report.md showed only the asked rate."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.campaign_support import stub_plan, write
from tests.bench.launch.test_crash_named import _cli


def test_a_client_bound_cell_is_not_ok_and_every_table_shows_the_rate_sent(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    text = stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n', concurrency="[1]",
                     workload="input_len = 32\noutput_len = 8\nnum_prompts = 20\nwarmup = 0")  # fmt: skip
    plan = write(
        tmp_path, text.replace("concurrency = [1]", "concurrency = [1]\nrequest_rate = [2000]")
    )
    out = tmp_path / "run"
    proc = _cli("run", str(plan), "--out", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "0 ok, 1 client-bound, 0 failed" in proc.stdout
    # the progress lines count it as the closing table does, never as "1 ok"
    assert "concurrency 1: no result (client-bound: sent" in proc.stderr, proc.stderr
    assert "bench: finished [1/1 done: 0 ok, 1 client-bound, 0 failed, 0 crashed," in proc.stderr
    assert "1 cell(s) client-bound: the load generator did not send at the schedule's rate" in (
        proc.stderr
    )
    [record] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    audit = record["measurement"]["client"]["audit"]
    sent = audit["achieved_rate"]
    assert record["status"] == "ok" and record["client_bound"] and sent < 0.95 * 2000
    assert (
        f"sent {sent:.0f} req/s, {audit['rate_ratio']:.2f} of the schedule's rate"
        in (record["client_bound"])
    )
    assert "waits for a concurrency slot p99" in record["client_bound"]
    assert f"2000 (sent {sent:.4g})" in proc.stdout  # the closing table's rate column
    assert _cli("report", str(out)).returncode == 0
    assert f"sent {sent:.4g} req/s" in (out / "report.md").read_text(encoding="utf-8")
