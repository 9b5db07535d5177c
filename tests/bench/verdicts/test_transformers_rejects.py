"""Issue 31 with the real `transformers serve` (CPU, the tiny Llama): it answers HTTP 422
"Unexpected fields in the request: {'ignore_eos'}" to every request that carries the
field. The plan check refuses that plan before any server starts; through the
``command`` engine (whose fields are unknown) the warmup meets the 422 and the cell
fails at once with the server's message, exit 3, the report saying FAILED."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import write


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip


WORKLOAD = """\
[workload]
input_len = 16
output_len = 4
num_prompts = 2
warmup = 1
ignore_eos = true
"""


def test_the_plan_check_refuses_ignore_eos_for_transformers(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = write(tmp_path, textwrap.dedent(f"""\
        name = "tiny"
        [model]
        path = "{tiny_model_dir}"
        [engine]
        name = "transformers"
        [axes]
        concurrency = [1]
        """) + WORKLOAD)  # fmt: skip
    for args in (("--dry-run", "--no-validate"), ()):
        out = tmp_path / f"run{len(args)}"
        result = _bench("run", str(plan), "--out", str(out), "--no-preflight", *args)
        assert result.returncode == 1, result.stderr
        assert (
            "workload.ignore_eos: the transformers engine rejects the request field"
            in result.stderr
        )
        assert "set ignore_eos = false in [workload]" in result.stderr
        assert "Traceback" not in result.stderr
        assert not (out / "logs").exists()  # no server started


def test_real_transformers_serve_rejecting_ignore_eos_fails_the_cell_with_exit_3(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    exe = Path(sys.executable).parent / "transformers"
    command = [
        str(exe),
        "serve",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--device",
        "cpu",
    ]
    plan = write(tmp_path, textwrap.dedent(f"""\
        name = "tiny"
        [model]
        path = "{tiny_model_dir}"
        [engine]
        name = "command"
        command = [{", ".join(f'"{w}"' for w in command)}]
        version = "transformers"
        env = {{ HF_HUB_OFFLINE = "1" }}
        startup_timeout_s = 180
        stop_timeout_s = 10
        [axes]
        concurrency = [1, 2]
        [preflight]
        enabled = false
        """) + WORKLOAD)  # fmt: skip
    out = tmp_path / "run"
    result = _bench("run", str(plan), "--out", str(out))
    assert result.returncode == 3, result.stderr[-3000:]
    records = read_records(out / "results.jsonl")[0]
    assert [r["status"] for r in records] == ["failed", "failed"]
    for r in records:
        assert "HTTP 422" in r["reason"] and "Unexpected fields in the request" in r["reason"]
        assert "'ignore_eos'" in r["verdict"]["first_error"]
    assert "FAILED (the server rejected the warmup request (HTTP 422" in result.stderr
    assert "change ignore_eos in [workload]" in result.stderr
    report = _bench("report", str(out))
    assert report.returncode == 0, report.stderr
    md = (out / "report.md").read_text()
    assert "## Needs attention" in md and "**FAILED**" in md and "HTTP 422" in md
