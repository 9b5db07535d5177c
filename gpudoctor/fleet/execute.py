"""Run the check catalogue on a whole fleet: every node once, every listed CT inside.

Per node, ONE SSH connection (an :class:`~gpudoctor.hosts.ssh.host.SSHHost`) is opened and reused:

1. connect job: connect and list the CTs' states (``pct list`` / ``lxc-ls -f``);
2. host job: the catalogue on the node itself (driver, /proc/devices majors, nodes, CUDA);
3. one job per running CT: the catalogue INSIDE it through a ContainerHost (``pct exec`` /
   ``lxc-attach`` over that same connection), plus its config check on the node
   (``ct.device_rules``).

Jobs run in a :class:`~gpudoctor.fleet.pool.DeadlinePool`: ``parallel`` at a time, at most
``per_node`` per node, each with a deadline. An unreachable node makes its CTs ERROR
("not reached"); a hung CT is ERROR after ``target_timeout_s`` while the others go on;
a stopped CT is SKIP (not entered). Every target ends with exactly one Report.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.fleet.inventory import RUNNING, STOPPED, CtSpec, Inventory, NodeSpec
from gpudoctor.fleet.nodehost import NodeHost
from gpudoctor.fleet.pool import DeadlinePool, Job
from gpudoctor.fleet.results import (
    CHECKED,
    FAILED,
    MISSING,
    NOT_RUNNING,
    REACH,
    STATE,
    STOPPED_STATE,
    TIMED_OUT,
    TIMEOUT,
    UNREACHABLE,
    FleetResult,
    Outcome,
    ct_labels,
    node_labels,
    synthetic_report,
)
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.model import Report, Status


@dataclass(frozen=True)
class FleetSettings:
    """How to run a fleet check.

    Attributes:
        options: the check options for every target (``--only``, ``--device``, timeouts);
            ``ct``/``flavor``/``fix_host`` are set per CT, ``--device`` applies inside CTs.
        parallel: jobs at once over the whole fleet (``--parallel``).
        per_node: jobs at once on one node (each CT holds SSH sessions on its node).
        target_timeout_s: deadline of one job (a node's connect or host checks, one CT).
        connect_timeout_s: SSH connect timeout (TCP, banner, auth); None: the node's ssh
            config decides (``ConnectTimeout``, else 10 s).
        known_hosts, accept_new_host_key, identity_file: SSH options for every node (a
            node's own ``known_hosts``/``identity_file`` win).
        host_devices: extra device nodes to probe on the nodes themselves.
    """

    options: CheckOptions = field(default_factory=CheckOptions)
    parallel: int = 8
    per_node: int = 4
    target_timeout_s: float = 120.0
    connect_timeout_s: float | None = None
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    identity_file: str | None = None
    host_devices: tuple[DeviceRequest, ...] = ()


def open_node(node: NodeSpec, settings: FleetSettings) -> Host:
    """Return the Host for a node (``local`` -> LocalHost, else an SSHHost, not yet
    connected) with the node's and the run's SSH options."""
    from gpudoctor.hosts.connect import open_host

    if node.ssh in ("", "local"):
        return open_host("local")
    opts: dict[str, object] = {
        "known_hosts": node.known_hosts or settings.known_hosts,
        "accept_new_host_key": settings.accept_new_host_key,
        "connect_timeout": settings.connect_timeout_s,
        "call_timeout": settings.target_timeout_s,
    }
    key = node.identity_file or settings.identity_file
    if key:
        opts["key_filename"] = key
    return open_host(node.ssh, **opts)


class NodeListError(HostError):
    """The node answered, but listing its CTs failed (no ``pct``, ``lxc-ls`` error)."""


def list_states(host: Host, node: NodeSpec, timeout: float) -> dict[str, str]:
    """Return ``{ct: running|stopped|<other, lowercase>}`` for every CT on the node
    (``pct list`` on Proxmox, ``lxc-ls -f -F NAME,STATE`` on plain LXC); raise HostError
    when the node cannot be reached, NodeListError when the command fails there."""
    if node.flavor == "pve":
        argv = ["pct", "list"]
    else:
        argv = ["lxc-ls", "-f", "-F", "NAME,STATE", *(["-P", node.lxcpath] if node.lxcpath else [])]
    result = host.run(argv, timeout=timeout)
    if result.returncode == 127:
        other = "lxc" if node.flavor == "pve" else "pve"
        raise NodeListError(
            f"{node.name}: `{argv[0]}` is not installed there: not a "
            f"{'Proxmox' if node.flavor == 'pve' else 'plain LXC'} host? (for the other kind "
            f'set flavor = "{other}" for this node in the inventory)'
        )
    if not result.ok:
        why = (result.stderr.strip() or f"exit {result.returncode}").splitlines()[-1][:200]
        raise NodeListError(f"{node.name}: `{' '.join(argv)}` failed: {why}")
    return parse_states(result.stdout, node.flavor)


def parse_states(text: str, flavor: str) -> dict[str, str]:
    """Return ``{ct: state}`` from ``pct list`` (``VMID Status Lock Name``) or
    ``lxc-ls -f -F NAME,STATE`` output; states lower-cased (``running``, ``stopped``)."""
    states: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2:
            states[fields[0]] = fields[1].lower()
    return states


def fleet_catalogue() -> list:
    """Return the check catalogue, loaded (and validated) once for the whole run rather than
    once per target; it includes the host-side ``ct.device_rules`` check."""
    from gpudoctor.registry import load_catalogue

    return load_catalogue()


class FleetRun:
    """One fleet check: builds the jobs, runs them, collects one Outcome per target."""

    def __init__(
        self,
        inventory: Inventory,
        settings: FleetSettings,
        connector: Callable[[NodeSpec, FleetSettings], Host] = open_node,
        progress: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.inventory = inventory
        self.settings = settings
        self.connector = connector
        self.progress = progress
        self.pool: DeadlinePool | None = None
        self.specs: list = []
        self.hosts: dict[str, Host] = {}
        self._lock = threading.Lock()
        self._outcomes: dict[tuple[str, str | None], Outcome] = {}

    def run(self) -> FleetResult:
        """Check every node and CT; return the result (never raises for a target)."""
        from gpudoctor.fleet.quiet import quiet_probe_threads

        quiet_probe_threads()
        self.specs = fleet_catalogue()
        self.pool = DeadlinePool(self.settings.parallel, self.settings.per_node)
        try:
            for node in self.inventory.nodes:
                self._submit_connect(node)
            self.pool.wait()
        finally:
            for host in self.hosts.values():
                threading.Thread(target=host.close, daemon=True).start()
        nodes = tuple(self._outcomes[(n.name, None)] for n in self.inventory.nodes)
        cts = tuple(self._outcomes[(c.node, c.ct)] for c in self.inventory.cts
                    if (c.node, c.ct) in self._outcomes)  # fmt: skip
        return FleetResult(self.inventory, nodes, cts, self.pool.now())

    # -- recording ------------------------------------------------------------------------

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self._outcomes[(outcome.node, outcome.ct)] = outcome
        if self.progress is not None:
            self.progress(outcome)

    def _record_ct(self, ct: CtSpec, state: str, check_id: str, status: Status,
                   message: str, remediation: str = "") -> None:  # fmt: skip
        now = self.pool.now() if self.pool else 0.0
        report = synthetic_report(ct.label, ct_labels(ct.node, ct.ct), check_id, status,
                                  f"ct {ct.ct}", message, remediation)  # fmt: skip
        self._record(Outcome(ct.node, ct.ct, state, report, now, now))

    # -- jobs -------------------------------------------------------------------------------

    def _submit_connect(self, node: NodeSpec) -> None:
        assert self.pool is not None
        timeout = self.settings.target_timeout_s
        labels = node_labels(node.name)

        def failed(message: str, check_id: str) -> Report:
            return synthetic_report(node.name, labels, check_id, Status.ERROR, "node", message,
                                    f"check that {node.ssh} is up and reachable over SSH")  # fmt: skip

        if not node.online:
            offline = failed(f"node {node.name} is offline (cluster status)", REACH)
            self._record(Outcome(node.name, None, UNREACHABLE, offline))
            self._all_cts(node, "node offline: CT not reached")
            return

        def connect() -> dict[str, str]:
            host = NodeHost(self.connector(node, self.settings), self.settings.target_timeout_s)
            with self._lock:
                self.hosts[node.name] = host
            return list_states(host, node, timeout)

        def done(result: object, began: float, ended: float) -> None:
            if isinstance(result, dict):
                self._submit_host(node)
                self._submit_cts(node, result)
                return
            state, message = result  # type: ignore[misc]
            report = failed(message, TIMEOUT if state == TIMED_OUT else REACH)
            self._record(Outcome(node.name, None, state, report, began, ended))
            verb = "could not list its CTs" if state == FAILED else "not reached"
            self._all_cts(node, f"node {node.name} {verb}: {message}")

        self.pool.submit(Job(
            key=node.name, label=f"{node.name}:connect", run=connect, timeout_s=timeout,
            on_timeout=lambda s: (TIMED_OUT, f"no answer from {node.ssh} within {s:.0f} s"),
            on_error=lambda exc: (
                FAILED if isinstance(exc, NodeListError) else UNREACHABLE, error_text(exc)
            ),
            done=done,
        ))  # fmt: skip

    def _all_cts(self, node: NodeSpec, message: str) -> None:
        for ct in self.inventory.cts_of(node.name):
            self._record_ct(ct, UNREACHABLE, REACH, Status.ERROR, message)

    def _submit_host(self, node: NodeSpec) -> None:
        from gpudoctor.runner import run_checks

        assert self.pool is not None
        host = self.hosts[node.name]
        options = replace(self.settings.options, ct=None, devices=self.settings.host_devices,
                          model_dirs=(), fix_host=node.ssh)  # fmt: skip
        labels = node_labels(node.name)

        def run() -> Report:
            report = run_checks(host, options, specs=self.specs, target_name=node.name)
            return replace(report, labels=labels)

        self.pool.submit(self._check_job(node.name, None, node.name, labels, run))

    def _submit_cts(self, node: NodeSpec, states: dict[str, str]) -> None:
        for ct in self.inventory.cts_of(node.name):
            state = states.get(ct.ct)
            if state is None:
                self._record_ct(ct, MISSING, STATE, Status.ERROR,
                                f"CT {ct.ct} does not exist on node {node.name}")  # fmt: skip
            elif state == STOPPED:
                self._record_ct(ct, STOPPED_STATE, STATE, Status.SKIP,
                                f"CT {ct.ct} is stopped: not checked (start it to check it)")  # fmt: skip
            elif state != RUNNING:
                self._record_ct(ct, NOT_RUNNING, STATE, Status.WARN,
                                f"CT {ct.ct} is {state}: not checked")  # fmt: skip
            else:
                self._submit_ct(node, ct)

    def _submit_ct(self, node: NodeSpec, ct: CtSpec) -> None:
        from gpudoctor.fleet.prefetch import prefetch_ct
        from gpudoctor.hosts.container import ContainerHost
        from gpudoctor.runner import run_checks, select

        assert self.pool is not None
        parent = self.hosts[node.name]
        options = replace(self.settings.options, ct=ct.ct, flavor=node.flavor,
                          lxcpath=node.lxcpath, fix_host=node.ssh)  # fmt: skip
        labels = ct_labels(node.name, ct.ct)
        inside = ContainerHost(parent, ct.ct, flavor=node.flavor, lxcpath=node.lxcpath,
                               call_timeout=self.settings.target_timeout_s)  # fmt: skip
        opens = "device.open" in {s.id for s in select(self.specs, options.only, True)}

        def run() -> Report:
            try:
                with contextlib.suppress(HostError):  # the checks then meet it themselves
                    prefetch_ct(inside, options, open_nodes=opens)
                report = run_checks(
                    inside, options, ct_host=parent, specs=self.specs, target_name=ct.label
                )
            finally:
                inside.close()
            return replace(report, labels=labels)

        self.pool.submit(self._check_job(node.name, ct.ct, ct.label, labels, run, inside.close))

    def _check_job(self, node: str, ct: str | None, target: str, labels: tuple,
                   run: Callable[[], Report], abandon: Callable[[], None] | None = None) -> Job:  # fmt: skip
        subject = "node" if ct is None else f"ct {ct}"
        timeout = self.settings.target_timeout_s

        def on_timeout(waited: float) -> tuple[str, Report]:
            message = (f"{target}: no result within {waited:.0f} s (per-target timeout): a hung "
                       "probe or container; the rest of the fleet was not held up")  # fmt: skip
            return TIMED_OUT, synthetic_report(target, labels, TIMEOUT, Status.ERROR, subject,
                                               message)  # fmt: skip

        def on_error(exc: BaseException) -> tuple[str, Report]:
            return FAILED, synthetic_report(target, labels, REACH, Status.ERROR, subject,
                                            error_text(exc))  # fmt: skip

        def done(result: object, began: float, ended: float) -> None:
            if isinstance(result, Report):
                result = (CHECKED, result)
            state, report = result  # type: ignore[misc]
            self._record(Outcome(node, ct, state, report, began, ended))

        return Job(key=node, label=target, run=run, timeout_s=timeout, on_timeout=on_timeout,
                   on_error=on_error, done=done, abandon=abandon)  # fmt: skip


def error_text(exc: BaseException) -> str:
    """Return one line saying what went wrong (HostError messages as they are)."""
    if isinstance(exc, HostError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def check_fleet(
    inventory: Inventory,
    settings: FleetSettings,
    connector: Callable[[NodeSpec, FleetSettings], Host] = open_node,
    progress: Callable[[Outcome], None] | None = None,
) -> FleetResult:
    """Return the FleetResult of checking every node and CT of ``inventory``."""
    return FleetRun(inventory, settings, connector, progress).run()
