"""``--host-prep``: the systemd oneshot, written and enabled with real systemctl on a
scratch root (``systemctl --root=DIR enable``), with backup and idempotence."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.uvm_unit import UNIT_NAME, run_host_prep
from tests.fakes.pvetree import PveTree

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    (tmp_path / "sysroot" / "etc" / "systemd" / "system").mkdir(parents=True)
    return tmp_path / "sysroot"


def test_host_prep_installs_enables_and_then_has_nothing_to_do(root: Path, tmp_path: Path) -> None:
    layout = PveTree(tmp_path).layout()
    host = LocalHost()
    dry = run_host_prep(host, dry_run=True, layout=layout, root=str(root))
    assert dry.status == "dry_run" and "+Before=pve-guests.service lxc.service" in dry.plan.diff
    assert not (root / "etc/systemd/system" / UNIT_NAME).exists()

    done = run_host_prep(host, yes=True, layout=layout, root=str(root))
    assert done.status == "applied", done.message
    unit = root / "etc/systemd/system" / UNIT_NAME
    text = unit.read_text()
    assert "ExecStart=" in text and text.split("ExecStart=")[1].startswith(("/", "nvidia"))
    assert "-u -c=0\n" in text and "Type=oneshot\n" in text
    link = root / "etc/systemd/system/multi-user.target.wants" / UNIT_NAME
    assert link.is_symlink()  # made by the real systemctl enable
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                            capture_output=True, text=True)  # fmt: skip
    assert "Unknown key" not in verify.stderr and "Invalid" not in verify.stderr, verify.stderr

    stamp = unit.stat().st_mtime_ns
    again = run_host_prep(host, yes=True, layout=layout, root=str(root))
    assert again.status == "nothing_to_change"
    assert unit.stat().st_mtime_ns == stamp


def test_host_prep_backs_up_a_different_existing_unit(root: Path, tmp_path: Path) -> None:
    tree = PveTree(tmp_path)
    unit = root / "etc/systemd/system" / UNIT_NAME
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    done = run_host_prep(LocalHost(), yes=True, layout=tree.layout(), root=str(root))
    assert done.status == "applied"
    assert Path(done.backup).read_text() == "[Service]\nExecStart=/bin/true\n"
    assert "-ExecStart=/bin/true" in done.plan.diff


def test_host_prep_declined_writes_nothing(root: Path, tmp_path: Path) -> None:
    outcome = run_host_prep(LocalHost(), confirm=lambda plan: False,
                            layout=PveTree(tmp_path).layout(), root=str(root))  # fmt: skip
    assert outcome.status == "declined"
    assert not (root / "etc/systemd/system" / UNIT_NAME).exists()


def test_a_node_missing_at_the_cts_start_proposes_host_prep_until_it_is_installed(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32 item 2: when the CT's state shows /dev/nvidia-uvm was missing when it
    started, the plan names the host cause and ``--host-prep``; once the boot unit is
    installed (the real ``systemctl --root``), it no longer does. A stand-in node (not
    made late by the host) never does."""
    from gpudoctor.pve.ctstate import host_cause

    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", str(root))
    layout = PveTree(tmp_path).layout()
    late = ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1"]
    cause = host_cause(LocalHost(), layout, late, "root@pve1")
    assert cause == (
        "the cause is on the host: /dev/nvidia-uvm, /dev/nvidia-caps/nvidia-cap1 did not exist "
        "there when the CT started (nvidia-uvm loads on the first CUDA use, after CTs "
        "autostart); the durable cure is the boot unit that makes them before guests start: "
        "gpudoctor fix --host root@pve1 --host-prep"
    )
    assert host_cause(LocalHost(), layout, ["/dev/fakegpu"], "root@pve1") == ""
    run_host_prep(LocalHost(), yes=True, layout=layout, root=str(root))
    assert host_cause(LocalHost(), layout, ["/dev/nvidia-uvm"], "root@pve1") == ""


def test_host_prep_installs_the_follow_driver_triggers_and_never_drops_a_watch(
    root: Path, tmp_path: Path
) -> None:
    """Issue 32 item 6: with the boot unit come the follow-driver service, its path unit
    (enabled by the real ``systemctl --root``; NVIDIA's moving nodes and ``--device``
    watched) and the udev rule; ``systemd-analyze verify`` accepts the units; a later
    ``--host-prep`` without ``--device`` keeps the watched path (nothing to change)."""
    from gpudoctor.pve import follow_units

    layout = PveTree(tmp_path).layout()
    done = run_host_prep(LocalHost(), yes=True, layout=layout, root=str(root),
                         watch=("/dev/fakeuvm",))  # fmt: skip
    assert done.status == "applied", done.message
    units = root / "etc/systemd/system"
    service = (units / follow_units.SERVICE).read_text()
    assert "Type=oneshot\n" in service
    assert "-m gpudoctor fix --follow-driver --if-host-changed --yes $GPUDOCTOR_FOLLOW_ARGS\n" in (
        service
    )
    path_unit = (units / follow_units.PATH_UNIT).read_text()
    for watched in ("/dev/nvidia-uvm", "/dev/nvidia-caps", "/dev/fakeuvm"):
        assert f"PathChanged={watched}\n" in path_unit
    assert (units / "multi-user.target.wants" / follow_units.PATH_UNIT).is_symlink()
    rule = (root / follow_units.UDEV_RULE).read_text()
    assert 'SUBSYSTEM=="module", KERNEL=="nvidia|nvidia_uvm|nvidia_modeset"' in rule
    assert f"--no-block start {follow_units.SERVICE}" in rule
    verify = subprocess.run(["systemd-analyze", "verify", "--man=no",
                             str(units / follow_units.PATH_UNIT), str(units / follow_units.SERVICE)],
                            capture_output=True, text=True)  # fmt: skip
    assert "Unknown key" not in verify.stderr and "Invalid" not in verify.stderr, verify.stderr
    assert "Unknown section" not in verify.stderr, verify.stderr

    again = run_host_prep(LocalHost(), yes=True, layout=layout, root=str(root))
    assert again.status == "nothing_to_change", again.plan.diff
    assert "PathChanged=/dev/fakeuvm\n" in (units / follow_units.PATH_UNIT).read_text()


def test_no_follow_unit_runs_files_another_user_can_change(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follow unit would run gpudoctor as root at every trigger: when the interpreter
    it would run belongs to another user (or sits in a directory others can write), only
    the boot unit is planned, with a warning naming the file; a root-owned one is fine."""
    import os

    from gpudoctor.pve import follow_units, uvm_unit

    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    os.chown(python, 65534, 65534)
    monkeypatch.setattr(uvm_unit, "gpudoctor_command",
                        lambda host: (f"{python} -I -m gpudoctor", (str(python),)))  # fmt: skip
    layout = PveTree(tmp_path).layout()
    prep = uvm_unit.plan_host_prep(LocalHost(), str(root), layout)
    assert [f.path.rsplit("/", 1)[1] for f in prep.files] == [UNIT_NAME]
    [warning] = [w for w in prep.plan.warnings if "follows a driver reload" in w]
    assert f"{python} (uid 65534, mode 0755)" in warning
    os.chown(python, 0, 0)
    python.parent.chmod(0o777)  # root's file in a directory anyone can write: refused too
    prep = uvm_unit.plan_host_prep(LocalHost(), str(root), layout)
    assert [f.path.rsplit("/", 1)[1] for f in prep.files] == [UNIT_NAME]
    python.parent.chmod(0o755)
    prep = uvm_unit.plan_host_prep(LocalHost(), str(root), layout)
    assert follow_units.SERVICE in [f.path.rsplit("/", 1)[1] for f in prep.files]


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of nobody's needs root's chown")
def test_a_pth_file_nobody_owns_keeps_the_follow_unit_out(
    root: Path, public_tmp_path: Path
) -> None:
    """Issue 46.9: gpudoctor installed in a venv whose site-packages holds a ``.pth`` file
    nobody owns (it runs at every start of that interpreter, ``-I`` or not). On the code
    before, only the interpreter and the package directory were judged: the follow unit was
    installed, and its ExecStart ran nobody's code as root at every trigger. Now the real
    ``fix --host-prep`` warns, naming the file, and installs the boot unit only."""
    venv = public_tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = next(
        p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "click").is_dir()
    )
    (site / "gpudoctor-src.pth").write_text(f"{REPO}\n{deps}\n")  # root's: the code and its deps
    evil = site / "zz-nobody.pth"
    evil.write_text("import os  # nobody's: any line starting with import runs\n")
    os.chown(evil, 65534, 65534)
    tree = PveTree(public_tmp_path / "tree")
    env = {**os.environ, **tree.env(), "GPUDOCTOR_SYSTEMD_ROOT": str(root)}
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "gpudoctor", "fix", "--host-prep", "--yes"],
                          capture_output=True, text=True, env=env, timeout=180)  # fmt: skip
    assert done.returncode in (0, 4), done.stdout + done.stderr
    shown = done.stdout + done.stderr
    assert f"{evil} (uid 65534, mode 0644) can be changed by a user other than root" in shown
    units = root / "etc" / "systemd" / "system"
    assert (units / UNIT_NAME).is_file() and not (
        units / "gpudoctor-follow-driver.service"
    ).exists()
