"""The campaign loop: plan -> validate -> preflight -> weights -> a server per config ->
a cell per concurrency -> one fsync'ed record per cell.

Order of work (:func:`run_campaign`):

1. every flag of every configuration is checked against the installed engine's
   ``--help`` before anything starts (a typo must not cost an hour of GPU time);
2. the run directory is opened (resume: finished cells are never rerun);
3. processes left by an earlier launch on this directory are reaped; a guardian is
   started that kills this launch's servers if the launcher dies;
4. ``gpudoctor check`` runs in-process; a FAIL stops the campaign with the diagnosis
   written to ``preflight.jsonl`` and shown on screen (again before each config);
5. the model's weights are ensured (``gpudoctor weights``) when the plan names a repo;
6. per configuration: known-bad (quirk) -> all its cells skipped; else one server,
   readiness, the real max context, then the concurrency sweep; a crash records the
   cell as crashed with the last 50 log lines, adds a local quirk, and the matrix goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudoctor.bench.cell_spec import CellTarget
from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch import prep as launch_prep
from gpudoctor.bench.launch import schedule as sched
from gpudoctor.bench.launch import searching
from gpudoctor.bench.launch import slots as slots_mod
from gpudoctor.bench.launch.packed import STATE, LiveState, PackedRun, Slot, now_utc
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.server import Guardian, ServerCrashed, ServerProcess, free_port, reap
from gpudoctor.bench.launch.steps import (
    CampaignError,
    Decision,
    LaunchOptions,
    Summary,
    clamp_workload,
    decide,
    keeps_text,
    model_problems,
    run_id,
    validate_flags,
)
from gpudoctor.bench.plan import Cell, Plan, ServerConfig, load_fields
from gpudoctor.bench.plan import quirks as quirks_mod
from gpudoctor.bench.results.run_dir import RunDir, environment_facts, read_records
from gpudoctor.bench.results.trace import cell_label, trace_path

MeasureFn = Callable[..., dict[str, Any]]
_PORT_TAKEN = re.compile(r"address already in use|Errno 98|EADDRINUSE", re.IGNORECASE)
__all__ = [
    "CampaignError",
    "Decision",
    "LaunchOptions",
    "Summary",
    "clamp_workload",
    "dry_run",
    "run_campaign",
]


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into KeyboardInterrupt so cleanup runs (SIGINT already does)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Campaign:
    """One launch of a plan on a run directory (see the module docstring)."""

    def __init__(self, plan: Plan, options: LaunchOptions, reporter: PlainReporter | None = None,
                 measure: MeasureFn | None = None) -> None:  # fmt: skip
        self.plan = plan
        self.options = options
        self.reporter = reporter or PlainReporter()
        self.engine = engine_for(plan.engine)
        self.measure = measure
        self.rundir = RunDir(options.out)
        self.quirks_path = options.quirks_path or quirks_mod.default_local_path()
        self.server_starts = 0
        self.counts = {"ok": 0, "crashed": 0, "skipped": 0}
        self.done: dict[str, dict] = {}  # every recorded cell (earlier launches' too)
        self.pool: slots_mod.GpuPool | None = None  # None: no GPU known, one server at a time
        self.stopping = threading.Event()  # set when interrupted: nothing more is recorded
        self.live: dict[int, ServerProcess] = {}  # running servers by slot (0 = unpacked)
        self._write_lock = threading.Lock()  # the one writer of results.jsonl
        self.weights: dict[str, Any] | None = None

    @property
    def state(self) -> LiveState:
        """Return the run directory's ``state.json`` writer (what runs where)."""
        if not hasattr(self, "_state"):
            self._state = LiveState(self.rundir.path / STATE, self.tag)
        return self._state

    # ---- records
    def record(self, cell: Cell, status: str, **extra: Any) -> None:
        """Append one cell's record (the only writer of results.jsonl; thread-safe)."""
        self._record(cell, status, **extra)

    def gpu_out(self, gpu: slots_mod.Gpu, reason: str, before: str) -> None:
        """Record that ``gpu`` failed its check before ``before`` and left the pool."""
        line = {"uuid": gpu.uuid, "index": gpu.index, "name": gpu.name, "reason": reason,
                "before": before, "at": now_utc()}  # fmt: skip
        with self._write_lock:
            self.rundir._append_lines(self.rundir.path / "gpus.jsonl", [line])
        self.reporter.note(
            f"GPU {gpu.index} ({gpu.uuid}) failed its check and left the pool: {reason}"
        )

    def _record(self, cell: Cell, status: str, **extra: Any) -> None:
        if self.stopping.is_set():
            return  # interrupted: the cell was not finished; a resume runs it
        server = extra.get("server") if isinstance(extra.get("server"), dict) else {}
        placed = {k: server[k] for k in ("gpus", "slot") if k in server}
        if self.options.shard is not None:
            placed["shard"] = "{}/{}".format(*self.options.shard)
        record = {
            "key": cell.key,
            "config": cell.config.name,
            "tp": cell.config.tp,
            "concurrency": cell.concurrency,
            **load_fields(cell),
            "status": status,
            "measurement": extra.pop("measurement", None),
            "config_key": cell.config.key,
            "label": cell.config.label,
            "plan": self.plan.name,
            "engine": {"name": self.plan.engine.name, "version": self.version},
            "gpu_arch": self.arch,
            "args": dict(cell.config.args),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **placed,
            **extra,
        }
        with self._write_lock:
            self.rundir.append(record)
            self.done[cell.key] = record
            self.counts[
                "ok" if status == "ok" else "crashed" if status == "crashed" else "skipped"
            ] += 1
        self.reporter.cell_done(
            cell.config.label, cell.concurrency, status, extra.get("reason") or ""
        )

    # ---- before the servers
    def _preflight(self, when: str, model_ready: bool = True) -> None:
        if self.options.preflight and self.plan.preflight.enabled:
            launch_prep.preflight(self.plan, self.arch, when, model_ready, self.reporter,
                                  self.rundir.append_preflight)  # fmt: skip

    # ---- the loop
    def run(self, resume_info: dict[str, dict]) -> Summary:
        """Run every pending cell; return the summary (raises CampaignError to stop)."""
        decisions = [
            d
            for d in decide(
                self.plan,
                resume_info,
                self.quirk_list,
                self.arch,
                self.version,
                self.options.retry_crashed,
            )
            if sched.in_shard(d.cell.key, self.options.shard)
        ]
        already = sum(1 for d in decisions if d.action == "done")
        self.done = dict(resume_info)
        self.reporter.begin(len(decisions), already)
        self._preflight("campaign", model_ready=not self.plan.model.repo)
        self.weights = launch_prep.ensure_weights(self.plan, self.reporter)
        if self.weights is not None:
            self.rundir.write_run_json({**self.facts, "weights": self.weights})
        by_config: dict[str, list[Decision]] = {}
        for d in decisions:
            by_config.setdefault(d.cell.config.label, []).append(d)
        groups: list[tuple[ServerConfig, list[Cell]]] = []
        searches: list[tuple[ServerConfig, list[Cell], searching.Bisection]] = []
        for config in self.plan.configs:
            decided = by_config.get(config.label, [])
            pending = [d for d in decided if d.action != "done"]
            search = searching.pending_search(self, config, decided)
            if not pending and search is None:
                continue
            for d in [d for d in pending if d.action == "skip"]:
                self._record(d.cell, "skipped", reason=d.reason, retryable=True)
            runnable = [d.cell for d in pending if d.action == "run"]
            if search is not None:  # a search bisects on one server: run it alone, after
                searches.append((config, runnable, search))
            elif runnable:
                groups.append((config, runnable))
        if self.pool is not None and groups:
            est = sched.learn_estimates(
                list(resume_info.values()), read_records(self.rundir.path / "servers.jsonl")[0]
            )
            _import_tokenizer_once()
            PackedRun(self, self.pool, sched.make_jobs(groups, est)).run()
        else:
            for config, runnable in groups:
                self._preflight(f"config {config.label}")
                self._run_config(config, runnable)
        for config, runnable, search in searches:
            self._preflight(f"config {config.label}")
            self._run_config(config, runnable, search=search)
        return Summary(
            len(decisions),
            already,
            self.counts["ok"],
            self.counts["crashed"],
            self.counts["skipped"],
            self.server_starts,
        )

    def _crash_quirk(self, config: ServerConfig, reason: str) -> None:
        if self.stopping.is_set():
            return  # stopped by us (interrupted), not a crash of the configuration
        try:
            quirks_mod.record_crash(
                self.quirks_path, self.arch, self.plan.engine.name, self.version, config, reason
            )
        except quirks_mod.QuirksError as exc:  # the crash is in results.jsonl all the same
            self.reporter.note(f"warning: {exc}")
            return
        self.reporter.note(f"{config.label}: added to the local quirks table {self.quirks_path}")

    def _start(
        self, config: ServerConfig, attempt: int, slot: Slot | None = None
    ) -> tuple[ServerProcess, str, dict[str, Any]]:
        """Start the server of ``config`` on a free port (on ``slot``'s GPUs when given:
        ``CUDA_VISIBLE_DEVICES=<uuids>``); return it, its URL and its facts."""
        port = free_port()
        argv = self.engine.command(config, self.plan.model, port)
        log = self.rundir.log_path(config.label)
        facts: dict[str, Any] = {"argv": argv, "port": port, "attempt": attempt,
                                 "log": str(log.relative_to(self.rundir.path))}  # fmt: skip
        env = self.engine.environment(config)
        where = ""
        if slot is not None:
            env = {**env, "CUDA_VISIBLE_DEVICES": slots_mod.visible_devices(list(slot.gpus))}
            facts.update(slot=slot.number, gpus=slot.uuids,
                         gpu_indices=[g.index for g in slot.gpus])  # fmt: skip
            where = f" (slot {slot.number}, GPU {','.join(str(g.index) for g in slot.gpus)})"
        self.reporter.config(config.label, f"starting server on port {port}{where}")
        number = slot.number if slot is not None else 0
        # its own tag under the launch's: stopping it reaps its stragglers, not its neighbours
        # (the terminator keeps slot 1's prefix from matching slot 10's)
        tag = self.tag if slot is None else f"{self.tag}:slot{number}/"
        server = ServerProcess(argv, env, log, tag)
        self.live[number] = server
        with self._write_lock:
            self.server_starts += 1
        facts["pid"] = server.pid
        self.state.start(str(number), {"label": config.label, "slot": number, "pid": server.pid,
                                       "gpus": facts.get("gpus", []),
                                       "gpu_indices": facts.get("gpu_indices", []),
                                       "log": facts["log"]})  # fmt: skip
        return server, f"http://127.0.0.1:{port}", facts

    def stop_all_servers(self) -> None:
        """Stop every running server (interrupted); each slot thread then ends."""
        for server in list(self.live.values()):
            server.stop(min(self.plan.engine.stop_timeout_s, 10.0))

    def _wait_ready(self, server: ServerProcess, base_url: str, facts: dict[str, Any]) -> None:
        """Wait for readiness, then learn the real max context (raises ServerCrashed)."""
        import httpx

        with httpx.Client() as client:
            facts["startup_s"] = round(server.wait_ready(
                lambda: self.engine.is_ready(client, base_url), self.plan.engine.startup_timeout_s,
                self.engine.log_ready_pattern), 3)  # fmt: skip
            facts["log_ready_s"] = (
                None if server.log_ready_s is None else round(server.log_ready_s, 3)
            )
            facts["max_context"] = self.engine.max_context(client, base_url, self.plan.model)

    def _stop(
        self, config: ServerConfig, server: ServerProcess, facts: dict, t_config: float
    ) -> None:
        t0 = time.monotonic()
        code = server.stop(self.plan.engine.stop_timeout_s)
        done = time.monotonic()
        number = facts.get("slot", 0)
        if self.live.get(number) is server:
            del self.live[number]
            self.state.stop(str(number))
        self._server_line(config, facts, stop_s=round(done - t0, 3), exit_code=code,
                          config_wall_s=round(done - t_config, 4))  # fmt: skip

    def run_config(self, config: ServerConfig, cells: list[Cell], slot: Slot) -> None:
        """Run ``config``'s sweep on ``slot``'s GPUs (a packed run's slot thread)."""
        self._run_config(config, cells, slot)

    def _run_config(
        self,
        config: ServerConfig,
        cells: list[Cell],
        slot: Slot | None = None,
        search: searching.Bisection | None = None,
    ) -> None:
        """Start one server for ``config`` (on ``slot``'s GPUs), run its sweep (then its
        search), stop it."""
        t_config = time.monotonic()
        for attempt in (1, 2):
            server, base_url, facts = self._start(config, attempt, slot)
            try:
                self._wait_ready(server, base_url, facts)
                break
            except ServerCrashed as exc:
                self._stop(config, server, facts, t_config)
                if attempt == 1 and _PORT_TAKEN.search("\n".join(exc.tail)):
                    self.reporter.config(
                        config.label, "port was taken meanwhile; retrying on another"
                    )
                    continue
                reason = f"server failed to start: {exc}"
                for cell in cells:
                    self._record(
                        cell, "crashed", reason=reason, server=facts, server_log_tail=exc.tail
                    )
                self._crash_quirk(config, reason)
                searching.finish(self, config, search, "crashed", reason)
                return
            except BaseException:
                self._stop(config, server, facts, t_config)
                raise
        self.reporter.config(
            config.label, f"ready in {facts['startup_s']:.1f} s, max context {facts['max_context']}"
        )
        try:
            for i, cell in enumerate(cells):
                if not self._run_cell(cell, server, base_url, facts):
                    reason = f"not run: the server of {config.label} crashed at concurrency {cell.concurrency}"
                    for later in cells[i + 1 :]:
                        self._record(later, "skipped", reason=reason, retryable=True, server=facts)
                    searching.finish(self, config, search, "crashed", reason)
                    return
            searching.run_search(self, config, search, server, base_url, facts)
        finally:
            self._stop(config, server, facts, t_config)

    def _server_line(self, config: ServerConfig, facts: dict, **extra: Any) -> None:
        line = {"label": config.label, "config_key": config.key, **facts, **extra}
        with self._write_lock:
            self.rundir._append_lines(self.rundir.path / "servers.jsonl", [line])

    def _run_cell(
        self, cell: Cell, server: ServerProcess, base_url: str, server_facts: dict
    ) -> bool:
        """Measure one cell; return False when the server crashed."""
        started = time.monotonic()
        workload, clamp = clamp_workload(
            self.plan.workload, server_facts.get("max_context"), self.plan.limits
        )
        if workload is None:
            self._record(
                cell, "skipped", reason=f"cannot fit: {clamp['note']}", clamp=clamp, retryable=False
            )
            return True
        raw = self.rundir.raw_path(cell.key)
        raw.unlink(missing_ok=True)  # an unfinished earlier attempt; this cell reruns from scratch
        metrics_url, metrics_note = self.engine.metrics_url(base_url)
        label = cell_label(cell.config.label, cell.concurrency, cell.request_rate, cell.repeat)
        target = CellTarget(
            base_url=base_url,
            served_model=self.engine.served_model(self.plan.model),
            tokenizer_dir=self.plan.model.tokenizer or self.plan.model.local_dir,
            flush_cache_path=self.engine.flush_cache_path,
            raw_path=raw,
            metrics_url=metrics_url,
            metrics_note=metrics_note,
            trace_path=trace_path(self.rundir.path, label),
            label=label,
        )
        self.reporter.cell_start(cell.config.label, cell.concurrency)
        self.state.cell(str(server_facts.get("slot", 0)), cell.concurrency)
        t_measure = time.monotonic()
        workload = workload.for_concurrency(cell.concurrency)
        if cell.request_rate is not None:
            workload = dataclasses.replace(workload, request_rate=cell.request_rate)
        slo = (
            (self.plan.search.slo or self.plan.slo)
            if cell.search and self.plan.search
            else self.plan.slo
        )
        measurement = self._measure()(target, workload, cell.concurrency, slo,
                                      telemetry=self.arch != "cpu", progress=self.reporter.requests,
                                      timeout_s=self.plan.limits.request_timeout_s,
                                      cell_timeout_s=self.plan.limits.cell_timeout_s,
                                      keep_text=keeps_text(self.plan.limits, cell.config),
                                      max_total_tokens=clamp.get("max_total_tokens"),
                                      telemetry_gpus=server_facts.get("gpus"))  # fmt: skip
        if "max_total_tokens" in clamp:
            clamp["prompts_cut"] = measurement.get("prompts_cut", 0)
        measure_s = time.monotonic() - t_measure
        timings = {"measure_s": round(measure_s, 4), "cell_s": round(time.monotonic() - started, 4)}
        common = {"measurement": measurement, "clamp": clamp, "server": server_facts, "timings": timings,
                  "raw": str(raw.relative_to(self.rundir.path))}  # fmt: skip
        if not server.alive():
            reason = f"server exited with code {server.proc.returncode} during the cell"
            self._record(cell, "crashed", reason=reason, server_log_tail=server.tail(), **common)
            self._crash_quirk(cell.config, reason)
            return False
        self._record(cell, "ok", **common)
        return True

    def run_facts(self) -> dict[str, Any]:
        """Return run.json's facts of this launch (with the weights step's result)."""
        return {**self.facts, **({"weights": self.weights} if self.weights else {})}

    def _measure(self) -> MeasureFn:
        if self.measure is None:
            from gpudoctor.bench.load.loadgen import measure_cell

            self.measure = measure_cell
        return self.measure

    # ---- setup shared by run and dry run
    def inspect(self) -> str:
        """Validate flags and learn engine version, GPU arch and quirks; return the help text."""
        help_text = validate_flags(self.plan, self.engine, self.options.help_cache)
        self.version = self.engine.version()
        self.arch = quirks_mod.detect_arch()
        try:
            self.quirk_list = quirks_mod.load_quirks(self.quirks_path)
        except quirks_mod.QuirksError as exc:
            raise CampaignError(str(exc)) from exc
        return help_text

    def setup_pool(self, announce: bool = True) -> None:
        """Learn the host's GPUs (NVML, or ``$GPUDOCTOR_FAKE_GPUS``), cap them by
        ``[hardware]``, and make the pool (no GPU: one server at a time, as before)."""
        gpus, source = slots_mod.discover_gpus()
        hw = self.plan.hardware
        if not gpus:
            if hw.gpus is not None or hw.count is not None:
                raise CampaignError("[hardware] gpus is set, but no GPU was found (NVML)")
            return
        try:
            gpus = slots_mod.cap_gpus(gpus, hw.gpus, hw.count)
        except ValueError as exc:
            raise CampaignError(f"{self.plan.source}: {exc}") from exc
        self.pool = slots_mod.GpuPool(gpus, slots_mod.read_topology())
        self.pool_source = source
        if announce:
            self.reporter.note(f"GPU pool: {len(gpus)} GPU(s) from {source}: "
                           + ", ".join(f"{g.index}={g.uuid}" for g in gpus))  # fmt: skip

    @property
    def tag(self) -> str:
        """Return this launch's process tag (``<run id>:<launch id>``)."""
        if not hasattr(self, "_tag"):
            self._tag = f"{run_id(self.options.out)}:{uuid.uuid4().hex[:8]}"
        return self._tag


def _import_tokenizer_once() -> None:
    """Import transformers' AutoTokenizer in this (main) thread before the slot threads
    start: transformers' lazy module is not safe to resolve from several threads at once."""
    with contextlib.suppress(ImportError):
        from transformers import AutoTokenizer  # noqa: F401


def run_campaign(plan: Plan, options: LaunchOptions, reporter: PlainReporter | None = None,
                 measure: MeasureFn | None = None) -> Summary:  # fmt: skip
    """Run (or resume) ``plan`` into ``options.out``; return the Summary.

    Raises CampaignError (bad flag, busy directory, failed preflight...) with one line;
    KeyboardInterrupt after SIGINT/SIGTERM. Every server is gone when this returns or raises."""
    from gpudoctor.bench.results.run_dir import RunDirError

    problems = model_problems(plan)
    if problems:
        raise CampaignError("; ".join(problems))
    campaign = Campaign(plan, options, reporter, measure)
    campaign.inspect()
    campaign.setup_pool()
    try:
        with campaign.rundir as rundir, _signals_raise():
            opened = rundir.open(plan.text, options.resume)
            done = dict(opened.done)
            if opened.dropped_bytes:
                campaign.reporter.note(
                    f"cut off a torn last line ({opened.dropped_bytes} bytes) of results.jsonl"
                )
            if opened.corrupt_lines:
                numbers = ", ".join(map(str, opened.corrupt_lines[:10]))
                campaign.reporter.note(
                    f"warning: skipped {len(opened.corrupt_lines)} corrupt line(s) of "
                    f"results.jsonl (line {numbers}); their cells, if any, run again"
                )
            if options.retry_crashed:
                retry = {
                    k for k, r in done.items() if r.get("status") == "crashed" or r.get("retryable")
                }
                rundir.drop_records(retry)
                done = {k: r for k, r in done.items() if k not in retry}
            leftovers = reap(run_id(options.out))
            if leftovers:
                campaign.reporter.note(
                    f"stopped {leftovers} server process(es) left by an earlier launch"
                )
            facts = {
                **environment_facts(plan.engine.name, campaign.version, campaign.arch),
                "tag": campaign.tag,
                "plan": plan.name,
                "shard": list(options.shard) if options.shard else None,
            }
            campaign.facts = facts
            rundir.write_run_json(facts)
            guardian = Guardian(campaign.tag)
            try:
                return campaign.run(done)
            except CampaignError as exc:
                rundir.write_run_json({**campaign.run_facts(), "stopped": str(exc)})
                raise
            except KeyboardInterrupt:
                rundir.write_run_json({**campaign.run_facts(), "stopped": "interrupted"})
                raise
            finally:
                campaign.reporter.end()
                campaign.state.close()
                guardian.close()
    except RunDirError as exc:
        raise CampaignError(str(exc)) from exc


def dry_run(plan: Plan, options: LaunchOptions, validate: bool = True) -> dict[str, Any]:
    """Return the expanded matrix without starting a server: every cell with its action
    (run / done / skip + reason), every configuration's exact server command, and
    ``problems`` (e.g. a model path that does not exist).

    ``validate`` runs the engine's ``--help`` and its interpreter (``engine.python``) to
    check flags and learn the version: a plan is code, and those are programs it names.
    ``validate=False`` is a pure expansion: no program of the plan runs."""
    campaign = Campaign(plan, options)
    notes = []
    if not validate:
        notes.append("flags not validated (--no-validate): no program of the plan was run")
        campaign.version, campaign.arch = plan.engine.version, quirks_mod.detect_arch()
        campaign.quirk_list = quirks_mod.load_quirks(campaign.quirks_path)
    else:
        try:
            campaign.inspect()
        except CampaignError as exc:
            if "not installed" not in str(exc):
                raise
            notes.append(f"flags not validated: {exc}")
            campaign.version, campaign.arch = None, quirks_mod.detect_arch()
            campaign.quirk_list = quirks_mod.load_quirks(campaign.quirks_path)
    from gpudoctor.bench.results.run_dir import RunDirError, check_run_dir, read_records

    records: list[dict[str, Any]] = []
    try:  # the same trust as a run: another user's --out is refused, links never followed
        if options.out and check_run_dir(Path(options.out)):
            records, _ = read_records(Path(options.out) / "results.jsonl")
    except RunDirError as exc:
        raise CampaignError(str(exc)) from exc
    done = {str(r["key"]): r for r in records if "key" in r} if options.resume is not False else {}
    decisions = [
        d
        for d in decide(
            plan, done, campaign.quirk_list, campaign.arch, campaign.version, options.retry_crashed
        )
        if sched.in_shard(d.cell.key, options.shard)
    ]
    try:
        campaign.setup_pool(announce=False)
    except CampaignError as exc:  # e.g. [hardware] on a machine without the GPUs
        notes.append(f"no GPU pool: {exc}")
    servers = read_records(Path(options.out) / "servers.jsonl")[0] if options.out else []
    schedule = _schedule(campaign, decisions, sched.learn_estimates(list(done.values()), servers))
    configs = []
    for config in plan.configs:
        argv = campaign.engine.command(config, plan.model, 0)
        env = campaign.engine.environment(config)
        configs.append({"label": config.label, "key": config.key, "command": argv, "env": env,
                        "concurrencies": list(config.concurrencies)})  # fmt: skip
    cells = [{"key": d.cell.key, "label": d.cell.config.label, "concurrency": d.cell.concurrency,
              **load_fields(d.cell), "action": d.action, "reason": d.reason}
             for d in decisions]  # fmt: skip
    return {"plan": plan.name, "engine": plan.engine.name, "engine_version": campaign.version,
            "validated": validate, "gpu_arch": campaign.arch, "configs": configs, "cells": cells, "notes": notes,
            "problems": model_problems(plan), "schedule": schedule,
            "shard": list(options.shard) if options.shard else None,
            "search": dataclasses.asdict(plan.search) if plan.search else None,
            "repeats": plan.repeats,
            "workload": dataclasses.asdict(plan.workload)}  # fmt: skip


def _schedule(
    campaign: Campaign, decisions: list[Decision], est: sched.Estimates
) -> dict[str, Any]:
    """Return the dry run's schedule: each job's GPUs and wave, the expected length."""
    groups: dict[str, tuple[ServerConfig, list[Cell]]] = {}
    for d in decisions:
        if d.action == "run":
            groups.setdefault(d.cell.config.label, (d.cell.config, []))[1].append(d.cell)
    jobs = sched.make_jobs(list(groups.values()), est)
    pool = campaign.pool
    serial_s = sum(j.estimate_s for j in jobs)
    if pool is None:  # no GPU known: one server at a time, in plan order
        t, rows = 0.0, []
        for wave, (config, cells) in enumerate(groups.values(), start=1):
            job = sched.make_jobs([(config, cells)], est)[0]
            rows.append({"label": config.label, "gpus": [], "wave": wave, "start_s": t,
                         "end_s": t + job.estimate_s, "cells": len(cells)})  # fmt: skip
            t += job.estimate_s
        return {"gpus": [], "source": None, "placements": rows, "expected_s": t,
                "ideal_s": t, "serial_s": serial_s, "packed": False}  # fmt: skip
    by_index = {g.index: g for g in pool.gpus}
    placements = sched.simulate(jobs, [g.index for g in pool.gpus])
    too_big = [j.config.label for j in jobs if j.gpus > len(pool.gpus)]
    return {
        "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name} for g in pool.gpus],
        "source": campaign.pool_source,
        "placements": [
            {
                "label": p.label,
                "gpus": [by_index[i].uuid for i in p.gpus],
                "gpu_indices": list(p.gpus),
                "wave": p.wave,
                "start_s": p.start_s,
                "end_s": p.end_s,
                "cells": p.cells,
            }
            for p in placements
        ],
        "not_runnable": too_big,
        "expected_s": sched.makespan(placements),
        "ideal_s": sched.ideal_s([j for j in jobs if j.gpus <= len(pool.gpus)], len(pool.gpus)),
        "serial_s": serial_s,
        "packed": True,
    }


def dumps(obj: Any) -> str:
    """Return ``obj`` as indented JSON (for ``--json``)."""
    return json.dumps(obj, indent=2, default=str)
