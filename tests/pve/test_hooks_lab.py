"""A CT whose lxc.hook.autodev script mknods its GPU node with a hard-coded wrong major,
on REAL LXC (pure cgroup v2) reached over a real sshd: check names the hook, fix comments
the hook line out and passes the host's node, the restart works, the re-check passes; and
a restart that fails shows the failing hook's own error line (issue 21.2).

The stand-in GPU node is a real misc node on the host (10:232, as the lab's fake GPU);
the hook writes 11:232, the "major of an earlier boot". Plain LXC flavor for real; the
Proxmox flavor through the pct stand-in (tests/fakes/pct.py) and pveversion 8.2.4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lab.pvelab import make_pve_ct, unique_vmid
from tests.pve.support import fix_in_process as fix
from tests.pve.test_fix_lab import ssh_args

pytestmark = pytest.mark.lab
STALE_MAJOR = 11  # the lab node is misc 10:232


def write_script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def guide_hook(tmp_path: Path, node: str) -> str:
    """The forum-guide hook: mknod with a fixed (wrong) major."""
    return write_script(
        tmp_path / "nvidia-autodev.sh",
        "#!/bin/sh\n"
        "# make the GPU nodes (majors from an earlier boot)\n"
        f"mknod -m 666 ${{LXC_ROOTFS_MOUNT}}{node} c {STALE_MAJOR} 232\n",
    )


def failing_hook(tmp_path: Path) -> tuple[str, Path]:
    """A pre-start hook that fails (with a message) as many times as its counter file says."""
    counter = tmp_path / "fail-count"
    counter.write_text("0")
    script = write_script(
        tmp_path / "models-mounted.sh",
        "#!/bin/sh\n"
        f"n=$(cat {counter})\n"
        f'if [ "$n" -gt 0 ]; then echo $((n - 1)) > {counter}; '
        'echo "models-mounted.sh: /srv/models is not mounted"; exit 1; fi\n'
        "exit 0\n",
    )
    return script, counter


def check(sshd, options, env, monkeypatch, ids=("ct.hooks",)):
    from gpudoctor.checks.ct import device_rules, hooks

    from gpudoctor.registry import validate
    from gpudoctor.runner import run_checks

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    specs = [s for s in validate([device_rules, hooks]) if s.id in ids]
    with sshd.host() as host:
        return run_checks(host, options, ct_host=host, specs=specs).findings


def opened(container, path: str) -> str:
    code = f"import os; os.close(os.open({path!r}, os.O_RDWR))"
    result = container.attach(["python3", "-I", "-c", code])
    return "OK" if result.ok else result.stderr.strip().splitlines()[-1]


def test_lxc_hook_with_a_stale_major_is_named_cured_and_rechecked(
    lab, lab_sshd, lab_container, dev_node, tmp_path, monkeypatch
) -> None:
    from gpudoctor.context import CheckOptions, DeviceRequest
    from gpudoctor.model import Status

    hook = guide_hook(tmp_path, dev_node)
    hook_bytes = Path(hook).read_bytes()
    ct = lab_container(extra_config=["lxc.autodev = 1", f"lxc.hook.autodev = {hook}"])
    assert opened(ct, dev_node) != "OK"  # the hook's node is 11:232: no such device / EPERM
    env = {"GPUDOCTOR_LXCPATH": ct.lxcpath, "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "hb"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "cb"),
           "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks")}  # fmt: skip
    options = CheckOptions(ct=ct.name, flavor="lxc", devices=(DeviceRequest(dev_node),))
    [finding] = check(lab_sshd, options, env, monkeypatch)
    assert finding.status is Status.FAIL and finding.subject == f"{hook}:3"
    assert (
        f"makes {dev_node} {STALE_MAJOR}:232, but the host's is 10:232 now (misc, stat "
        f"{dev_node}): stale" in finding.message
    )

    args = [*ssh_args(lab_sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
            "--device", dev_node, "--yes", "--json"]  # fmt: skip
    result = fix(args, env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied", out
    [comment] = [e for e in out["edits"] if e["action"] == "comment"]
    assert comment["line"] == f"lxc.hook.autodev = {hook}" and "stale" in comment["reason"]
    config = ct.config_path.read_text().splitlines()
    assert f"#lxc.hook.autodev = {hook}" in config
    assert f"lxc.hook.autodev = {hook}" not in config
    rel = dev_node.lstrip("/")
    assert f"lxc.mount.entry = {dev_node} {rel} none bind,optional,create=file" in config
    assert "lxc.cgroup2.devices.allow = c 10:232 rwm" in config
    assert Path(hook).read_bytes() == hook_bytes  # the hook FILE is never edited
    assert out["probes"]["after"][dev_node] == "OK"
    assert opened(ct, dev_node) == "OK"
    both = check(lab_sshd, options, env, monkeypatch, ("ct.hooks", "ct.device_rules"))
    assert [f.status for f in both] == [Status.PASS, Status.PASS], [f.message for f in both]


def test_lxc_restart_that_fails_shows_the_hooks_error_line(
    lab, lab_sshd, lab_container, dev_node, tmp_path
) -> None:
    hook = guide_hook(tmp_path, dev_node)
    other, counter = failing_hook(tmp_path)
    ct = lab_container(extra_config=["lxc.autodev = 1", f"lxc.hook.autodev = {hook}",
                                     f"lxc.hook.pre-start = {other}"])  # fmt: skip
    old = ct.config_path.read_bytes()
    counter.write_text("2")  # the restart and the debug start fail; the rollback's works
    env = {"GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "hb"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "cb"),
           "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks")}  # fmt: skip
    args = [*ssh_args(lab_sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
            "--device", dev_node, "--yes", "--json"]  # fmt: skip
    result = fix(args, env)
    assert result.exit_code == 3, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "rolled_back", out
    said = f"hook {other}: models-mounted.sh: /srv/models is not mounted"
    assert said in out["message"] and said in out["start_log"]
    assert any(line.startswith("ERROR conf.c:run_buffer: Script exited with status 1")
               for line in out["start_log"])  # fmt: skip
    assert "Additional information can be obtained" not in out["message"]
    assert ct.config_path.read_bytes() == old and ct.state() == "RUNNING"


def test_pve_hook_is_cured_with_devn_entries_through_the_stand_in(
    lab, lab_sshd, lab_container, dev_node, tmp_path
) -> None:
    hook = guide_hook(tmp_path, dev_node)
    container = lab_container(name=unique_vmid(), start=False)
    ct = make_pve_ct(lab, container, tmp_path, extra=f"lxc.autodev: 1\nlxc.hook.autodev: {hook}\n")
    env = {**ct.env(), "GPUDOCTOR_PVEVERSION": ct.tree.pveversion("8.2.4")}
    assert not ct.open_inside(dev_node).ok
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", dev_node, "--yes", "--json"]
    result = fix(args, env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied" and out["mode"] == "devn", out
    live = ct.conf.read_text().split("\n[")[0].splitlines()
    assert f"#lxc.hook.autodev: {hook}" in live and f"lxc.hook.autodev: {hook}" not in live
    assert f"dev0: {dev_node},gid=0,mode=0666" in live
    assert ct.open_inside(dev_node).ok
    assert json.loads(fix(args, env).stdout)["status"] == "nothing_to_change"


def test_pve_failed_reboot_shows_the_hooks_error_from_pct_start_debug(
    lab, lab_sshd, lab_container, dev_node, tmp_path
) -> None:
    hook = guide_hook(tmp_path, dev_node)
    other, counter = failing_hook(tmp_path)
    container = lab_container(name=unique_vmid(), start=False)
    extra = f"lxc.autodev: 1\nlxc.hook.autodev: {hook}\nlxc.hook.pre-start: {other}\n"
    ct = make_pve_ct(lab, container, tmp_path, extra=extra)
    old = ct.conf.read_bytes()
    counter.write_text("2")
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", dev_node, "--mode", "rules",
            "--yes", "--json"]  # fmt: skip
    result = fix(args, ct.env())
    out = json.loads(result.stdout)
    assert out["status"] == "rolled_back", out
    said = f"hook {other}: models-mounted.sh: /srv/models is not mounted"
    assert said in out["start_log"] and out["message"].startswith("rolled back: pct reboot")
    assert said in out["message"]
    assert ct.conf.read_bytes() == old and ct.container.state() == "RUNNING"
