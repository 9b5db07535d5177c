# Copyright: gpudoctor developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Run ``gpudoctor`` on the managed node and read its JSON: the one place where the
collection's modules meet gpudoctor. The modules never plan nor write anything themselves:
``gpudoctor fix`` / ``check`` do, with their own lock, backup and compare-and-swap."""

from __future__ import annotations

import json
import os

# `gpudoctor fix` exit codes (docs/cli.md): 0 done or nothing to do, 3 not applied /
# failed / rolled back, 4 changes pending and nothing written (--dry-run).
OK, FAILED, PENDING = 0, 3, 4
FIX_RESULTS = (OK, FAILED, PENDING)  # the exits whose stdout is fix's JSON outcome
# `gpudoctor check` exit codes: 0 healthy, 3 a FAIL or ERROR, 4 every check SKIPped.
CHECK_RESULTS = (0, 3, 4)

# the argument specs of the doc fragments gpudoctor.gpu.gpudoctor and .containers
COMMON_OPTIONS = {
    "executable": {"type": "path"},
}
CONTAINER_OPTIONS = {
    "flavor": {"type": "str", "choices": ["pve", "lxc"], "default": "pve"},
    "lxcpath": {"type": "path"},
}

# gpudoctor's per-node lock: what `gpudoctor fix --follow-driver` (and the unit that runs it
# after a driver reload) holds while it changes the node's CTs (gpudoctor/pve/follow.py)
NODE_LOCK = "follow-driver.lock"
LOCK_WAIT_S = 900
LOCK_BUSY = 75  # flock's exit code when the wait ran out (-E)


def node_lock(module):
    """Return the command prefix that runs gpudoctor under its per-node lock (``flock`` on
    ``$GPUDOCTOR_LOCK_DIR/follow-driver.lock``, ``/run/gpudoctor`` by default): two plays,
    or a play and the follow-driver unit, never change one node's CTs at once."""
    lock_dir = os.environ.get("GPUDOCTOR_LOCK_DIR") or "/run/gpudoctor"
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    flock = module.get_bin_path("flock", required=True)
    path = os.path.join(lock_dir, NODE_LOCK)
    return [flock, "-w", str(LOCK_WAIT_S), "-E", str(LOCK_BUSY), path]


def gpudoctor_path(module):
    """Return the gpudoctor executable: the ``executable`` option, else ``gpudoctor`` on the
    node's PATH (fails the task, naming what to install, when there is none)."""
    given = module.params.get("executable")
    if given:
        return given
    return module.get_bin_path("gpudoctor", required=True)


def run_json(module, args, results, locked=False):
    """Run ``gpudoctor ARGS`` on the node (``locked``: under its per-node lock); return
    ``(rc, document)`` when it exits with one of ``results`` and prints a JSON document,
    else fail the task with gpudoctor's own one-line error (its last stderr line)."""
    lock = node_lock(module) if locked else []
    cmd = [*lock, gpudoctor_path(module), *args]
    rc, out, err = module.run_command(cmd)  # check_rc off: every exit is read here
    if lock and rc == LOCK_BUSY and not out.strip():
        module.fail_json(msg=f"another gpudoctor run held {lock[-1]} for {LOCK_WAIT_S} s; "
                         "run the play again when it is done", rc=rc, cmd=cmd)  # fmt: skip
    doc = parse_document(out)
    if doc is None or (rc not in results and not is_failure_document(doc)):
        module.fail_json(msg=error_line(rc, err, out), rc=rc, cmd=cmd, stdout=out, stderr=err)
    return rc, doc


def parse_document(text):
    """Return the JSON object printed on stdout, or None when there is none."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def is_failure_document(doc):
    """Return True for ``fix --json``'s refusal form (``{"ok": false, "error": ...}``)."""
    return doc.get("ok") is False and "error" in doc


def error_line(rc, err, out):
    """Return the line that says why gpudoctor failed: its last ``gpudoctor: error:`` line
    of stderr, else the last line of any output, else the exit code."""
    lines = [line.strip() for line in (err or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("gpudoctor: error:")]
    if errors:
        return errors[-1]
    if lines:
        return lines[-1]
    tail = [line.strip() for line in (out or "").splitlines() if line.strip()]
    return tail[-1] if tail else f"gpudoctor exited with code {rc} and printed nothing"


def fix_result(doc, rc, check_mode, done):
    """Return ``(failed, result)`` for a ``gpudoctor fix --json`` outcome ``doc`` (exit
    ``rc``): ``changed`` when check mode finds a fix pending (``dry_run``) or, applying, when
    the status is one of ``done`` (written or restarted); gpudoctor's diff as Ansible's;
    failed unless fix exited 0 (or 4, pending, in check mode)."""
    status = doc.get("status", "failed")
    result = {
        "changed": status == "dry_run" if check_mode else status in done,
        "status": status,
        "message": doc.get("message", ""),
        "outcome": doc,
    }
    diff = config_diff(doc.get("config") or doc.get("unit"), doc.get("diff"))
    if diff is not None:
        result["diff"] = diff
    return not (rc == OK or (check_mode and rc == PENDING)), result


def config_diff(path, diff):
    """Return Ansible's diff form of gpudoctor's unified diff of ``path`` (``prepared``: the
    exact text fix would write, headers included), or None when nothing would change."""
    if not diff:
        return None
    return {"before_header": path, "after_header": path, "prepared": diff}
