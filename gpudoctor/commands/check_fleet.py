"""The ``gpudoctor check --cluster/--inventory`` command body (called from commands/check.py).

Builds the inventory (API or file, narrowed by ``--ct``: :mod:`gpudoctor.fleet.request`),
runs the fleet check with progress on stderr, renders the result (human table, ``--json``,
Prometheus) and returns the exit code (ExitCode.OK healthy, FAILED any FAIL/ERROR).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import TextIO

import click

from gpudoctor.context import CheckOptions
from gpudoctor.exit_codes import ExitCode
from gpudoctor.fleet.execute import FleetSettings, check_fleet
from gpudoctor.fleet.explain import Explanation, explain
from gpudoctor.fleet.inventory import InventoryError
from gpudoctor.fleet.request import FleetRequest, build_inventory
from gpudoctor.fleet.results import FleetResult, Outcome
from gpudoctor.model import Status
from gpudoctor.output import Format


def progress_printer(total: int, stream: TextIO | None = None) -> Callable[[Outcome], None]:
    """Return a callback printing ``[k/N] target STATUS`` per finished target on stderr
    (one overwritten line on a terminal, plain lines otherwise)."""
    done = [0]
    out = stream or sys.stderr
    from gpudoctor.terminal import live

    tty = live(out)

    def show(outcome: Outcome) -> None:
        done[0] += 1
        line = f"[{done[0]}/{total}] {outcome.report.target} {outcome.status.value}"
        if outcome.state != "checked":
            line += f" ({outcome.state})"
        out.write(f"\r\033[K{line}" if tty else f"gpudoctor: {line}\n")
        if tty and done[0] == total:
            out.write("\r\033[K")
        out.flush()

    return show


def render_fleet(result: FleetResult, explanations: tuple[Explanation, ...],
                 warnings: tuple[str, ...], fmt: Format, stream: TextIO,
                 verbose: bool) -> None:  # fmt: skip
    """Write the fleet result to ``stream`` in ``fmt``."""
    if fmt is Format.JSON:
        import json

        from gpudoctor.fleet.summary import fleet_document

        json.dump(fleet_document(result, explanations, warnings), stream, indent=2)
        stream.write("\n")
    elif fmt is Format.PROMETHEUS:
        from gpudoctor.output.prometheus import write_prometheus

        write_prometheus(result.reports(), stream)
    else:
        from gpudoctor.fleet.summary import write_fleet_human

        write_fleet_human(result, explanations, stream, verbose, warnings)


def run_fleet_command(request: FleetRequest, options: CheckOptions, fmt: Format,
                      output: str | None, verbose: bool,
                      write_file: Callable[[str, str], None]) -> ExitCode:  # fmt: skip
    """Run the whole ``check --cluster/--inventory``; return the exit code (OK or FAILED).
    Raise click.UsageError / ClickException with one line for bad input or a failed API."""
    if request.parallel < 1:
        raise click.UsageError("--parallel must be at least 1")
    if request.cluster and request.inventory:
        raise click.UsageError("--cluster and --inventory exclude each other: pick one")
    from gpudoctor.fleet.execute import fleet_catalogue
    from gpudoctor.runner import select

    try:  # a bad --only is a usage error, not one ERROR per target
        select(fleet_catalogue(), options.only, with_ct_host=True)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        inventory, warnings = build_inventory(request)
    except InventoryError as exc:
        if output and fmt is Format.PROMETHEUS:  # the textfile says the fleet is unknown
            from gpudoctor.output.prometheus import textfile, unreachable_report

            source = request.cluster or request.inventory or "fleet"
            write_file(output, textfile([unreachable_report(source, str(exc))], output))
        raise click.ClickException(str(exc)) from None
    for warning in warnings:
        click.echo(f"gpudoctor: warning: {warning}", err=True)
    settings = FleetSettings(
        options=options,
        parallel=request.parallel,
        target_timeout_s=request.target_timeout_s,
        known_hosts=request.known_hosts,
        accept_new_host_key=request.accept_new_host_key,
    )
    total = len(inventory.nodes) + len(inventory.cts)
    result = check_fleet(inventory, settings, progress=progress_printer(total))
    explanations = explain(result)
    if output and fmt is Format.PROMETHEUS:
        from gpudoctor.output.prometheus import textfile

        write_file(output, textfile(result.reports(), output))
    elif output:
        buffer = io.StringIO()
        render_fleet(result, explanations, warnings, fmt, buffer, verbose)
        write_file(output, buffer.getvalue())
    else:
        render_fleet(result, explanations, warnings, fmt, sys.stdout, verbose)
    bad = any(f.status in (Status.FAIL, Status.ERROR) for r in result.reports() for f in r.findings)
    return ExitCode.FAILED if bad else ExitCode.OK
