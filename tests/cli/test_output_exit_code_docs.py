"""The exit code of an unwritable `-o` is the one every doc says (issue 34.8:
docs/prometheus.md said 2, README and docs/cli.md 1). The real CLI in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unwritable_output_exit_code_matches_the_docs(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "check", "-o",
                           str(tmp_path / "missing" / "x.prom"), "--format", "prometheus"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "cannot write -o" in done.stderr
    said = {
        "docs/prometheus.md": re.findall(r"unwritable `-o` is refused \(exit (\d)\)",
                                         (ROOT / "docs/prometheus.md").read_text()),
        "docs/cli.md": re.findall(r"Outputs that cannot be written are refused \*\*before any "
                                  r"work starts\*\* \(exit (\d)", (ROOT / "docs/cli.md").read_text()),
    }  # fmt: skip
    assert all(len(codes) == 1 for codes in said.values()), said
    assert {int(codes[0]) for codes in said.values()} == {done.returncode}, (said, done.returncode)
