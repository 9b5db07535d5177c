"""The CT config a ``ct_host`` check reads: found and read on the CT's host once, the same
way for every check that needs it (``ct.device_rules``, ``ct.hooks``, ``driver.libs_mode``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpudoctor.context import CheckContext
from gpudoctor.model import Finding


@dataclass(frozen=True)
class CtConfig:
    """A CT's config as read on its host: ``target`` (flavor, paths), ``layout`` (where
    Proxmox/LXC keep things, ``--lxcpath`` applied) and ``snap`` (the parsed config)."""

    target: Any
    layout: Any
    snap: Any


def read_ct_config(ctx: CheckContext) -> CtConfig | Finding:
    """Return the config of the CT named by ``--ct`` (``cat /etc/pve/lxc/ID.conf`` or
    ``LXCPATH/NAME/config``, ``--lxcpath`` or the inventory node's lxcpath honoured), or the
    SKIP finding that says why there is none to read (no ``--ct``; unreadable)."""
    from gpudoctor.pve.apply import ApplyError, Layout, read_config, resolve_target

    ct = ctx.options.ct
    if not ct:
        return ctx.skip("config", "no --ct given: there is no container config to read")
    layout = Layout.from_env()
    if ctx.options.lxcpath:
        layout = replace(layout, lxcpath=ctx.options.lxcpath)
    try:
        target = resolve_target(ctx.host, ctx.options.flavor, ct, layout)
        return CtConfig(target, layout, read_config(ctx.host, target, layout))
    except ApplyError as exc:
        return ctx.skip(f"ct {ct}", f"cannot read the CT config: {exc}")
