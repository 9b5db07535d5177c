"""The gpudoctor.gpu modules in this process (fast; the lab tests run them through
ansible-playbook): the gpudoctor command line each builds from its options, how each maps
gpudoctor's JSON to Ansible's result (changed, failed, diff, facts), and real runs of the
modules with a real AnsibleModule (``patch_module_args``) and the real gpudoctor on a
container that does not exist."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from tests.ansible.collection_import import plugin

cli = plugin("module_utils", "gpudoctor_cli")
ct_gpu = plugin("modules", "ct_gpu")
check_facts = plugin("modules", "check_facts")
host_prep = plugin("modules", "host_prep")
GPUDOCTOR = str(Path(sys.executable).parent / "gpudoctor")

CT_PARAMS = {"ct": "200", "flavor": "pve", "mode": "auto", "lxcpath": None, "devices": [],
             "dev_gid": None, "prune": False, "driver_libs": None, "restart": True}  # fmt: skip


def run_module(main, args: dict, capsys) -> dict:  # type: ignore[no-untyped-def]
    """Run a module's ``main`` with ``args``; return its result (exit_json / fail_json)."""
    with patch_module_args(args), pytest.raises(SystemExit):
        main()
    return json.loads(capsys.readouterr().out)


# -- the command line ---------------------------------------------------------------------


def test_fix_args_apply_every_option() -> None:
    params = {**CT_PARAMS, "flavor": "lxc", "mode": "rules", "lxcpath": "/srv/lxc",
              "devices": ["/dev/dri", "/dev/fakegpu"], "dev_gid": 44, "prune": True,
              "driver_libs": "bind", "restart": False}  # fmt: skip
    assert ct_gpu.fix_args(params, check_mode=False) == [
        "fix", "--host", "local", "--ct", "200", "--flavor", "lxc", "--mode", "rules", "--json",
        "--yes", "--lxcpath", "/srv/lxc", "--device", "/dev/dri", "--device", "/dev/fakegpu",
        "--dev-gid", "44", "--prune", "--driver-libs", "bind", "--no-restart",
    ]  # fmt: skip


def test_fix_args_in_check_mode_are_a_dry_run_with_the_defaults() -> None:
    assert ct_gpu.fix_args(CT_PARAMS, check_mode=True) == [
        "fix", "--host", "local", "--ct", "200", "--flavor", "pve", "--mode", "auto", "--json",
        "--dry-run",
    ]  # fmt: skip
    assert ct_gpu.fix_args({**CT_PARAMS, "dev_gid": 0}, True)[-2:] == ["--dev-gid", "0"]


def test_check_args_and_the_place_of_the_containers() -> None:
    params = {"flavor": "lxc", "lxcpath": "/srv/lxc", "devices": ["/dev/fakegpu:misc"],
              "only": ["device", "ct"]}  # fmt: skip
    assert check_facts.check_args(params, "web1") == [
        "check", "--host", "local", "--ct", "web1", "--json", "--flavor", "lxc",
        "--lxcpath", "/srv/lxc", "--device", "/dev/fakegpu:misc", "--only", "device",
        "--only", "ct",
    ]  # fmt: skip
    plain = {"flavor": "pve", "lxcpath": None, "devices": [], "only": []}
    assert check_facts.check_args(plain, "200") == [
        "check", "--host", "local", "--ct", "200", "--json", "--flavor", "pve"]  # fmt: skip


def test_node_lock_is_gpudoctors_follow_driver_lock(tmp_path, monkeypatch) -> None:
    class Module:
        """What node_lock asks of AnsibleModule: get_bin_path."""

        def get_bin_path(self, name: str, required: bool = False) -> str:
            assert required
            return f"/usr/bin/{name}"

    monkeypatch.setenv("GPUDOCTOR_LOCK_DIR", str(tmp_path / "locks"))
    prefix = cli.node_lock(Module())
    assert prefix == ["/usr/bin/flock", "-w", "900", "-E", "75",
                      str(tmp_path / "locks" / "follow-driver.lock")]  # fmt: skip
    assert stat.S_IMODE(os.stat(tmp_path / "locks").st_mode) == 0o700
    monkeypatch.delenv("GPUDOCTOR_LOCK_DIR")
    monkeypatch.setattr(cli.os, "makedirs", lambda *a, **k: None)  # /run/gpudoctor: not here
    assert cli.node_lock(Module())[-1] == "/run/gpudoctor/follow-driver.lock"


# -- gpudoctor's JSON -> Ansible's result ---------------------------------------------------


def test_a_dry_run_is_changed_in_check_mode_with_the_diff() -> None:
    doc = {"status": "dry_run", "message": "dry run: nothing written", "config": "/c/200.conf",
           "diff": "--- a/c\n+++ b/c\n+x\n", "edits": [{"action": "add"}],
           "restart_reasons": []}  # fmt: skip
    failed, result = ct_gpu.result_of(doc, 4, True, "200")
    assert not failed and result["changed"] is True and result["status"] == "dry_run"
    assert result["diff"] == {"before_header": "/c/200.conf", "after_header": "/c/200.conf",
                              "prepared": "--- a/c\n+++ b/c\n+x\n"}  # fmt: skip
    assert result["edits"] == [{"action": "add"}] and result["outcome"] is doc
    assert "msg" not in result


@pytest.mark.parametrize(
    ("status", "rc", "check_mode", "changed"),
    [("nothing_to_change", 0, False, False), ("nothing_to_change", 0, True, False),
     ("applied", 0, False, True), ("applied_not_running", 0, False, True)],
)  # fmt: skip
def test_changed_only_when_written_or_restarted(status, rc, check_mode, changed) -> None:
    failed, result = ct_gpu.result_of({"status": status, "diff": ""}, rc, check_mode, "200")
    assert not failed and result["changed"] is changed
    assert "diff" not in result


def test_a_rollback_fails_the_task_naming_it_and_the_start_log() -> None:
    doc = {"status": "rolled_back", "message": "rolled back: pct start 200 failed",
           "start_log": ["hook: error", "lxc-start: failed"], "diff": "+x\n",
           "config": "/c/200.conf"}  # fmt: skip
    failed, result = ct_gpu.result_of(doc, 3, False, "200")
    assert failed and result["changed"] is True
    assert result["msg"] == (
        "CT 200: rolled back: pct start 200 failed (start log: hook: error | lxc-start: failed)"
    )


def test_a_refusal_fails_unchanged_and_a_silent_failure_names_the_exit_code() -> None:
    failed, result = ct_gpu.result_of({"status": "refused", "message": "locked (backup)"}, 3,
                                      False, "200")  # fmt: skip
    assert failed and result["changed"] is False and result["msg"] == "CT 200: locked (backup)"
    failed, result = ct_gpu.result_of({}, 1, True, "7")
    assert failed and result["status"] == "failed" and result["changed"] is False
    assert result["msg"] == "CT 7: gpudoctor fix failed (exit 1)"
    assert result["config"] is None and result["edits"] == [] and result["restart_reasons"] == []


def test_a_failure_document_gives_empty_fields_and_restart_reasons_pass_through() -> None:
    failure = {"ok": False, "status": "failed", "error": "io", "exit_code": 1}
    failed, result = cli.fix_result(failure, 1, False, ("applied",))
    assert failed and result == {"changed": False, "status": "failed", "message": "",
                                 "outcome": failure}  # fmt: skip
    failed, result = ct_gpu.result_of({"status": "dry_run", "restart_reasons": ["stale node"]},
                                      4, True, "200")  # fmt: skip
    assert not failed and result["restart_reasons"] == ["stale node"] and result["changed"]


def test_host_prep_arguments_and_results() -> None:
    assert host_prep.prep_args({"devices": ["/dev/dri", "/dev/kfd"]}, False) == [
        "fix", "--host", "local", "--host-prep", "--json", "--yes",
        "--device", "/dev/dri", "--device", "/dev/kfd"]  # fmt: skip
    assert host_prep.prep_args({"devices": []}, True)[-1] == "--dry-run"
    failed, result = host_prep.result_of({"status": "failed", "message": "no systemctl"}, 1, False)
    assert failed and result["msg"] == "no systemctl" and result["explanation"] == []
    failed, result = host_prep.result_of({}, 3, False)
    assert failed and result["msg"] == "gpudoctor fix --host-prep failed (exit 3)"
    doc = {"status": "applied", "unit": "/etc/u", "diff": "+x\n", "explanation": ["why"]}
    failed, result = host_prep.result_of(doc, 0, False)
    assert not failed and result["changed"] and "msg" not in result
    assert result["explanation"] == ["why"] and result["diff"]["before_header"] == "/etc/u"
    assert host_prep.result_of({"status": "applied"}, 0, True)[1]["changed"] is False


def test_a_finding_keeps_every_field_and_names_its_remedy() -> None:
    raw = {"check": "device.open", "status": "FAIL", "subject": "/dev/nvidia-uvm",
           "message": "EPERM", "evidence": ("open: EPERM",), "remediation": "gpudoctor fix",
           "fix_hint": "gpudoctor fix --ct 200", "caused_by": ("ct.device_rules",),
           "debug": "x"}  # fmt: skip
    assert check_facts.finding(raw) == {
        "check": "device.open", "status": "FAIL", "subject": "/dev/nvidia-uvm",
        "message": "EPERM", "evidence": ["open: EPERM"], "remedy": "gpudoctor fix",
        "fix_hint": "gpudoctor fix --ct 200", "caused_by": ["ct.device_rules"],
    }  # fmt: skip
    assert check_facts.finding({"check": "a", "status": "PASS"}) == {
        "check": "a", "status": "PASS", "subject": "", "message": "", "evidence": [],
        "remedy": "", "fix_hint": "", "caused_by": []}  # fmt: skip


def test_parse_and_error_lines() -> None:
    assert cli.parse_document('{"a": 1}') == {"a": 1}
    assert cli.parse_document("[1]") is None and cli.parse_document("no") is None
    assert cli.is_failure_document({"ok": False, "error": "x"})
    assert not cli.is_failure_document({"ok": False}) and not cli.is_failure_document({"error": 1})
    err = "gpudoctor: step\ngpudoctor: error: first\ngpudoctor: error: last; do x\nafter\n"
    assert cli.error_line(1, err, "") == "gpudoctor: error: last; do x"
    assert cli.error_line(1, "one\n two \n\nthree", "") == "three"
    assert cli.error_line(2, "", "out\nmid\n last out \n") == "last out"
    assert cli.error_line(9, None, None) == "gpudoctor exited with code 9 and printed nothing"
    assert cli.config_diff("/c", "") is None


# -- whole modules, real AnsibleModule, real processes --------------------------------------


def script(tmp_path: Path, text: str, name: str = "prog") -> str:
    """Return an executable shell script (a program for run_json to run) running ``text``."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return str(path)


def test_run_json_reads_the_document_of_an_expected_exit(tmp_path, capsys) -> None:
    prog = script(tmp_path, """echo '{"status": "dry_run"}'; exit 4""")
    with patch_module_args({}):
        assert run_json_of(cli_module(), prog, (0, 3, 4)) == (4, {"status": "dry_run"})


def test_run_json_fails_the_task_with_gpudoctors_error_line(tmp_path, capsys) -> None:
    prog = script(tmp_path, "echo 'gpudoctor: error: no such CT; check --ct' >&2; exit 2")
    with patch_module_args({}), pytest.raises(SystemExit):
        run_json_of(cli_module(), prog, (0, 3, 4))
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and out["msg"] == "gpudoctor: error: no such CT; check --ct"
    assert out["rc"] == 2 and out["cmd"] == [prog, "x"]
    assert out["stderr"] == "gpudoctor: error: no such CT; check --ct\n" and out["stdout"] == ""


def test_a_held_node_lock_fails_the_task_saying_so(tmp_path, capsys, monkeypatch) -> None:
    """``locked``: gpudoctor runs under ``flock`` on the node lock; held by another run past
    the wait (0 s here), the task fails naming the lock, and gpudoctor never ran."""
    import fcntl

    monkeypatch.setenv("GPUDOCTOR_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(cli, "LOCK_WAIT_S", 0)
    ran = tmp_path / "ran"
    prog = script(tmp_path, f"touch {ran}; echo '{{}}'")
    with patch_module_args({}):
        module = cli_module()
        assert run_json_of(module, prog, (0,), locked=True) == (0, {})  # free: it runs
        assert ran.exists()
        ran.unlink()
        held = os.open(tmp_path / "locks" / "follow-driver.lock", os.O_RDWR)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)
            with pytest.raises(SystemExit):
                run_json_of(module, prog, (0,), locked=True)
        finally:
            os.close(held)
    out = json.loads(capsys.readouterr().out)
    lock = tmp_path / "locks" / "follow-driver.lock"
    assert out["failed"] and out["rc"] == 75 and not ran.exists()
    assert out["cmd"] == [*cli.node_lock(cli_module_stub()), prog, "x"]
    assert out["msg"] == (
        f"another gpudoctor run held {lock} for 0 s; run the play again when it is done"
    )


def test_gpudoctor_is_found_on_the_nodes_path_or_the_task_fails_naming_it(
    tmp_path, capsys, monkeypatch
) -> None:
    (tmp_path / "bin").mkdir()
    found = script(tmp_path / "bin", "true", name="gpudoctor")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with patch_module_args({}):
        assert cli.gpudoctor_path(cli_module()) == found
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with patch_module_args({}), pytest.raises(SystemExit):
        cli.gpudoctor_path(cli_module())
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and "gpudoctor" in out["msg"], out


def cli_module_stub():  # type: ignore[no-untyped-def]
    """What node_lock asks of AnsibleModule (get_bin_path), for the expected command."""
    import shutil

    class Stub:
        def get_bin_path(self, name: str, required: bool = False) -> str:
            return shutil.which(name) or name

    return Stub()


def cli_module():  # type: ignore[no-untyped-def]
    from ansible.module_utils.basic import AnsibleModule

    return AnsibleModule(argument_spec=dict(cli.COMMON_OPTIONS))


def run_json_of(module, prog: str, results: tuple[int, ...], locked: bool = False):  # type: ignore[no-untyped-def]
    module.params["executable"] = prog
    return cli.run_json(module, ["x"], results, locked=locked)


def test_ct_gpu_fails_with_gpudoctors_reason_for_a_missing_ct(tmp_path, capsys) -> None:
    result = run_module(ct_gpu.main, {"ct": "nope", "flavor": "lxc", "lxcpath": str(tmp_path),
                                      "executable": GPUDOCTOR, "_ansible_check_mode": True},
                        capsys)  # fmt: skip
    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == (
        f"CT nope: no LXC container 'nope': {tmp_path}/nope/config does not exist"
    )
    assert result["outcome"]["error"] == "unknown_ct"


def test_check_facts_of_no_container_are_empty(tmp_path, capsys, monkeypatch) -> None:
    """An LXC directory with no container: nothing to check, empty facts, not changed (the
    real follow-driver dry run lists the node's containers: lxc-ls on an empty lxcpath)."""
    import shutil

    if not shutil.which("lxc-ls"):
        pytest.skip("lxc-ls is not installed")
    monkeypatch.setenv("GPUDOCTOR_LOCK_DIR", str(tmp_path / "locks"))  # follow's own lock
    result = run_module(check_facts.main, {"flavor": "lxc", "lxcpath": str(tmp_path),
                                           "executable": GPUDOCTOR}, capsys)  # fmt: skip
    assert result["changed"] is False and "failed" not in result, result
    assert result["ansible_facts"] == {"gpudoctor": {"cts": {}, "failing": []}}


# -- the argument specs are what DOCUMENTATION says -----------------------------------------

FIELDS = ("type", "default", "choices", "required", "elements")


def documented_options(module) -> dict:  # type: ignore[no-untyped-def]
    """Return the options of a module's DOCUMENTATION with its doc fragments merged."""
    import yaml

    doc = yaml.safe_load(module.DOCUMENTATION)
    options = dict(doc.get("options") or {})
    fragments = plugin("doc_fragments", "gpudoctor").ModuleDocFragment
    for name in doc.get("extends_documentation_fragment", []):
        attr = name.rsplit(".", 1)[1].upper() if name.count(".") == 3 else "DOCUMENTATION"
        options.update(yaml.safe_load(getattr(fragments, attr))["options"])
    return options


def normal(option: dict) -> dict:
    """Return an option's fields as the argument spec gives them (defaults filled in)."""
    return {"type": option.get("type", "str"), "default": option.get("default"),
            "choices": option.get("choices"), "required": option.get("required", False),
            "elements": option.get("elements")}  # fmt: skip


@pytest.mark.parametrize("module", [ct_gpu, check_facts, host_prep], ids=lambda m: m.__name__)
def test_the_argument_spec_is_the_documented_options(module) -> None:
    documented = {k: normal(v) for k, v in documented_options(module).items()}
    spec = {k: normal(v) for k, v in module.ARGUMENT_SPEC.items()}
    assert spec == documented
    assert "executable" in spec and ("flavor" in spec) is (module is not host_prep)


# -- whole modules on a real LXC config (a stopped CT: no container runs) -------------------


@pytest.fixture
def stopped_ct(tmp_path, monkeypatch) -> Path:
    """Return the lxcpath of three stopped plain LXC CTs (deny-all policy; they never run):
    ``ct1`` passes /dev/zero with no rule for it, ``ct2`` with its rule, ``ct3`` passes no
    device; backups and locks in tmp_path."""
    lxcpath = tmp_path / "lxc"
    lxcpath.mkdir()
    passes = "lxc.mount.entry = /dev/zero dev/zero none bind,optional,create=file\n"
    for name, more in (("ct1", passes), ("ct2", passes + "lxc.cgroup2.devices.allow = c 1:5 rwm\n"),
                       ("ct3", "")):  # fmt: skip
        (lxcpath / name).mkdir()
        (lxcpath / name / "config").write_text(
            f"lxc.uts.name = {name}\nlxc.cgroup2.devices.deny = a\n{more}"
        )
    for name, folder in (("LOCK", "locks"), ("HOST_BACKUP", "host-backups"),
                         ("CLIENT_BACKUP", "client-backups")):  # fmt: skip
        monkeypatch.setenv(f"GPUDOCTOR_{name}_DIR", str(tmp_path / folder))
    return lxcpath


def test_ct_gpu_check_mode_then_apply_then_ok(stopped_ct, capsys) -> None:
    config = stopped_ct / "ct1" / "config"
    before = config.read_bytes()
    args = {"ct": "ct1", "flavor": "lxc", "lxcpath": str(stopped_ct), "devices": ["/dev/zero"],
            "executable": GPUDOCTOR}  # fmt: skip
    rule = "lxc.cgroup2.devices.allow = c 1:5 rwm"
    planned = run_module(ct_gpu.main, {**args, "_ansible_check_mode": True,
                                       "_ansible_diff": True}, capsys)  # fmt: skip
    assert planned["changed"] is True and planned["status"] == "dry_run", planned
    assert "failed" not in planned and planned["config"] == str(config)
    assert f"+{rule}\n" in planned["diff"]["prepared"]
    assert planned["diff"]["before_header"] == str(config)
    assert [e["line"] for e in planned["edits"]] == [rule]
    assert planned["outcome"]["exit_code"] == 4 and config.read_bytes() == before

    applied = run_module(ct_gpu.main, args, capsys)
    assert applied["changed"] is True and applied["status"] == "applied_not_running", applied
    assert "failed" not in applied and applied["message"].startswith("applied;")
    assert rule in config.read_text().splitlines()
    assert applied["outcome"]["backup"]["host"]  # gpudoctor's backup, before the write

    again = run_module(ct_gpu.main, args, capsys)
    assert again["changed"] is False and again["status"] == "nothing_to_change", again
    assert again["edits"] == [] and again["restart_reasons"] == []


def test_ct_gpu_needs_a_ct(capsys) -> None:
    result = run_module(ct_gpu.main, {"executable": GPUDOCTOR}, capsys)
    assert result["failed"] and "missing required arguments: ct" in result["msg"]


def test_check_facts_of_a_failing_and_a_healthy_ct(stopped_ct, capsys) -> None:
    result = run_module(check_facts.main, {"cts": ["ct1", "ct2"], "flavor": "lxc",
                                           "lxcpath": str(stopped_ct), "only": ["ct"],
                                           "executable": GPUDOCTOR,
                                           "_ansible_check_mode": True}, capsys)  # fmt: skip
    facts = result["ansible_facts"]["gpudoctor"]
    assert result["changed"] is False and facts["failing"] == ["ct1"], result
    assert sorted(facts["cts"]) == ["ct1", "ct2"]  # the CTs named, no others
    ct1, ct2 = facts["cts"]["ct1"], facts["cts"]["ct2"]
    assert (ct1["status"], ct1["target"], ct2["status"]) == ("FAIL", "local/ct1", "PASS")
    rules = {f["check"]: f for f in ct1["findings"]}["ct.device_rules"]
    assert rules["status"] == "FAIL" and rules["subject"] == "/dev/zero"
    assert rules["remedy"] == "lxc.cgroup2.devices.allow = c 1:5 rwm"
    assert {f["check"] for f in ct2["findings"]} == {"ct.device_rules", "ct.hooks"}


def test_check_facts_finds_the_gpu_cts_itself(stopped_ct, capsys) -> None:
    """No ``cts``: the CTs that pass a device node (ct1, ct2), not ct3."""
    result = run_module(check_facts.main, {"flavor": "lxc", "lxcpath": str(stopped_ct),
                                           "only": ["ct"], "executable": GPUDOCTOR}, capsys)  # fmt: skip
    facts = result["ansible_facts"]["gpudoctor"]
    assert sorted(facts["cts"]) == ["ct1", "ct2"] and facts["failing"] == ["ct1"], result


def test_check_facts_says_when_the_node_has_no_ct_list(tmp_path, capsys, monkeypatch) -> None:
    """Flavor pve on a machine that is no Proxmox node: gpudoctor's reason, named."""
    monkeypatch.setenv("GPUDOCTOR_PVE_ROOT", str(tmp_path / "no-pve"))
    monkeypatch.setenv("GPUDOCTOR_LOCK_DIR", str(tmp_path / "locks"))
    result = run_module(check_facts.main, {"executable": GPUDOCTOR}, capsys)
    assert result["failed"] is True
    assert result["msg"].startswith("cannot list the node's containers: ")
    assert "not a Proxmox VE node" in result["msg"]


@pytest.mark.parametrize("module", [ct_gpu, host_prep], ids=lambda m: m.__name__)
def test_only_an_applying_run_takes_the_node_lock(module, stopped_ct, tmp_path, capsys,
                                                  monkeypatch) -> None:  # fmt: skip
    """The node lock held by another run (the wait cut to 0 s): check mode runs, the apply
    fails naming the lock."""
    import fcntl

    monkeypatch.setattr(cli, "LOCK_WAIT_S", 0)
    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", str(tmp_path / "root"))
    (tmp_path / "root" / "etc/systemd/system").mkdir(parents=True)
    args = {"executable": GPUDOCTOR}
    if module is ct_gpu:
        args.update(ct="ct1", flavor="lxc", lxcpath=str(stopped_ct), devices=["/dev/zero"])
    (tmp_path / "locks").mkdir()
    held = os.open(tmp_path / "locks" / "follow-driver.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        planned = run_module(module.main, {**args, "_ansible_check_mode": True}, capsys)
        refused = run_module(module.main, args, capsys)
    finally:
        os.close(held)
    assert planned["status"] == "dry_run" and "failed" not in planned, planned
    assert refused["failed"] and refused["rc"] == 75, refused
    assert "follow-driver.lock for 0 s" in refused["msg"]


def test_host_prep_check_mode_then_install_then_ok(tmp_path, capsys, monkeypatch) -> None:
    """On a scratch systemd tree (GPUDOCTOR_SYSTEMD_ROOT, the real ``systemctl --root``)."""
    import shutil

    from gpudoctor.pve import uvm_unit

    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    root = tmp_path / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", str(root))
    monkeypatch.setenv("GPUDOCTOR_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("GPUDOCTOR_HOST_BACKUP_DIR", str(tmp_path / "backups"))
    unit = root / "etc/systemd/system" / uvm_unit.UNIT_NAME
    args = {"executable": GPUDOCTOR}
    planned = run_module(host_prep.main, {**args, "_ansible_check_mode": True}, capsys)
    assert planned["changed"] is True and planned["status"] == "dry_run", planned
    assert f"+++ b{unit}" in planned["diff"]["prepared"] and not unit.exists()
    assert planned["diff"]["before_header"] == str(unit) and planned["explanation"]
    applied = run_module(host_prep.main, args, capsys)
    assert applied["changed"] is True and applied["status"] == "applied", applied
    assert unit.exists() and "failed" not in applied
    again = run_module(host_prep.main, args, capsys)
    assert again["changed"] is False and again["status"] == "nothing_to_change"
    assert "diff" not in again and again["message"] == "nothing to change"
