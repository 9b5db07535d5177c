#!/usr/bin/python
# Copyright: gpudoctor developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ensure one container's GPU access with ``gpudoctor fix`` run on its node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ct_gpu
short_description: Ensure an LXC / Proxmox VE container can open its GPU devices
description:
  - Runs C(gpudoctor fix --host local --json) on the node that holds the container, so the
    plan, the diff, the backup, the locked compare-and-swap write, the restart, the
    re-check inside the container and the rollback are gpudoctor's own (one plan, one
    writer).
  - In check mode it runs C(gpudoctor fix --dry-run) - nothing is written, and the task
    reports C(changed) when a fix is pending. With C(--diff) it returns the config diff
    fix would write.
  - Otherwise it applies with C(--yes), restarts the container and re-checks inside it.
    It reports C(changed) only when something was written or restarted; a second run
    reports C(ok).
  - The task fails with gpudoctor's reason when the container does not come back
    healthy; the message says what was rolled back.
  - Needs C(gpudoctor) installed on the node (C(pip install gpudoctor)) and root there
    (C(become=true)).
version_added: 0.1.0
author:
  - gpudoctor developers (!UNKNOWN)
options:
  ct:
    description:
      - The Proxmox VE VMID (C(200)) or the plain LXC container name.
    type: str
    required: true
  devices:
    description:
      - Pass these character devices (or directories under C(/dev)) instead of every
        C(/dev/nvidia*) node of the host (C(gpudoctor fix --device)).
    type: list
    elements: str
    default: []
  mode:
    description:
      - C(devn) writes Proxmox devN entries, C(rules) cgroup allow rules and bind mounts,
        C(auto) devN on Proxmox VE 8.1 and later, rules elsewhere.
    type: str
    choices: [auto, devn, rules]
    default: auto
  dev_gid:
    description:
      - The C(gid=) of devN entries (default the host node's group).
    type: int
  prune:
    description:
      - Remove stale NVIDIA allow rules (otherwise only reported).
    type: bool
    default: false
  driver_libs:
    description:
      - C(bind) also binds the host's NVIDIA user-space driver files into the container;
        C(copy) reports the exact-version install for inside it.
    type: str
    choices: [bind, copy]
  restart:
    description:
      - Restart a running container after the write and re-check inside it. With C(false)
        the new config applies at its next start.
    type: bool
    default: true
extends_documentation_fragment:
  - gpudoctor.gpu.gpudoctor
  - gpudoctor.gpu.gpudoctor.containers
attributes:
  check_mode:
    support: full
    description: Runs C(gpudoctor fix --dry-run); nothing is written.
  diff_mode:
    support: full
    description: Returns the unified diff of the container config that fix writes.
notes:
  - Ansible's forks run the nodes in parallel. On one node, an applying run holds
    gpudoctor's per-node lock (C(flock) on C($GPUDOCTOR_LOCK_DIR/follow-driver.lock), the
    lock C(gpudoctor fix --follow-driver) holds) from the plan to the re-check, so two plays,
    or a play and the follow-driver unit, never change one node's containers at once; a
    second one waits (up to 900 s), then finds the work done. The write itself also takes
    the config's own lock and is a compare-and-swap against the planned bytes.
  - Needs C(flock) (util-linux) on the node, as gpudoctor fix does.
seealso:
  - module: gpudoctor.gpu.check_facts
  - module: gpudoctor.gpu.host_prep
"""

EXAMPLES = r"""
- name: Every GPU CT can open its GPUs
  gpudoctor.gpu.ct_gpu:
    ct: "{{ item }}"
  loop: "{{ gpu_cts }}"
  become: true

- name: A plain LXC container, one device, old-style rules
  gpudoctor.gpu.ct_gpu:
    ct: bench1
    flavor: lxc
    devices: [/dev/dri]
    mode: rules
"""

RETURN = r"""
status:
  description:
    - gpudoctor's outcome - C(nothing_to_change), C(dry_run), C(applied),
      C(applied_not_running), C(not_fixed), C(rolled_back), C(refused), C(failed).
  returned: always
  type: str
  sample: applied
message:
  description: gpudoctor's one sentence on what happened.
  returned: always
  type: str
  sample: "fixed: CT 200 restarted and every device opens inside it"
config:
  description: The container config's path on the node.
  returned: when the container was found
  type: str
  sample: /etc/pve/nodes/pve1/lxc/200.conf
edits:
  description: The planned edits (action, line, reason).
  returned: when the container was found
  type: list
  elements: dict
restart_reasons:
  description: Why the running container needs a restart although its config is right.
  returned: when the container was found
  type: list
  elements: str
outcome:
  description: The whole C(gpudoctor fix --json) document (backup paths, SHA-1s, probes
    before and after, checks inside).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpudoctor.gpu.plugins.module_utils import gpudoctor_cli as cli

# the options DOCUMENTATION describes (tests/ansible/test_modules_unit.py compares them)
ARGUMENT_SPEC = {
    "ct": {"type": "str", "required": True},
    "devices": {"type": "list", "elements": "str", "default": []},
    "mode": {"type": "str", "choices": ["auto", "devn", "rules"], "default": "auto"},
    "dev_gid": {"type": "int"},
    "prune": {"type": "bool", "default": False},
    "driver_libs": {"type": "str", "choices": ["bind", "copy"]},
    "restart": {"type": "bool", "default": True},
    **cli.COMMON_OPTIONS,
    **cli.CONTAINER_OPTIONS,
}

# what a run changed: written, or restarted (a restart-only fix writes nothing)
WROTE_OR_RESTARTED = ("applied", "applied_not_running", "not_fixed", "rolled_back")


def fix_args(params, check_mode):
    """Return the ``gpudoctor fix`` arguments for the task's options."""
    args = ["fix", "--host", "local", "--ct", params["ct"], "--flavor", params["flavor"],
            "--mode", params["mode"], "--json"]  # fmt: skip
    args.append("--dry-run" if check_mode else "--yes")
    if params["lxcpath"]:
        args += ["--lxcpath", params["lxcpath"]]
    for device in params["devices"]:
        args += ["--device", device]
    if params["dev_gid"] is not None:
        args += ["--dev-gid", str(params["dev_gid"])]
    if params["prune"]:
        args.append("--prune")
    if params["driver_libs"]:
        args += ["--driver-libs", params["driver_libs"]]
    if not params["restart"]:
        args.append("--no-restart")
    return args


def result_of(doc, rc, check_mode, ct):
    """Return ``(failed, result)``: the task's result for gpudoctor's outcome ``doc``."""
    failed, result = cli.fix_result(doc, rc, check_mode, WROTE_OR_RESTARTED)
    result.update(config=doc.get("config"), edits=doc.get("edits", []),
                  restart_reasons=doc.get("restart_reasons", []))  # fmt: skip
    if failed:
        why = doc.get("message") or f"gpudoctor fix failed (exit {rc})"
        start_log = doc.get("start_log") or []
        tail = f" (start log: {' | '.join(start_log)})" if start_log else ""
        result["msg"] = f"CT {ct}: {why}{tail}"
    return failed, result


def main():
    """Run the module: plan (check mode) or apply through ``gpudoctor fix``."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    args = fix_args(module.params, module.check_mode)
    # applying: under gpudoctor's per-node lock, so another play (or the follow-driver
    # unit) never plans, writes or restarts this node's CTs at the same time
    rc, doc = cli.run_json(module, args, cli.FIX_RESULTS, locked=not module.check_mode)
    failed, result = result_of(doc, rc, module.check_mode, module.params["ct"])
    if failed:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
