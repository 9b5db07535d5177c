"""The campaign: a plan's launch on a run directory, from the first check to the summary.

A campaign, step by step (docs/architecture.md draws the same walk):

1. :mod:`.steps` -- the plan's model is there; every cell gets a :class:`Decision`
   (run / done / skip by a quirk), filtered to this host's shard;
2. :mod:`.prep` -- every flag checked against the engine's ``--help`` (before anything
   starts: a typo must not cost an hour of GPU time), the version, the GPU arch, the
   quirks, the GPU pool; ``gpudoctor check`` (preflight) and the weights;
3. the run directory opened (:mod:`gpudoctor.bench.results.run_dir`; a resume never reruns
   a finished cell), leftovers of an earlier launch reaped, a guardian started
   (:mod:`.server`);
4. a strategy decides what runs where next: :mod:`.serial` (no GPU pool: one server at a
   time), :mod:`.packed` (several servers, each on its own GPUs), :mod:`.searching` (a
   ``[search]`` bisects on its configuration's server);
5. :mod:`.config_sweep` with :mod:`.server_lifecycle` -- one server per configuration,
   its cells in order, a crash recorded and quirked, the matrix goes on;
6. :mod:`.cell_runner` -- one cell on one running server -> one record, appended by
   :mod:`.run_writer` (the one writer of results.jsonl); :mod:`.live_state` says what
   runs where.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch import interrupts, prep
from gpudoctor.bench.launch.cell_runner import CellRunner, EngineFacts, MeasureFn
from gpudoctor.bench.launch.live_state import LiveState
from gpudoctor.bench.launch.packed import PackedRun
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.run_writer import RunWriter
from gpudoctor.bench.launch.schedule import in_shard, learn_estimates, make_jobs
from gpudoctor.bench.launch.searching import Bisection, SearchRun
from gpudoctor.bench.launch.serial import run_serial
from gpudoctor.bench.launch.server import Guardian, reap
from gpudoctor.bench.launch.server_lifecycle import ServerLifecycle
from gpudoctor.bench.launch.steps import (
    CampaignError,
    Decision,
    LaunchOptions,
    Summary,
    decide,
    load_generator_problems,
    model_problems,
    retried,
    run_id,
    with_legacy_keys,
)
from gpudoctor.bench.plan import Cell, Plan, ServerConfig
from gpudoctor.bench.plan import quirks as quirks_mod
from gpudoctor.bench.results.launcher_state import STATE
from gpudoctor.bench.results.run_dir import RunDir, RunDirError, environment_facts, read_records

__all__ = ["CampaignError", "LaunchOptions", "Summary", "run_campaign"]


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt so cleanup runs, each one also
    recorded so that one Python drops is raised again (:mod:`interrupts`)."""
    with interrupts.catching():
        yield


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
        self.tag = f"{run_id(options.out)}:{uuid.uuid4().hex[:8]}"  # this launch's processes
        self.writer = RunWriter(self.rundir, self.reporter)
        self.state = LiveState(self.rundir.path / STATE, self.tag)
        self.facts: dict[str, Any] = {}
        self.weights: dict[str, Any] | None = None

    def inspect(self) -> None:
        """Validate flags, learn the engine's version, the GPU arch and the quirks, and the
        GPU pool (CampaignError on a bad flag or a missing GPU the plan asks for)."""
        self.inspection = prep.inspect_engine(
            self.plan, self.engine, self.options.help_cache, self.quirks_path
        )
        self.pool, source = prep.gpu_pool(self.plan)
        if self.pool is not None:
            self.reporter.note(f"GPU pool: {len(self.pool.gpus)} GPU(s) from {source}: "
                               + ", ".join(f"{g.index}={g.uuid}" for g in self.pool.gpus))  # fmt: skip

    def run_facts(self) -> dict[str, Any]:
        """Return run.json's facts of this launch (with the weights step's result)."""
        return {**self.facts, **({"weights": self.weights} if self.weights else {})}

    def run(self, resume_info: dict[str, dict]) -> Summary:
        """Run every pending cell; return the summary (raises CampaignError to stop)."""
        plan, options, found = self.plan, self.options, self.inspection
        decided = decide(
            plan, resume_info, found.quirks, found.arch, found.version, options.retry_crashed
        )
        decisions = [d for d in decided if in_shard(d.cell.key, options.shard)]
        already = sum(1 for d in decisions if d.action == "done")
        self.writer.done = dict(resume_info)
        self.reporter.begin(len(decisions), already)
        engine_facts = EngineFacts(found.version, found.arch)
        runner = CellRunner(plan, self.engine, self.writer, self.reporter, self.state,
                            engine_facts, options.shard, self.measure)  # fmt: skip
        servers = ServerLifecycle(plan, self.engine, self.writer, self.reporter, self.state,
                                  self.tag, engine_facts, self.quirks_path)  # fmt: skip
        preflight = prep.Preflight(plan, found.arch, options.preflight, self.reporter,
                                   self.rundir.append_preflight)  # fmt: skip
        preflight("campaign", model_ready=not plan.model.repo)
        self.weights = prep.ensure_weights(plan, self.reporter)
        if self.weights is not None:
            self.rundir.write_run_json({**self.facts, "weights": self.weights})
        search_run = SearchRun(plan, servers, runner)
        groups, searches = self._plan_servers(decisions, runner, search_run)
        if self.pool is not None and groups:
            est = learn_estimates(
                list(resume_info.values()), read_records(self.rundir.path / "servers.jsonl")[0]
            )
            _import_tokenizer_once()
            PackedRun(servers, runner, self.pool, make_jobs(groups, est)).run()
        else:
            run_serial(servers, runner, preflight, groups)
        for config, runnable, search in searches:
            preflight(f"config {config.label}")
            search_run.run(config, runnable, search)
        counts = self.writer.counts
        ok = counts["ok"] - counts["client_bound"]  # a client-bound cell is no result
        return Summary(len(decisions), already, ok, counts["crashed"],
                       counts["skipped"], servers.starts, failed=counts["failed"],
                       client_bound=counts["client_bound"])  # fmt: skip

    def _plan_servers(
        self, decisions: list[Decision], runner: CellRunner, search_run: SearchRun
    ) -> tuple[
        list[tuple[ServerConfig, list[Cell]]], list[tuple[ServerConfig, list[Cell], Bisection]]
    ]:
        """Record the cells skipped by a quirk; return the configurations with cells to run
        (a sweep each) and those with a search left (run alone, after the sweeps)."""
        by_config: dict[str, list[Decision]] = {}
        for d in decisions:
            by_config.setdefault(d.cell.config.label, []).append(d)
        groups: list[tuple[ServerConfig, list[Cell]]] = []
        searches: list[tuple[ServerConfig, list[Cell], Bisection]] = []
        for config in self.plan.configs:
            decided = by_config.get(config.label, [])
            pending = [d for d in decided if d.action != "done"]
            search = search_run.pending(config, decided)
            if not pending and search is None:
                continue
            for d in [d for d in pending if d.action == "skip"]:
                runner.record(d.cell, "skipped", reason=d.reason, retryable=True)
            runnable = [d.cell for d in pending if d.action == "run"]
            if search is not None:  # a search bisects on one server: run it alone, after
                searches.append((config, runnable, search))
            elif runnable:
                groups.append((config, runnable))
        return groups, searches


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
    problems = model_problems(plan) + (load_generator_problems() if measure is None else [])
    if problems:
        raise CampaignError("; ".join(problems))
    campaign = Campaign(plan, options, reporter, measure)
    campaign.inspect()
    try:
        with campaign.rundir as rundir, _signals_raise():
            opened = rundir.open(plan.text, options.resume)
            done = with_legacy_keys(plan, opened.done) if opened.same_plan else dict(opened.done)
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
            if options.retry_crashed or options.retry_failed:
                retry = {k for k, r in done.items() if retried(r, options)}
                rundir.drop_records(retry)
                done = {k: r for k, r in done.items() if k not in retry}
            leftovers = reap(run_id(options.out))
            if leftovers:
                campaign.reporter.note(
                    f"stopped {leftovers} server process(es) left by an earlier launch"
                )
            found = campaign.inspection
            facts = {
                **environment_facts(plan.engine.name, found.version, found.arch),
                "tag": campaign.tag,
                "plan": plan.name,
                "plan_dir": str(Path(plan.source).resolve().parent),  # bench status: keys
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
