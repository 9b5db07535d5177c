"""What the node snapshot holds and what `device.unchanged` is told changed: the NVIDIA
nodes present before the probe (in discovery order), each one's stat, the files read beside
them, and every node the probe removed, created, re-numbered, chmod-ed or chown-ed.

Real device nodes (mknod) in a tmp root tree read through tests/fakes/rooted_host.py (a
container's root as its agent sees it), and the early probe's raw snapshot made of real
``os.stat`` results of those nodes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpudoctor.facts import node_snapshot
from gpudoctor.facts.node_snapshot import NodeChange, NodeSnapshot, changes
from gpudoctor.hosts.base import FileStat
from tests.fakes.rooted_host import RootedHost

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char nodes needs root")

NODES = (("dev/nvidiactl", 195, 255), ("dev/nvidia0", 195, 0), ("dev/nvidia-uvm", 511, 0),
         ("dev/nvidia-caps/nvidia-cap1", 234, 1))  # fmt: skip


def ct_root(tmp_path: Path) -> Path:
    root = tmp_path / "ct"
    (root / "dev/nvidia-caps").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc/devices").write_text("Character devices:\n195 nvidia\n511 nvidia-uvm\n")
    for rel, major, minor in NODES:
        os.mknod(root / rel, 0o020666, os.makedev(major, minor))
        os.chmod(root / rel, 0o666)
    (root / "dev/null").write_text("")  # not an NVIDIA node
    (root / "dev/nvidia-loop").symlink_to("nvidia-loop")  # stat fails with ELOOP
    return root


def node(
    path: str, major: int, minor: int, mode: int = 0o666, uid: int = 0, gid: int = 0
) -> FileStat:
    return FileStat(path, "char", mode, major, minor, uid, gid)


def comparable(stat: FileStat | None) -> tuple | None:
    return (
        None
        if stat is None
        else (stat.path, stat.kind, stat.mode, stat.major, stat.minor, stat.uid, stat.gid)
    )


def test_the_snapshot_holds_every_node_its_stat_and_the_files(tmp_path: Path) -> None:
    host = RootedHost(str(ct_root(tmp_path)))
    snap = node_snapshot.take(host, extra=["/dev/nvidia-loop", "/dev/dri/card0", "/dev/nvidia0"],
                              files=["/proc/devices", "/proc/driver/nvidia/params"])  # fmt: skip
    assert snap.nodes == (
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap1",
    )
    # each path once; the missing one held as missing; the unreadable one not looked at
    assert snap.paths == (*snap.nodes, "/dev/dri/card0")
    assert [comparable(s) for _, s in snap.stats] == [
        comparable(node("/dev/nvidia-uvm", 511, 0)), comparable(node("/dev/nvidia0", 195, 0)),
        comparable(node("/dev/nvidiactl", 195, 255)),
        comparable(node("/dev/nvidia-caps/nvidia-cap1", 234, 1)), None,
    ]  # fmt: skip
    assert snap.looked_at("/dev/dri/card0") and snap.stat("/dev/dri/card0") is None
    assert not snap.looked_at("/dev/nvidia-loop") and snap.stat("/dev/nvidia-loop") is None
    assert snap.stat("/dev/nvidia0").minor == 0
    assert snap.files == (
        ("/proc/devices", "Character devices:\n195 nvidia\n511 nvidia-uvm\n"),
        ("/proc/driver/nvidia/params", None),
    )


def test_again_looks_at_every_path_of_before_and_the_nodes_now(tmp_path: Path) -> None:
    root = ct_root(tmp_path)
    host = RootedHost(str(root))
    before = node_snapshot.take(host, extra=["/dev/nvidia1", "/dev/null"])  # a --device path
    os.unlink(root / "dev/nvidia-uvm")
    os.mknod(root / "dev/nvidia-uvm-tools", 0o020666, os.makedev(511, 1))
    os.mknod(root / "dev/nvidia1", 0o020666, os.makedev(195, 1))
    for created in ("nvidia-uvm-tools", "nvidia1"):
        os.chmod(root / "dev" / created, 0o666)
    os.chmod(root / "dev/nvidia0", 0o600)
    os.chown(root / "dev/nvidiactl", 0, 44)
    after = node_snapshot.again(host, before)
    assert after.files == ()
    assert [(c.path, c.kind, comparable(c.before), comparable(c.after)) for c in changes(before, after)] == [
        ("/dev/nvidia-uvm", "removed", comparable(node("/dev/nvidia-uvm", 511, 0)), None),
        ("/dev/nvidia0", "changed", comparable(node("/dev/nvidia0", 195, 0)),
         comparable(node("/dev/nvidia0", 195, 0, mode=0o600))),
        ("/dev/nvidiactl", "changed", comparable(node("/dev/nvidiactl", 195, 255)),
         comparable(node("/dev/nvidiactl", 195, 255, gid=44))),
        ("/dev/nvidia1", "created", None, comparable(node("/dev/nvidia1", 195, 1))),
        ("/dev/nvidia-uvm-tools", "created", None, comparable(node("/dev/nvidia-uvm-tools", 511, 1))),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("after", "changed"),
    [(node("/dev/nvidia0", 195, 0), False), (node("/dev/nvidia0", 195, 0, mode=0o660), True),
     (node("/dev/nvidia0", 195, 0, uid=1000), True), (node("/dev/nvidia0", 195, 0, gid=44), True),
     (node("/dev/nvidia0", 195, 1), True), (node("/dev/nvidia0", 511, 0), True),
     (FileStat("/dev/nvidia0", "block", 0o666, 195, 0), True),
     (FileStat("/dev/nvidia0", "char", 0o666, 195, 0, size=1, mtime=5.0), False)],
)  # fmt: skip
def test_what_counts_as_a_changed_node(after: FileStat, changed: bool) -> None:
    """Type, major:minor, mode, owner and group: a change in any is reported; a new
    timestamp alone (the driver opened the node) is not."""
    before = NodeSnapshot(("/dev/nvidia0",), (("/dev/nvidia0", node("/dev/nvidia0", 195, 0)),))
    now = NodeSnapshot(("/dev/nvidia0",), (("/dev/nvidia0", after),))
    assert changes(before, now) == (
        [NodeChange("/dev/nvidia0", before.stats[0][1], after)] if changed else []
    )


def test_a_path_missing_before_and_after_is_no_change() -> None:
    """... and the paths after it are still compared."""
    gone = NodeSnapshot(
        (), (("/dev/nvidia1", None), ("/dev/nvidia0", node("/dev/nvidia0", 195, 0)))
    )
    assert changes(gone, gone) == []
    moved = NodeSnapshot(
        (), (("/dev/nvidia1", None), ("/dev/nvidia0", node("/dev/nvidia0", 511, 0)))
    )
    assert [(c.path, c.kind) for c in changes(gone, moved)] == [("/dev/nvidia0", "changed")]


def test_the_early_snapshot_reads_as_the_same_snapshot(tmp_path: Path) -> None:
    """The early probe's raw snapshot (os.stat results, listings, file bytes or errnos)
    gives what take() gives for the same tree."""
    root = ct_root(tmp_path)
    dirs: dict[str, object] = {"/dev": sorted(os.listdir(root / "dev")),
                               "/dev/nvidia-caps": sorted(os.listdir(root / "dev/nvidia-caps")),
                               "/dev/nvidia-caps-imex-channels": errno.ENOENT}  # fmt: skip
    stats: dict[str, object] = {f"/{rel}": os.stat(root / rel) for rel, _, _ in NODES}
    stats["/dev/nvidiactl"] = errno.EACCES
    raw = {"dirs": dirs, "stats": stats,
           "files": {"/proc/devices": (root / "proc/devices").read_bytes(),
                     "/proc/self/status": b"Name:\tpython3\nUid:\t1000\t0\t0\t0\n\xff",
                     "/proc/driver/nvidia/params": errno.ENOENT}}  # fmt: skip
    snap = node_snapshot.from_early(raw)
    assert snap.nodes == (
        "/dev/nvidia-uvm",
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap1",
    )
    assert [comparable(s) for _, s in snap.stats] == [
        comparable(node("/dev/nvidia-uvm", 511, 0)), comparable(node("/dev/nvidia0", 195, 0)),
        None, comparable(node("/dev/nvidia-caps/nvidia-cap1", 234, 1)),
    ]  # fmt: skip
    assert snap.files == (
        ("/proc/devices", "Character devices:\n195 nvidia\n511 nvidia-uvm\n"),
        ("/proc/self/status", "Name:\tpython3\nUid:\t1000\t0\t0\t0\n\ufffd"),
        ("/proc/driver/nvidia/params", None),
    )
    assert node_snapshot.effective_uid(dict(snap.files)["/proc/self/status"]) == 0
    unlisted = node_snapshot.from_early({**raw, "dirs": {"/dev": errno.EACCES}})
    assert unlisted.nodes == () and unlisted.stats == ()


@pytest.mark.parametrize(
    ("status", "uid"),
    [("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n", 1000),
     ("Name:\tpython3\nUid:\t0\t65534\t0\t0\n", 65534),
     ("Uid:\t0\n", None), ("Uid:\t0\tx\t0\t0\n", None), ("Name:\tx\n", None), (None, None),
     ("Name:\tUid: 5\nUid:\t7\t7\t7\t7\n", 7)],
)  # fmt: skip
def test_the_effective_uid_the_probe_ran_as(status: str | None, uid: int | None) -> None:
    assert node_snapshot.effective_uid(status) == uid


@pytest.mark.parametrize(
    ("params", "line"),
    [("ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n", "ModifyDeviceFiles: 1"),
     ("  ModifyDeviceFiles: 0  \n", "ModifyDeviceFiles: 0"), ("ResmanDebugLevel: 4294967295\n", None),
     (None, None)],
)  # fmt: skip
def test_the_modify_device_files_setting(params: str | None, line: str | None) -> None:
    assert node_snapshot.modify_device_files(params) == line
