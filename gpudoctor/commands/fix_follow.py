"""``gpudoctor fix --follow-driver``'s command-line end: ask (or not), run
:func:`gpudoctor.pve.follow.follow_driver`, print one line per changed CT and the summary
(the unit's journal), or ``--json``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gpudoctor.exit_codes import ExitCode


def say(text: str) -> None:
    """Print a progress line on stderr (the report goes to stdout)."""
    click.echo(f"gpudoctor: {text}", err=True)


def run_follow(host: Any, flavor: str, layout: Any, flags: tuple[bool, bool, bool],
                as_json: bool, host_label: str) -> int:  # fmt: skip
    """Run ``--follow-driver`` (``flags``: dry run, yes, if-host-changed): one line per CT
    that was (or would be) changed, then the summary (stdout: the unit's journal); return
    the exit code."""
    from gpudoctor.pve.follow import follow_driver

    dry_run, yes, if_host_changed = flags
    if not dry_run and not yes and not sys.stdin.isatty():
        say("not applied: --follow-driver changes CTs without asking each: pass --yes "
             f"(or --dry-run) (exit {ExitCode.NOTHING_DONE})")  # fmt: skip
        return ExitCode.NOTHING_DONE
    if not dry_run and not yes and not click.confirm(
        "Bring every CT of this node in line with the host's devices (restarting those "
        "whose devices changed)?", default=False):  # fmt: skip
        return ExitCode.NOTHING_DONE
    label = "" if host_label == "local" else host_label
    result = follow_driver(host, flavor, layout, dry_run=dry_run, progress=say, host_label=label,
                           if_host_changed=if_host_changed)  # fmt: skip
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return result.exit_code
    for item in result.changed:
        restarted = " (restarted)" if item.restarted else ""
        click.echo(f"CT {item.ct}: {item.status}{restarted}: {item.message}")
        for reason in item.reasons:
            click.echo(f"  why: {reason}")
    click.echo(f"follow-driver: {result.summary()}")
    return result.exit_code
