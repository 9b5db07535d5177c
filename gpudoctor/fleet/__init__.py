"""Fleet: check and fix every GPU container of a Proxmox cluster (or an inventory) at once.

- :mod:`gpudoctor.fleet.inventory`: which nodes and containers (TOML file, ``--ct`` narrowing).
- :mod:`gpudoctor.fleet.proxmox`: the same from a Proxmox cluster's API (proxmoxer, https).
- :mod:`gpudoctor.fleet.results`: one Outcome (state + Report) per node and CT.
- :mod:`gpudoctor.fleet.execute`: one SSH connection per node, host checks once per node,
  CT checks inside each CT, bounded parallelism and per-target timeouts.
- :mod:`gpudoctor.fleet.explain`: host findings that explain the findings of their CTs.
- :mod:`gpudoctor.fleet.summary`: the nodes x CTs table and the machine-readable document.
- :mod:`gpudoctor.fleet.fix`: ``fix --cluster``: the per-CT fixer, a few restarts at a time.

Support: :mod:`~gpudoctor.fleet.pool` (bounded worker pool with per-job deadlines),
:mod:`~gpudoctor.fleet.nodehost` (a node's connection shared by its CTs),
:mod:`~gpudoctor.fleet.quiet` (no tracebacks from abandoned probe threads),
:mod:`~gpudoctor.fleet.request` (what a fleet command asks for, the inventory it names).
The command bodies are :mod:`gpudoctor.commands.check_fleet` (``check --cluster``) and
:mod:`gpudoctor.commands.fix_cluster` (``fix --cluster``).
"""
