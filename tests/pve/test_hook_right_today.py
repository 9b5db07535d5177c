"""A hook that mknods a GPU node with a fixed major is cured even when that major is
right today: the fix passes the host's node by a bind mount (or a devN entry), and a hook
left beside it would meet the mounted node ("File exists") and abort the CT's start; the
major also moves at the next driver update. The hook file is a real file read through a
real LocalHost; the host facts are the real H200 capture (nvidia-uvm is 238 there)."""

from __future__ import annotations

from gpudoctor.pve.config import LXC, parse
from tests.pve.test_hooks import config_with_hook, hook_plan, write_hook

RIGHT_TODAY = """#!/bin/sh
mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c 238 0
mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm-tools c 238 1
"""


def _active_lines(text: str, flavor: str) -> list[str]:
    return [ln.text for ln in parse(text, flavor).lines if not ln.text.lstrip().startswith("#")]


def test_a_hook_whose_major_is_right_today_is_not_left_beside_the_bind_mount(tmp_path) -> None:
    hook = write_hook(tmp_path, RIGHT_TODAY)
    p = hook_plan(config_with_hook(hook, flavor=LXC), "rules")
    live = _active_lines(p.new_text, LXC)
    mounts = [ln for ln in live if ln.startswith("lxc.mount.entry") and "/dev/nvidia-uvm " in ln]
    assert mounts, p.new_text  # the node is passed the durable way
    assert not [ln for ln in live if ln.startswith("lxc.hook.")], p.new_text  # the hook is off
    (comment,) = [e for e in p.edits if e.action == "comment"]
    assert "as the host's now" in comment.reason and "breaks when it moves" in comment.reason


def test_on_proxmox_81_the_hook_right_today_gives_way_to_devn_entries(tmp_path) -> None:
    hook = write_hook(tmp_path, RIGHT_TODAY)
    p = hook_plan(config_with_hook(hook), "auto", "8.2.4")
    assert p.mode == "devn"
    live = _active_lines(p.new_text, "pve")
    assert any(ln.startswith("dev") and "/dev/nvidia-uvm," in ln for ln in live)
    assert not [ln for ln in live if ln.startswith("lxc.hook.")], p.new_text
