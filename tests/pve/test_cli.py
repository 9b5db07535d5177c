"""``gpudoctor fix`` command line: usage errors, exit codes, and a local run on a
Proxmox-like tree (LocalHost; the CT is not running, so nothing is restarted)."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

from gpudoctor.cli import cli
from tests.fakes.pvetree import PveTree
from tests.pve.support import stopped_pct

CONF = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"


def invoke(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["fix", *args], env=env or {})


def test_help_teaches() -> None:
    result = invoke(["--help"])
    assert result.exit_code == 0
    for words in ("--dry-run", "--mode", "devn", "nothing to change", "Exit codes:", "--host-prep"):
        assert words in result.output


def test_usage_errors_exit_2() -> None:
    assert invoke([]).exit_code == 2
    assert invoke(["--ct", "200", "--device", "dev/nvidia0"]).exit_code == 2
    api_only = invoke(["--ct", "200", "--api", "https://pve1:8006", "--api-token", "a@pam!t=s"])
    assert api_only.exit_code == 2
    assert "cannot be written through the Proxmox API" in api_only.output


def test_not_a_proxmox_host_is_a_one_line_error(tmp_path) -> None:
    result = invoke(["--ct", "200"], {"GPUDOCTOR_PVE_ROOT": str(tmp_path / "none")})
    assert result.exit_code == 1
    assert "not a Proxmox VE host" in result.output and "Traceback" not in result.output


def test_local_run_on_a_stopped_ct_writes_and_says_so(tmp_path) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    env = tree.env(GPUDOCTOR_PCT="/bin/false", GPUDOCTOR_LXCPATH=str(tmp_path / "lxc"))
    dry = invoke(["--ct", "200", "--device", "/dev/fakegpu", "--dry-run"], env)
    assert dry.exit_code == 4, dry.output  # changes pending
    assert "+lxc.cgroup2.devices.allow: c 1:3 rwm" in dry.output
    assert conf.read_text() == CONF
    # no --yes and no terminal: nothing is applied
    asked = invoke(["--ct", "200", "--device", "/dev/fakegpu"], env)
    assert asked.exit_code == 4 and conf.read_text() == CONF
    assert "pass --yes" in asked.output
    # /bin/false as pct: `pct status` fails -> a clear error, config untouched
    broken = invoke(["--ct", "200", "--device", "/dev/fakegpu", "--yes"], env)
    assert broken.exit_code == 1 and "pct status 200 failed" in broken.output
    assert conf.read_text() == CONF


def test_json_outcome_for_nothing_to_change(tmp_path) -> None:
    tree = PveTree(tmp_path)
    tree.add_ct("200", CONF + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))  # a running CT's state is looked at
    result = invoke(["--ct", "200", "--device", "/dev/fakegpu", "--json"], env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "nothing_to_change" and out["diff"] == "" and out["changed"] is False
    assert "is stopped" in out["message"] and out["restart_reasons"] == []


def test_gpudoctor_help_stays_lazy() -> None:
    code = "import sys, gpudoctor.cli; print('gpudoctor.pve' in str(list(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_worse_means_opened_before_and_not_after() -> None:
    from gpudoctor.pve.fixer import worse

    before = (("/dev/a", "OK"), ("/dev/b", "EPERM"), ("/dev/c", "OK"))
    assert worse(before, (("/dev/a", "OK"), ("/dev/b", "OK"), ("/dev/c", "OK"))) == []
    assert worse(before, (("/dev/a", "EPERM"), ("/dev/b", "EPERM"))) == ["/dev/a", "/dev/c"]


def test_exit_codes_through_the_real_entry_point(tmp_path) -> None:
    import os

    env = {**os.environ, "GPUDOCTOR_PVE_ROOT": str(tmp_path / "none")}
    base = [sys.executable, "-m", "gpudoctor", "fix"]
    usage = subprocess.run([*base], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "--ct is required" in usage.stderr
    error = subprocess.run([*base, "--ct", "200"], capture_output=True, text=True, env=env)
    assert error.returncode == 1 and "not a Proxmox VE host" in error.stderr
    assert "Traceback" not in error.stderr
    tree = PveTree(tmp_path)
    tree.add_ct("200", "lock: backup\n" + CONF)
    locked = subprocess.run([*base, "--ct", "200", "--yes"], capture_output=True, text=True,
                            env={**os.environ, **tree.env()})  # fmt: skip
    assert locked.returncode == 3 and "locked (backup)" in locked.stdout + locked.stderr
