"""The fixer for Proxmox VE / LXC container configs: parse -> plan -> diff -> confirm ->
backup -> locked compare-and-swap write -> restart -> re-check inside -> rollback.

Modules: ``config`` (byte-exact parser/writer), ``entries`` (rule, mount and devN values),
``facts`` (host device facts through a Host), ``audit``, ``devn`` (mode choice and the
devN migration) and ``planner`` (pure: a FixPlan), ``apply`` and ``conf_program`` (the one
locked write; ``conf_program`` is the stdlib program run on the CT's host for every config
read and write), ``restart`` and ``api`` (pct / lxc-* / Proxmox API), ``inside`` (probes in
the CT), ``fixer`` (orchestration), ``uvm_unit`` (the nvidia-uvm boot unit that ``fix
--host-prep`` installs). The click command is :mod:`gpudoctor.commands.fix`.
"""
