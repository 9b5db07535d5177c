#!/usr/bin/python
# Copyright: gpudoctor developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Prepare a node with ``gpudoctor fix --host-prep``: the boot and follow-driver units."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_prep
short_description: Install gpudoctor's boot and follow-driver units on a node
description:
  - Runs C(gpudoctor fix --host local --host-prep --json) on the node - the systemd oneshot
    that creates C(/dev/nvidia-uvm) before containers start, and the triggers (a udev rule,
    a path unit) that run C(gpudoctor fix --follow-driver) after a driver reload.
  - In check mode it runs C(--dry-run) and reports C(changed) when something is missing;
    with C(--diff) it returns the unit files' diff. Otherwise it installs and enables them
    (C(--yes)); a second run reports C(ok).
version_added: 0.1.0
author:
  - gpudoctor developers (!UNKNOWN)
options:
  devices:
    description:
      - Also watch these device nodes for the follow-driver trigger (C(--device)).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - gpudoctor.gpu.gpudoctor
attributes:
  check_mode:
    support: full
    description: Runs C(--dry-run); nothing is written.
  diff_mode:
    support: full
    description: Returns the unified diff of the unit files.
seealso:
  - module: gpudoctor.gpu.ct_gpu
"""

EXAMPLES = r"""
- name: /dev/nvidia-uvm exists before the CTs start, and CTs follow driver reloads
  gpudoctor.gpu.host_prep:
  become: true
"""

RETURN = r"""
status:
  description: C(nothing_to_change), C(dry_run) or C(applied).
  returned: always
  type: str
  sample: applied
message:
  description: gpudoctor's one sentence on what happened.
  returned: always
  type: str
explanation:
  description: One sentence per step of the plan.
  returned: always
  type: list
  elements: str
outcome:
  description: The whole C(gpudoctor fix --host-prep --json) document.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpudoctor.gpu.plugins.module_utils import gpudoctor_cli as cli

# the options DOCUMENTATION describes (tests/ansible/test_modules_unit.py compares them)
ARGUMENT_SPEC = {
    "devices": {"type": "list", "elements": "str", "default": []},
    **cli.COMMON_OPTIONS,
}


def prep_args(params, check_mode):
    """Return the ``gpudoctor fix --host-prep`` arguments for the task's options."""
    args = ["fix", "--host", "local", "--host-prep", "--json"]
    args.append("--dry-run" if check_mode else "--yes")
    for device in params["devices"]:
        args += ["--device", device]
    return args


def result_of(doc, rc, check_mode):
    """Return ``(failed, result)``: the task's result for gpudoctor's outcome ``doc``."""
    failed, result = cli.fix_result(doc, rc, check_mode, ("applied",))
    result["explanation"] = doc.get("explanation", [])
    if failed:
        result["msg"] = doc.get("message") or f"gpudoctor fix --host-prep failed (exit {rc})"
    return failed, result


def main():
    """Run the module: plan (check mode) or install through ``gpudoctor fix --host-prep``."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    args = prep_args(module.params, module.check_mode)
    rc, doc = cli.run_json(module, args, cli.FIX_RESULTS, locked=not module.check_mode)
    failed, result = result_of(doc, rc, module.check_mode)
    if failed:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
