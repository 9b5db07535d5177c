"""Hooks that mknod GPU nodes with fixed majors: found, checked, cured (issue 21.2).

The hook scripts are real files read through a real LocalHost; the host facts are the
real H200 capture (nvidia-uvm is major 238 there; the forum guide's hook says 511).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpudoctor.facts.procfs import parse_proc_devices
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.config import LXC, Kind, parse
from gpudoctor.pve.facts import HostNode
from gpudoctor.pve.hookplan import HookCure, gpu_verdicts, judge, plan_hooks
from gpudoctor.pve.hooks import Hook, Mknod, find_mknods, inline_script, is_gpu_path, read_hooks
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


def _hook(*mknods: Mknod, index: int = 5, commands: int = 0, file: str = "/h/gpu.sh") -> Hook:
    return Hook(index, "lxc.hook.autodev", file, file, mknods, commands)


def _mknod(path: str, major: int, minor: int, line_no: int = 4) -> Mknod:
    return Mknod(line_no, f"mknod {path} c {major} {minor}", path, "c", major, minor)


def _without(facts, *paths: str):
    return replace(facts, nodes=tuple(n for n in facts.nodes if n.path not in paths))


def test_a_node_not_on_the_host_is_judged_by_the_major_proc_devices_gives() -> None:
    uvm = _mknod("/dev/nvidia-uvm", 511, 0)
    for facts in (
        _without(h200_facts(), "/dev/nvidia-uvm"),  # not looked at
        replace(h200_facts(), nodes=(HostNode("/dev/nvidia-uvm", "missing"),)),
        replace(h200_facts(), nodes=(HostNode("/dev/nvidia-uvm", "file", mode=0o644),)),
    ):
        verdict = judge(facts, _hook(uvm), uvm)
        assert (verdict.current, verdict.source, verdict.driver) == (
            (238, 0), "/proc/devices", "nvidia-uvm")  # fmt: skip
        assert verdict.stale
        assert verdict.describe() == (
            "/h/gpu.sh:4 `mknod /dev/nvidia-uvm c 511 0` makes /dev/nvidia-uvm 511:0, but the "
            "host's is 238:0 now (nvidia-uvm, /proc/devices): stale"
        )


def test_the_hosts_node_decides_and_a_right_major_is_still_fragile() -> None:
    right = _mknod("/dev/nvidia-uvm-tools", 238, 1)
    verdict = judge(h200_facts(), _hook(right), right)
    assert (verdict.current, verdict.source) == ((238, 1), "stat /dev/nvidia-uvm-tools")
    assert not verdict.stale
    assert verdict.describe() == (
        "/h/gpu.sh:4 `mknod /dev/nvidia-uvm-tools c 238 1` makes /dev/nvidia-uvm-tools 238:1, "
        "as the host's now (nvidia-uvm); a fixed major breaks when it moves"
    )
    minor = _mknod("/dev/nvidia-uvm-tools", 238, 0)  # the major right, the minor not
    assert judge(h200_facts(), _hook(minor), minor).stale
    block = replace(h200_facts(), nodes=(HostNode("/dev/nvidia-uvm", "block", 238, 0),))
    uvm = _mknod("/dev/nvidia-uvm", 238, 0)
    assert judge(block, _hook(uvm), uvm).source == "stat /dev/nvidia-uvm"


def test_a_node_the_host_cannot_say_anything_about_is_not_called_stale() -> None:
    unknown = _mknod("/dev/fakegpu0", 250, 0)  # a --device path: no NVIDIA family
    no_uvm = replace(_without(h200_facts(), "/dev/nvidia-uvm"),
                     devices=parse_proc_devices("Character devices:\n195 nvidia\n"))  # fmt: skip
    uvm = _mknod("/dev/nvidia-uvm", 511, 0)
    for facts, mknod in ((h200_facts(), unknown), (no_uvm, uvm)):
        verdict = judge(facts, _hook(mknod), mknod)
        assert (verdict.current, verdict.source, verdict.driver) == (None, "", "")
        assert not verdict.stale
        assert verdict.describe().endswith(
            f"makes {mknod.path} {mknod.major}:{mknod.minor}; the host has no such node and "
            "/proc/devices no major for it"
        )


def test_only_nvidia_nodes_and_the_device_paths_asked_for_are_gpu_nodes() -> None:
    assert is_gpu_path("/dev/nvidia0") and is_gpu_path("/dev/nvidia-caps/nvidia-cap1")
    assert is_gpu_path("/dev/fakegpu0", ("/dev/fakegpu0",))
    assert not is_gpu_path("/dev/fakegpu0") and not is_gpu_path("/dev/net/tun", ("/dev/x",))
    null = _mknod("/dev/null", 1, 3)
    facts = replace(h200_facts(), hooks=(_hook(null, _mknod("/dev/nvidia0", 195, 0)),))
    assert [v.mknod.path for v in gpu_verdicts(facts)] == ["/dev/nvidia0"]
    assert [v.mknod.path for v in gpu_verdicts(facts, ("/dev/null",))] == [
        "/dev/null", "/dev/nvidia0"]  # fmt: skip


def test_the_cure_comments_each_hook_once_with_every_reason_and_passes_each_node_once() -> None:
    uvm, tools = _mknod("/dev/nvidia-uvm", 511, 0, 3), _mknod("/dev/nvidia-uvm-tools", 511, 1, 4)
    again = _mknod("/dev/nvidia-uvm", 511, 0, 1)
    gone = _mknod("/dev/nvidia-caps/nvidia-cap9", 241, 9, 2)  # the host lacks it
    first = _hook(uvm, tools, index=7, commands=2)
    second = _hook(again, gone, index=3, file="/h/other.sh")
    broken = Hook(9, "lxc.hook.mount", "/h/gone.sh", "/h/gone.sh", error="cannot read /h/gone.sh")
    facts = replace(h200_facts(), hooks=(first, second, broken))
    cure = plan_hooks(facts, (), devn=False, pve=False)
    assert [i for i, _ in cure.comment_out] == [7, 3]
    how = "bind mounts of the host's nodes and rules for their current majors pass the host's"
    assert cure.comment_out[0][1] == (
        "/h/gpu.sh:3 `mknod /dev/nvidia-uvm c 511 0` makes /dev/nvidia-uvm 511:0, but the "
        "host's is 238:0 now (nvidia-uvm, stat /dev/nvidia-uvm): stale; /h/gpu.sh:4 `mknod "
        "/dev/nvidia-uvm-tools c 511 1` makes /dev/nvidia-uvm-tools 511:1, but the host's is "
        f"238:1 now (nvidia-uvm, stat /dev/nvidia-uvm-tools): stale. {how} nodes instead; the "
        "hook file is not changed (its 2 other command line(s) stop running too: check them)"
    )
    assert cure.comment_out[1][1].endswith(
        ". " + how + " nodes instead; the hook file is not changed"
    )
    assert [n.path for n in cure.nodes] == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert len(cure.verdicts) == 4
    assert cure.warnings == (
        "lxc.hook.mount: cannot read /h/gone.sh: its mknods are not known",
        "/dev/nvidia-caps/nvidia-cap9 (made by /h/other.sh) does not exist on the host: not passed",
    )
    missing = replace(
        facts, nodes=(*facts.nodes, HostNode("/dev/nvidia-caps/nvidia-cap9", "missing"))
    )
    assert plan_hooks(missing, (), devn=False, pve=False).warnings == cure.warnings
    on_pve = plan_hooks(facts, (), devn=True, pve=True).comment_out[1][1]
    assert on_pve.endswith(
        ". devN entries (Proxmox re-reads their numbers at every start) pass the host's nodes "
        "instead; the hook file is not changed; Proxmox keeps the `#` line as part of the CT's "
        "description"
    )
    assert plan_hooks(replace(facts, hooks=()), (), devn=True, pve=True) == HookCure()


def _found(script: str) -> list[tuple[str, str, int, int]]:
    return [(m.path, m.type, m.major, m.minor) for m in find_mknods(script)[0]]


def test_every_way_a_hook_writes_mknod_is_read() -> None:
    assert _found('mknod -m 0666 "${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm" c 511 0') == [
        ("/dev/nvidia-uvm", "c", 511, 0)]  # fmt: skip  # quoted, as careful scripts write it
    assert _found("busybox mknod /dev/nvidia0 c 195 0") == [("/dev/nvidia0", "c", 195, 0)]
    assert _found("/usr/bin/mknod --mode 666 /dev/nvidia1 c 195 1") == [
        ("/dev/nvidia1", "c", 195, 1)]  # fmt: skip
    assert _found("mknod /dev/nvidia2 u 195 2") == [("/dev/nvidia2", "c", 195, 2)]  # u is c
    assert _found("mknod /dev/nvidia-blk b 7 0") == [("/dev/nvidia-blk", "b", 7, 0)]
    # a literal rootfs path that holds /dev/ itself: the CT's path is the last /dev/
    assert _found("mknod /mnt/dev/ct101/rootfs/dev/nvidia0 c 195 0") == [
        ("/dev/nvidia0", "c", 195, 0)]  # fmt: skip
    assert _found("mknod dev/nvidiactl c 195 255") == [("/dev/nvidiactl", "c", 195, 255)]


def test_what_makes_no_node_with_fixed_numbers_is_not_reported() -> None:
    assert _found("mknod /tmp/nvidia0 c 195 0") == []  # not a /dev path
    assert _found("mknod /dev/nvidia0 c 195") == []  # a broken line: no minor
    assert _found("mknod /dev/nvidia-pipe p") == []  # a FIFO has no numbers
    # the FIFO first, then a node on the same line: the node is still found
    assert _found("mknod /dev/x p; mknod /dev/nvidia0 c 195 0") == [("/dev/nvidia0", "c", 195, 0)]
    assert _found("mknod /dev/nvidia0 c 195 0 extra") == [("/dev/nvidia0", "c", 195, 0)]
    found, others = find_mknods("#!/bin/sh\n# mknod /dev/nvidia0 c 195 0\n\n   \nexit 0\n")
    assert (found, others) == ([], 1)  # the #! line, a comment, blank lines: not commands


def test_inline_hooks_of_every_shell_are_read_and_a_script_file_is_not_inline() -> None:
    script = "mknod /dev/nvidia0 c 195 0"
    for shell in ("sh", "/bin/sh", "/usr/bin/bash", "dash", "busybox sh", "/bin/busybox ash"):
        assert inline_script(f"{shell} -c '{script}'") == script, shell
    assert inline_script("/bin/sh /usr/share/lxc/hooks/nvidia.sh -c x") is None  # a file + args
    assert inline_script("sh -c") is None  # nothing to run
    assert inline_script("python3 -c 'print(1)'") is None  # not a shell
    assert inline_script("busybox mknod /dev/nvidia0 c 195 0") is None
    assert inline_script("sh -c 'unbalanced") is None
    assert inline_script("/bin/busybox") is None  # the program alone: a file hook


def test_each_hook_line_is_read_with_its_place_and_only_hook_lines(tmp_path) -> None:
    script = write_hook(tmp_path, "#!/bin/sh\nmknod /dev/nvidia0 c 195 0\necho done\n")
    directory = tmp_path / "hooks.d"
    directory.mkdir()
    value = "sh -c 'mknod /dev/nvidia-uvm c 511 0; true'"
    config = parse(
        "lxc.cgroup2.devices.allow = c 195:* rwm\n"
        f"lxc.hook.pre-start = {value}\n"
        f"lxc.hook.autodev = {directory}\n"
        f"lxc.hook.mount = {script} --with-args\n"
        f"lxc.hook.start-host = {script} 'unbalanced\n"
        "lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n",
        LXC,
    )
    hooks = read_hooks(LocalHost(), config)
    assert [(h.index, h.key, h.value, h.file) for h in hooks] == [
        (1, "lxc.hook.pre-start", value, ""),
        (2, "lxc.hook.autodev", str(directory), str(directory)),
        (3, "lxc.hook.mount", f"{script} --with-args", script),
        (4, "lxc.hook.start-host", f"{script} 'unbalanced", script),
    ]
    inline, a_dir, with_args, unbalanced = hooks
    assert [(m.line_no, m.path) for m in inline.mknods] == [(2, "/dev/nvidia-uvm")]
    assert inline.commands == 0 and inline.error == ""
    assert a_dir.error == f"cannot read {directory}: [Errno 22] it is a dir, not a script file"
    assert a_dir.mknods == () and a_dir.commands == 0
    for hook in (with_args, unbalanced):
        assert [(m.line_no, m.path) for m in hook.mknods] == [(2, "/dev/nvidia0")]
        assert hook.commands == 1 and hook.error == ""


def test_a_hook_script_is_read_up_to_256_kib(tmp_path) -> None:
    padding = "# " + "x" * 1021 + "\n"  # 1 KiB a line
    near = write_hook(tmp_path, padding * 250 + "mknod /dev/nvidia0 c 195 0\n")
    (tmp_path / "far.sh").write_text(padding * 300 + "mknod /dev/nvidia0 c 195 0\n")
    config = parse(f"lxc.hook.autodev = {near}\nlxc.hook.mount = {tmp_path / 'far.sh'}\n", LXC)
    near_hook, far_hook = read_hooks(LocalHost(), config)
    assert [m.path for m in near_hook.mknods] == ["/dev/nvidia0"]
    assert far_hook.mknods == () and far_hook.error == ""  # past the limit: not read


def test_a_hook_with_one_gpu_mknod_or_one_of_the_device_paths_is_cured() -> None:
    null = _mknod("/dev/null", 1, 7)
    facts = replace(h200_facts(), nodes=(*h200_facts().nodes, HostNode("/dev/null", "char", 1, 3)),
                    hooks=(_hook(null, index=2),))  # fmt: skip
    assert plan_hooks(facts, (), devn=False, pve=False) == HookCure()  # not a GPU node
    cure = plan_hooks(facts, ("/dev/null",), devn=False, pve=False)
    assert [i for i, _ in cure.comment_out] == [2]
    assert cure.comment_out[0][1].startswith(
        "/h/gpu.sh:4 `mknod /dev/null c 1 7` makes /dev/null 1:7, but the host's is 1:3 now"
    )
    assert [n.path for n in cure.nodes] == ["/dev/null"]


def test_an_inline_hook_counts_its_other_commands() -> None:
    config = parse("lxc.hook.pre-start = sh -c 'modprobe nvidia-uvm'\n", LXC)
    [hook] = read_hooks(LocalHost(), config)
    assert (hook.mknods, hook.commands) == ((), 1)
