"""`gpudoctor bench run` against servers whose streams lie (issue 45.1), as a user runs it.

Each lying server (``tests/bench/stream_server.py --lie``) streams ONE content token per
request and claims ``usage.completion_tokens = max_tokens``: ending with vLLM's
``finish_reason: "abort"``, or after an unwrapped ``{"object": "error", ...}`` event (SGLang's
ErrorResponse), or well (``length``). Before, the first two cells were ``ok`` at the claimed
throughput; now they fail with their kind, and the third counts the tokens that arrived and
names the server's claim in its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write

CONFIGS = """\
[[configs]]
name = "honest"
[[configs]]
name = "abort"
args = { lie = "abort" }
[[configs]]
name = "error"
args = { lie = "error-event" }
[[configs]]
name = "overclaim"
args = { lie = "overclaim" }
"""


def test_aborted_and_errored_streams_fail_and_a_claim_is_only_compared(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir, configs=CONFIGS, concurrency="[2]"))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "run", str(plan), "--out",
                           str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    cells = {r["config"]: r for r in read_records(out / "results.jsonl")[0] if "config" in r}
    honest, abort, error, over = (cells[n] for n in ("honest", "abort", "error", "overclaim"))
    assert honest["status"] == "ok" and honest["reason"] == ""
    assert honest["measurement"]["metrics"]["token_count_mismatches"] == 0
    assert abort["status"] == "failed" and abort["measurement"]["errors"]["aborted"] == 4
    assert "the stream ended with finish_reason 'abort'" in abort["reason"]
    assert error["status"] == "failed" and error["measurement"]["errors"]["stream_error"] == 4
    assert "CUDA out of memory" in error["reason"]
    metrics = over["measurement"]["metrics"]
    assert over["status"] == "ok" and metrics["total_output_tokens"] == 4  # one token each
    assert (metrics["token_count_mismatches"], metrics["usage_overclaims"]) == (4, 4)
    assert metrics["usage_overclaimed_tokens"] == 4 * 7
    assert "usage claims 28 output tokens more than it streamed in 4 replies" in over["reason"]
    assert honest["measurement"]["metrics"]["total_output_tokens"] == 4 * 8
    assert "gpudoctor: FAILED: abort (TP1) c=2:" in proc.stderr
