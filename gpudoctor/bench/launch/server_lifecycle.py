"""A configuration's server, start to stop: a free port (a second one when the first was
taken meanwhile), ``CUDA_VISIBLE_DEVICES`` of its slot, readiness, the real max context,
``state.json`` while it runs, one line in ``servers.jsonl`` when it stops, and a local
quirk when it crashed.

Nothing here knows cells or strategies: :mod:`gpudoctor.bench.launch.config_sweep` runs a
configuration's cells on the :class:`~gpudoctor.bench.launch.cell_runner.RunningServer`
this module starts.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpudoctor.bench.engines import Engine
from gpudoctor.bench.launch.cell_runner import EngineFacts, RunningServer
from gpudoctor.bench.launch.live_state import LiveState
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.run_writer import RunWriter
from gpudoctor.bench.launch.server import (
    ExternalServer,
    NoFreePort,
    ServerCrashed,
    ServerProcess,
    free_port,
)
from gpudoctor.bench.launch.slots import Slot, visible_devices
from gpudoctor.bench.launch.steps import CampaignError
from gpudoctor.bench.plan import Plan, ServerConfig
from gpudoctor.bench.plan import quirks as quirks_mod

ATTACH_WAIT_S = 10.0  # how long a plan's running server (engine.server_url) may take to answer
_PORT_TAKEN = re.compile(r"address already in use|Errno 98|EADDRINUSE", re.IGNORECASE)


class StartFailed(Exception):
    """A configuration's server did not become ready (after the port retry); it is stopped."""

    def __init__(self, reason: str, facts: dict[str, Any], tail: list[str],
                 exited: bool = True) -> None:  # fmt: skip
        super().__init__(reason)
        self.reason = reason
        self.facts = facts  # the last attempt's (argv, port, log...)
        self.tail = tail  # the last lines of its log
        self.exited = exited  # False: it only missed its readiness deadline (not a crash)


class ServerLifecycle:
    """Start, watch and stop the servers of one launch (tagged ``tag`` for the guardian)."""

    def __init__(self, plan: Plan, engine: Engine, writer: RunWriter, reporter: PlainReporter,
                 state: LiveState, tag: str, facts: EngineFacts, quirks_path: Path) -> None:  # fmt: skip
        self.plan = plan
        self.engine = engine
        self.writer = writer
        self.reporter = reporter
        self.state = state
        self.tag = tag
        self.facts = facts
        self.quirks_path = quirks_path
        self.starts = 0  # server processes started by this launch
        self.live: dict[int, ServerProcess] = {}  # running servers by slot (0 = unpacked)
        self.ports: set[int] = set()  # ports handed out to servers not stopped yet
        self._lock = threading.Lock()

    def start(self, config: ServerConfig, slot: Slot | None = None) -> RunningServer:
        """Start ``config``'s server (on ``slot``'s GPUs) and wait until it is ready; return
        it. Raises StartFailed (the server stopped) when it does not start, CampaignError
        when ``engine.port_range`` has no free port (the cells stay pending for a resume)."""
        started = time.monotonic()
        if self.plan.engine.server_url:
            return self._attach(config, started)
        for attempt in (1, 2):
            try:
                port = self._pick_port()
            except NoFreePort as exc:  # the machine's, not the configuration's: stop here
                raise CampaignError(f"{exc}; nothing was run for {config.label}") from None
            process, base_url, facts = self._spawn(config, attempt, slot, port)
            server = RunningServer(config, process, base_url, facts, started)
            try:
                self._wait_ready(server)
                return server
            except ServerCrashed as exc:
                self.stop(server)
                if attempt == 1 and _PORT_TAKEN.search("\n".join(exc.tail)):
                    self.reporter.config(
                        config.label, "port was taken meanwhile; retrying on another"
                    )
                    continue
                raise StartFailed(f"server failed to start: {exc}", facts, exc.tail,
                                  exc.returncode is not None) from exc  # fmt: skip
            except BaseException:
                self.stop(server)
                raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _pick_port(self) -> int:
        """Return a free port for a new server, never one handed to a server of this launch
        that is still running (it may not listen yet: slots start at once)."""
        with self._lock:
            ports = frozenset(self.ports)
            port = free_port(port_range=self.plan.engine.port_range, avoid=ports)
            self.ports.add(port)
            return port

    def _attach(self, config: ServerConfig, started: float) -> RunningServer:
        """Return the plan's already running server (``engine.server_url``) once it answers
        its readiness check; CampaignError when it does not. Nothing is started (or, at the
        end, stopped): its facts say ``launched: false``."""
        url = str(self.plan.engine.server_url)
        facts: dict[str, Any] = {"launched": False, "url": url, "port": urlsplit(url).port}
        self.reporter.config(config.label, f"measuring the running server at {url} (not started)")
        server = RunningServer(config, ExternalServer(), url, facts, started)
        try:
            self._wait_ready(server, min(self.plan.engine.startup_timeout_s, ATTACH_WAIT_S))
        except ServerCrashed:
            path = getattr(self.engine, "ready_path", "/health")
            raise CampaignError(
                f"engine.server_url {url} does not answer (GET {path}): start the server first,"
                " or remove server_url to let gpudoctor start one"
            ) from None
        self.state.start("0", {"label": config.label, "slot": 0, "pid": None, "gpus": [],
                               "gpu_indices": [], "log": None, "url": url})  # fmt: skip
        return server

    def _spawn(
        self, config: ServerConfig, attempt: int, slot: Slot | None, port: int
    ) -> tuple[ServerProcess, str, dict[str, Any]]:
        """Start the server of ``config`` on ``port`` (on ``slot``'s GPUs when given:
        ``CUDA_VISIBLE_DEVICES=<uuids>``); return it, its URL and its facts."""
        argv = self.engine.command(config, self.plan.model, port)
        rundir = self.writer.rundir
        log = rundir.log_path(config.label)
        facts: dict[str, Any] = {"argv": argv, "port": port, "attempt": attempt,
                                 "log": str(log.relative_to(rundir.path))}  # fmt: skip
        env = self.engine.environment(config)
        where = ""
        if slot is not None:
            env = {**env, "CUDA_VISIBLE_DEVICES": visible_devices(list(slot.gpus))}
            facts.update(slot=slot.number, gpus=slot.uuids,
                         gpu_indices=[g.index for g in slot.gpus])  # fmt: skip
            where = f" (slot {slot.number}, GPU {','.join(str(g.index) for g in slot.gpus)})"
        self.reporter.config(config.label, f"starting server on port {port}{where}")
        number = slot.number if slot is not None else 0
        # its own tag under the launch's: stopping it reaps its stragglers, not its neighbours
        # (the terminator keeps slot 1's prefix from matching slot 10's)
        tag = self.tag if slot is None else f"{self.tag}:slot{number}/"
        process = ServerProcess(argv, env, log, tag)
        self.live[number] = process
        with self._lock:
            self.starts += 1
        facts["pid"] = process.pid
        self.state.start(str(number), {"label": config.label, "slot": number, "pid": process.pid,
                                       "gpus": facts.get("gpus", []),
                                       "gpu_indices": facts.get("gpu_indices", []),
                                       "log": facts["log"]})  # fmt: skip
        return process, f"http://127.0.0.1:{port}", facts

    def _wait_ready(self, server: RunningServer, timeout_s: float | None = None) -> None:
        """Wait for readiness (``timeout_s``, default the plan's ``startup_timeout_s``), then
        learn the real max context (raises ServerCrashed)."""
        import httpx

        facts, base_url = server.facts, server.base_url
        timeout_s = self.plan.engine.startup_timeout_s if timeout_s is None else timeout_s
        with httpx.Client() as client:
            facts["startup_s"] = round(server.process.wait_ready(
                lambda: self.engine.is_ready(client, base_url), timeout_s,
                self.engine.log_ready_pattern), 3)  # fmt: skip
            log_ready_s = server.process.log_ready_s
            facts["log_ready_s"] = None if log_ready_s is None else round(log_ready_s, 3)
            facts["max_context"] = self.engine.max_context(client, base_url, self.plan.model)

    def stop(self, server: RunningServer) -> None:
        """Stop ``server`` and append its line (stop time, exit code) to servers.jsonl."""
        t0 = time.monotonic()
        code = server.process.stop(self.plan.engine.stop_timeout_s)  # external: left running
        with self._lock:
            self.ports.discard(server.facts.get("port"))
        done = time.monotonic()
        number = server.facts.get("slot", 0)
        if self.live.get(number) is server.process:
            del self.live[number]
            self.state.stop(str(number))
        config = server.config
        self.writer.server_line({"label": config.label, "config_key": config.key,
                                 **server.facts, "stop_s": round(done - t0, 3), "exit_code": code,
                                 "config_wall_s": round(done - server.started, 4)})  # fmt: skip

    def stop_all(self) -> None:
        """Stop every running server (interrupted); each slot thread then ends."""
        for process in list(self.live.values()):
            process.stop(min(self.plan.engine.stop_timeout_s, 10.0))

    def record_crash(self, config: ServerConfig, reason: str) -> None:
        """Add ``config`` to the local quirks table (it crashed); nothing when we stopped it."""
        if self.writer.stopping.is_set():
            return  # stopped by us (interrupted), not a crash of the configuration
        try:
            quirks_mod.record_crash(self.quirks_path, self.facts.arch, self.plan.engine.name,
                                    self.facts.version, config, reason)  # fmt: skip
        except quirks_mod.QuirksError as exc:  # the crash is in results.jsonl all the same
            self.reporter.note(f"warning: {exc}")
            return
        self.reporter.note(f"{config.label}: added to the local quirks table {self.quirks_path}")
