# Copyright: gpudoctor developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The options every gpudoctor.gpu module shares, documented once."""

from __future__ import annotations


class ModuleDocFragment:
    """``gpudoctor.gpu.gpudoctor``: gpudoctor on the node; ``.containers``: where the
    node's containers are."""

    DOCUMENTATION = r"""
options:
  executable:
    description:
      - The gpudoctor executable on the node (default C(gpudoctor) on its PATH).
    type: path
"""

    CONTAINERS = r"""
options:
  flavor:
    description:
      - C(pve) for Proxmox VE (C(/etc/pve), C(pct)), C(lxc) for plain LXC (C(lxc-attach)).
    type: str
    choices: [pve, lxc]
    default: pve
  lxcpath:
    description:
      - LXC's container directory for I(flavor=lxc) (default LXC's own).
    type: path
"""
