"""What a fleet command asks for (:class:`FleetRequest`) and the inventory it names
(:func:`build_inventory`: the TOML file or the Proxmox API, narrowed by ``--ct``).

Shared by ``check --cluster/--inventory`` (:mod:`gpudoctor.commands.check_fleet`) and
``fix --cluster/--inventory`` (:mod:`gpudoctor.commands.fix_cluster`); click-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.credentials import ApiAuth
from gpudoctor.fleet.inventory import (
    Inventory,
    InventoryError,
    load_inventory_file,
    split_patterns,
)


@dataclass(frozen=True)
class FleetRequest:
    """What the command line asked for.

    Attributes:
        cluster: the Proxmox API host (``pve1``, ``pve1:8006``), or None.
        inventory: the TOML inventory path, or None.
        ct: ``--ct`` values (ids, names, globs; comma-separated allowed).
        parallel: ``--parallel``.
        target_timeout_s: ``--target-timeout``.
        known_hosts, accept_new_host_key: SSH options.
        credentials: the Proxmox API credentials and TLS trust (secrets never shown).
    """

    cluster: str | None = None
    inventory: str | None = None
    ct: tuple[str, ...] = ()
    parallel: int = 8
    target_timeout_s: float = 120.0
    known_hosts: str | None = None
    accept_new_host_key: bool = False
    credentials: ApiAuth = field(default_factory=ApiAuth)


def build_inventory(request: FleetRequest) -> tuple[Inventory, tuple[str, ...]]:
    """Return (inventory narrowed by ``--ct``, warnings); raise InventoryError."""
    if request.cluster and request.inventory:
        raise InventoryError("--cluster and --inventory exclude each other: pick one source")
    if request.inventory:
        inventory, warnings = load_inventory_file(request.inventory), ()
    else:
        from gpudoctor.fleet.proxmox import ApiCredentials, cluster_inventory

        auth = request.credentials
        creds = ApiCredentials(
            host=request.cluster or "",
            token_id=auth.token_id,
            token_secret=auth.token_secret,
            user=auth.user,
            password=auth.password,
            verify=auth.verify,
        )
        inventory, warnings = cluster_inventory(creds)
    narrowed = inventory.narrowed(split_patterns(request.ct))
    if request.ct and not narrowed.cts:
        raise InventoryError(f"--ct {','.join(request.ct)} matches no CT of {inventory.source}")
    return narrowed, warnings
