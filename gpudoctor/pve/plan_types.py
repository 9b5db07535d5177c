"""The planner's vocabulary: what a user asks for (PlanOptions), one planned change (Edit), a
node whose major no rule allows (MissingRule), and the planner's answer (FixPlan). Pure data;
:mod:`gpudoctor.pve.planner` makes them."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.pve.devn import AUTO, RULES


class FixPlanError(ValueError):
    """The options cannot be planned for this config/host (the message says why);
    ``code`` is ``usage`` for a request that can never work (``--device /root``)."""

    def __init__(self, message: str, code: str = "plan") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PlanOptions:
    """What the user asked for.

    Attributes:
        mode: ``auto`` (devN entries on Proxmox VE >= 8.1, else rules), ``devn``
            (Proxmox devN entries) or ``rules`` (cgroup rules + bind mounts; ``raw`` too).
        devices: host device paths to pass (nodes or directories of nodes).
        include_host_nvidia: also pass every NVIDIA node found in the host's /dev.
        prune: remove stale NVIDIA allow rules instead of only flagging them.
        dev_gid: the ``gid=`` for devN entries (None: the host node's group).
        label: the config path shown in the diff header.
    """

    mode: str = AUTO
    devices: tuple[str, ...] = ()
    include_host_nvidia: bool = True
    prune: bool = False
    dev_gid: int | None = None
    label: str = "config"


@dataclass(frozen=True)
class Edit:
    """One planned change: ``add``, ``remove`` or ``comment`` (out, in place) a line, and why."""

    action: str
    line: str
    reason: str


@dataclass(frozen=True)
class MissingRule:
    """A passed node whose CURRENT major no allow rule covers (``ct.device_rules`` FAILs)."""

    path: str
    major: int
    minor: int
    driver: str


@dataclass(frozen=True)
class FixPlan:
    """The planner's answer.

    Attributes:
        old_text: the config as read.
        new_text: the config after the edits (equal to ``old_text`` when nothing to do).
        edits: the changes, in file order of their reasons.
        diff: a unified diff of old -> new (empty when unchanged).
        explanation: one sentence per edit, with the fact that motivates it.
        warnings: things the user should know that the plan does not change.
        missing: nodes passed through (or requested) whose current major is not allowed.
        stale: the stale allow lines found (``c 509:* rwm``), removed or not.
        probe_paths: the char nodes as the CT sees them, to try-open before and after.
        mode: the mode used (``devn`` or ``rules``; ``auto`` resolved).
        pve_version: the Proxmox VE version it was planned for (None: unknown/plain LXC).
        nothing_to_pass: no NVIDIA node on the host and no ``--device``: nothing to pass.
        dev_paths: the host paths that have a devN entry after the plan.
        probe_nodes: ``(path inside the CT, major, minor)`` of each char node the CT
            should see, with the numbers the HOST's node has now (:mod:`ctstate` compares).
        restart_reasons: why the running CT needs a restart although its config may need
            no change (its state is older than its config: :mod:`ctstate`); set by the
            fixer, never by this pure planner.
        host_cause: why the CT's state points to the host (a node missing there when the CT
            started) and the durable cure, or "" (set by the fixer with restart_reasons).
    """

    old_text: str
    new_text: str
    edits: tuple[Edit, ...] = ()
    diff: str = ""
    explanation: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    missing: tuple[MissingRule, ...] = ()
    stale: tuple[str, ...] = field(default=())
    probe_paths: tuple[str, ...] = ()
    mode: str = RULES
    pve_version: str | None = None
    nothing_to_pass: bool = False
    dev_paths: tuple[str, ...] = ()
    probe_nodes: tuple[tuple[str, int, int], ...] = ()
    restart_reasons: tuple[str, ...] = ()
    host_cause: str = ""

    @property
    def changed(self) -> bool:
        """Return True when applying the plan changes the file."""
        return self.new_text != self.old_text

    @property
    def pending(self) -> bool:
        """Return True when the plan has anything to do: a config change or a restart."""
        return self.changed or bool(self.restart_reasons)
