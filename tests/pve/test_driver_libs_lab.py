"""``fix --driver-libs bind`` end to end on REAL systems: a real LXC container on pure cgroup
v2, reached through a real OpenSSH server on 127.0.0.1. Only the driver is a stand-in (no
GPU here): a fake driver tree on the host (``libcuda.so.V`` + its soname link, ``libnvidia-
ml.so.V``, a versioned-only ``libnvidia-gpucomp.so.V``, an ``nvidia-smi`` stub printing V,
a /proc/driver/nvidia/version-like file the fixer reads through
``GPUDOCTOR_NVIDIA_VERSION_FILE``) whose version changes between two "upgrades". The CT in
bind mode sees the new version after one restart; ``driver.libs_mode`` PASSes, then WARNs
for the versioned file the upgrade removed.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.pve.support import fix_in_process as fix
from tests.pve.test_fix_lab import ssh_args

pytestmark = pytest.mark.lab

V1, V2 = "580.95.05", "580.159.04"
KERNEL_LINE = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Release Build  (dvs-builder@U16-I3-C03-1)\n"


def install_driver(tree: Path, version: str) -> None:
    """Put driver ``version`` into the fake tree as an upgrade does: new versioned files,
    the soname links moved, the old version's files removed."""
    lib, bin_dir = tree / "lib", tree / "bin"
    lib.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for old in lib.iterdir():
        old.unlink()
    for name in ("libcuda", "libnvidia-ml", "libnvidia-gpucomp"):
        (lib / f"{name}.so.{version}").write_text(f"fake {name} {version}\n")
    for name, soname in (("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1")):
        (lib / soname).symlink_to(f"{name}.so.{version}")
    smi = bin_dir / "nvidia-smi.new"
    smi.write_text(f"#!/bin/sh\necho 'Driver Version: {version}'\n")
    smi.chmod(0o755)
    smi.replace(bin_dir / "nvidia-smi")
    (tree / "version").write_text(KERNEL_LINE.format(v=version))


def libs_mode(sshd, name: str, env: dict[str, str]) -> list[dict]:
    """Return driver.libs_mode's findings (as JSON dicts) for the CT, run on its host over
    the real sshd, the way `check --host H --ct NAME --flavor lxc` runs it."""
    from dataclasses import replace

    from checks.driver import libs_mode as spec
    from gpudoctor.context import CheckOptions
    from gpudoctor.registry import validate
    from gpudoctor.runner import run_checks

    with sshd.host() as host:
        options = CheckOptions(ct=name, flavor="lxc", only=("driver.libs_mode",))
        alone = validate([replace(spec, after=())])  # the CT's own probe is not needed here
        report = run_checks(host, options, ct_host=host, specs=alone)
    return [{"status": f.status.value, "message": f.message} for f in report.findings]


def inside(ct, path: str) -> str:
    done = ct.attach(["/bin/sh", "-c", path])
    return (done.stdout + done.stderr).strip()


def test_bind_mode_follows_a_host_driver_upgrade_after_one_restart(
    lab, lab_sshd, lab_container, tmp_path
) -> None:
    tree = lab.root / f"driver-{tmp_path.name}"
    install_driver(tree, V1)
    mount_point = Path("/usr/lib/gpudoctor-driver")  # the CT's /usr is this machine's (ro)
    made_dir = not mount_point.exists()
    mount_point.mkdir(exist_ok=True)
    ct = lab_container(
        devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)},
        allow=[f"c {lab.fake_gpu_major}:* rwm"],
        extra_config=["lxc.mount.entry = tmpfs usr/lib/gpudoctor-driver tmpfs rw,mode=755 0 0"],
    )
    env = {
        "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "host-backups"),
        "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "client-backups"),
        "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks"),
        "GPUDOCTOR_NVIDIA_VERSION_FILE": str(tree / "version"),
        "GPUDOCTOR_DRIVER_LIB_DIRS": str(tree / "lib"),
        "GPUDOCTOR_DRIVER_BIN_DIRS": str(tree / "bin"),
    }
    target = [*ssh_args(lab_sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath]
    try:
        planned = fix([*target, "--device", FAKE_GPU_INSIDE, "--driver-libs", "bind",
                       "--dry-run", "--json"], env)  # fmt: skip
        assert planned.exit_code == 4, planned.output
        diff = json.loads(planned.stdout)["diff"]
        lib = tree / "lib"
        assert (
            f"+lxc.mount.entry = {lib}/libcuda.so.1 usr/lib/gpudoctor-driver/libcuda.so.1" in diff
        )
        assert f"{lib}/libnvidia-gpucomp.so.{V1} usr/lib/gpudoctor-driver/libnvidia-gpucomp" in diff
        assert f"{tree}/bin/nvidia-smi" in diff and "bind,ro,optional" in diff
        done = fix([*target, "--device", FAKE_GPU_INSIDE, "--driver-libs", "bind", "--yes",
                    "--json"], env)  # fmt: skip
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["status"] == "applied"
        assert inside(ct, "cat /usr/lib/gpudoctor-driver/libcuda.so.1") == f"fake libcuda {V1}"
        assert inside(ct, f"{tree}/bin/nvidia-smi") == f"Driver Version: {V1}"
        (finding,) = libs_mode(lab_sshd, ct.name, env)
        assert finding["status"] == "PASS" and "bind mode" in finding["message"], finding

        install_driver(tree, V2)  # the host driver upgrade
        began = time.monotonic()
        ct.restart()
        seen = inside(ct, "cat /usr/lib/gpudoctor-driver/libcuda.so.1")
        usable_s = time.monotonic() - began
        assert seen == f"fake libcuda {V2}"
        assert (
            inside(ct, "cat /usr/lib/gpudoctor-driver/libnvidia-ml.so.1")
            == f"fake libnvidia-ml {V2}"
        )
        assert inside(ct, f"{tree}/bin/nvidia-smi") == f"Driver Version: {V2}"
        print(f"driver upgrade -> CT sees {V2}: {usable_s:.2f} s (one restart)")
        (finding,) = libs_mode(lab_sshd, ct.name, env)
        assert finding["status"] == "WARN", finding
        assert f"libnvidia-gpucomp.so.{V1}" in finding["message"]
        again = fix([*target, "--device", FAKE_GPU_INSIDE, "--driver-libs", "bind", "--dry-run",
                     "--json"], env)  # fmt: skip
        diff = json.loads(again.stdout)["diff"]
        assert f"-lxc.mount.entry = {lib}/libnvidia-gpucomp.so.{V1}" in diff
        assert f"+lxc.mount.entry = {lib}/libnvidia-gpucomp.so.{V2}" in diff
        assert f"+lxc.mount.entry = {lib}/libcuda.so.1" not in diff  # soname entry: unchanged
    finally:
        ct.stop(kill=True)
        if made_dir:
            mount_point.rmdir()
        shutil.rmtree(tree, ignore_errors=True)
