"""Issue 45.6 through the real fixer (``run_fix``, what ``gpudoctor fix`` runs) on the
recorded H200 host: a CT that ``check`` passes (``allow = a`` and the four usual bind
mounts, as on the H200, where torch ran in it) gets nothing to change, exit 0, and no
restart; a CT that misses nvidia-uvm gets the whole plan, the host's other NVIDIA nodes
with it, each line naming the check it cures.

The host is ``tests.unit.scenarios.h200_host`` (a RecordedHost: its /dev/nvidia* and
/proc/devices are the H200's recorded files under tests/data/proc_devices), standing for
the H200 node; the CT is plain LXC, its config a file of that host. The lab has no NVIDIA
node to pass, so this is the closest real run of the case (tests/pve/test_fix_lab.py runs
the same fixer against real LXC CTs with the lab's stand-in node)."""

from __future__ import annotations

from gpudoctor.pve.fixer import FixOptions, run_fix
from gpudoctor.pve.planner import PlanOptions
from tests.pve.test_planner import FOUR_MOUNTS
from tests.unit.scenarios import h200_host

CONFIG = "/var/lib/lxc/gpu/config"


def _dry_run(config: str) -> tuple[object, list[str]]:
    host = h200_host()
    host.files[CONFIG] = config
    said: list[str] = []
    options = FixOptions(ct="gpu", flavor="lxc", dry_run=True, plan=PlanOptions(mode="rules"))
    done = run_fix(host, options, progress=said.append)
    assert host.files[CONFIG] == config  # a dry run writes nothing
    return done, said


def test_a_ct_that_check_passes_is_nothing_to_change() -> None:
    done, _ = _dry_run("lxc.uts.name = gpu\nlxc.cgroup2.devices.allow = a\n" + FOUR_MOUNTS)
    assert (done.status, done.exit_code) == ("nothing_to_change", 0), done.message
    assert (done.plan.changed, done.plan.edits) == (False, ())


def test_a_ct_without_nvidia_uvm_gets_every_node_each_naming_its_cure() -> None:
    without_uvm = FOUR_MOUNTS.replace("/dev/nvidia-uvm dev/nvidia-uvm none", "/dev/null dev/x none")
    done, _ = _dry_run("lxc.uts.name = gpu\nlxc.cgroup2.devices.allow = a\n" + without_uvm)
    assert (done.status, done.exit_code) == ("dry_run", 4), done.message
    why = {e.line.split()[2]: e.reason for e in done.plan.edits}
    assert why["/dev/nvidia-uvm"].endswith("(cures device.nodes)")
    assert why["/dev/nvidia-caps"].endswith(
        "(no check requires it alone: passed with the nodes device.nodes requires)"
    )
