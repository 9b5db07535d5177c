"""The body of ``gpudoctor fix --cluster/--inventory`` (click-free: the CLI passes ``echo``
and ``ask``). Builds the inventory, plans and applies through :func:`fix_cluster`, prints
the diffs and one line per CT (or ``--json``), returns the exit code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpudoctor.credentials import ApiAuth
from gpudoctor.exit_codes import ExitCode
from gpudoctor.fleet.execute import FleetSettings
from gpudoctor.fleet.fix import ClusterFixResult, ClusterFixSettings, CtFix, fix_cluster
from gpudoctor.fleet.inventory import InventoryError
from gpudoctor.fleet.request import FleetRequest, build_inventory
from gpudoctor.pve.fixer import FixOptions

Echo = Callable[..., None]


def fail(message: str, code: ExitCode, as_json: bool, echo: Echo) -> ExitCode:
    """Print the error in the documented one-line form (and as JSON on stdout with
    ``--json``); return ``code``."""
    from gpudoctor.errors import ERROR_HINT, error_line

    line = error_line(
        message, "see 'gpudoctor fix --help'" if code == ExitCode.USAGE else ERROR_HINT
    )
    if as_json:
        echo(json.dumps({"ok": False, "error": line.removeprefix("gpudoctor: error: "),
                         "exit_code": int(code)}))  # fmt: skip
    echo(line, err=True)
    return code


@dataclass(frozen=True)
class ClusterFixRequest:
    """What ``gpudoctor fix --cluster/--inventory`` was asked.

    Attributes:
        cluster: the Proxmox API host, or None.
        inventory: the TOML inventory path, or None.
        ct: ``--ct`` patterns (ids, names, globs; comma-separated allowed).
        max_restarts: ``--max-restarts``.
        keep_going: ``--keep-going``.
        known_hosts, accept_new_host_key, identity_file: SSH options.
        as_json: print the result as JSON.
        host_prep: ``--host-prep``: install the boot unit on each node that needs it.
        credentials: the Proxmox API credentials and TLS trust (secrets never shown).
    """

    cluster: str | None = None
    inventory: str | None = None
    ct: tuple[str, ...] = ()
    max_restarts: int = 2
    keep_going: bool = False
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    identity_file: str | None = None
    as_json: bool = False
    host_prep: bool = False
    credentials: ApiAuth = field(default_factory=ApiAuth)


def show(fixes: Sequence[CtFix], echo: Echo, with_diff: bool) -> None:
    """Print one line per CT (``node/ct: status: message``), diffs first when asked."""
    for fix in fixes:
        if with_diff and fix.diff:
            echo(f"--- {fix.node}/{fix.ct}")
            echo(fix.diff.rstrip("\n"))
    for fix in fixes:
        echo(f"{fix.node}/{fix.ct}: {fix.status}: {fix.message}")
        plan = fix.outcome.plan if fix.outcome is not None else None
        for reason in plan.restart_reasons if with_diff and plan is not None else ():
            echo(f"  why: restart: {reason}")


def run_cluster_fix(
    request: ClusterFixRequest,
    template: FixOptions,
    echo: Echo,
    ask: Callable[[str], bool],
) -> ExitCode:
    """Run the fleet fix; return ExitCode.OK (all fixed or nothing to change), FAILED
    (something not fixed, rolled back, skipped or declined), ERROR (no inventory) or USAGE
    (a bad ``--max-restarts``). ``template`` carries the per-CT options (plan, layout,
    dry_run, yes, restart; its ``ct`` is ignored)."""
    if request.max_restarts < 1:
        return fail("--max-restarts must be at least 1", ExitCode.USAGE, request.as_json, echo)
    fleet_request = FleetRequest(
        cluster=request.cluster,
        inventory=request.inventory,
        ct=request.ct,
        known_hosts=request.known_hosts,
        accept_new_host_key=request.accept_new_host_key,
        credentials=request.credentials,
    )
    try:
        inventory, warnings = build_inventory(fleet_request)
    except InventoryError as exc:
        return fail(str(exc), ExitCode.ERROR, request.as_json, echo)
    for warning in warnings:
        echo(f"gpudoctor: warning: {warning}", err=True)
    settings = ClusterFixSettings(
        plan=template.plan,
        layout=template.layout,
        max_restarts=request.max_restarts,
        keep_going=request.keep_going,
        dry_run=template.dry_run,
        yes=template.yes,
        restart=template.restart,
        driver_libs=template.driver_libs,
        host_prep=request.host_prep,
        connection=FleetSettings(
            known_hosts=request.known_hosts,
            accept_new_host_key=request.accept_new_host_key,
            identity_file=request.identity_file,
        ),
    )

    def confirm(changes: Sequence[CtFix]) -> bool:
        show(changes, echo, with_diff=True)
        nodes = ClusterFixResult(tuple(changes)).host_prep if request.host_prep else ()
        prep = f" and install the host prep on {', '.join(n for n, _ in nodes)}" if nodes else ""
        return ask(
            f"Apply these changes to {len(changes)} CT(s), restarting at most "
            f"{request.max_restarts} at a time{prep}?"
        )

    result = fix_cluster(
        inventory, settings, confirm, progress=lambda text: echo(f"gpudoctor: {text}", err=True)
    )
    report(result, request.as_json, template.dry_run, echo)
    return ExitCode(result.exit_code)


def report(result: ClusterFixResult, as_json: bool, dry_run: bool, echo: Echo) -> None:
    """Print the result: JSON, or the diffs (dry run) and one line per CT."""
    if as_json:
        echo(json.dumps(result.to_dict(), indent=2))
        return
    show(result.fixes, echo, with_diff=dry_run)
    if any(f.status == "declined" for f in result.fixes):
        echo("not applied: nothing written (pass --yes to apply without asking)")
    prepared = {p.node: p for p in result.prepared}
    for node, why in result.host_prep:
        done = prepared.get(node)
        if done is None:
            echo(f"{node}: {why}")
            continue
        if dry_run and done.diff:
            echo(done.diff.rstrip("\n"))
        echo(f"{node}: --host-prep: {done.status}: {done.message}")
    if result.stopped_by:
        echo(f"stopped after {result.stopped_by}: the remaining CTs were not touched "
             "(--keep-going fixes them anyway)")  # fmt: skip
