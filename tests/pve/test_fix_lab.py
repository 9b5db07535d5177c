"""``gpudoctor fix`` end to end against REAL systems: real LXC containers on pure cgroup v2
(eBPF device policy), reached through a real OpenSSH server on 127.0.0.1.

Plain LXC flavor: nothing is faked but the GPU (a misc char node bind-mounted as
/dev/fakegpu). Proxmox flavor: the same, with /etc/pve laid out in a temp dir and the
pct stand-in (tests/fakes/pct.py) in place of Proxmox's pct.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.cli import cli
from gpudoctor.pve.apply import ApplyError, Layout
from gpudoctor.pve.fixer import FixOptions, run_fix
from gpudoctor.pve.planner import PlanOptions
from tests.lab.pvelab import PveCt, make_pve_ct, unique_vmid

pytestmark = pytest.mark.lab


def ssh_args(sshd, known_hosts: str | None = None) -> list[str]:
    return [
        "--host",
        sshd.spec,
        "-i",
        str(sshd.client_key),
        "--known-hosts",
        known_hosts or str(sshd.known_hosts),
    ]


def gpudoctor(args: list[str], env: dict[str, str]):
    result = CliRunner().invoke(cli, ["fix", *args], env=env, catch_exceptions=False)
    return result


def fix_lxc_yes(sshd, ct, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """Return the environment (backups and locks under ``tmp_path``) and the arguments of
    ``fix --yes --json`` passing /dev/fakegpu into the plain LXC container ``ct``."""
    env = {
        "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "host-backups"),
        "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "client-backups"),
        "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks"),
    }
    args = [*ssh_args(sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
            "--device", "/dev/fakegpu", "--yes", "--json"]  # fmt: skip
    return env, args


def mtime_ns(path: Path | str) -> int:
    return os.stat(path).st_mtime_ns


def opened_inside(container, path: str = "/dev/fakegpu") -> str:
    """Return 'OK' or the error text of open(path, O_RDWR) inside a plain LXC container."""
    result = container.attach(
        ["python3", "-I", "-c", f"import os; os.close(os.open({path!r}, os.O_RDWR))"]
    )
    return "OK" if result.ok else result.stderr.strip().splitlines()[-1]


# --- plain LXC -----------------------------------------------------------------------------


def test_lxc_flavor_fix_over_ssh_then_second_run_touches_nothing(
    lab, lab_sshd, denied_container, tmp_path
) -> None:
    ct = denied_container
    assert "Operation not permitted" in opened_inside(ct)
    old_config = ct.config_path.read_bytes()
    old_pid = ct.init_pid()
    env, args = fix_lxc_yes(lab_sshd, ct, tmp_path)
    result = gpudoctor(args, env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied", out
    rule = f"lxc.cgroup2.devices.allow = c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"
    lines = ct.config_path.read_text().splitlines()
    assert lines.count(rule) == 1
    assert lines[lines.index(rule) - 1] == "lxc.cgroup2.devices.allow = c 136:* rwm"
    assert Path(out["backup"]["host"]).read_bytes() == old_config
    assert Path(out["backup"]["client"]).read_bytes() == old_config
    new_pid = ct.init_pid()
    assert new_pid is not None and new_pid != old_pid
    assert out["init_pid"] == {"before": old_pid, "after": new_pid}
    basic = {"/dev/null": "OK", "/dev/zero": "OK", "/dev/urandom": "OK", "/dev/tty": "ENXIO"}
    assert out["probes"]["before"] == {"/dev/fakegpu": "EPERM", **basic}
    assert out["probes"]["after"] == {"/dev/fakegpu": "OK", **basic}  # nothing lost
    assert opened_inside(ct) == "OK"
    assert os.listdir(tmp_path / "locks") == []  # the config lock went with the write (34.8)
    # the catalogue's device checks ran INSIDE the CT (agent over stdin, nothing installed)
    opens = [c for c in out["checks"] if c["check"] == "device.open"]
    assert opens and opens[0]["status"] == "PASS" and opens[0]["subject"] == "/dev/fakegpu"

    stamp, backups = mtime_ns(ct.config_path), sorted((tmp_path / "host-backups").rglob("*.conf"))
    again = gpudoctor(args, env)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["status"] == "nothing_to_change"
    assert mtime_ns(ct.config_path) == stamp
    assert ct.init_pid() == new_pid
    assert sorted((tmp_path / "host-backups").rglob("*.conf")) == backups


def test_dry_run_shows_the_diff_and_changes_nothing(lab, lab_sshd, denied_container) -> None:
    ct = denied_container
    before, pid = ct.config_path.read_bytes(), ct.init_pid()
    args = [*ssh_args(lab_sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
            "--device", "/dev/fakegpu", "--dry-run"]  # fmt: skip
    result = gpudoctor(args, {})
    assert result.exit_code == 4, result.output  # changes pending, nothing written
    assert (
        f"+lxc.cgroup2.devices.allow = c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"
        in result.stdout
    )
    assert "dry run" in result.stdout
    assert ct.config_path.read_bytes() == before and ct.init_pid() == pid


def test_a_ct_of_an_old_guide_is_cured_and_its_legacy_keys_commented_out(
    lab, lab_sshd, lab_container, tmp_path
) -> None:
    """Issue 45.7: a CT configured with `lxc.cgroup.devices.allow` (cgroup v1) only: its
    node fails with EPERM on cgroup v2 (as on the H200); fix adds the cgroup2 rule and
    cured it, but left the legacy line check calls "rejected by PVE 9". It is commented
    out, with its reason, in the same write; a second run has nothing to change."""
    legacy = f"lxc.cgroup.devices.allow = c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"
    ct = lab_container(devices={"/dev/fakegpu": str(lab.fake_gpu)}, extra_config=[legacy])
    assert "Operation not permitted" in opened_inside(ct)
    env, args = fix_lxc_yes(lab_sshd, ct, tmp_path)
    result = gpudoctor(args, env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied", out
    lines = ct.config_path.read_text().splitlines()
    assert "#" + legacy in lines and legacy not in lines
    [comment] = [e for e in out["edits"] if e["action"] == "comment"]
    assert comment["line"] == legacy and "rejected by PVE 9" in comment["reason"]
    assert opened_inside(ct) == "OK"
    again = gpudoctor(args, env)
    assert again.exit_code == 0 and json.loads(again.stdout)["status"] == "nothing_to_change"


def test_unknown_host_key_is_refused_and_nothing_changes(
    lab_sshd, denied_container, tmp_path
) -> None:
    ct = denied_container
    before = ct.config_path.read_bytes()
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    args = [*ssh_args(lab_sshd, str(empty)), "--ct", ct.name, "--flavor", "lxc",
            "--lxcpath", ct.lxcpath, "--yes"]  # fmt: skip
    result = CliRunner().invoke(cli, ["fix", *args], env={"HOME": str(tmp_path)})
    assert result.exit_code == 1, result.output
    assert "unknown SSH host key" in result.output
    assert "Traceback" not in result.output
    assert ct.config_path.read_bytes() == before
    assert empty.read_text() == ""  # never silently trusted


# --- Proxmox flavor (pct stand-in) ---------------------------------------------------------


@pytest.fixture
def pve_ct(lab, lab_container, tmp_path) -> PveCt:
    container = lab_container(name=unique_vmid(), start=False)
    return make_pve_ct(lab, container, tmp_path)


def test_pve_flavor_fix_over_ssh_then_second_run_touches_nothing(lab, lab_sshd, pve_ct) -> None:
    ct = pve_ct
    assert not ct.open_inside().ok
    old = ct.conf.read_text()
    old_pid = ct.container.init_pid()
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", "/dev/fakegpu", "--yes", "--json"]
    result = gpudoctor(args, ct.env())
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied" and out["node"] == "pve1", out
    rule = f"lxc.cgroup2.devices.allow: c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"
    new = ct.conf.read_text()
    mount_line = f"lxc.mount.entry: {lab.fake_gpu} dev/fakegpu none bind,optional,create=file"
    assert new == old.replace(mount_line + "\n", mount_line + "\n" + rule + "\n")
    assert new.endswith(old[old.index("\n[before_gpu]") :])  # the snapshot is untouched
    assert ct.tree.backups() and ct.tree.backups()[0].read_text() == old
    assert Path(out["backup"]["client"]).read_text() == old
    assert ct.container.init_pid() not in (None, old_pid)
    assert ct.open_inside().ok
    assert not list(ct.conf.parent.glob("*.tmp.*"))

    stamp, pid, backups = mtime_ns(ct.conf), ct.container.init_pid(), ct.tree.backups()
    again = gpudoctor(args, ct.env())
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["status"] == "nothing_to_change"
    assert mtime_ns(ct.conf) == stamp and ct.container.init_pid() == pid
    assert ct.tree.backups() == backups


def test_pve_locked_ct_is_refused(lab_sshd, lab, lab_container, tmp_path) -> None:
    container = lab_container(name=unique_vmid(), start=False)
    ct = make_pve_ct(lab, container, tmp_path)
    text = ct.conf.read_text().replace("arch: amd64\n", "arch: amd64\nlock: backup\n", 1)
    ct.conf.write_text(text)
    pid = ct.container.init_pid()
    result = gpudoctor([*ssh_args(lab_sshd), "--ct", ct.vmid, "--yes"], ct.env())
    assert result.exit_code == 3, result.output
    assert "locked (backup)" in result.output
    assert ct.conf.read_text() == text and ct.tree.backups() == []
    assert ct.container.init_pid() == pid


def test_pve_config_changed_between_plan_and_write_is_aborted(lab_sshd, pve_ct) -> None:
    ct = pve_ct
    edited = ct.conf.read_text().replace("memory: 2048\n", "memory: 4096\n", 1)
    pid = ct.container.init_pid()

    def someone_edits_meanwhile(plan) -> bool:
        assert plan.changed
        ct.conf.write_text(edited)
        return True

    layout = Layout(**{**Layout.from_env(ct.env()).__dict__})
    options = FixOptions(ct=ct.vmid, flavor="pve", layout=layout,
                         plan=PlanOptions(devices=("/dev/fakegpu",), include_host_nvidia=False))  # fmt: skip
    with lab_sshd.host() as host, pytest.raises(ApplyError, match="changed since the plan"):
        run_fix(host, options, confirm=someone_edits_meanwhile)
    assert ct.conf.read_text() == edited
    assert ct.tree.backups() == []
    # no client copy is left: the backup directory the user named may stay, empty
    kept = ct.tree.client_backup_dir
    assert not kept.exists() or list(kept.iterdir()) == []
    assert ct.container.init_pid() == pid


def test_pve_ct_that_does_not_start_after_the_fix_is_rolled_back(lab, lab_sshd, pve_ct) -> None:
    ct = pve_ct
    old = ct.conf.read_bytes()
    pid = ct.container.init_pid()

    def approve_and_break_next_start(plan) -> bool:
        (ct.container.dir / "fail-next-start").write_text("1")
        return True

    options = FixOptions(ct=ct.vmid, flavor="pve", layout=Layout.from_env(ct.env()),
                         plan=PlanOptions(devices=("/dev/fakegpu",), include_host_nvidia=False))  # fmt: skip
    with lab_sshd.host() as host:
        outcome = run_fix(host, options, confirm=approve_and_break_next_start)
    assert outcome.status == "rolled_back" and outcome.exit_code == 3, outcome.message
    assert "hookscript error" in outcome.message
    assert ct.conf.read_bytes() == old  # the same CAS put the old bytes back
    assert ct.tree.backups()[0].read_bytes() == old
    assert ct.container.state() == "RUNNING"
    assert ct.container.init_pid() not in (None, pid)  # started again, on the old config
    assert not ct.open_inside().ok


def test_ct_device_rules_over_ssh_catches_the_drift_then_passes_after_fix(
    lab, lab_sshd, pve_ct, monkeypatch
) -> None:
    from gpudoctor.checks.ct import device_rules

    from gpudoctor.context import CheckOptions, DeviceRequest
    from gpudoctor.model import Status
    from gpudoctor.registry import validate
    from gpudoctor.runner import run_checks

    ct = pve_ct
    for key, value in ct.env().items():
        monkeypatch.setenv(key, value)
    options = CheckOptions(ct=ct.vmid, flavor="pve", devices=(DeviceRequest("/dev/fakegpu"),))

    def statuses() -> list[Status]:
        with lab_sshd.host() as host:
            report = run_checks(host, options, ct_host=host, specs=validate([device_rules]))
        return [f.status for f in report.findings]

    assert statuses() == [Status.FAIL]
    result = gpudoctor(
        [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", "/dev/fakegpu", "--yes"], ct.env()
    )
    assert result.exit_code == 0, result.output
    assert statuses() == [Status.PASS]


def test_pve_devn_mode_through_the_stand_in(lab, lab_sshd, pve_ct, dev_node) -> None:
    ct = pve_ct
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--mode", "devn", "--device", dev_node,
            "--yes", "--json"]  # fmt: skip
    result = gpudoctor(args, ct.env())
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied", out
    assert f"dev0: {dev_node},gid=0,mode=0666" in ct.conf.read_text().split("\n[")[0]
    assert any("version unknown" in w for w in out["warnings"])
    assert out["probes"]["before"][dev_node] == "ENOENT"  # devN creates the node itself
    assert out["probes"]["after"][dev_node] == "OK"
    # the devN rule (c 10:232) also covers the old bind mount of the same major:minor
    assert out["probes"]["after"]["/dev/fakegpu"] == "OK"
    assert ct.open_inside(dev_node).ok
    again = gpudoctor(args, ct.env())
    assert json.loads(again.stdout)["status"] == "nothing_to_change"


@pytest.mark.parametrize(("version", "mode"), [("8.2.4", "devn"), ("8.0.4", "rules")])
def test_pve_default_mode_follows_pveversion(
    lab, lab_sshd, pve_ct, dev_node, version, mode
) -> None:
    """No --mode: devN entries on Proxmox VE >= 8.1 (read with the pveversion stand-in on
    the SSH host), rules before; either way the CT restarts and opens the node."""
    ct = pve_ct
    env = {**ct.env(), "GPUDOCTOR_PVEVERSION": ct.tree.pveversion(version)}
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", dev_node, "--yes", "--json"]
    result = gpudoctor(args, env)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "applied" and out["mode"] == mode, out
    assert out["pve_version"] == version
    live = ct.conf.read_text().split("\n[")[0]
    if mode == "devn":
        assert f"dev0: {dev_node},gid=0,mode=0666" in live
        assert not any("version unknown" in w for w in out["warnings"])
    else:
        assert "dev0:" not in live and "lxc.cgroup2.devices.allow: c 10:232 rwm" in live
    assert ct.open_inside(dev_node).ok
    assert json.loads(gpudoctor(args, env).stdout)["status"] == "nothing_to_change"


@pytest.fixture
def pve_api(lab, pve_ct, tmp_path):
    from tests.fakes.pveapi import FakePveApi

    token = f"root@pam!gpudoctor=secret-{os.getpid()}"
    api = FakePveApi(pve_ct.tree.node, pve_ct.conf.parent,
                     lambda argv: lab.namespace.run(list(argv), 120), str(pve_ct.pct), token,
                     tmp_path, users={"root@pam": "lab-password"}).start()  # fmt: skip
    yield api, token
    api.stop()


def test_pve_fix_restarts_through_the_api_and_waits_for_the_task(lab_sshd, pve_ct, pve_api) -> None:
    ct, (api, token) = pve_ct, pve_api
    old_pid = ct.container.init_pid()
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", "/dev/fakegpu", "--api", api.url,
            "--api-ca", str(api.cert), "--yes", "--json"]  # fmt: skip
    result = gpudoctor(args, {**ct.env(), "GPUDOCTOR_API_TOKEN": token})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "applied"
    base = f"/api2/json/nodes/{ct.tree.node}/lxc/{ct.vmid}"
    assert ("GET", f"{base}/config") in api.requests  # digest == SHA-1 read over SSH
    assert ("POST", f"{base}/status/reboot") in api.requests
    polls = [p for m, p in api.requests if "/tasks/UPID:" in p and p.endswith("/status")]
    assert polls
    upid = polls[-1].split("/tasks/")[1].removesuffix("/status")
    finished = api.tasks[upid]
    assert finished is not None and finished.ok  # polled until the task stopped with OK
    assert ct.container.init_pid() not in (None, old_pid)
    assert ct.open_inside().ok


def test_api_with_a_wrong_token_is_a_clear_error_and_nothing_is_written(
    lab_sshd, pve_ct, pve_api
) -> None:
    ct, (api, _) = pve_ct, pve_api
    before = ct.conf.read_bytes()
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", "/dev/fakegpu", "--api", api.url,
            "--api-ca", str(api.cert), "--api-token", "root@pam!gpudoctor=wrong", "--yes"]  # fmt: skip
    result = gpudoctor(args, ct.env())
    assert result.exit_code == 1, result.output
    assert "Proxmox API" in result.output and "401" in result.output
    assert "Traceback" not in result.output
    assert ct.conf.read_bytes() == before and ct.tree.backups() == []


def test_failed_api_task_is_detected_and_rolled_back_through_the_api(
    lab_sshd, pve_ct, pve_api
) -> None:
    from gpudoctor.pve.api import ApiSettings

    ct, (api, token) = pve_ct, pve_api
    old = ct.conf.read_bytes()

    def approve_and_break_next_start(plan) -> bool:
        (ct.container.dir / "fail-next-start").write_text("1")
        return True

    options = FixOptions(ct=ct.vmid, flavor="pve", layout=Layout.from_env(ct.env()),
                         api=ApiSettings(api.url, token, str(api.cert)),
                         plan=PlanOptions(devices=("/dev/fakegpu",), include_host_nvidia=False))  # fmt: skip
    with lab_sshd.host() as host:
        outcome = run_fix(host, options, confirm=approve_and_break_next_start)
    assert outcome.status == "rolled_back", outcome.message
    assert "reboot task UPID:" in outcome.message and "hookscript error" in outcome.message
    assert ct.conf.read_bytes() == old
    base = f"/api2/json/nodes/{ct.tree.node}/lxc/{ct.vmid}"
    assert ("POST", f"{base}/status/start") in api.requests  # the rollback's start
    assert ct.container.state() == "RUNNING"


def test_accept_new_host_key_opt_in_saves_the_key_and_fixes(lab_sshd, pve_ct, tmp_path) -> None:
    ct = pve_ct
    fresh = tmp_path / "fresh_known_hosts"
    fresh.write_text("")
    args = [*ssh_args(lab_sshd, str(fresh)), "--ct", ct.vmid, "--device", "/dev/fakegpu",
            "--accept-new-host-key", "--yes"]  # fmt: skip
    result = CliRunner().invoke(cli, ["fix", *args], env={**ct.env(), "HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert "127.0.0.1" in fresh.read_text()  # saved, so the next run needs no opt-in
    assert ct.open_inside().ok


def test_when_the_rollbacks_start_fails_the_error_says_the_old_config_is_back(
    lab_sshd, pve_ct
) -> None:
    ct = pve_ct
    old = ct.conf.read_bytes()

    def approve_and_break_two_starts(plan) -> bool:
        # 3: the reboot, the --debug start that asks why, the rollback's start
        (ct.container.dir / "fail-next-start").write_text("3")
        return True

    options = FixOptions(ct=ct.vmid, flavor="pve", layout=Layout.from_env(ct.env()),
                         plan=PlanOptions(devices=("/dev/fakegpu",), include_host_nvidia=False))  # fmt: skip
    with lab_sshd.host() as host, pytest.raises(ApplyError, match="old config is back") as info:
        run_fix(host, options, confirm=approve_and_break_two_starts)
    backup = ct.tree.backups()[0]
    assert str(backup) in str(info.value) and info.value.code == "rollback_failed"
    assert f"back in place in {ct.conf}" in str(info.value)
    assert "did not start on it either" in str(info.value)
    assert ct.conf.read_bytes() == old == backup.read_bytes()  # the old config is back
    assert ct.pct_run("start", ct.vmid).ok  # and starts, once the hook works again


def test_api_password_login_gets_a_ticket_and_restarts(lab_sshd, pve_ct, pve_api) -> None:
    ct, (api, _) = pve_ct, pve_api
    args = [*ssh_args(lab_sshd), "--ct", ct.vmid, "--device", "/dev/fakegpu", "--api", api.url,
            "--api-ca", str(api.cert), "--api-user", "root@pam", "--yes"]  # fmt: skip
    result = gpudoctor(args, {**ct.env(), "GPUDOCTOR_API_PASSWORD": "lab-password"})
    assert result.exit_code == 0, result.output
    assert ("POST", "/api2/json/access/ticket") in api.requests and api.tickets
    assert ("POST", f"/api2/json/nodes/{ct.tree.node}/lxc/{ct.vmid}/status/reboot") in api.requests
    assert ct.open_inside().ok


def test_no_restart_writes_but_leaves_the_running_ct_alone(
    lab, lab_sshd, denied_container, tmp_path
) -> None:
    ct = denied_container
    pid = ct.init_pid()
    env = {"GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "hb"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "cb"), "GPUDOCTOR_LOCK_DIR": str(tmp_path)}  # fmt: skip
    args = [*ssh_args(lab_sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
            "--device", "/dev/fakegpu", "--yes", "--no-restart"]  # fmt: skip
    result = gpudoctor(args, env)
    assert result.exit_code == 0, result.output
    assert "restart the CT for the new rules to take effect" in result.output
    assert f"c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm" in ct.config_path.read_text()
    assert ct.init_pid() == pid
    assert "Operation not permitted" in opened_inside(ct)  # old rules until the restart
    ct.restart()
    assert opened_inside(ct) == "OK"
