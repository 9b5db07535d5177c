"""The gpudoctor.gpu Ansible collection end to end: built with the real ``ansible-galaxy``,
its documented playbook (``gpudoctor.gpu.gpu_cts``) run by the real ``ansible-playbook``
over the lab's real sshd against real LXC containers on pure cgroup v2 (issue 48).

Plain LXC flavor: a broken CT (the stand-in GPU bind-mounted, its major denied) and a
healthy one. ``--check --diff`` shows the diff and leaves every config byte alone; the
apply run makes the broken CT's device open inside; a second run reports ``changed=0``.
Proxmox flavor (the pct stand-in and /etc/pve tree the ``fix`` lab tests use): every GPU
CT of the node found without naming it, fixed, then ``ok``; a CT that cannot start again
fails its task with the rollback named and its old config back.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.ansible.playbook import Controller, build_and_install
from tests.lab.pvelab import make_pve_ct, unique_vmid
from tests.pve.test_fix_lab import opened_inside

pytestmark = pytest.mark.lab
ONLY = ["device", "ct"]  # the lab has no NVIDIA driver: the device and config checks


@pytest.fixture(scope="session")
def collections(tmp_path_factory):  # type: ignore[no-untyped-def]
    """Return the collections path holding gpudoctor.gpu, built and installed once."""
    return build_and_install(tmp_path_factory.mktemp("ansible-collection"))


def node_env(tmp_path, **more: str) -> dict[str, str]:
    """Return gpudoctor's environment on the node: backups and locks in the test's dir."""
    return {
        "GPUDOCTOR_HOST_BACKUP_DIR": str(tmp_path / "host-backups"),
        "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "client-backups"),
        "GPUDOCTOR_LOCK_DIR": str(tmp_path / "locks"),
        **more,
    }


def lxc_controller(tmp_path, collections, sshd, *cts) -> Controller:  # type: ignore[no-untyped-def]
    """Return the controller of a plain LXC node whose GPU CTs are ``cts`` (the lab's)."""
    return Controller(tmp_path / "controller", collections, sshd, {
        "gpudoctor_cts": [ct.name for ct in cts],
        "gpudoctor_flavor": "lxc",
        "gpudoctor_lxcpath": cts[0].lxcpath,
        "gpudoctor_devices": ["/dev/fakegpu"],
        "gpudoctor_only": ONLY,
        "gpudoctor_environment": node_env(tmp_path),
    })  # fmt: skip


def test_lxc_playbook_check_diff_then_fix_then_nothing_changed(
    lab, lab_sshd, lab_container, collections, tmp_path
) -> None:
    broken = lab_container(devices={"/dev/fakegpu": str(lab.fake_gpu)})
    healthy = lab_container(devices={"/dev/fakegpu": str(lab.fake_gpu)},
                            allow=(f"c {lab.fake_gpu_major}:* rwm",))  # fmt: skip
    assert "Operation not permitted" in opened_inside(broken)
    assert opened_inside(healthy) == "OK"
    ansible = lxc_controller(tmp_path, collections, lab_sshd, broken, healthy)
    configs = {ct.name: ct.config_path.read_bytes() for ct in (broken, healthy)}
    pids = {ct.name: ct.init_pid() for ct in (broken, healthy)}
    rule = f"lxc.cgroup2.devices.allow = c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"

    # the facts: each finding structured, per CT
    facts = ansible.module("check_facts", {"cts": [broken.name, healthy.name], "flavor": "lxc",
                                           "lxcpath": broken.lxcpath, "devices": ["/dev/fakegpu"],
                                           "only": ONLY, "executable": ansible_executable()})  # fmt: skip
    found = facts["ansible_facts"]["gpudoctor"]
    bad = [(ct, f["check"], f["subject"], f["message"]) for ct, r in found["cts"].items()
           for f in r["findings"] if f["status"] in ("FAIL", "ERROR")]  # fmt: skip
    assert found["failing"] == [broken.name], bad
    opens = [f for f in found["cts"][broken.name]["findings"] if f["check"] == "device.open"]
    assert opens and opens[0]["status"] == "FAIL" and opens[0]["subject"] == "/dev/fakegpu"
    assert opens[0]["evidence"] and opens[0]["remedy"]
    rules = [f for f in found["cts"][broken.name]["findings"] if f["check"] == "ct.device_rules"]
    assert rules and rules[0]["status"] == "FAIL" and "gpudoctor fix" in rules[0]["fix_hint"]
    assert {f["status"] for f in found["cts"][healthy.name]["findings"]} <= {"PASS", "SKIP", "WARN"}
    assert facts["changed"] is False

    # 1. --check --diff: the diff fix would write, changed=1, nothing touched
    planned = ansible.playbook("--check", "--diff")
    assert planned.returncode == 0, planned.output
    assert planned.recap["labnode"].changed == 1, planned.output
    assert f"+{rule}" in planned.output
    assert planned.output.count(f"+{rule}") == 1  # the healthy CT has nothing to change
    assert {ct.name: ct.config_path.read_bytes() for ct in (broken, healthy)} == configs
    assert {ct.name: ct.init_pid() for ct in (broken, healthy)} == pids
    assert not (tmp_path / "host-backups").exists()

    # 2. apply: the broken CT is fixed (written, restarted, opens inside); the healthy one
    # is left alone
    applied = ansible.playbook()
    assert applied.returncode == 0, applied.output
    assert applied.recap["labnode"].changed == 1 and applied.recap["labnode"].failed == 0
    assert opened_inside(broken) == "OK"
    assert broken.config_path.read_text().splitlines().count(rule) == 1
    assert broken.init_pid() not in (None, pids[broken.name])
    assert healthy.config_path.read_bytes() == configs[healthy.name]
    assert healthy.init_pid() == pids[healthy.name]
    assert [p.read_bytes() for p in (tmp_path / "host-backups").rglob("*.conf")] == [
        configs[broken.name]
    ]

    # 3. again: nothing to change, changed=0, nothing written or restarted
    stamp, pid = os.stat(broken.config_path).st_mtime_ns, broken.init_pid()
    again = ansible.playbook()
    assert again.returncode == 0, again.output
    assert again.recap["labnode"].changed == 0, again.output
    assert os.stat(broken.config_path).st_mtime_ns == stamp and broken.init_pid() == pid
    record(tmp_path, "lxc", planned, applied, again)


def ansible_executable() -> str:
    from tests.ansible.playbook import GPUDOCTOR

    return GPUDOCTOR


def pct_first(ct) -> str:  # type: ignore[no-untyped-def]
    """Return a PATH on the node that finds the pct stand-in as ``pct`` (check's pct exec)."""
    return f"{ct.pct.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def record(tmp_path, name: str, *runs) -> None:  # type: ignore[no-untyped-def]
    """Keep the runs' output and recap lines where GPUDOCTOR_ANSIBLE_RECAPS names a file
    (what docs/ansible.md shows)."""
    target = os.environ.get("GPUDOCTOR_ANSIBLE_RECAPS")
    if target:
        doc = {
            "recaps": [r.recap["labnode"].line for r in runs],
            "outputs": [r.output for r in runs],
        }
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({name: doc}) + "\n")


def test_pve_playbook_finds_the_gpu_cts_fixes_them_and_names_a_rollback(
    lab, lab_sshd, lab_container, collections, tmp_path
) -> None:
    broken = make_pve_ct(lab, lab_container(name=unique_vmid(), start=False), tmp_path / "pve")
    assert not broken.open_inside().ok
    env = node_env(tmp_path, **broken.env(), PATH=pct_first(broken))
    ansible = Controller(tmp_path / "controller", collections, lab_sshd, {
        "gpudoctor_devices": ["/dev/fakegpu"],
        "gpudoctor_only": ONLY,
        "gpudoctor_environment": env,
    })  # fmt: skip
    old = broken.conf.read_bytes()
    planned = ansible.playbook("--check", "--diff")  # no gpudoctor_cts: every GPU CT
    assert planned.returncode == 0, planned.output
    assert planned.recap["labnode"].changed == 1, planned.output
    rule = f"lxc.cgroup2.devices.allow: c {lab.fake_gpu_major}:{lab.fake_gpu_minor} rwm"
    assert f"+{rule}" in planned.output and f"item={broken.vmid}" in planned.output
    # the gathered facts, through the playbook's own report of failing findings
    assert f"{broken.vmid}: device.open FAIL (/dev/fakegpu)" in planned.output
    assert broken.conf.read_bytes() == old

    applied = ansible.playbook()
    assert applied.returncode == 0, applied.output
    assert applied.recap["labnode"].changed == 1
    assert broken.open_inside().ok
    assert broken.tree.backups() and broken.tree.backups()[0].read_bytes() == old
    again = ansible.playbook()
    assert again.returncode == 0 and again.recap["labnode"].changed == 0, again.output
    record(tmp_path, "pve", planned, applied, again)

    # a CT that cannot come back: its task fails, naming the rollback; old config back
    flaky = make_pve_ct(lab, lab_container(name=unique_vmid(), start=False), tmp_path / "pve2")
    before, pid = flaky.conf.read_bytes(), flaky.container.init_pid()
    (flaky.container.dir / "fail-next-start").write_text("1")
    failing = Controller(tmp_path / "controller2", collections, lab_sshd, {
        "gpudoctor_cts": [flaky.vmid],
        "gpudoctor_devices": ["/dev/fakegpu"],
        "gpudoctor_environment": node_env(tmp_path / "f", **flaky.env(), PATH=pct_first(flaky)),
    }).playbook()  # fmt: skip
    record(tmp_path, "pve-rollback", failing)
    assert failing.returncode == 2, failing.output
    assert failing.recap["labnode"].failed == 1, failing.output
    assert f"CT {flaky.vmid}: rolled back" in failing.output
    assert "hookscript error" in failing.output
    assert flaky.conf.read_bytes() == before
    assert flaky.container.state() == "RUNNING" and flaky.container.init_pid() != pid


HOST_PREP_PLAY = """\
- name: Prepare the node
  hosts: all
  gather_facts: false
  environment: "{{ gpudoctor_environment }}"
  tasks:
    - name: The boot unit that creates /dev/nvidia-uvm before the CTs start
      gpudoctor.gpu.host_prep:
        executable: "{{ gpudoctor_executable }}"
"""


def test_host_prep_check_diff_then_install_then_nothing_changed(
    lab, lab_sshd, collections, tmp_path
) -> None:
    """The node's boot unit through ``systemctl --root`` on a scratch tree standing for the
    node's root (GPUDOCTOR_SYSTEMD_ROOT): check mode shows the unit's diff and writes
    nothing; the apply run installs and enables it; a second run is ``ok``."""
    import shutil

    from gpudoctor.pve import uvm_unit

    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    root = tmp_path / "node-root"
    (root / "etc/systemd/system").mkdir(parents=True)
    play = tmp_path / "host_prep.yml"
    play.write_text(HOST_PREP_PLAY)
    ansible = Controller(tmp_path / "controller", collections, lab_sshd, {
        "gpudoctor_environment": node_env(tmp_path, GPUDOCTOR_SYSTEMD_ROOT=str(root)),
    })  # fmt: skip
    unit = root / "etc/systemd/system" / uvm_unit.UNIT_NAME
    planned = ansible.playbook("--check", "--diff", playbook=str(play))
    assert planned.returncode == 0 and planned.recap["labnode"].changed == 1, planned.output
    assert f"+++ b{unit}" in planned.output and "+ExecStart=" in planned.output
    assert not unit.exists()
    applied = ansible.playbook(playbook=str(play))
    assert applied.returncode == 0 and applied.recap["labnode"].changed == 1, applied.output
    assert unit.exists()
    assert (root / "etc/systemd/system/multi-user.target.wants" / uvm_unit.UNIT_NAME).is_symlink()
    again = ansible.playbook(playbook=str(play))
    assert again.returncode == 0 and again.recap["labnode"].changed == 0, again.output


def waiting_on(lock: str) -> list[int]:
    """Return the pids of the ``flock`` processes whose command line names ``lock``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if argv and os.path.basename(argv[0]) == b"flock" and lock.encode() in argv:
            found.append(int(entry))
    return found


def test_an_applying_play_waits_for_gpudoctors_node_lock(
    lab, lab_sshd, lab_container, collections, tmp_path
) -> None:
    """While something holds gpudoctor's per-node lock (what ``fix --follow-driver``
    holds), the apply run waits for it and writes nothing; once it is released, the play
    fixes the CT."""
    import fcntl
    import time

    from tests.ansible.playbook import finish

    broken = lab_container(devices={"/dev/fakegpu": str(lab.fake_gpu)})
    old = broken.config_path.read_bytes()
    ansible = lxc_controller(tmp_path, collections, lab_sshd, broken)
    (tmp_path / "locks").mkdir(mode=0o700)
    lock = str(tmp_path / "locks" / "follow-driver.lock")
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        play = ansible.start()
        deadline = time.monotonic() + 300
        while not waiting_on(lock):  # the module's flock, blocked on our lock
            assert play.poll() is None, finish(play).output
            assert time.monotonic() < deadline, "the play never waited for the node lock"
            time.sleep(0.1)
        assert broken.config_path.read_bytes() == old  # nothing written while it waits
    finally:
        os.close(held)
    done = finish(play)
    assert done.returncode == 0 and done.recap["labnode"].changed == 1, done.output
    assert opened_inside(broken) == "OK"
