"""The runner: runs the selected checks in dependency order, in parallel, each with a timeout.

- A check starts as soon as every check it depends on (``requires`` + ``after``) has
  finished; independent checks run side by side in threads.
- A check whose ``requires`` are not healthy is not run: it reports SKIP with the reason.
- Every check has a timeout; a check that overruns, or raises, becomes ERROR (with the
  traceback in ``--json`` only) and never vanishes from the report.
- The CUDA/NVML probe runs in a child process (see :mod:`gpudoctor.facts.gpu`), started
  first so that it overlaps the file-based checks.
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
    return [s for s in specs if s.id in chosen and (with_ct_host or s.scope == "target")]


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
        target_facts.start_gpu_probe()  # no NVIDIA driver: every probe check SKIPs anyway
    results = Schedule(selected, facts_by_scope, options, progress).run()
    return Report(
        target=target_name or host.name,
        results=tuple(results[s.id] for s in selected),
        duration_s=time.monotonic() - started,
    )


class Schedule:
    """Runs checks as their dependencies complete; one supervisor thread per check."""

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
        """Run every check; return {id: result} once all have finished or timed out."""
        started: set[str] = set()
        with self.done:
            while len(self.results) < len(self.specs):
                for spec in self.specs:
                    if spec.id not in started and self.deps(spec) <= self.results.keys():
                        started.add(spec.id)
                        threading.Thread(target=self.supervise, args=(spec,), daemon=True).start()
                self.done.wait()
        return self.results

    def supervise(self, spec: CheckSpec) -> None:
        """Run one check in a worker thread with a timeout; record its result."""
        began = time.monotonic()
        blocked = [d for d in spec.requires if not self.results[d].status.healthy]
        if blocked:
            findings: tuple[Finding, ...] = (skipped_for(spec, blocked, self.results),)
        else:
            findings = self.execute(spec)
        result = CheckResult(spec.id, findings, time.monotonic() - began)
        with self.done:
            self.results[spec.id] = result
            self.done.notify_all()
        if self.progress is not None:
            self.progress(result)

    def execute(self, spec: CheckSpec) -> tuple[Finding, ...]:
        """Return the check's findings, or one ERROR finding when it raised or timed out."""
        facts = self.facts["ct_host" if spec.scope == "ct_host" else "target"]
        ctx = CheckContext(spec.id, facts.host, self.options, facts, self.results)
        box: dict[str, object] = {}

        def work() -> None:
            try:
                box["findings"] = tuple(spec.func(ctx))
            except BaseException as exc:
                box["error"] = exc
                box["traceback"] = traceback.format_exc()

        worker = threading.Thread(target=work, name=f"check:{spec.id}", daemon=True)
        worker.start()
        timeout = self.options.timeout_s + (
            self.options.probe_timeout_s if spec.uses_gpu_probe else 0
        )
        worker.join(timeout)
        if worker.is_alive():
            return (
                Finding(
                    spec.id, Status.ERROR, "check", f"the check did not finish within {timeout:g} s"
                ),
            )
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


def skipped_for(spec: CheckSpec, blocked: list[str], results: dict[str, CheckResult]) -> Finding:
    """Return the SKIP finding of a check whose required checks are not healthy."""
    reasons = ", ".join(f"{d} {results[d].status.value}" for d in blocked)
    return Finding(spec.id, Status.SKIP, "check", f"not run: {reasons}", caused_by=tuple(blocked))
