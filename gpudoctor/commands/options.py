"""Command-line options that several commands share, defined once (``check`` and ``fix``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

Decorator = Callable[[Any], Any]

FLAVOR = click.option(
    "--flavor",
    type=click.Choice(["pve", "lxc"]),
    default="pve",
    show_default=True,
    help="How the container's host is managed: Proxmox VE (/etc/pve, pct) or plain LXC "
    "(/var/lib/lxc/NAME/config, lxc-attach).",
)
KNOWN_HOSTS = click.option(
    "--known-hosts", type=click.Path(dir_okay=False), help="Extra known_hosts file."
)
ACCEPT_NEW_HOST_KEY = click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust and save the key of an SSH host never seen before (never a changed one).",
)


def cluster_option(verb: str) -> Decorator:
    """Return the ``--cluster HOST`` option of a fleet command (``verb``: Check, Fix)."""
    return click.option(
        "--cluster",
        metavar="HOST[:PORT]",
        help=f"{verb} every CT passing NVIDIA devices through on every node of this Proxmox "
        "cluster (its API over https lists them; the nodes are reached over SSH as root@NODE). "
        "--ct narrows it (ids, names, globs: 200,llm-*).",
    )


def inventory_option(verb: str) -> Decorator:
    """Return the ``--inventory FILE`` option of a fleet command (``verb``: Check, Fix)."""
    return click.option(
        "--inventory",
        "inventory_file",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help=f"{verb} the nodes and CTs listed in this TOML file (see docs/fleet.md).",
    )
