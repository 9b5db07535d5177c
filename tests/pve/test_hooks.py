"""Hooks that mknod GPU nodes with fixed majors: found, checked, cured (issue 21.2).

The hook scripts are real files read through a real LocalHost; the host facts are the
real H200 capture (nvidia-uvm is major 238 there; the forum guide's hook says 511).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.config import LXC, Kind, parse
from gpudoctor.pve.hooks import find_mknods, inline_script, read_hooks
from gpudoctor.pve.planner import PlanOptions, plan
from tests.pve.captures import h200_facts

GUIDE_HOOK = """#!/bin/sh
# from a forum guide: nodes with the majors of an earlier boot
mkdir -p ${LXC_ROOTFS_MOUNT}/dev/nvidia-caps
mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c 511 0
mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm-tools c 511 1
MAJOR=$(awk '$2=="nvidia-uvm" {print $1}' /proc/devices)
mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c $MAJOR 0 || true
"""


def test_find_mknods_reads_literal_numbers_only() -> None:
    found, others = find_mknods(GUIDE_HOOK)
    assert [(m.line_no, m.path, m.major, m.minor) for m in found] == [
        (4, "/dev/nvidia-uvm", 511, 0),
        (5, "/dev/nvidia-uvm-tools", 511, 1),
    ]  # the $MAJOR line follows the host: not reported
    assert others == 3  # mkdir, MAJOR=..., the $MAJOR mknod
    forms = "test -e x || /bin/mknod --mode=0666 dev/nvidia0 c 195 0; sudo mknod -Z /dev/nvidiactl c 195 255"
    assert [(m.path, m.major, m.minor) for m in find_mknods(forms)[0]] == [
        ("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255)]  # fmt: skip
    assert find_mknods("echo mknod /dev/nvidia0 c 195 0")[0] == []  # an argument, not a command


def test_inline_sh_c_hooks_are_read_from_the_config() -> None:
    value = "sh -c 'mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c 511 0'"
    assert inline_script(value) == "mknod -m 666 ${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c 511 0"
    assert inline_script("/usr/share/lxc/hooks/nvidia") is None
    config = parse(f"arch: amd64\nlxc.hook.autodev: {value}\n")
    [hook] = read_hooks(LocalHost(), config)
    assert hook.file == "" and hook.where == "inline lxc.hook.autodev"
    assert [(m.line_no, m.major) for m in hook.mknods] == [(2, 511)]


def write_hook(tmp_path, text: str = GUIDE_HOOK) -> str:
    path = tmp_path / "nvidia-autodev.sh"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def config_with_hook(hook: str, key: str = "lxc.hook.autodev", flavor: str = "pve"):
    sep = ": " if flavor == "pve" else " = "
    head = "arch: amd64\nhostname: llm\n" if flavor == "pve" else ""
    return parse(
        f"{head}lxc.cgroup2.devices.allow{sep}c 195:* rwm\n"
        f"lxc.cgroup2.devices.allow{sep}c 511:* rwm\n"
        f"lxc.mount.entry{sep}/dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        f"lxc.mount.entry{sep}/dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
        f"lxc.autodev{sep}1\n{key}{sep}{hook}\n",
        flavor,
    )


def hook_plan(config, mode: str, version: str | None = None):
    facts = h200_facts(version)
    facts = replace(facts, hooks=read_hooks(LocalHost(), config))
    return plan(config, facts, PlanOptions(mode=mode, label="ct.conf"))


def test_plain_lxc_plan_comments_the_hook_out_and_bind_mounts_the_nodes(tmp_path) -> None:
    hook = write_hook(tmp_path)
    config = config_with_hook(hook, flavor=LXC)
    before = (tmp_path / "nvidia-autodev.sh").read_bytes()
    p = hook_plan(config, "rules")
    comments = [e for e in p.edits if e.action == "comment"]
    assert [e.line for e in comments] == [f"lxc.hook.autodev = {hook}"]
    why = comments[0].reason
    assert f"{hook}:4 `mknod -m 666 ${{LXC_ROOTFS_MOUNT}}/dev/nvidia-uvm c 511 0`" in why
    assert "the host's is 238:0 now (nvidia-uvm, stat /dev/nvidia-uvm): stale" in why
    assert "bind mounts of the host's nodes" in why and "hook file is not changed" in why
    assert "3 other command line(s) stop running too" in why
    new = parse(p.new_text, LXC)
    texts = [ln.text for ln in new.lines]
    assert f"#lxc.hook.autodev = {hook}" in texts
    assert new.lines[texts.index(f"#lxc.hook.autodev = {hook}")].kind is Kind.DESCRIPTION
    assert (
        "lxc.mount.entry = /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in texts
    )
    assert "lxc.cgroup2.devices.allow = c 238:* rwm" in texts
    assert any("stale rule `c 511:* rwm`" in w for w in p.warnings)
    assert (tmp_path / "nvidia-autodev.sh").read_bytes() == before  # the file is never edited
    assert any("comment out `lxc.hook.autodev" in line for line in p.explanation)
    # a fixed point: planned again on the result, nothing left to do for the hook
    again = plan(new, replace(h200_facts(), hooks=read_hooks(LocalHost(), new)),
                 PlanOptions(mode="rules"))  # fmt: skip
    assert not [e for e in again.edits if e.action == "comment"]


def test_pve_81_plan_comments_the_hook_out_and_adds_devn_entries(tmp_path) -> None:
    hook = write_hook(tmp_path)
    p = hook_plan(config_with_hook(hook), "auto", "8.2.4")
    assert p.mode == "devn"
    live = p.new_text
    assert f"#lxc.hook.autodev: {hook}" in live
    assert any(ln.startswith("dev") and "/dev/nvidia-uvm," in ln for ln in live.splitlines())
    assert any(ln.startswith("dev") and "/dev/nvidia-uvm-tools," in ln for ln in live.splitlines())
    reason = next(e.reason for e in p.edits if e.action == "comment")
    assert "devN entries" in reason and "CT's description" in reason


@pytest.mark.parametrize("key", ["lxc.hook.mount", "lxc.hook.pre-start"])
def test_other_hook_kinds_are_read_too(tmp_path, key) -> None:
    p = hook_plan(config_with_hook(write_hook(tmp_path), key, flavor=LXC), "rules")
    assert [e.line.split(" =")[0] for e in p.edits if e.action == "comment"] == [key]


def test_a_hook_with_no_gpu_mknod_is_left_alone(tmp_path) -> None:
    hook = write_hook(tmp_path, "#!/bin/sh\nmknod ${LXC_ROOTFS_MOUNT}/dev/net/tun c 10 200\n")
    p = hook_plan(config_with_hook(hook, flavor=LXC), "rules")
    assert not [e for e in p.edits if e.action == "comment"]


def test_an_unreadable_hook_is_a_warning(tmp_path) -> None:
    p = hook_plan(config_with_hook(str(tmp_path / "missing.sh"), flavor=LXC), "rules")
    assert any("cannot read" in w and "missing.sh" in w for w in p.warnings)


def test_check_names_the_hook_its_line_and_the_stale_major(tmp_path, monkeypatch) -> None:
    from gpudoctor.checks.ct import hooks

    from gpudoctor.context import CheckOptions
    from gpudoctor.model import Status
    from gpudoctor.registry import validate
    from gpudoctor.runner import run_checks
    from tests.fakes.pvetree import PveTree

    # /dev/null (char 1:3) is this machine's real node; the hook writes 1:7 for it
    script = write_hook(tmp_path, "#!/bin/sh\n\nmknod -m 666 $LXC_ROOTFS_MOUNT/dev/null c 1 7\n")
    tree = PveTree(tmp_path)
    tree.add_ct("200", f"arch: amd64\nlxc.hook.autodev: {script}\n")
    for key, value in tree.env().items():
        monkeypatch.setenv(key, value)
    from gpudoctor.context import DeviceRequest

    options = CheckOptions(ct="200", flavor="pve", fix_host="root@pve1",
                           devices=(DeviceRequest("/dev/null"),))  # fmt: skip
    report = run_checks(LocalHost(), options, ct_host=LocalHost(), specs=validate([hooks]))
    [finding] = report.findings
    assert finding.status is Status.FAIL and finding.subject == f"{script}:3"
    assert "makes /dev/null 1:7, but the host's is 1:3 now (mem, stat /dev/null): stale" in (
        finding.message
    )
    assert any("line 2: lxc.hook.autodev" in e for e in finding.evidence)
    # the --device it was checked with: without it fix would not pass /dev/null (issue 32)
    assert finding.fix_hint == "gpudoctor fix --host root@pve1 --ct 200 --device /dev/null"
    # without --device /dev/null it is no GPU node: PASS
    report = run_checks(LocalHost(), CheckOptions(ct="200", flavor="pve"), ct_host=LocalHost(),
                        specs=validate([hooks]))  # fmt: skip
    assert [f.status for f in report.findings] == [Status.PASS]


def test_a_fifo_named_as_the_hook_script_is_refused_not_waited_on(public_tmp_path) -> None:
    """Attack (issue 33.12): the owner of an LXC dir (``--lxcpath``; here ``nobody`` through
    ``setpriv``) names a FIFO as the hook script; ``fix --dry-run`` and ``check`` read it as
    root and blocked for good (local reads had no deadline). Now the hook carries the
    error; the same for a socket. Run in a child with a deadline: on the old code it hangs."""
    import subprocess
    import sys

    lxcpath = public_tmp_path / "lxc"  # the user's own LXC dir
    lxcpath.mkdir()
    import os

    os.chown(lxcpath, 65534, 65534)
    fifo = lxcpath / "hook.sh"
    subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                    "mkfifo", str(fifo)], check=True)  # fmt: skip
    code = ("import sys; from tests.pve.test_hooks import config_with_hook; "
            "from gpudoctor.pve.hooks import read_hooks; from gpudoctor.hosts.local import LocalHost; "
            "from gpudoctor.hosts.agent.server import op_read_text\n"
            "[hook] = read_hooks(LocalHost(), config_with_hook(sys.argv[1], flavor='lxc'))\n"
            "print(hook.error)\n"
            "try:\n    op_read_text(sys.argv[1])\nexcept OSError as exc:\n    print(exc)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"cannot read {fifo}: [Errno 22] it is a fifo, not a script file",
        f"[Errno 22] fifo, not a file: refusing to read it: '{fifo}'",
    ]


def test_a_lone_dash_is_mknods_file_name_not_an_option() -> None:
    # GNU mknod reads `-` as the NAME operand; the /dev path after it is an extra operand
    # and the command fails: no node is made, so there is nothing to report
    assert find_mknods("mknod - /dev/nvidia-uvm c 511 0")[0] == []
    assert [(m.path, m.major) for m in find_mknods("mknod -m666 /dev/nvidia-uvm c 511 0")[0]] == [
        ("/dev/nvidia-uvm", 511)]  # fmt: skip
