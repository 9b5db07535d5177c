"""Observe before disturbing, at process start: `gpudoctor check`'s early probe (started
before click is imported) reads every device-node fact before the probe process exists,
so what the checks report is the nodes as they were, not as cuInit/NVML left them.

A real interpreter runs ``early_probe.start`` as the console entry does; CPython's audit
events (``os.listdir``, ``open``, ``os.fork``, ``os.posix_spawn``) give the order of the
reads and of the probe's start. This machine has no NVIDIA driver: the one gate that reads
/proc/devices for it (``nvidia_registered``) is answered yes in that interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
events = []
WATCHED = {"os.listdir", "open", "os.fork", "os.posix_spawn"}
def hook(event, args):
    if event in WATCHED:
        events.append([event, str(args[0]) if args else ""])
sys.addaudithook(hook)
from gpudoctor import early_probe
early_probe.nvidia_registered = lambda: True  # a loaded NVIDIA driver, which this box lacks
early_probe.start(["gpudoctor", "check"])
started = bool(early_probe._PENDING)
early_probe.discard()
print(json.dumps({"started": started, "events": events,
                  "dirs": list(early_probe.NODE_DIRS), "files": list(early_probe.SNAPSHOT_FILES)}))
"""


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_every_node_fact_is_read_before_the_probe_process_starts(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUDOCTOR_EARLY_PROBE": mode}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=120, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["started"], "the early probe did not start"
    events = [tuple(e) for e in out["events"]]
    starts = [i for i, (e, _) in enumerate(events) if e in ("os.fork", "os.posix_spawn")]
    assert starts, events
    reads = [i for i, (e, what) in enumerate(events)
             if (e == "os.listdir" and what in out["dirs"]) or (e == "open" and what in out["files"])]  # fmt: skip
    read_what = {events[i][1] for i in reads}
    assert set(out["dirs"]) <= read_what and set(out["files"]) <= read_what, events
    assert max(reads) < min(starts), events  # all observed before the probe exists
