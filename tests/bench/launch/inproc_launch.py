"""The launcher's parts wired in this test process, fast: a real run directory in tmp_path,
the real writer, reporter, state.json, cell runner and server lifecycle of one launch,
around servers that start in a fraction of a second.

- ``served_dir``: a directory that Python's own ``http.server`` serves as an inference
  server's readiness and models endpoints (``GET /health`` -> 200, ``GET /v1/models`` ->
  ``max_model_len``): ``python -m http.server`` started by the launcher is a real server
  process it starts, watches and stops; :class:`ServedDir` serves the same directory from
  a thread of this process (a server the user started: ``engine.server_url``).
- :class:`ScriptedLoad` stands for :func:`gpudoctor.bench.load.loadgen.measure_cell` (the
  load generator measuring a cell against the server): it returns the measurement a
  server of a known capacity gives (every request within the SLO up to ``capacity``,
  half of them above), so a search's outcome is known in advance, with no sleeps.
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch.cell_runner import CellRunner, EngineFacts
from gpudoctor.bench.launch.live_state import LiveState
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.run_writer import RunWriter
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle
from gpudoctor.bench.plan import Plan, load_plan
from gpudoctor.bench.results.launcher_state import STATE
from gpudoctor.bench.results.run_dir import RunDir, read_records

MAX_MODEL_LEN = 4096


def served_dir(path: Path, max_model_len: int = MAX_MODEL_LEN) -> Path:
    """Fill ``path`` with what ``http.server`` serves as ``/health`` and ``/v1/models``."""
    (path / "v1").mkdir(parents=True, exist_ok=True)
    (path / "health").write_text("ok\n")
    models = {"data": [{"id": "tiny", "max_model_len": max_model_len}]}
    (path / "v1" / "models").write_text(json.dumps(models))
    return path


class ServedDir:
    """``with ServedDir(dir) as url:`` -- ``dir`` served over HTTP on 127.0.0.1 by a thread."""

    def __init__(self, path: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(path))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(  # shutdown() waits up to one poll interval
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Say nothing (the test's output stays readable)."""


@dataclass
class ScriptedLoad:
    """Stands for ``measure_cell``: a server that meets the SLO up to ``capacity`` (a
    request rate, or a concurrency for a concurrency search); ``crash_at``: loads at
    which ``during`` runs (e.g. kills the server) before the measurement is returned;
    ``fail_at``: loads whose every request fails (HTTP 500)."""

    capacity: float
    over: str = "request_rate"
    crash_at: frozenset[float] = frozenset()
    fail_at: frozenset[float] = frozenset()
    during: Any = None
    loads: list[float] = field(default_factory=list)  # the loads measured, in order

    def __call__(self, target: Any, workload: Any, concurrency: int, slo: Any,
                 **_: Any) -> dict[str, Any]:  # fmt: skip
        load = float(concurrency if self.over == "concurrency" else workload.request_rate)
        self.loads.append(load)
        if load in self.crash_at and self.during is not None:
            self.during()
        if load in self.fail_at:
            return {"num_prompts": 4, "completed": 0, "errors": {"http": 4},
                    "first_error": "HTTP 500", "metrics": {"total_output_tokens": 0}}  # fmt: skip
        attainment = 1.0 if load <= self.capacity else 0.5
        return {"num_prompts": 4, "completed": 4, "errors": {},
                "metrics": {"total_output_tokens": 32, "slo_attainment": attainment}}  # fmt: skip


class Launch:
    """One launch's parts on ``out`` (a real run directory), as campaign.py wires them."""

    def __init__(self, plan: Plan, out: Path, measure: Any = None,
                 done: dict[str, dict] | None = None, quirks: Path | None = None) -> None:  # fmt: skip
        self.plan = plan
        self.out = out
        self.stream = io.StringIO()
        self.rundir = RunDir(out)
        self.rundir.__enter__()
        self.reporter = PlainReporter(self.stream)
        self.writer = RunWriter(self.rundir, self.reporter)
        self.writer.done = dict(done or {})
        self.state = LiveState(out / STATE, "test-tag")
        self.engine = engine_for(plan.engine)
        facts = EngineFacts("stub-1", "cpu")
        self.runner = CellRunner(plan, self.engine, self.writer, self.reporter, self.state,
                                 facts, None, measure)  # fmt: skip
        self.servers = ServerLifecycle(plan, self.engine, self.writer, self.reporter,
                                       self.state, f"gpudoctor-test-{id(self)}:", facts,
                                       quirks or out.parent / "local-quirks.toml")  # fmt: skip

    def close(self) -> None:
        """Stop what still runs and release the run directory."""
        self.servers.stop_all()
        self.rundir.__exit__(None, None, None)

    def records(self) -> list[dict[str, Any]]:
        """Return results.jsonl's records."""
        return read_records(self.out / "results.jsonl")[0]

    def servers_lines(self) -> list[dict[str, Any]]:
        """Return servers.jsonl's lines."""
        return read_records(self.out / "servers.jsonl")[0]

    def said(self) -> str:
        """Return what the reporter printed."""
        return self.stream.getvalue()


def plan_text(model_dir: Path, engine: str, configs: str = '[[configs]]\nname = "a"\n',
              concurrency: str = "[4]", extra: str = "") -> str:  # fmt: skip
    """Return a plan whose ``[engine]`` table is ``engine`` (its lines)."""
    return (
        f'name = "inproc"\n[model]\npath = "{model_dir}"\n[engine]\nname = "command"\n'
        f'version = "stub-1"\n{engine}'
        f"[axes]\nconcurrency = {concurrency}\n[preflight]\nenabled = false\n"
        "[workload]\ninput_len = 16\noutput_len = 4\nnum_prompts = 4\nwarmup = 0\n"
        + configs
        + extra
    )


def http_server_engine(served: Path, extra: str = "") -> str:
    """Return ``[engine]`` lines starting ``python -m http.server`` on ``served`` as the server."""
    words = [sys.executable, "-m", "http.server", "--bind", "{host}", "--directory",
             str(served), "{port}"]  # fmt: skip
    command = ", ".join(json.dumps(w) for w in words)
    return f"command = [{command}]\nstartup_timeout_s = 30\nstop_timeout_s = 5\n{extra}"


def load(tmp_path: Path, text: str) -> Plan:
    """Write ``text`` as a plan file and load it."""
    path = tmp_path / "plan.toml"
    path.write_text(text, encoding="utf-8")
    return load_plan(path)
