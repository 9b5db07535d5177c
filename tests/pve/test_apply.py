"""Target resolution, refusals and the locked compare-and-swap write, on real files
through LocalHost (the same host commands run over SSH in the lab tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.apply import (
    ApplyError,
    Layout,
    compare_and_swap,
    read_config,
    refusal,
    resolve_target,
    sha1_hex,
)
from tests.fakes.pvetree import PveTree

CONF = "arch: amd64\nhostname: ct\nlxc.cgroup2.devices.allow: c 195:* rwm\n\n[snap]\narch: amd64\n"


@pytest.fixture
def tree(tmp_path: Path) -> PveTree:
    return PveTree(tmp_path)


def test_owner_node_comes_from_vmlist(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    target = resolve_target(LocalHost(), "pve", "200", tree.layout())
    assert target.config_path == str(path)
    assert target.node == "pve1"
    assert target.lock_path == f"{tree.lock_dir}/pve-config-200.lock"


def test_ct_on_another_node_vm_and_unknown_ids_are_refused(tree: PveTree) -> None:
    tree.add_ct("201", CONF, node="pve2")
    tree.add_ct("300", "memory: 512\n", kind="qemu")
    host, layout = LocalHost(), tree.layout()
    with pytest.raises(ApplyError, match=r"lives on node 'pve2'.*--host pve2"):
        resolve_target(host, "pve", "201", layout)
    with pytest.raises(ApplyError, match="qemu VM, not a container"):
        resolve_target(host, "pve", "300", layout)
    with pytest.raises(ApplyError, match="does not exist"):
        resolve_target(host, "pve", "999", layout)


def test_not_a_proxmox_host(tmp_path: Path) -> None:
    layout = PveTree(tmp_path).layout(pve_root=str(tmp_path / "nothing"))
    with pytest.raises(ApplyError, match="not a Proxmox VE host"):
        resolve_target(LocalHost(), "pve", "200", layout)


def test_locked_and_template_cts_are_refused(tree: PveTree) -> None:
    tree.add_ct("200", "lock: backup\n" + CONF)
    tree.add_ct("202", "template: 1\n" + CONF)
    tree.add_ct("203", CONF + "lock: snapshot\n")  # a lock inside the snapshot is not live
    host, layout = LocalHost(), tree.layout()
    for vmid, expected in (("200", "locked \\(backup\\)"), ("202", "template")):
        target = resolve_target(host, "pve", vmid, layout)
        assert expected.replace("\\", "") in (
            refusal(read_config(host, target, layout).config, target) or ""
        )
    target = resolve_target(host, "pve", "203", layout)
    assert refusal(read_config(host, target, layout).config, target) is None


def test_cas_writes_new_bytes_and_backs_up_the_old(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    host, layout = LocalHost(), tree.layout()
    target = resolve_target(host, "pve", "200", layout)
    snap = read_config(host, target, layout)
    assert snap.sha1 == sha1_hex(CONF.encode()) and snap.data == CONF.encode()
    new = CONF.replace("195:* rwm\n", "195:* rwm\nlxc.cgroup2.devices.allow: c 238:* rwm\n")
    backup = f"{tree.backup_dir}/ct-200/x.conf"
    result = compare_and_swap(host, target, layout, snap.sha1, new.encode(), backup)
    assert path.read_text() == new
    assert Path(backup).read_bytes() == CONF.encode()
    assert result.new_sha1 == sha1_hex(new.encode()) and result.old_sha1 == snap.sha1
    assert not list(path.parent.glob("200.conf.tmp.*"))


def test_cas_aborts_when_the_file_changed_since_the_plan(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    host, layout = LocalHost(), tree.layout()
    target = resolve_target(host, "pve", "200", layout)
    snap = read_config(host, target, layout)
    path.write_text(CONF + "memory: 1024\n")  # somebody else edited it meanwhile
    with pytest.raises(ApplyError, match="changed since the plan") as info:
        compare_and_swap(host, target, layout, snap.sha1, b"new\n", f"{tree.backup_dir}/b.conf")
    assert info.value.code == "changed"
    assert path.read_text() == CONF + "memory: 1024\n"
    assert tree.backups() == []


def test_stale_tmp_files_are_cleared_under_the_lock(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    stale = path.parent / "200.conf.tmp.4242"
    stale.write_text("half")
    host, layout = LocalHost(), tree.layout()
    target = resolve_target(host, "pve", "200", layout)
    compare_and_swap(host, target, layout, sha1_hex(CONF.encode()), b"arch: amd64\n")
    assert not stale.exists() and path.read_text() == "arch: amd64\n"


@pytest.mark.slow
def test_cas_gives_up_when_proxmox_holds_the_config_lock(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    host, layout = LocalHost(), tree.layout()
    target = resolve_target(host, "pve", "200", layout)
    tree.lock_dir.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(["flock", target.lock_path, "sleep", "60"], start_new_session=True)
    try:
        while subprocess.run(["flock", "-n", target.lock_path, "true"]).returncode == 0:
            time.sleep(0.05)
        with pytest.raises(ApplyError, match="held by another task") as info:
            compare_and_swap(host, target, layout, sha1_hex(CONF.encode()), b"x\n")
        assert info.value.code == "lock_busy"
        assert path.read_text() == CONF
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and its sleep, which holds the lock
        holder.wait()


def test_own_locks_live_in_a_private_directory(tmp_path: Path) -> None:
    """Blocks a planted lock: gpudoctor's own lock directory is never a world-writable one
    (``/run/lock`` is 1777, where another user could pre-create the lock file or a symlink
    in its place); the directory the write creates is 0700."""
    default = Layout().own_lock_dir
    assert not default.startswith(("/run/lock", "/tmp", "/dev/shm", "/var/tmp"))
    lxcpath = tmp_path / "lxc"
    (lxcpath / "ct1").mkdir(parents=True)
    (lxcpath / "ct1" / "config").write_text("lxc.uts.name = ct1\n")
    own = tmp_path / "run-gpudoctor"
    layout = Layout(lxcpath=str(lxcpath), own_lock_dir=str(own))
    host = LocalHost()
    target = resolve_target(host, "lxc", "ct1", layout)
    assert target.lock_path.startswith(f"{own}/")
    snap = read_config(host, target, layout)
    compare_and_swap(host, target, layout, snap.sha1, b"lxc.uts.name = ct1\n# x\n")
    assert own.stat().st_mode & 0o777 == 0o700


def test_host_backup_is_saved_before_the_write(tree: PveTree) -> None:
    """The host program backs the old bytes up BEFORE it replaces the config: when the
    backup cannot be saved (its directory would be under a regular file), the config keeps
    its old bytes and the write fails."""
    path = tree.add_ct("200", CONF)
    host, layout = LocalHost(), tree.layout()
    target = resolve_target(host, "pve", "200", layout)
    blocker = tree.backup_dir / "not-a-dir"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where the backup directory should be\n")
    with pytest.raises(ApplyError) as info:
        compare_and_swap(
            host,
            target,
            layout,
            sha1_hex(CONF.encode()),
            b"arch: amd64\n",
            f"{blocker}/ct-200/b.conf",
        )
    assert info.value.code == "io"
    assert path.read_text() == CONF
    assert not list(path.parent.glob("200.conf.tmp.*"))
