"""The fixer for Proxmox VE / LXC container configs: parse -> plan -> diff -> confirm ->
backup -> locked compare-and-swap write -> restart -> re-check inside -> rollback.

Modules: ``config`` (byte-exact parser/writer), ``entries`` (rule, mount and devN values),
``facts`` (host device facts through a Host), ``audit``, ``devn`` (mode choice and the
devN migration) and ``planner`` (pure), ``apply`` and ``hostprog`` (the one locked write),
``restart`` and ``api`` (pct / lxc-* / Proxmox API), ``inside`` (probes in the CT),
``fixer`` (orchestration), ``hostprep`` (the nvidia-uvm boot unit). The click command is
:mod:`gpudoctor.commands.fix`.
"""
