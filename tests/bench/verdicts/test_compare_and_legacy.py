"""A failed cell is never compared as a result, and a run recorded before verdicts existed
(its cells ``ok`` although every request failed, as issue 31 found on the H200) is judged
by its requests when read: the real ``bench compare`` and ``bench report`` commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _cell(status: str, completed: int, errors: dict, **extra: object) -> dict:
    return {"key": "k1", "config": "a", "tp": 1, "concurrency": 4, "status": status,
            "measurement": {"num_prompts": 8, "completed": completed, "errors": errors,
                            "metrics": {"output_throughput": 100.0 if completed else 0.0,
                                        "total_output_tokens": 64 * completed}},
            **extra}  # fmt: skip


def _run_dir(path: Path, record: dict) -> Path:
    path.mkdir(mode=0o755)
    (path / "results.jsonl").write_text(json.dumps(record) + "\n")
    return path


def _gd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_legacy_ok_cell_whose_requests_all_failed_reads_as_failed_and_is_not_compared(
    tmp_path: Path,
) -> None:
    a = _run_dir(tmp_path / "a", _cell("ok", 8, {"http_4xx": 0}))
    b = _run_dir(tmp_path / "b", _cell("ok", 0, {"http_4xx": 8}))  # before verdicts: "ok"
    compared = _gd("compare", str(a), str(b))
    assert compared.returncode == 0, compared.stderr
    assert "not compared: k1 (A ok, B failed)" in compared.stdout
    report = _gd("report", str(b))
    assert report.returncode == 0, report.stderr
    md = (b / "report.md").read_text()
    assert "1 cells: 0 ok, 1 failed" in md and "all 8 requests failed (http\\_4xx 8) |" in md
