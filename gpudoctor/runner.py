"""The runner: runs the selected checks in dependency order, in parallel, each with a timeout.

- A check starts as soon as every check it depends on (``requires`` + ``after``) has
  finished; independent checks run side by side in threads.
- A check whose ``requires`` are not healthy is not run: it reports SKIP with the reason.
- Every check has a timeout; a check that overruns, or raises, becomes ERROR (with the
  traceback in ``--json`` only) and never vanishes from the report.
- The CUDA/NVML probe runs in a child process (see :mod:`gpudoctor.facts.gpu`), started
  first so that it overlaps the file-based checks, but only after every device-node fact
  was read (:meth:`gpudoctor.context.FactCache.nodes_before`): the driver library in the
  probe may rewrite nodes, and the node checks report what was there before it ran.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable

from gpudoctor.context import CheckContext, CheckOptions, FactCache
from gpudoctor.facts.nodes import nvidia_majors
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.model import CheckResult, Finding, Report, Status
from gpudoctor.registry import CheckSpec, load_catalogue

ProgressCallback = Callable[[CheckResult], None]


def select(specs: list[CheckSpec], only: Iterable[str], with_ct_host: bool) -> list[CheckSpec]:
    """Return the checks to run: those named in ``only`` (ids or families; all when empty)
    plus everything they require, in catalogue order. ``ct_host`` checks need a CT host."""
    by_id = {s.id: s for s in specs}
    wanted = [w.strip() for w in only if w.strip()]
    unknown = [w for w in wanted if w not in by_id and not any(s.family == w for s in specs)]
    if unknown:
        raise ValueError(f"unknown check id or family: {', '.join(unknown)} (see `gpudoctor list`)")
    chosen = {s.id for s in specs if not wanted or s.id in wanted or s.family in wanted}
    stack = list(chosen)
    while stack:
        for dep in by_id[stack.pop()].requires:
            if dep not in chosen:
                chosen.add(dep)
                stack.append(dep)
    return [s for s in specs if s.id in chosen and (with_ct_host or s.scope != "ct_host")]


def run_checks(
    host: Host,
    options: CheckOptions,
    *,
    ct_host: Host | None = None,
    specs: list[CheckSpec] | None = None,
    progress: ProgressCallback | None = None,
    target_name: str | None = None,
    facts: FactCache | None = None,
) -> Report:
    """Run the catalogue against ``host`` (and ``ct_host`` for host-side CT checks) and
    return the Report. Raises ValueError for an unknown ``--only`` id; never for a check."""
    started = time.monotonic()
    facts_by_scope = {"target": facts or FactCache(host, options)}
    catalogue = specs if specs is not None else load_catalogue()
    selected = select(catalogue, options.only, ct_host is not None)
    if ct_host is not None:
        facts_by_scope["ct_host"] = FactCache(ct_host, options)
    target_facts = facts_by_scope["target"]
    if any(s.uses_gpu_probe for s in selected) and nvidia_majors(target_facts.proc_devices()):
        # reads every node fact first (observe before disturbing), then starts the probe;
        # no NVIDIA driver: every probe check SKIPs anyway, and nothing disturbs the nodes
        target_facts.start_gpu_probe()
    results = Schedule(selected, facts_by_scope, options, progress).run()
    return Report(
        target=target_name or host.name,
        results=tuple(results[s.id] for s in selected),
        duration_s=time.monotonic() - started,
    )


class Schedule:
    """Runs checks as their dependencies complete; one worker thread per check that runs."""

    def __init__(
        self,
        specs: list[CheckSpec],
        facts: dict[str, FactCache],
        options: CheckOptions,
        progress: ProgressCallback | None,
    ) -> None:
        self.specs = specs
        self.facts = facts
        self.options = options
        self.progress = progress
        self.results: dict[str, CheckResult] = {}
        self.done = threading.Condition()
        self.selected = {s.id for s in specs}

    def deps(self, spec: CheckSpec) -> set[str]:
        """Return the selected checks that must finish before ``spec`` starts."""
        return {d for d in spec.requires + spec.after if d in self.selected}

    def run(self) -> dict[str, CheckResult]:
        """Run every check; return {id: result} once all have finished or timed out. Each
        check that runs gets one worker thread; this loop starts them as their dependencies
        finish, records the SKIP of those whose requirements are unhealthy, and an ERROR
        for a check that overruns its deadline (its thread is left behind)."""
        started: set[str] = set()
        running: dict[str, tuple[float, float]] = {}  # id -> (began, deadline)
        while True:
            announce: list[CheckResult] = []
            finished = False
            with self.done:
                now = time.monotonic()
                for spec_id, (began, deadline) in list(running.items()):
                    if spec_id in self.results:
                        del running[spec_id]
                    elif deadline <= now:
                        del running[spec_id]
                        announce.append(self.record(timed_out(spec_id, deadline - began), began))
                for spec in self.specs:
                    if spec.id in started or not self.deps(spec) <= self.results.keys():
                        continue
                    started.add(spec.id)
                    blocked = [d for d in spec.requires if not self.results[d].status.healthy]
                    if blocked:
                        skipped = (skipped_for(spec, blocked, self.results),)
                        announce.append(self.record(skipped, time.monotonic(), spec.id))
                        continue
                    began = time.monotonic()
                    running[spec.id] = (began, began + self.timeout_of(spec))
                    threading.Thread(target=self.work, args=(spec, began),
                                     name=f"check:{spec.id}", daemon=True).start()  # fmt: skip
                if not announce:
                    if len(self.results) >= len(self.specs):
                        finished = True
                    else:
                        deadlines = [d for _, d in running.values()]
                        self.done.wait(min(deadlines) - now if deadlines else None)
            if self.progress is not None:
                for result in announce:
                    self.progress(result)
            if finished:
                return self.results

    def record(
        self, findings: tuple[Finding, ...], began: float, spec_id: str | None = None
    ) -> CheckResult:
        """Record a result made by the run loop (lock held); return it."""
        check_id = spec_id or findings[0].check_id
        result = CheckResult(check_id, findings, time.monotonic() - began)
        self.results[check_id] = result
        return result

    def timeout_of(self, spec: CheckSpec) -> float:
        """Return the seconds ``spec`` may run (the probe's timeout added for probe checks)."""
        return self.options.timeout_s + (self.options.probe_timeout_s if spec.uses_gpu_probe else 0)

    def work(self, spec: CheckSpec, began: float) -> None:
        """Run one check in this (worker) thread; record its result unless it timed out."""
        result = CheckResult(spec.id, self.execute(spec), time.monotonic() - began)
        with self.done:
            if spec.id in self.results:  # the run loop gave up on it
                return
            self.results[spec.id] = result
            self.done.notify_all()
        if self.progress is not None:
            self.progress(result)

    def execute(self, spec: CheckSpec) -> tuple[Finding, ...]:
        """Return the check's findings, or one ERROR finding when it raised."""
        on_host = spec.scope == "ct_host" or (spec.scope == "node" and "ct_host" in self.facts)
        facts = self.facts["ct_host" if on_host else "target"]
        ctx = CheckContext(spec.id, facts.host, self.options, facts, self.results)
        box: dict[str, object] = {}
        try:
            box["findings"] = tuple(spec.func(ctx))
        except BaseException as exc:
            box["error"] = exc
            box["traceback"] = traceback.format_exc()
        if "error" in box:
            exc = box["error"]
            kind = (
                "the host could not be reached"
                if isinstance(exc, HostError)
                else "the check raised"
            )
            return (
                Finding(
                    spec.id,
                    Status.ERROR,
                    "check",
                    f"{kind}: {type(exc).__name__}: {exc}",
                    debug=str(box["traceback"]),
                ),
            )
        findings = box.get("findings") or ()
        if not findings:
            return (Finding(spec.id, Status.PASS, "check", "nothing to report"),)
        return findings  # type: ignore[return-value]


def timed_out(check_id: str, timeout: float) -> tuple[Finding, ...]:
    """Return the ERROR finding of a check that overran its ``timeout`` seconds."""
    message = f"the check did not finish within {timeout:g} s"
    return (Finding(check_id, Status.ERROR, "check", message),)


def skipped_for(spec: CheckSpec, blocked: list[str], results: dict[str, CheckResult]) -> Finding:
    """Return the SKIP finding of a check whose required checks are not healthy."""
    reasons = ", ".join(f"{d} {results[d].status.value}" for d in blocked)
    return Finding(spec.id, Status.SKIP, "check", f"not run: {reasons}", caused_by=tuple(blocked))
