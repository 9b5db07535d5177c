"""Attacks on ``bench status DIR`` (issue 33.5, 33.6): another user (``nobody`` through
``setpriv``) made DIR in a real 1777 directory; root runs the real CLI on it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.bench.launch.test_out_security import as_nobody

# what a hostile record carries: clipboard write (OSC 52), window title (OSC 0), clear screen
ESCAPES = "\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b]0;pwned\x07\x1b[2J\x1b[H"


def _limited() -> None:
    """The child's address space is capped (2 GiB): an unbounded read dies, not the box."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _status(run: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "status", str(run), *extra],
                          capture_output=True, text=True, timeout=60, preexec_fn=_limited,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def _planted(public_tmp_path: Path, plant: str) -> Path:
    public = public_tmp_path / "public"
    public.mkdir(mode=0o1777)
    os.chmod(public, 0o1777)
    run = public / "run"
    record = {"key": "k1", "config": "c", "concurrency": 1, "tp": 1, "status": "crashed",
              "reason": f"boom{ESCAPES}", "server_log_tail": [f"last line{ESCAPES}\u2028x"]}  # fmt: skip
    as_nobody(f"mkdir -m 0755 {run} && printf '%s\\n' '{json.dumps(record)}' > {run}/results.jsonl"
              + plant.format(run=run))  # fmt: skip
    return run


def test_status_prints_no_escape_sequence_of_the_runs_strings(public_tmp_path: Path) -> None:
    """Attack (33.6): a results line whose crash reason and last server log line carry OSC 52
    (write the clipboard), OSC 0 (retitle) and clear-screen sequences and a U+2028; status
    printed them raw to root's terminal. Now each is shown escaped, as ``cat -v`` would."""
    shown = _status(_planted(public_tmp_path, ""))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert not any(c in out for c in "\x1b\x07\u2028"), repr(out)
    assert "boom\\x1b]52;c;" in out and "last line\\x1b]52;c;" in out and "\\u2028x" in out, out


def test_status_reads_no_link_no_fifo_and_nothing_unbounded(public_tmp_path: Path) -> None:
    """Attack (33.5): DIR's plan.toml and gpus.jsonl are FIFOs (status hung for good),
    state.json -> /dev/zero (memory grew without bound), run.json a 1 GiB sparse file.
    Status answers and names each file it did not read."""
    run = _planted(public_tmp_path, " && mkfifo {run}/plan.toml {run}/gpus.jsonl && "
                   "ln -s /dev/zero {run}/state.json && truncate -s 1G {run}/run.json")  # fmt: skip
    shown = _status(run)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    for name, why in (("plan.toml", "a FIFO"), ("gpus.jsonl", "a FIFO"),
                      ("state.json", "a symlink"), ("run.json", "larger than 4 MiB")):  # fmt: skip
        assert f"[!] not read: {run / name} is {why}" in out, out
    as_json = json.loads(_status(run, "--json").stdout)
    assert len(as_json["unreadable"]) == 4
