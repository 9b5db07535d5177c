"""device.unchanged reports a node whose mode or owner the probe changed, not only one
whose major:minor changed: the real driver library, as root with ModifyDeviceFiles=1,
chmods/chowns nodes to NVreg_DeviceFileMode/UID/GID, and a node that turns 0600 root
locks every other user of the CT out of the GPU.

Real device nodes (mknod) in a tmp /dev tree (tests/fakes/rooted_host.py), the real probe,
and the fake driver (tests/unit/fake_libcuda.c, FAKE_CUDA_CHMOD_NODES) doing the chmod and
chown that libcuda does."""

from __future__ import annotations

import os

import pytest

from gpudoctor.context import CheckOptions
from gpudoctor.model import Status
from gpudoctor.runner import run_checks
from tests.unit.test_node_changes import by, ct_tree, driver

__all__ = ["driver"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of char nodes needs root")


@pytest.mark.parametrize(
    ("spec", "mode", "owner"),
    [("0600:0:0", 0o600, (0, 0)), ("0666:0:44", 0o666, (0, 44))],
    ids=["mode", "owner"],
)
def test_a_node_whose_mode_or_owner_the_probe_changed_is_reported(
    tmp_path, driver, monkeypatch, spec, mode, owner
) -> None:
    root = tmp_path / "ct"
    host = ct_tree(root, uvm_major=238)  # healthy numbers: only mode/owner will change
    driver(root, mknod_denied=True)
    node = root / "dev/nvidia0"
    monkeypatch.setenv("FAKE_CUDA_CHMOD_NODES", f"{node}:{spec}")
    report = run_checks(host, CheckOptions())
    st = os.stat(node)
    assert (st.st_mode & 0o7777, (st.st_uid, st.st_gid)) == (mode, owner)  # it really changed
    changed = by(report, "device.unchanged")
    assert "/dev/nvidia0" in changed, {s: f.message for s, f in changed.items()}
    assert changed["/dev/nvidia0"].status is not Status.PASS
    assert "/dev/nvidia-uvm" not in changed  # untouched nodes are not findings
