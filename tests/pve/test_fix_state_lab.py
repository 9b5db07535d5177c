"""``gpudoctor fix`` cures what the RUNNING CT has wrong even when its config is right, on
REAL LXC (pure cgroup v2) over a real sshd (issue 32):

* the autostart race: the CT started while its host node did not exist yet, so the
  ``bind,optional,create=file`` mount left an empty placeholder file; the config needs no
  change, the plan is a restart with its reason (``--dry-run``: exit 4), ``--yes`` cures it;
* an interrupted fix (``--no-restart``): run again, it restarts and re-checks;
* a config with no device rules (LXC allows everything) keeps its open policy; a config
  whose allow list would deny /dev/null after the change is rolled back by the re-check.

The stand-in GPU node is the lab's misc char node (10:232), made with mknod.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pve.test_fix_lab import gpudoctor, opened_inside, ssh_args

pytestmark = pytest.mark.lab

RACE_INSIDE = "/dev/racegpu"


def env_for(tmp_path: Path) -> dict[str, str]:
    return {
        "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "host-backups"),
        "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "client-backups"),
        "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks"),
    }


def fix_args(sshd, ct, device: str, *more: str) -> list[str]:
    return [*ssh_args(sshd), "--ct", ct.name, "--flavor", "lxc", "--lxcpath", ct.lxcpath,
            "--device", device, "--json", *more]  # fmt: skip


def device_findings(sshd, ct, device: str) -> list:
    """Return the catalogue's device findings run INSIDE the CT over the real sshd (what
    ``gpudoctor check --host H --ct NAME --flavor lxc --device DEVICE`` reports)."""
    from gpudoctor.context import CheckOptions, DeviceRequest
    from gpudoctor.hosts.container import ContainerHost
    from gpudoctor.runner import run_checks

    options = CheckOptions(devices=(DeviceRequest.parse(device),), only=("device",),
                           ct=ct.name, flavor="lxc", lxcpath=ct.lxcpath)  # fmt: skip
    with sshd.host() as host:
        inside = ContainerHost(host, ct.name, "lxc", ct.lxcpath)
        try:
            return list(run_checks(inside, options).findings)
        finally:
            inside.close()


def kind_inside(ct, path: str) -> str:
    result = ct.attach(["stat", "-c", "%F", path])
    return result.stdout.strip() if result.ok else result.stderr.strip()


@pytest.mark.parametrize("create", ["create=file", ""])
def test_autostart_race_is_named_by_check_and_cured_by_one_fix(
    lab, lab_sshd, lab_container, tmp_path, create
) -> None:
    """``create=file``: an empty placeholder where the node belongs, cured by a restart
    alone; without ``create=`` nothing at all (the node is missing inside), and the mount
    gets ``create=file`` (a restart alone would leave it missing: measured here)."""
    node = lab.nodes_dir / f"race-{lab.unique_name()}"
    rule = f"c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"
    options = ",".join(["bind", "optional", *([create] if create else [])])
    ct = lab_container(allow=[rule], extra_config=[
        f"lxc.mount.entry = {node} {RACE_INSIDE.lstrip('/')} none {options} 0 0"])  # fmt: skip
    placeholder = kind_inside(ct, RACE_INSIDE)
    assert placeholder == "regular empty file" if create else "No such file" in placeholder
    lab.make_node(node.name, lab.fake_gpu_major, lab.fake_gpu_minor)  # the host's node, late
    [named] = [f for f in device_findings(lab_sshd, ct, f"{RACE_INSIDE}:misc")
               if f.check_id == "device.nodes" and f.subject == RACE_INSIDE]  # fmt: skip
    assert named.status.name == "FAIL"
    assert ("missing when the container started" if create else "does not exist") in named.message
    assert named.fix_hint.endswith(f"--device {RACE_INSIDE}"), named.fix_hint  # the flag it needs
    config, pid = ct.config_path.read_bytes(), ct.init_pid()

    dry = gpudoctor(fix_args(lab_sshd, ct, RACE_INSIDE, "--dry-run"), env_for(tmp_path))
    assert dry.exit_code == 4, dry.output  # pending: a restart, or the create= and a restart
    out = json.loads(dry.stdout)
    assert out["status"] == "dry_run"
    if create:  # the config is right: the plan is a restart with its reason, no diff
        assert out["changed"] is False and out["diff"] == ""
        [reason] = out["restart_reasons"]
        assert reason.startswith(f"{RACE_INSIDE} is a regular file inside the CT (mode 0")
        assert "placeholder" in reason
    else:  # no create=: a restart alone never brings the node; the mount gets create=file
        assert out["changed"] is True
        assert (
            f"+lxc.mount.entry = {node} {RACE_INSIDE.lstrip('/')} none "
            "bind,optional,create=file 0 0" in out["diff"]
        )
    assert ct.config_path.read_bytes() == config and ct.init_pid() == pid

    done = gpudoctor(fix_args(lab_sshd, ct, RACE_INSIDE, "--yes"), env_for(tmp_path))
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["status"] == "applied", out
    before = "NOT_A_DEVICE (file)" if create else "ENOENT"  # the placeholder opens, no device
    assert out["probes"]["before"][RACE_INSIDE] == before
    assert out["probes"]["after"][RACE_INSIDE] == "OK"
    assert out["probes"]["after"]["/dev/null"] == "OK"
    if create:
        assert out["backup"] == {"host": "", "client": ""}  # nothing written
        assert ct.config_path.read_bytes() == config
    assert ct.init_pid() not in (None, pid)
    assert opened_inside(ct, RACE_INSIDE) == "OK"
    again = gpudoctor(fix_args(lab_sshd, ct, RACE_INSIDE, "--dry-run"), env_for(tmp_path))
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["status"] == "nothing_to_change"


def test_a_fix_not_restarted_is_finished_by_running_it_again(
    lab, lab_sshd, denied_container, tmp_path
) -> None:
    ct = denied_container
    env = env_for(tmp_path)
    first = gpudoctor(fix_args(lab_sshd, ct, "/dev/fakegpu", "--yes", "--no-restart"), env)
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    assert out["status"] == "applied_not_running" and "running this fix again" in out["message"]
    assert "Operation not permitted" in opened_inside(ct)  # the CT still has its old rules
    written = ct.config_path.read_bytes()

    dry = gpudoctor(fix_args(lab_sshd, ct, "/dev/fakegpu", "--dry-run"), env)
    assert dry.exit_code == 4, dry.output
    [reason] = json.loads(dry.stdout)["restart_reasons"]
    assert "EPERM" in reason and "older than its config" in reason

    pid = ct.init_pid()
    second = gpudoctor(fix_args(lab_sshd, ct, "/dev/fakegpu", "--yes"), env)
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["status"] == "applied"
    assert ct.config_path.read_bytes() == written and ct.init_pid() != pid
    assert opened_inside(ct) == "OK"


def _without_device_rules(ct, extra: list[str]) -> None:
    text = ct.config_path.read_text().splitlines()
    kept = [ln for ln in text if "lxc.cgroup2.devices" not in ln]
    ct.config_path.write_text("\n".join([*kept, *extra]) + "\n")


def test_a_config_with_no_device_rules_keeps_every_device(
    lab, lab_sshd, lab_container, tmp_path
) -> None:
    """No ``lxc.cgroup2.devices.*`` line: LXC allows every device. fix only bind-mounts the
    node: no allow list that would deny /dev/null (the issue's EPERM on /dev/null)."""
    ct = lab_container(start=False)
    _without_device_rules(ct, [])
    ct.start()
    done = gpudoctor(fix_args(lab_sshd, ct, str(lab.fake_gpu), "--yes"), env_for(tmp_path))
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["status"] == "applied", out
    assert [e["action"] for e in out["edits"]] == ["add"]
    assert "lxc.mount.entry" in out["edits"][0]["line"]
    assert "devices.allow" not in ct.config_path.read_text()
    for path in ("/dev/null", "/dev/zero", "/dev/urandom", str(lab.fake_gpu)):
        assert out["probes"]["after"][path] == "OK", out["probes"]
        assert opened_inside(ct, path) == "OK"


def test_an_allow_list_that_denies_the_basic_devices_is_rolled_back(
    lab, lab_sshd, lab_container, tmp_path
) -> None:
    """An included file (here: empty) may hold rules, so fix adds its allow line; that line
    makes LXC's policy an allow list that denies /dev/null: the re-check sees /dev/null go
    from OK to EPERM and rolls back (LXC 5.0.2 here; 4.0.6 and 6.0.4 do the same)."""
    include = tmp_path / "empty.conf"
    include.write_text("# no device rules\n")
    ct = lab_container(start=False, devices={"/dev/fakegpu": str(lab.fake_gpu)})
    _without_device_rules(ct, [f"lxc.include = {include}"])
    ct.start()
    old = ct.config_path.read_bytes()
    assert opened_inside(ct, "/dev/null") == "OK"
    done = gpudoctor(fix_args(lab_sshd, ct, "/dev/fakegpu", "--yes"), env_for(tmp_path))
    assert done.exit_code == 3, done.output
    out = json.loads(done.stdout)
    assert out["status"] == "rolled_back", out
    assert "/dev/null" in out["message"] and out["probes"]["after"]["/dev/null"] == "EPERM"
    assert ct.config_path.read_bytes() == old
    assert opened_inside(ct, "/dev/null") == "OK"
