"""The closing table of `bench` stays aligned with an emoji in a configuration's name
(issue 34.8): widths in terminal cells, not characters. A real launch of the stub server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.cells import cell_len

from tests.bench.campaign_support import stub_plan, write


def test_closing_table_aligned_with_an_emoji_name(tmp_path: Path, tiny_model_dir: Path) -> None:
    configs = (
        '[[configs]]\nname = "🚀fast"\n[[configs]]\nname = "slow"\nargs = { token-delay-ms = 1 }\n'
    )
    plan = write(tmp_path, stub_plan(tiny_model_dir, configs=configs, concurrency="[1]"))
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", str(plan), "--out",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "} and "--" in line) - 1
    table = lines[start : start + 4]  # header, rule, two rows
    assert any("🚀fast" in line for line in table), table
    assert len({cell_len(line) for line in table}) == 1, table
