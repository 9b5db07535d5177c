"""``gpudoctor fix --cluster``: the per-CT fixer on every CT of a fleet, a few restarts at a time.

Two phases, both through :func:`gpudoctor.pve.fixer.run_fix` (no shelling out):

1. plan (read-only, ``parallel`` at a time): a dry run per CT says ``nothing_to_change``,
   ``refused`` (locked CT, ...) or shows the diff it would apply;
2. apply (after ``confirm`` unless ``yes``): the CTs with a diff, at most ``max_restarts``
   at once (each fix restarts its CT and re-checks inside it). The first ``rolled_back``
   (or an error) stops the phase: fixes not started yet are ``skipped``, unless
   ``keep_going``.

One SSH connection per node, shared by its CTs' fixes. No click here: the CLI wraps it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.exit_codes import ExitCode
from gpudoctor.fleet.execute import FleetSettings, error_text, open_node
from gpudoctor.fleet.inventory import CtSpec, Inventory, NodeSpec
from gpudoctor.fleet.pool import DeadlinePool, Job
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.pve.apply import ApplyError, Layout
from gpudoctor.pve.fixer import FixOptions, FixOutcome, run_fix
from gpudoctor.pve.planner import PlanOptions
from gpudoctor.pve.uvm_unit import run_host_prep

OK_STATUSES = ("nothing_to_change", "dry_run", "applied", "applied_not_running")
NEEDS_CHANGE = "dry_run"
STOPPING = ("rolled_back", "error")  # an apply that ends so stops the others


@dataclass(frozen=True)
class ClusterFixSettings:
    """How to fix a fleet.

    Attributes:
        plan: the planner's options for every CT (mode, devices, prune).
        layout: where things are on the nodes (``Layout.from_env()``).
        max_restarts: fixes (each restarting one CT) at once, over the whole fleet.
        keep_going: go on after a rollback instead of stopping.
        dry_run: plan and show the diffs only.
        yes: apply without ``confirm``.
        restart: restart running CTs after the write (and re-check inside).
        parallel: plans at once (read-only phase).
        plan_timeout_s: deadline of one CT's plan.
        apply_timeout_s: deadline of one CT's fix (write + restart + re-check).
        connection: SSH options (``known_hosts``, ``identity_file``, ...; its
            ``parallel`` and ``options`` are not used).
        driver_libs: ``fix --driver-libs`` for every CT ("" = none).
        host_prep: ``--host-prep``: install the boot unit (and the follow-driver
            triggers) on each node where a CT's state points to the host
            (:attr:`ClusterFixResult.host_prep`).
    """

    plan: PlanOptions = field(default_factory=PlanOptions)
    layout: Layout = field(default_factory=Layout)
    max_restarts: int = 2
    keep_going: bool = False
    dry_run: bool = False
    yes: bool = False
    restart: bool = True
    driver_libs: str = ""
    host_prep: bool = False
    parallel: int = 8
    plan_timeout_s: float = 120.0
    apply_timeout_s: float = 600.0
    connection: FleetSettings = field(default_factory=FleetSettings)


@dataclass(frozen=True)
class CtFix:
    """What happened to one CT.

    Attributes:
        node, ct: where.
        status: a :class:`FixOutcome` status (``applied``, ``rolled_back``, ...), or
            ``declined``, ``skipped`` (not started after a rollback), ``error``.
        exit_code: 0 fine, 3 not fixed / failed.
        message: one sentence.
        diff: the planned unified diff ("" when none).
        outcome: the fixer's full outcome, when it ran.
        started_s, finished_s: seconds since the phase's start (apply phase for applied
            fixes, plan phase otherwise).
    """

    node: str
    ct: str
    status: str
    exit_code: int
    message: str
    diff: str = ""
    outcome: FixOutcome | None = None
    started_s: float = 0.0
    finished_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the CT's result as JSON-ready data (the fixer's outcome under ``fix``)."""
        return {
            "node": self.node,
            "ct": self.ct,
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "diff": self.diff,
            "started_s": round(self.started_s, 3),
            "finished_s": round(self.finished_s, 3),
            "fix": self.outcome.to_dict() if self.outcome else None,
        }


@dataclass(frozen=True)
class NodePrep:
    """What ``--host-prep`` did on one node: ``status`` is the host prep's (``applied``,
    ``nothing_to_change``, ``dry_run``) or ``error``; ``exit_code`` 0 unless ``error``."""

    node: str
    status: str
    exit_code: int
    message: str
    diff: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return the node's host prep as JSON-ready data."""
        return {"node": self.node, "status": self.status, "exit_code": self.exit_code,
                "message": self.message, "diff": self.diff}  # fmt: skip


@dataclass(frozen=True)
class ClusterFixResult:
    """Every CT's result, in inventory order.

    Attributes:
        fixes: one CtFix per CT.
        stopped_by: ``node/ct`` of the rollback that stopped the apply phase, or None.
        prepared: with ``--host-prep``, one :class:`NodePrep` per node that needed it.
    """

    fixes: tuple[CtFix, ...]
    stopped_by: str | None = None
    prepared: tuple[NodePrep, ...] = ()

    @property
    def host_prep(self) -> tuple[tuple[str, str], ...]:
        """Return ``(node, why)`` once per node where a CT's state points to the host
        (nodes missing there when the CT started: :attr:`FixPlan.host_cause`): the durable
        cure is ``gpudoctor fix --host NODE --host-prep`` on that node."""
        found: dict[str, str] = {}
        for fix in self.fixes:
            plan = fix.outcome.plan if fix.outcome is not None else None
            if plan is not None and plan.host_cause:
                found.setdefault(fix.node, plan.host_cause)
        return tuple(found.items())

    @property
    def exit_code(self) -> int:
        """Return 0 when every CT is fixed or needed nothing (or only planned), else 3."""
        ok = all(f.exit_code == ExitCode.OK for f in [*self.fixes, *self.prepared])
        return ExitCode.OK if ok else ExitCode.FAILED

    def to_dict(self) -> dict[str, Any]:
        """Return the whole result as JSON-ready data."""
        return {
            "status": "ok" if self.exit_code == ExitCode.OK else "failed",
            "exit_code": self.exit_code,
            "stopped_by": self.stopped_by,
            "cts": [f.to_dict() for f in self.fixes],
            "host_prep": [{"node": node, "why": why} for node, why in self.host_prep],
            "prepared": [p.to_dict() for p in self.prepared],
        }


Confirm = Callable[[Sequence[CtFix]], bool]
Progress = Callable[[str], None]


def fix_cluster(
    inventory: Inventory,
    settings: ClusterFixSettings,
    confirm: Confirm = lambda fixes: False,
    progress: Progress = lambda text: None,
    connector: Callable[[NodeSpec, FleetSettings], Host] = open_node,
) -> ClusterFixResult:
    """Plan every CT, then (``yes`` or ``confirm(planned)``) apply the changed ones at most
    ``max_restarts`` at a time; return the per-CT results (raises nothing per CT)."""
    hosts = _NodeHosts(inventory, settings.connection, connector)
    try:
        planned = _plan_all(inventory, settings, hosts, progress)
        changes = [f for f in planned if f.status == NEEDS_CHANGE]
        if settings.dry_run or not changes:
            result = ClusterFixResult(tuple(planned))
            return replace(result, prepared=prepare_nodes(result, settings, hosts.get, progress))
        if not settings.yes and not confirm(changes):
            declined = [
                replace(f, status="declined", exit_code=ExitCode.OK, message="not applied: declined")
                if f.status == NEEDS_CHANGE else f
                for f in planned
            ]  # fmt: skip
            return ClusterFixResult(tuple(declined))
        applied, stopped_by = _apply_all(inventory, changes, settings, hosts, progress)
        merged = [applied.get((f.node, f.ct), f) for f in planned]
        # the nodes named by the plans: the restarts cured the CTs, the unit keeps the
        # next boot from bringing the race back
        named = ClusterFixResult(tuple(planned))
        prepared = prepare_nodes(named, settings, hosts.get, progress)
        return ClusterFixResult(tuple(merged), stopped_by, prepared)
    finally:
        hosts.close()


def prepare_nodes(
    result: ClusterFixResult,
    settings: ClusterFixSettings,
    host_of: Callable[[str], Host],
    progress: Progress = lambda text: None,
) -> tuple[NodePrep, ...]:
    """With ``settings.host_prep``, run ``--host-prep`` (:func:`uvm_unit.run_host_prep`; a
    dry run in a dry run) on each node of ``result.host_prep``, once per node, one node
    after the other; return what it did per node (empty without ``host_prep``)."""
    done = []
    for node, _why in result.host_prep if settings.host_prep else ():
        progress(f"{node}: --host-prep")
        try:
            out = run_host_prep(host_of(node), dry_run=settings.dry_run, yes=True,
                                layout=settings.layout)  # fmt: skip
        except (ApplyError, HostError) as exc:
            done.append(NodePrep(node, "error", ExitCode.FAILED, str(exc)))
            continue
        pending = out.status == "dry_run"
        done.append(NodePrep(node, out.status, ExitCode.OK if pending else out.exit_code,
                             out.message, out.plan.diff))  # fmt: skip
    return tuple(done)


class _NodeHosts:
    """One connection per node, opened on first use and shared by its CTs' fixes."""

    def __init__(self, inventory: Inventory, settings: FleetSettings,
                 connector: Callable[[NodeSpec, FleetSettings], Host]) -> None:  # fmt: skip
        self.inventory = inventory
        self.settings = settings
        self.connector = connector
        self._lock = threading.Lock()
        self._hosts: dict[str, Host] = {}

    def get(self, node: str) -> Host:
        """Return node ``node``'s Host, opening it on first use (not yet connected)."""
        with self._lock:
            if node not in self._hosts:
                self._hosts[node] = self.connector(self.inventory.node(node), self.settings)
            return self._hosts[node]

    def close(self) -> None:
        """Close every connection opened (in the background: a closing SSH transport
        can take a moment and nothing waits for it)."""
        for host in self._hosts.values():
            threading.Thread(target=host.close, daemon=True).start()


def _fix_options(ct: CtSpec, node: NodeSpec, settings: ClusterFixSettings, **kw: Any) -> FixOptions:
    layout = settings.layout
    if node.lxcpath and node.flavor == "lxc":
        layout = replace(layout, lxcpath=node.lxcpath)
    return FixOptions(ct=ct.ct, flavor=node.flavor, plan=settings.plan, layout=layout,
                      restart=settings.restart, driver_libs=settings.driver_libs, **kw)  # fmt: skip


def _from_outcome(ct: CtSpec, outcome: FixOutcome, began: float, ended: float) -> CtFix:
    diff = outcome.plan.diff if outcome.plan is not None and outcome.plan.changed else ""
    planned = outcome.status == NEEDS_CHANGE  # planned, not a failure
    code = ExitCode.OK if planned else outcome.exit_code
    return CtFix(ct.node, ct.ct, outcome.status, code, outcome.message, diff,
                 outcome, began, ended)  # fmt: skip


def _failed(ct: CtSpec, status: str, message: str, began: float = 0.0, ended: float = 0.0) -> CtFix:
    return CtFix(
        ct.node, ct.ct, status, ExitCode.FAILED, message, started_s=began, finished_s=ended
    )


def _plan_all(inventory: Inventory, settings: ClusterFixSettings, hosts: _NodeHosts,
              progress: Progress) -> list[CtFix]:  # fmt: skip
    pool = DeadlinePool(settings.parallel, settings.connection.per_node)
    results: dict[tuple[str, str], CtFix] = {}
    lock = threading.Lock()
    for ct in inventory.cts:
        node = inventory.node(ct.node)
        if not node.online:
            results[(ct.node, ct.ct)] = _failed(ct, "error", f"node {node.name} is offline")
            continue

        def run(ct: CtSpec = ct, node: NodeSpec = node) -> FixOutcome:
            return run_fix(hosts.get(node.name), _fix_options(ct, node, settings, dry_run=True),
                           host_label=node.ssh)  # fmt: skip

        def done(result: Any, began: float, ended: float, ct: CtSpec = ct) -> None:
            fix = result if isinstance(result, CtFix) else _from_outcome(ct, result, began, ended)
            if isinstance(result, CtFix):
                fix = replace(fix, started_s=began, finished_s=ended)
            with lock:
                results[(ct.node, ct.ct)] = fix
            progress(f"planned {ct.label}: {fix.status}")

        pool.submit(Job(
            key=ct.node, label=f"plan {ct.label}", run=run, timeout_s=settings.plan_timeout_s,
            on_timeout=lambda s, ct=ct: _failed(ct, "error", f"no plan within {s:.0f} s"),
            on_error=lambda exc, ct=ct: _failed(ct, "error", error_text(exc)),
            done=done,
        ))  # fmt: skip
    pool.wait()
    return [results[(c.node, c.ct)] for c in inventory.cts]


def _apply_all(inventory: Inventory, changes: list[CtFix], settings: ClusterFixSettings,
               hosts: _NodeHosts, progress: Progress) -> tuple[dict, str | None]:  # fmt: skip
    bound = max(1, settings.max_restarts)
    pool = DeadlinePool(bound, bound)
    results: dict[tuple[str, str], CtFix] = {}
    lock = threading.Lock()
    stop: list[str] = []
    for planned in changes:
        ct = next(c for c in inventory.cts if (c.node, c.ct) == (planned.node, planned.ct))
        node = inventory.node(ct.node)

        def run(ct: CtSpec = ct, node: NodeSpec = node) -> FixOutcome | CtFix:
            with lock:
                if stop and not settings.keep_going:
                    return _failed(ct, "skipped", f"not attempted: {stop[0]} failed or was rolled back "
                                   "(pass --keep-going to fix the others anyway)")  # fmt: skip
            progress(f"fixing {ct.label} (write, restart, re-check)")
            return run_fix(hosts.get(node.name), _fix_options(ct, node, settings, yes=True),
                           host_label=node.ssh)  # fmt: skip

        def done(result: Any, began: float, ended: float, ct: CtSpec = ct, diff: str = planned.diff) -> None:  # fmt: skip
            if isinstance(result, CtFix):
                fix = result if result.status == "skipped" else replace(result, started_s=began,
                                                                        finished_s=ended)  # fmt: skip
                fix = replace(fix, diff=diff)
            else:
                fix = _from_outcome(ct, result, began, ended)
            with lock:
                results[(ct.node, ct.ct)] = fix
                if fix.status in STOPPING and not stop:
                    stop.append(ct.label)
            progress(f"{ct.label}: {fix.status}: {fix.message}")

        pool.submit(Job(
            key="restarts", label=f"fix {ct.label}", run=run, timeout_s=settings.apply_timeout_s,
            on_timeout=lambda s, ct=ct: _failed(ct, "error", f"no result within {s:.0f} s: the "
                                                "fix may still be running; check the CT"),
            on_error=lambda exc, ct=ct: _failed(ct, "error", error_text(exc)),
            done=done,
        ))  # fmt: skip
    pool.wait()
    return results, (stop[0] if stop and not settings.keep_going else None)
