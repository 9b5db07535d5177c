"""Every alert `service rules` writes is in its --help and in docs/operations.md's table
(issue 34.8: both listed 5 of the file's 7). The real CLI in subprocesses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _gd(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "service", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_help_and_docs_list_every_alert_of_the_rules_file() -> None:
    alerts = re.findall(r"- alert: (\w+)", _gd("rules"))
    assert len(alerts) >= 7
    help_text = " ".join(_gd("rules", "--help").split())
    table = [line for line in DOCS.read_text().splitlines() if line.startswith("| `Gpudoctor")]
    documented = {re.match(r"\| `(\w+)`", line).group(1) for line in table}  # type: ignore[union-attr]
    for alert in alerts:
        assert alert in help_text, alert
    assert documented == set(alerts)
