#!/usr/bin/python
# Copyright: gpudoctor developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Gather what ``gpudoctor check`` finds for each GPU container of a node, as facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: check_facts
short_description: Gather gpudoctor's findings for each GPU container of a node as facts
description:
  - Runs C(gpudoctor check --host local --ct CT --json) on the node for each container and
    returns every finding structured - its check id, status, subject, message, evidence
    and remedy - under C(ansible_facts.gpudoctor.cts[CT]).
  - Without I(cts) it checks every GPU container of the node - those whose config passes a
    device node through, as C(gpudoctor fix --follow-driver --dry-run) lists them.
  - Read-only; never reports C(changed).
version_added: 0.1.0
author:
  - gpudoctor developers (!UNKNOWN)
options:
  cts:
    description:
      - The containers to check (VMIDs, or plain LXC names). Default every GPU container
        of the node.
    type: list
    elements: str
    default: []
  devices:
    description:
      - Also probe these device nodes inside each container (C(PATH[:DRIVER]), as
        C(gpudoctor check --device)).
    type: list
    elements: str
    default: []
  only:
    description:
      - Run only these checks or families (C(device), C(cuda.init)).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - gpudoctor.gpu.gpudoctor
  - gpudoctor.gpu.gpudoctor.containers
attributes:
  check_mode:
    support: full
    description: Read-only - it runs the same in check mode.
  diff_mode:
    support: none
    description: It changes nothing, so it has no diff.
  facts:
    support: full
    description: The findings are returned under C(ansible_facts.gpudoctor).
notes:
  - The exit code of C(gpudoctor check) does not fail the task - a FAIL finding is a fact.
    Use M(ansible.builtin.assert) on C(ansible_facts.gpudoctor.failing) to stop a play.
seealso:
  - module: gpudoctor.gpu.ct_gpu
"""

EXAMPLES = r"""
- name: What gpudoctor check finds in every GPU CT of the node
  gpudoctor.gpu.check_facts:
  become: true

- name: The failing findings, one line each
  ansible.builtin.debug:
    msg: "{{ item.0.key }}: {{ item.1.check }} {{ item.1.status }}: {{ item.1.remedy }}"
  loop: "{{ ansible_facts.gpudoctor.cts | dict2items | subelements('value.findings') }}"
  when: item.1.status in ['FAIL', 'ERROR']
"""

RETURN = r"""
ansible_facts:
  description: The findings.
  returned: always
  type: complex
  contains:
    gpudoctor:
      description:
        - C(cts) maps each container to its C(status) (the worst finding), C(target) and
          C(findings); each finding has C(check), C(status), C(subject), C(message),
          C(evidence) (a list), C(remedy), C(fix_hint) and C(caused_by).
        - C(failing) lists the containers with a FAIL or ERROR finding.
      returned: always
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpudoctor.gpu.plugins.module_utils import gpudoctor_cli as cli

# the options DOCUMENTATION describes (tests/ansible/test_modules_unit.py compares them)
ARGUMENT_SPEC = {
    "cts": {"type": "list", "elements": "str", "default": []},
    "devices": {"type": "list", "elements": "str", "default": []},
    "only": {"type": "list", "elements": "str", "default": []},
    **cli.COMMON_OPTIONS,
    **cli.CONTAINER_OPTIONS,
}

BAD = ("FAIL", "ERROR")


def place_args(params):
    """Return the ``--flavor`` / ``--lxcpath`` arguments for the task's options."""
    args = ["--flavor", params["flavor"]]
    if params["lxcpath"]:
        args += ["--lxcpath", params["lxcpath"]]
    return args


def gpu_cts(module):
    """Return the node's containers that pass a device node through (the follow-driver
    dry run's list: every CT but those it calls ``no_devices``)."""
    args = ["fix", "--host", "local", "--follow-driver", "--dry-run", "--json",
            *place_args(module.params)]  # fmt: skip
    doc = cli.run_json(module, args, cli.FIX_RESULTS)[1]
    if "cts" not in doc:
        module.fail_json(msg=f"cannot list the node's containers: {doc.get('message')}")
    return [str(c["ct"]) for c in doc["cts"] if c.get("status") != "no_devices"]


def check_args(params, ct):
    """Return the ``gpudoctor check`` arguments for one container."""
    args = ["check", "--host", "local", "--ct", ct, "--json", *place_args(params)]
    for device in params["devices"]:
        args += ["--device", device]
    for wanted in params["only"]:
        args += ["--only", wanted]
    return args


def finding(raw):
    """Return one finding of the JSON report, its remediation named ``remedy``."""
    return {
        "check": raw.get("check"),
        "status": raw.get("status"),
        "subject": raw.get("subject", ""),
        "message": raw.get("message", ""),
        "evidence": list(raw.get("evidence", [])),
        "remedy": raw.get("remediation", ""),
        "fix_hint": raw.get("fix_hint", ""),
        "caused_by": list(raw.get("caused_by", [])),
    }


def main():
    """Run the module: one ``gpudoctor check`` per container, as facts."""
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    cts = module.params["cts"] or gpu_cts(module)
    found = {}
    for ct in cts:
        doc = cli.run_json(module, check_args(module.params, ct), cli.CHECK_RESULTS)[1]
        found[ct] = {  # the gpudoctor.check/1 report (docs/json-schema.md)
            "status": doc["status"],
            "target": doc["target"],
            "findings": [finding(f) for f in doc["findings"]],
        }
    failing = [ct for ct, r in found.items() if any(f["status"] in BAD for f in r["findings"])]
    module.exit_json(changed=False, ansible_facts={"gpudoctor": {"cts": found, "failing": failing}})


if __name__ == "__main__":
    main()
