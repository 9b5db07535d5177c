"""Issue 46 ("also look at"): nobody's open/close loop on the watched node, under a REAL
systemd 252 (the node's systemd of tests/ops/test_follow_driver_drill.py: a lab CT booting
Debian 12's systemd as PID 1, the stand-in of /dev/nvidia-uvm bind-mounted in).

``PathChanged=`` reports every close after a write, and /dev/nvidia-uvm is 0666: any user
(here ``nobody`` on this machine, whose node inode the CT's watch shares) fires the path
unit at will. Under systemd's default limits (the path unit's 200 triggers in 2 s, the
service's 5 starts in 10 s) the path unit then went ``failed`` (``trigger-limit-hit`` or
``unit-start-limit-hit``) and watched no more: a real reload was not followed. The units
now have neither limit; after the loop the path unit still watches and a real move of the
node is still followed. No CT is followed here (an empty lxcpath): only the triggers are
under test."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.lab.lxc import Lab, wait_for
from tests.lab.sshd import LabSSHD
from tests.ops.test_follow_driver_drill import MOVED, PATH_UNIT, NodeSystemd, now_us

pytestmark = pytest.mark.lab

LOOP = (
    "import os, sys, time\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    os.close(os.open(sys.argv[1], os.O_RDWR))\n"  # a close after a write open
    "    time.sleep(0.002)\n"
)


def test_an_open_close_loop_does_not_stop_the_node_from_following(
    lab: Lab, lab_sshd: LabSSHD, tmp_path: Path
) -> None:
    name = lab.unique_name("lim")
    uvm = lab.make_node(f"{name}-uvm", 10, 232)
    work = tmp_path / "work"
    (work / "no-cts").mkdir(parents=True)
    node = NodeSystemd(lab, f"{name}-node", ro=[lab.nodes_dir], rw=[work])
    node.create()
    lab.containers.append(node)
    node.boot(work, f"--flavor lxc --lxcpath {work / 'no-cts'}")
    installed = node.gpudoctor("fix", "--host-prep", "--yes", "--device", str(uvm))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert node.systemctl("is-active", PATH_UNIT) == "active", installed.stdout

    # the attack: nobody opens the node read-write and closes it, 1500 times in ~4 s
    attacker = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    started = time.monotonic()
    subprocess.run(
        [*attacker, "/usr/bin/python3", "-c", LOOP, str(uvm), "1500"], check=True, timeout=300
    )
    loop_s = time.monotonic() - started
    assert wait_for(node.idle, 120), (  # the last triggered run over, the watch still on
        f"loop {loop_s:.1f} s; path unit: {node.show('ActiveState', PATH_UNIT)} "
        f"{node.show('Result', PATH_UNIT)}; service: {node.show('Result')}\n"
        + node.journal(PATH_UNIT)[-2000:]
    )
    assert node.show("Result", PATH_UNIT) == "success"

    # a real move of the node is still followed
    since = now_us()
    uvm.unlink()
    os.mknod(uvm, 0o020666, os.makedev(*MOVED))
    uvm.chmod(0o666)
    assert wait_for(lambda: node.ran_since(since), 120), node.journal()[-2000:] + node.systemctl(
        "status", PATH_UNIT
    )
