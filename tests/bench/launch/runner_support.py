"""What the fast cell-runner, sweep and serial tests share: a plan of the ``command``
engine in tmp_path, an opened run directory with its writer, reporter and state.json, and
the one stand-in they need, :class:`RecordedMeasure`.

A real server (:data:`TINY_SERVER`, a few lines of ``http.server`` answering ``/health``
and ``/v1/models``, exiting on ``POST /exit``, its ``--help`` naming its flags; exiting
at once with ``--fail-start``) is started by the real
:class:`ServerLifecycle` where a test needs one."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.bench.cell_spec import SLO, CellTarget, WorkloadSpec
from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch.cell_runner import CellRunner, EngineFacts
from gpudoctor.bench.launch.live_state import LiveState
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.run_writer import RunWriter
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle
from gpudoctor.bench.plan import Plan, load_plan
from gpudoctor.bench.results.launcher_state import STATE
from gpudoctor.bench.results.run_dir import RunDir, read_records

TINY_SERVER = """\
import json, sys, os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data); self.wfile.flush()
    def do_GET(self):
        if self.path == "/health": return self._send(200, {})
        if self.path == "/v1/models": return self._send(200, {"data": [{"max_model_len": 4096}]})
        self._send(404, {})
    def do_POST(self):
        self._send(200, {}); os._exit(3)
if "--help" in sys.argv:
    sys.exit(print("usage: tiny_server.py --port P [--threads N] [--fail-start]"))
if "--fail-start" in sys.argv:
    sys.exit(print("fatal: out of memory", flush=True) or 1)
port = int(sys.argv[sys.argv.index("--port") + 1])
print("Uvicorn running on", port, flush=True)
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def configs(*names: str, args: str = "") -> str:
    """Return ``[[configs]]`` tables named ``names`` (each with ``args``)."""
    return "".join(f'[[configs]]\nname = "{n}"\n' + (f"args = {{ {args} }}\n" if args else "")
                   for n in names)  # fmt: skip


def write_plan(tmp_path: Path, body: str, command: list[str] | None = None,
               head: str = "", concurrency: str = "[1, 2]", engine: str = "") -> Plan:  # fmt: skip
    """Write and load a plan of the ``command`` engine (default: :data:`TINY_SERVER`)."""
    (tmp_path / "m").mkdir(exist_ok=True)
    if command is None:
        server = tmp_path / "tiny_server.py"
        server.write_text(TINY_SERVER)
        command = [sys.executable, str(server), "--port", "{port}"]
    words = ", ".join(json.dumps(w) for w in command)
    path = tmp_path / "plan.toml"
    path.write_text(
        f'name = "fast"\n{head}[model]\npath = "m"\n[engine]\nname = "command"\n'
        f'command = [{words}]\nversion = "v7"\nstartup_timeout_s = 30\nstop_timeout_s = 5\n{engine}'
        f"[axes]\nconcurrency = {concurrency}\n[workload]\ninput_len = 64\noutput_len = 16\n{body}"
    )
    return load_plan(path)


def measurement(completed: int, errors: dict[str, int] | None = None, **extra: Any) -> dict:
    """Return a load generator's measurement of ``completed`` requests and ``errors``."""
    errors = errors or {}
    return {"num_prompts": completed + sum(errors.values()), "completed": completed,
            "errors": errors, "metrics": {"total_output_tokens": 16 * completed}, **extra}  # fmt: skip


@dataclass
class Call:
    """What the cell runner asked the load generator for."""

    target: CellTarget
    workload: WorkloadSpec
    concurrency: int
    slo: SLO
    options: dict[str, Any]


@dataclass
class RecordedMeasure:
    """Stands for :func:`gpudoctor.bench.load.loadgen.measure_cell` (the load generator's
    requests to a running inference server: what a fast test cannot run): each call
    returns the next of ``results``, after ``during(target)`` (what happens to the server
    meanwhile: its death), and keeps what it was asked (:class:`Call`)."""

    results: list[dict[str, Any]]
    during: Callable[[CellTarget], None] | None = None
    calls: list[Call] = field(default_factory=list)

    def __call__(self, target: CellTarget, workload: WorkloadSpec, concurrency: int, slo: SLO,
                 **options: Any) -> dict[str, Any]:  # fmt: skip
        self.calls.append(Call(target, workload, concurrency, slo, options))
        if self.during is not None:
            self.during(target)
        return self.results.pop(0)


def kill_server(target: CellTarget) -> None:
    """Make the tiny server exit with code 3 (``POST /exit``): a server dying in a cell."""
    with urllib.request.urlopen(urllib.request.Request(target.base_url + "/exit", b"", method="POST"),
                                timeout=10) as answer:  # fmt: skip
        answer.read()


@dataclass
class Launch:
    """One opened run directory and what a launch writes into it."""

    plan: Plan
    rundir: RunDir
    writer: RunWriter
    reporter: PlainReporter
    shown: io.StringIO
    state: LiveState
    quirks: Path
    tag: str  # this launch's own (stopping a server reaps every process of its prefix)

    def runner(self, measure: RecordedMeasure | None, arch: str = "cpu",
               shard: tuple[int, int] | None = None) -> CellRunner:  # fmt: skip
        """Return the cell runner of this launch (engine version v7, GPU arch ``arch``)."""
        return CellRunner(self.plan, engine_for(self.plan.engine), self.writer, self.reporter,
                          self.state, EngineFacts("v7", arch), shard, measure)  # fmt: skip

    def servers(self) -> ServerLifecycle:
        """Return this launch's real server lifecycle (quirks into ``self.quirks``)."""
        return ServerLifecycle(self.plan, engine_for(self.plan.engine), self.writer, self.reporter,
                               self.state, self.tag, EngineFacts("v7", "cpu"), self.quirks)  # fmt: skip

    def records(self) -> list[dict[str, Any]]:
        """Return results.jsonl's records in order."""
        return read_records(self.rundir.results_path)[0]

    def state_json(self) -> dict[str, Any]:
        """Return state.json."""
        return json.loads((self.rundir.path / STATE).read_text())


@contextmanager
def open_launch(tmp_path: Path, plan: Plan) -> Iterator[Launch]:
    """Yield a :class:`Launch` of ``plan`` on ``tmp_path/run`` (locked, opened)."""
    shown = io.StringIO()
    reporter = PlainReporter(shown)
    reporter.begin(len(plan.cells()), 0)
    with RunDir(tmp_path / "run") as rundir:
        rundir.open(plan.text, None)
        writer = RunWriter(rundir, reporter)
        tag = f"gdb-test{uuid.uuid4().hex[:12]}:0"
        state = LiveState(rundir.path / STATE, tag)
        yield Launch(plan, rundir, writer, reporter, shown, state, tmp_path / "quirks.toml", tag)


REPO, REVISION = "acme/tiny", "c" * 40


def write_mirror(root: Path) -> None:
    """Write a disk mirror ``root/acme/tiny`` (a config and a small shard, its manifest)."""
    from gpudoctor.weights.localfs import write_manifest
    from gpudoctor.weights.manifest import Manifest, ManifestFile

    model = root / "acme" / "tiny"
    model.mkdir(parents=True)
    shard = bytes(range(256)) * 64
    (model / "model.safetensors").write_bytes(shard)
    (model / "config.json").write_bytes(b'{"architectures": ["LlamaForCausalLM"]}\n')
    files = (ManifestFile("config.json", 40),
             ManifestFile("model.safetensors", len(shard), hashlib.sha256(shard).hexdigest()))  # fmt: skip
    write_manifest(model, Manifest(REPO, REVISION, files, "2026-12-02T10:00:00Z"))
