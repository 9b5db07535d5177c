"""``fix`` on Proxmox VE >= 8.1 (the pveversion stand-in): devN entries by default, the boot
unit that creates /dev/nvidia-uvm offered in the same plan when devN entries need it, and
the API-token caveat. Real files and real ``systemctl --root`` on a scratch tree; the CT is
stopped (a ``pct`` stand-in that says so), so nothing is restarted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.api import ApiSettings
from gpudoctor.pve.fixer import FixOptions, make_plan
from gpudoctor.pve.planner import PlanOptions
from gpudoctor.pve.uvm_unit import UNIT_NAME
from tests.fakes.pvetree import PveTree
from tests.pve.support import fix, stopped_pct

CONF = "arch: amd64\nhostname: ct\ndev0: /dev/nvidia-uvm,gid=0,mode=0666\n"


@pytest.fixture
def sysroot(tmp_path: Path) -> Path:
    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    root = tmp_path / "sysroot"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    return root


def test_devn_plan_offers_the_boot_unit_and_applies_it_with_the_fix(tmp_path, sysroot) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    env = tree.env(GPUDOCTOR_PVEVERSION=tree.pveversion("8.2.4"),
                   GPUDOCTOR_SYSTEMD_ROOT=str(sysroot), GPUDOCTOR_PCT=stopped_pct(tmp_path))  # fmt: skip
    args = ["--ct", "200", "--device", "/dev/null"]
    dry = fix([*args, "--dry-run"], env)
    assert dry.returncode == 4, dry.stdout + dry.stderr
    assert "+dev1: /dev/null,gid=0,mode=0666" in dry.stdout
    assert "+Before=pve-guests.service lxc.service" in dry.stdout  # the unit, same plan
    unit = sysroot / "etc/systemd/system" / UNIT_NAME
    assert not unit.exists() and conf.read_text() == CONF

    done = fix([*args, "--yes"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        unit.exists()
        and (sysroot / "etc/systemd/system/multi-user.target.wants" / UNIT_NAME).is_symlink()
    )
    assert "dev1: /dev/null,gid=0,mode=0666" in conf.read_text()
    again = fix([*args, "--dry-run"], env)
    assert again.returncode == 0 and "nothing to change" in again.stdout


def test_old_proxmox_gets_rules_and_no_boot_unit(tmp_path, sysroot) -> None:
    tree = PveTree(tmp_path)
    tree.add_ct("200", "arch: amd64\nhostname: ct\n")
    env = tree.env(
        GPUDOCTOR_PVEVERSION=tree.pveversion("8.0.4"), GPUDOCTOR_SYSTEMD_ROOT=str(sysroot)
    )
    dry = fix(["--ct", "200", "--device", "/dev/null", "--dry-run"], env)
    assert dry.returncode == 4, dry.stdout + dry.stderr
    assert "+lxc.cgroup2.devices.allow: c 1:3 rwm" in dry.stdout
    assert "dev0:" not in dry.stdout and UNIT_NAME not in dry.stdout


def test_an_api_token_gets_the_root_pam_caveat_for_devn(tmp_path) -> None:
    tree = PveTree(tmp_path)
    tree.add_ct("200", "arch: amd64\nhostname: ct\n")
    layout = tree.layout(pveversion=tree.pveversion("8.2.4"))
    plan_options = PlanOptions(devices=("/dev/null",), include_host_nvidia=False)
    token = ApiSettings("https://127.0.0.1:8006", token="gpudoctor@pve!fix=secret")
    for api, expected in ((token, True), (None, False)):
        options = FixOptions(ct="200", plan=plan_options, layout=layout, api=api)
        _, _, the_plan = make_plan(LocalHost(), options)
        assert the_plan.mode == "devn"
        assert any("only root@pam" in w for w in the_plan.warnings) is expected
