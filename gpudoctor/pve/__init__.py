"""The fixer for Proxmox VE / LXC container configs: parse -> plan -> diff -> confirm ->
backup -> locked compare-and-swap write -> restart -> re-check inside -> rollback.

Modules: ``config`` (byte-exact parser/writer), ``entries`` (rule, mount and devN values),
``facts`` (host device facts through a Host), ``audit`` and ``planner`` (pure), ``apply``
(the one locked write), ``restart`` and ``api`` (pct / lxc-* / Proxmox API), ``fixer``
(orchestration), ``hostprep`` (the nvidia-uvm boot unit), ``cli`` (``gpudoctor fix``).
"""
