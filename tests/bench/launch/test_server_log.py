"""The readiness scan reads a server's log incrementally: each byte once, not the whole
log again every 50 ms (a chatty or hostile server writing megabytes during its start
made the launcher re-read them 20 times a second)."""

from __future__ import annotations

import sys
from pathlib import Path

from gpudoctor.bench.launch.server import ServerProcess

CHATTY = """
import sys, time
line = "x" * 199 + "\\n"
for _ in range(50):
    sys.stdout.write(line * 1000)  # 200 kB a burst
    sys.stdout.flush()
    time.sleep(0.01)
print("INFO:     Application startup complete.", flush=True)
time.sleep(60)
"""


def test_log_is_scanned_once_per_byte(tmp_path: Path) -> None:
    """Attack: a server flooding its log during startup; before, each 50 ms poll re-read
    everything it had written since it started (quadratic in the log size)."""
    log = tmp_path / "server.log"
    log.write_text("an earlier launch's lines\n" * 1000)
    server = ServerProcess([sys.executable, "-c", CHATTY], {}, log, "gdb-test:log")
    polls = 0

    def ready() -> bool:
        nonlocal polls
        polls += 1
        return server.log_ready_s is not None

    try:
        server.wait_ready(ready, timeout_s=60, log_pattern="Application startup complete",
                          interval_s=0.005)  # fmt: skip
    finally:
        server.stop(grace_s=5)
    written = log.stat().st_size - server._log_start
    assert server.log_ready_s is not None and polls > 5
    assert written > 10_000_000
    assert server.log_bytes_read <= written  # every byte at most once, none before our start
