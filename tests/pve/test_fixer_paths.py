"""``gpudoctor fix`` on one CT, every path of it in-process: refused, nothing to pass,
nothing to change, dry run, declined, applied on a stopped CT, a write that lost its race,
and on a running CT the restart, the re-check inside, the rollback and what each outcome
tells the user (status, exit code, message, files left).

The config, its lock and its backups are real files (an /etc/pve-like tree,
tests/fakes/pvetree.py) written by the real locked write through LocalHost; the host's
nodes are this machine's (/dev/null is char 1:3). What cannot exist here has a stand-in:
``RunningCt`` for Proxmox's ``pct`` driving a running container, and its ``inside``
(a RecordedHost) for the CT's own /dev as its agent sees it; the lab drives real
containers (tests/pve/test_fix_lab.py)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from gpudoctor.hosts.base import CommandResult, FileStat, HostError
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve import fixer, uvm_unit
from gpudoctor.pve.api import ApiSettings
from gpudoctor.pve.apply import ApplyError, Layout
from gpudoctor.pve.driver_libs import ldconfig_script
from gpudoctor.pve.fixer import FixOptions, run_fix
from gpudoctor.pve.outcome import FixOutcome
from gpudoctor.pve.planner import FixPlanError, PlanOptions
from gpudoctor.pve.restart import Controller
from tests.fakes.pvetree import PveTree
from tests.fakes.recorded_host import RecordedHost
from tests.pve.support import stopped_pct

PASSES_NULL = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"
ALLOWED = PASSES_NULL + "lxc.cgroup2.devices.allow: c 1:3 rwm\n"
FIXED = "lxc.cgroup2.devices.allow: c 1:3 rwm"
RULES = PlanOptions(mode="rules", devices=("/dev/null",), include_host_nvidia=False)
NODES = {"/dev/fakegpu": (1, 3), "/dev/null": (1, 3), "/dev/zero": (1, 5),
         "/dev/urandom": (1, 9), "/dev/tty": (5, 0)}  # fmt: skip
ALL_OPEN = {"/dev/tty": errno.ENXIO}  # no controlling terminal: ENXIO, as in a real CT
GPU_DENIED = {**ALL_OPEN, "/dev/fakegpu": errno.EPERM}


class Inside(RecordedHost):
    """The running CT's /dev as the fixer's agent inside it sees it: ``NODES`` as char
    nodes, ``open_errno`` per node; ``unreachable``: every look raises HostError."""

    unreachable: bool = False
    closed: int = 0  # sessions given back (``pct exec`` channels closed)

    def close(self) -> None:
        self.closed += 1

    def run(self, argv, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        self.commands_run = [*getattr(self, "commands_run", []), (list(argv), timeout)]
        if getattr(self, "ldconfig_fails", False):
            return CommandResult(tuple(argv), 1, "out", "E" * 250 + "\nldconfig: no such dir")
        return super().run(argv, timeout, input)

    def stat(self, path: str) -> FileStat:
        if self.unreachable:
            raise HostError("pct exec 200: container is not running")
        return super().stat(path)


class RunningCt(Controller):
    """Proxmox's ``pct`` on a CT that runs: ``restart``/``start`` give it a new init PID
    and the next of ``opens`` (what opens inside after that start); ``fail``: how many of
    the next starts fail (``wait_running`` then raises the start log's lines)."""

    def __init__(self, opens: list[dict[str, int]], fail: int = 0, running: bool = True) -> None:
        self.opens, self.fail, self.running, self.pid = list(opens), fail, running, 100
        self.inside = Inside(nodes={p: FileStat(p, "char", 0o666, *n) for p, n in NODES.items()})
        self.inside.open_errno = dict(self.opens.pop(0))
        self.calls: list[str] = []
        self.entered = 0  # sessions opened inside
        self.sessions: list[tuple[object, object, object]] = []  # (host, target, layout)

    def state(self) -> str:
        return "RUNNING" if self.running else "STOPPED"

    def init_pid(self) -> int | None:
        return self.pid if self.running else None

    def restart(self) -> None:
        self.calls.append("restart")
        self._come_up()

    def start(self) -> None:
        self.calls.append("start")
        self._come_up()

    def stop(self) -> None:
        self.running = False

    def _come_up(self) -> None:
        if self.fail:
            self.fail, self.running = self.fail - 1, False
            return
        self.running, self.pid = True, self.pid + 1
        self.inside.open_errno = dict(self.opens.pop(0)) if self.opens else {}

    def wait_running(self, old_pid, timeout=60.0, sleep=None) -> int:
        self.calls.append(f"wait {old_pid}")
        if not self.running:
            raise ApplyError("start_failed", "CT 200 did not start", ("hook /h.sh: mknod failed",))
        return self.pid


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PveTree:
    monkeypatch.setenv("GPUDOCTOR_PCT", stopped_pct(tmp_path))
    return PveTree(tmp_path)


def options(tree: PveTree, **extra: object) -> FixOptions:
    layout = tree.layout(pct=stopped_pct(tree.root.parent))
    return FixOptions(**{"ct": "200", "plan": RULES, "layout": layout, **extra})  # type: ignore[arg-type]


def running(monkeypatch: pytest.MonkeyPatch, ct: RunningCt) -> RunningCt:
    """Make the fixer drive ``ct`` and look inside it."""
    monkeypatch.setattr(fixer, "controller_for", lambda host, target, layout: ct)

    def enter(host: object, target: object, layout: object) -> Inside:
        ct.entered += 1
        ct.sessions.append((host, target, layout))
        return ct.inside

    monkeypatch.setattr(fixer, "container_host", enter)
    return ct


def client_copies(tree: PveTree) -> list[Path]:
    return sorted(p for p in tree.client_backup_dir.rglob("*") if p.is_file())


# -- a stopped CT ----------------------------------------------------------------------


def test_a_locked_ct_is_refused_and_nothing_is_written(tree: PveTree) -> None:
    conf = tree.add_ct("200", PASSES_NULL + "lock: backup\n")
    done = run_fix(LocalHost(), options(tree, yes=True))
    assert (done.status, done.exit_code) == ("refused", 3)
    assert done.message.startswith("CT 200 is locked (backup)")
    assert conf.read_text() == PASSES_NULL + "lock: backup\n" and client_copies(tree) == []


def test_a_host_without_nvidia_nodes_has_nothing_to_pass(tree: PveTree) -> None:
    if list(Path("/dev").glob("nvidia*")):
        pytest.skip("this machine has NVIDIA nodes")
    tree.add_ct("200", "arch: amd64\n")
    done = run_fix(LocalHost(), options(tree, plan=PlanOptions(mode="rules")))
    assert (done.status, done.exit_code) == ("nothing_to_pass", 3)
    assert done.message == (
        "nothing to pass through: the host has no /dev/nvidia* node (is the NVIDIA driver "
        "loaded? `nvidia-smi` on the host) and no --device was given"
    )


def test_a_right_config_on_a_stopped_ct_is_nothing_to_change(tree: PveTree) -> None:
    tree.add_ct("200", ALLOWED)
    done = run_fix(LocalHost(), options(tree, yes=True))
    assert (done.status, done.exit_code) == ("nothing_to_change", 0)
    assert done.message == (
        "nothing to change (CT 200 is stopped: it gets its devices at its next start)"
    )
    assert done.plan.warnings == ()  # a stopped CT is not looked into


def test_a_dry_run_shows_the_plan_and_writes_nothing(tree: PveTree) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    shown, said = [], []
    done = run_fix(LocalHost(), options(tree, dry_run=True, yes=True), progress=said.append,
                   on_plan=shown.append)  # fmt: skip
    assert (done.status, done.exit_code, done.message) == ("dry_run", 4, "dry run: nothing written")
    assert shown == [done.plan] and done.host_prep is None
    assert f"--- a{conf}\n+++ b{conf}\n" in done.plan.diff  # the diff names the config
    assert said == ["reading the CT config and the host's devices"]
    assert conf.read_text() == PASSES_NULL and client_copies(tree) == [] and tree.backups() == []


def test_without_yes_the_answer_decides_and_no_answer_is_no(tree: PveTree) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    declined = run_fix(LocalHost(), options(tree))
    assert (declined.status, declined.exit_code) == ("declined", 4)
    assert declined.message == "not applied: nothing written"
    assert conf.read_text() == PASSES_NULL and client_copies(tree) == []
    asked = []
    done = run_fix(LocalHost(), options(tree), confirm=lambda plan: asked.append(plan) or True)
    assert asked == [done.plan] and done.status == "applied_not_running"


def test_applied_to_a_stopped_ct_with_both_backups_first(tree: PveTree) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    said: list[str] = []
    done = run_fix(LocalHost(), options(tree, yes=True), progress=said.append,
                   host_label="root@pve1")  # fmt: skip
    assert (done.status, done.exit_code) == ("applied_not_running", 0)
    assert done.message == "applied; the CT is stopped: the new rules apply at its next start"
    assert FIXED in conf.read_text() and done.before == () and done.init_pids == (None, None)
    [copy] = client_copies(tree)
    assert copy.read_text() == PASSES_NULL and copy.parent.parent.name == "root@pve1"
    assert done.client_backup == str(copy)
    [backup] = tree.backups()
    assert backup.read_text() == PASSES_NULL and done.write.host_backup == str(backup)
    assert backup.relative_to(tree.backup_dir).parts[0] == "ct-200"
    assert said == ["reading the CT config and the host's devices",
                    "saving the backup copy here, before anything is written",
                    f"backing up and writing {conf}"]  # fmt: skip
    unlabelled = tree.add_ct("201", PASSES_NULL)
    run_fix(LocalHost(name="pve-a"), FixOptions(ct="201", plan=RULES, yes=True,
                                                layout=options(tree).layout))  # fmt: skip
    assert FIXED in unlabelled.read_text()
    assert [p.parent.parent.name for p in client_copies(tree)] == ["pve-a", "root@pve1"]


def test_a_config_changed_under_the_fix_is_not_written_and_its_copy_is_dropped(
    tree: PveTree,
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)

    def edit_meanwhile(text: str) -> None:  # someone edits the config while we plan
        if text.startswith("backing up and writing"):
            conf.write_text(PASSES_NULL + "memory: 512\n")

    with pytest.raises(ApplyError) as lost:
        run_fix(LocalHost(), options(tree, yes=True), progress=edit_meanwhile)
    assert lost.value.code == "changed"
    assert conf.read_text() == PASSES_NULL + "memory: 512\n"
    assert client_copies(tree) == [] and tree.backups() == []


def test_a_write_that_failed_otherwise_keeps_the_client_copy(tree: PveTree) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    blocker = tree.root.parent / "a-file"
    blocker.write_text("not a folder\n")
    layout = options(tree).layout
    bad = FixOptions(ct="200", plan=RULES, yes=True,
                     layout=Layout(**{**layout.__dict__, "backup_dir": str(blocker)}))  # fmt: skip
    with pytest.raises(ApplyError) as failed:
        run_fix(LocalHost(), bad)
    assert failed.value.code == "io" and conf.read_text() == PASSES_NULL
    assert [p.read_text() for p in client_copies(tree)] == [PASSES_NULL]  # the state is unknown


def test_driver_libs_without_driver_files_is_a_plan_error(tree: PveTree) -> None:
    tree.add_ct("200", PASSES_NULL)
    with pytest.raises(FixPlanError) as failed:
        fixer.make_plan(LocalHost(), options(tree, driver_libs="bind"))
    assert str(failed.value).startswith("--driver-libs bind: ")


def test_a_devn_plan_through_an_api_token_warns_that_ssh_writes_it(tree: PveTree) -> None:
    tree.add_ct("200", PASSES_NULL)
    layout = tree.layout(pveversion=tree.pveversion("8.2.4"))
    api = ApiSettings("https://pve1:8006", token="root@pam!gd=secret")
    devn = PlanOptions(mode="devn", devices=("/dev/null",), include_host_nvidia=False)
    _, _, plan = fixer.make_plan(
        LocalHost(), FixOptions(ct="200", plan=devn, layout=layout, api=api)
    )
    assert plan.mode == "devn"
    assert plan.warnings[-1] == (
        "devN entries are refused through the API for API tokens (only root@pam may set "
        "them): gpudoctor writes them over SSH; edit them later as root@pam"
    )
    _, _, plain = fixer.make_plan(LocalHost(), FixOptions(ct="200", plan=devn, layout=layout,
                                                         api=ApiSettings("https://pve1")))  # fmt: skip
    assert not any("API tokens" in w for w in plain.warnings)


def test_the_api_is_refused_for_plain_lxc(tree: PveTree) -> None:
    from gpudoctor.pve.apply import Snapshot, Target

    with pytest.raises(ApplyError) as refused:
        fixer.make_controller(LocalHost(), Target("lxc", "web", "/c", "/l"),
                              FixOptions(ct="web", api=ApiSettings("https://x")),
                              Snapshot(b"", "", None))  # type: ignore[arg-type]  # fmt: skip
    assert (refused.value.code, str(refused.value)) == (
        "usage", "--api is for Proxmox VE; plain LXC has no API")  # fmt: skip


# -- a running CT ----------------------------------------------------------------------


def test_a_running_ct_is_restarted_and_checked_inside(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    ct = running(monkeypatch, RunningCt([GPU_DENIED, ALL_OPEN]))
    said: list[str] = []
    host, opts = LocalHost(), options(tree, yes=True)
    done = run_fix(host, opts, progress=said.append)
    assert (done.status, done.exit_code) == ("applied", 0)
    assert done.message == "fixed: CT 200 restarted and every device opens inside it"
    assert ct.sessions == [(host, done.target, opts.layout)] * 2  # this CT, on this host
    opened = [c for c in done.checks if c["check"] == "device.open"]  # the catalogue, inside
    assert [(c["subject"], c["status"]) for c in opened] == [("/dev/fakegpu", "PASS")]
    assert done.init_pids == (100, 101) and ct.calls == ["restart", "wait 100"]
    assert ct.entered == ct.inside.closed == 2  # before and after: each session closed
    assert dict(done.before)["/dev/fakegpu"] == "EPERM" and dict(done.after)["/dev/fakegpu"] == "OK"
    assert FIXED in conf.read_text()
    assert said[1:] == ["probing the devices inside the CT before the change",
                        "saving the backup copy here, before anything is written",
                        f"backing up and writing {conf}", "restarting CT 200",
                        "re-checking the devices inside the CT"]  # fmt: skip


def test_a_running_ct_left_running_says_to_restart_it(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    ct = running(monkeypatch, RunningCt([GPU_DENIED]))
    done = run_fix(LocalHost(), options(tree, yes=True, restart=False))
    assert (done.status, done.exit_code) == ("applied_not_running", 0)
    assert done.message == (
        "applied; restart the CT for the new rules to take effect (running this fix again "
        "restarts it and re-checks inside)"
    )
    assert dict(done.before)["/dev/fakegpu"] == "EPERM" and ct.calls == []
    assert FIXED in conf.read_text()


def test_a_ct_locked_before_its_restart_is_not_restarted(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    ct = running(monkeypatch, RunningCt([GPU_DENIED, ALL_OPEN]))

    def backup_starts(text: str) -> None:  # vzdump locks the CT just then
        if text == "restarting CT 200":
            conf.write_text(conf.read_text() + "lock: backup\n")

    done = run_fix(LocalHost(), options(tree, yes=True), progress=backup_starts)
    assert (done.status, done.exit_code) == ("applied_not_running", 3)
    assert done.message.startswith("applied, but not restarted: CT 200 is locked (backup)")
    assert done.message.endswith("; restart the CT when the task is done")
    assert ct.calls == []
    assert dict(done.before)["/dev/fakegpu"] == "EPERM"  # what was probed before is kept
    assert done.target.ct == "200" and done.write is not None and done.client_backup


def test_a_ct_that_does_not_come_back_is_rolled_back_and_started_on_its_old_config(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    ct = running(monkeypatch, RunningCt([GPU_DENIED, GPU_DENIED], fail=1))
    said: list[str] = []
    done = run_fix(LocalHost(), options(tree, yes=True), progress=said.append)
    assert (done.status, done.exit_code) == ("rolled_back", 3)
    assert done.message == "rolled back: CT 200 did not start"
    assert done.start_log == ("hook /h.sh: mknod failed",)
    assert conf.read_text() == PASSES_NULL
    assert ct.calls == ["restart", "wait 100", "start", "wait None"]  # stopped: started again
    assert "the CT did not come back (CT 200 did not start); rolling back" in said
    assert dict(done.before)["/dev/fakegpu"] == "EPERM" and done.target.ct == "200"
    assert done.write is not None and done.client_backup  # what was written, and its copy


def test_a_rollback_whose_ct_does_not_start_either_says_the_old_config_is_back(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    running(monkeypatch, RunningCt([GPU_DENIED], fail=2))
    with pytest.raises(ApplyError) as failed:
        run_fix(LocalHost(), options(tree, yes=True))
    [backup] = tree.backups()
    assert failed.value.code == "rollback_failed"
    assert str(failed.value) == (
        f"the CT did not come back (CT 200 did not start); the old config is back in place in "
        f"{conf} (a copy is in {backup} on the host), but the CT did not start on it either: "
        "CT 200 did not start"
    )
    assert failed.value.details == ("hook /h.sh: mknod failed",)
    assert conf.read_text() == PASSES_NULL


def test_a_rollback_that_cannot_put_the_old_bytes_back_names_the_backup(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    running(monkeypatch, RunningCt([GPU_DENIED], fail=1))

    def edit_meanwhile(text: str) -> None:
        if text == "restarting CT 200":
            conf.write_text(conf.read_text() + "memory: 512\n")

    with pytest.raises(ApplyError) as failed:
        run_fix(LocalHost(), options(tree, yes=True), progress=edit_meanwhile)
    [backup] = tree.backups()
    assert failed.value.code == "rollback_failed"
    assert str(failed.value).startswith(
        "the CT did not come back (CT 200 did not start), and the rollback failed too: "
    )
    assert str(failed.value).endswith(f". The old config is saved in {backup} on the host")
    assert conf.read_text().endswith("memory: 512\n")  # someone else's edit is never undone


def test_a_change_that_breaks_a_device_that_worked_is_rolled_back(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    broke = {**ALL_OPEN, "/dev/null": errno.EPERM, "/dev/zero": errno.EPERM}
    ct = running(monkeypatch, RunningCt([GPU_DENIED, broke, GPU_DENIED]))
    said: list[str] = []
    done = run_fix(LocalHost(), options(tree, yes=True), progress=said.append)
    assert (done.status, done.exit_code) == ("rolled_back", 3)
    assert done.message == (
        "rolled back: /dev/null, /dev/zero could be opened before the change, not after"
    )
    assert "/dev/null, /dev/zero opened before and not now; rolling back" in said
    assert dict(done.after)["/dev/null"] == "EPERM" and done.init_pids == (100, 101)
    assert dict(done.before)["/dev/null"] == "OK" and done.write is not None
    assert_everything_reported(done)
    assert conf.read_text() == PASSES_NULL
    assert ct.calls == ["restart", "wait 100", "restart", "wait None"]  # running: restarted


def test_a_rollback_after_a_broken_device_says_what_broke_when_the_ct_does_not_start(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", PASSES_NULL)
    broke = {**ALL_OPEN, "/dev/null": errno.EPERM, "/dev/zero": errno.EPERM}
    ct = running(monkeypatch, RunningCt([GPU_DENIED, broke]))
    real = ct._come_up

    def fail_after_first() -> None:  # the first restart works; the rollback's does not
        real()
        ct.fail = 1

    ct._come_up = fail_after_first  # type: ignore[method-assign]
    with pytest.raises(ApplyError) as failed:
        run_fix(LocalHost(), options(tree, yes=True))
    assert str(failed.value).startswith("/dev/null, /dev/zero broke; the old config is back in ")


def test_a_device_still_failing_after_the_restart_is_not_fixed(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", PASSES_NULL)
    running(monkeypatch, RunningCt([GPU_DENIED, GPU_DENIED]))
    done = run_fix(LocalHost(), options(tree, yes=True))
    assert (done.status, done.exit_code) == ("not_fixed", 3)
    assert done.message.startswith(
        "applied and CT 200 restarted, but inside it: /dev/fakegpu cannot be opened (EPERM); "
        "open(/dev/fakegpu) gives EPERM inside the CT although its config allows 1:3 now"
    )
    assert FIXED in conf.read_text()  # nothing worse than before: kept
    assert_everything_reported(done)


def assert_everything_reported(done: FixOutcome) -> None:
    """An outcome after a restart carries what the user needs to see why: the probes
    before and after, the init PIDs, the checks run inside, the config and the write."""
    assert dict(done.before) and dict(done.after) and done.checks
    assert done.init_pids == (100, 101) and done.target.ct == "200" and done.plan is not None
    assert done.write is not None and done.client_backup


def test_a_device_failing_otherwise_after_the_restart_is_not_fixed(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", PASSES_NULL)
    running(monkeypatch, RunningCt([GPU_DENIED, {**ALL_OPEN, "/dev/fakegpu": errno.EIO}]))
    done = run_fix(LocalHost(), options(tree, yes=True))  # no restart would cure EIO
    assert (done.status, done.message) == (
        "not_fixed", "applied and CT 200 restarted, but inside it: /dev/fakegpu cannot be "
        "opened (EIO)")  # fmt: skip


def test_a_node_still_old_after_the_restart_is_not_fixed(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", PASSES_NULL)
    ct = running(monkeypatch, RunningCt([GPU_DENIED, ALL_OPEN]))
    ct.inside.nodes["/dev/fakegpu"] = FileStat("/dev/fakegpu", "char", 0o666, 1, 7)
    done = run_fix(LocalHost(), options(tree, yes=True))  # every open works, numbers wrong
    assert done.status == "not_fixed"
    assert done.message.startswith(
        "applied and CT 200 restarted, but inside it: /dev/fakegpu is char 1:7 inside the CT"
    )


def test_a_right_config_on_a_ct_with_older_devices_is_restarted_only(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tree.add_ct("200", ALLOWED)
    running(monkeypatch, RunningCt([GPU_DENIED, ALL_OPEN]))
    dry = run_fix(LocalHost(), options(tree, dry_run=True))
    assert dry.message == "dry run: nothing written; CT 200 needs a restart (1 reason(s))"
    assert dry.plan.explanation[-1].startswith("restart CT 200: open(/dev/fakegpu) gives EPERM")
    assert dry.plan.host_cause == ""
    ct = running(monkeypatch, RunningCt([GPU_DENIED, ALL_OPEN]))
    said: list[str] = []
    host, opts = LocalHost(), options(tree, yes=True)
    done = run_fix(host, opts, progress=said.append)
    assert (done.status, done.message) == (
        "applied", "fixed: CT 200 restarted and every device opens inside it")  # fmt: skip
    assert done.write is None and done.client_backup == "" and ct.calls == ["restart", "wait 100"]
    assert ct.entered == ct.inside.closed == 3  # the state, before, after
    assert ct.sessions == [(host, done.target, opts.layout)] * 3
    assert said == ["reading the CT config and the host's devices",
                    "looking at the devices inside the running CT",
                    "probing the devices inside the CT before the change", "restarting CT 200",
                    "re-checking the devices inside the CT"]  # fmt: skip
    assert conf.read_text() == ALLOWED and client_copies(tree) == []
    again = running(monkeypatch, RunningCt([GPU_DENIED, GPU_DENIED]))
    still = run_fix(LocalHost(), options(tree, yes=True))
    assert still.status == "not_fixed" and again.calls == ["restart", "wait 100"]
    assert still.message.startswith("restart planned and CT 200 restarted, but inside it: ")
    failing = running(monkeypatch, RunningCt([GPU_DENIED], fail=1))
    gone = run_fix(LocalHost(), options(tree, yes=True))
    assert (gone.status, gone.exit_code) == ("not_fixed", 3)
    assert dict(gone.before)["/dev/fakegpu"] == "EPERM" and gone.target.ct == "200"
    assert gone.plan.restart_reasons and gone.write is None
    assert gone.message == (
        "the CT did not come back after the restart (CT 200 did not start); its config was "
        "not changed"
    )
    assert gone.start_log == ("hook /h.sh: mknod failed",) and failing.calls == [
        "restart",
        "wait 100",
    ]


def test_a_missing_node_inside_names_the_host_cause(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", ALLOWED)
    ct = running(monkeypatch, RunningCt([ALL_OPEN]))
    del ct.inside.nodes["/dev/fakegpu"]
    dry = run_fix(LocalHost(), options(tree, dry_run=True), host_label="root@pve1")
    assert dry.plan.restart_reasons[0].startswith("/dev/fakegpu does not exist inside the CT")
    assert dry.plan.host_cause == ""  # /dev/fakegpu is not one the host makes late


def test_a_running_ct_whose_inside_cannot_be_looked_at_is_planned_from_its_config(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", ALLOWED)
    ct = running(monkeypatch, RunningCt([ALL_OPEN]))
    ct.inside.unreachable = True
    done = run_fix(LocalHost(), options(tree, yes=True))
    assert done.status == "nothing_to_change" and done.message == "nothing to change"
    assert ct.entered == ct.inside.closed == 1  # closed though the look failed
    assert done.plan.warnings[-1] == (
        "the devices inside the running CT could not be looked at (pct exec 200: container "
        "is not running)"
    )


def test_a_ct_whose_state_cannot_be_read_is_planned_from_its_config(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", ALLOWED)

    def no_answer(host: object, target: object, layout: object) -> Controller:
        raise ApplyError("io", "pct status 200 failed: connection refused")

    monkeypatch.setattr(fixer, "controller_for", no_answer)
    done = run_fix(LocalHost(), options(tree, yes=True))
    assert done.status == "nothing_to_change" and done.message == "nothing to change"
    assert done.plan.warnings[-1] == (
        "the CT's state could not be read (pct status 200 failed: connection refused): only "
        "its config was checked"
    )


# -- the boot unit a devN plan needs ---------------------------------------------------

UVM_CT = "arch: amd64\ndev0: /dev/nvidia-uvm\n"


@pytest.fixture
def sysroot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch systemd root for --host-prep (the real systemctl --root enables there)."""
    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    root = tmp_path / "sysroot"
    (root / "etc/systemd/system").mkdir(parents=True)
    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", str(root))
    return root


def devn(tree: PveTree, **extra: object) -> FixOptions:
    layout = tree.layout(pveversion=tree.pveversion("8.2.4"), pct=stopped_pct(tree.root.parent))
    plan = PlanOptions(mode="devn", devices=("/dev/null",), include_host_nvidia=False)
    return FixOptions(**{"ct": "200", "plan": plan, "layout": layout, **extra})  # type: ignore[arg-type]


def test_only_a_plan_that_asks_for_it_reads_proxmoxs_version(tree: PveTree) -> None:
    tree.add_ct("200", PASSES_NULL)
    _, _, rules = fixer.make_plan(LocalHost(), devn(tree, plan=RULES))
    assert rules.pve_version is None  # rules need no version: pveversion not run
    _, _, with_devn = fixer.make_plan(LocalHost(), devn(tree))
    assert with_devn.pve_version == "8.2.4"


def test_a_devn_plan_needing_nvidia_uvm_at_start_offers_the_boot_unit(
    tree: PveTree, sysroot: Path
) -> None:
    conf = tree.add_ct("200", UVM_CT)
    shown: list[object] = []
    dry = run_fix(LocalHost(), devn(tree, dry_run=True), on_plan=shown.append)
    assert dry.status == "dry_run" and dry.host_prep is not None
    assert shown == [dry.plan, dry.host_prep]
    assert dry.host_prep.explanation[0].startswith(f"write {sysroot}/etc/systemd/system/")
    said: list[str] = []
    done = run_fix(LocalHost(), devn(tree, yes=True), progress=said.append)
    assert done.status == "applied_not_running" and "dev1: /dev/null" in conf.read_text()
    assert "installing gpudoctor-nvidia-uvm.service (creates /dev/nvidia-uvm before guests)" in said
    assert (sysroot / "etc/systemd/system/gpudoctor-nvidia-uvm.service").exists()
    again = run_fix(LocalHost(), devn(tree, yes=True))
    assert (again.status, again.host_prep) == ("nothing_to_change", None)


def test_a_right_config_still_gets_its_missing_boot_unit(tree: PveTree, sysroot: Path) -> None:
    conf = tree.add_ct("200", UVM_CT + "dev1: /dev/null,gid=0,mode=0666\n")
    done = run_fix(LocalHost(), devn(tree, yes=True))
    assert (done.status, done.exit_code) == ("applied", 0)
    assert done.message == "gpudoctor-nvidia-uvm.service installed; the CT config needed no change"
    assert conf.read_text() == UVM_CT + "dev1: /dev/null,gid=0,mode=0666\n"
    assert (sysroot / "etc/systemd/system/gpudoctor-nvidia-uvm.service").exists()


def test_a_boot_unit_installed_meanwhile_by_another_fix_is_planned_again_once(
    tree: PveTree, sysroot: Path
) -> None:
    tree.add_ct("200", UVM_CT)
    unit = sysroot / "etc/systemd/system/gpudoctor-nvidia-uvm.service"
    said: list[str] = []

    def another_fix_first(text: str) -> None:
        said.append(text)
        if text == f"writing {unit}" and not unit.exists():
            unit.write_text(uvm_unit.unit_text(shutil.which("nvidia-modprobe") or
                                               "/usr/bin/nvidia-modprobe"))  # fmt: skip

    done = run_fix(LocalHost(), devn(tree, yes=True), progress=another_fix_first)
    assert done.status == "applied_not_running"
    assert said.count(f"writing {unit}") == 1  # the second plan found it right
    units = sysroot / "etc/systemd/system"  # and installed the rest, with its progress shown
    assert (units / "gpudoctor-follow-driver.path").exists()
    assert (units / "multi-user.target.wants" / "gpudoctor-follow-driver.path").is_symlink()
    assert f"writing {units}/gpudoctor-follow-driver.path" in said


def test_a_boot_unit_that_cannot_be_written_stops_the_fix_at_the_first_try(
    tree: PveTree, sysroot: Path
) -> None:
    conf = tree.add_ct("200", UVM_CT)
    layout = devn(tree).layout
    Path(layout.own_lock_dir).mkdir(parents=True, exist_ok=True)
    Path(layout.own_lock_dir, "host-prep.lock").symlink_to(sysroot / "elsewhere")
    said: list[str] = []
    with pytest.raises(ApplyError) as failed:
        run_fix(LocalHost(), devn(tree, yes=True), progress=said.append)
    assert failed.value.code == "io" and conf.read_text() == UVM_CT
    assert len([s for s in said if s.startswith("writing ")]) == 1  # not tried again


# -- the driver's libraries, the API ---------------------------------------------------


@pytest.fixture
def driver_580(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's driver files as facts.driver_files reads them on a host with driver
    580.159.04 (this machine has no NVIDIA driver): tests/pve/test_driver_libs.py's list."""
    from gpudoctor.facts import driver_files
    from tests.pve.test_driver_libs import FILES

    monkeypatch.setattr(driver_files, "read_driver_files", lambda host: FILES)


def test_driver_libs_bind_or_copy_the_hosts_driver_files(tree: PveTree, driver_580: None) -> None:
    from tests.pve.test_driver_libs import CUDA

    tree.add_ct("200", ALLOWED)
    _, _, bind = fixer.make_plan(LocalHost(), options(tree, driver_libs="bind"))
    assert CUDA in bind.new_text.splitlines()
    _, _, copy = fixer.make_plan(LocalHost(), options(tree, driver_libs="copy"))
    assert copy.new_text == ALLOWED
    assert "inside the CT, install driver 580.159.04 (copies):" in copy.explanation


@pytest.mark.parametrize("hangs", [False, True])  # ldconfig inside works, or fails
def test_bound_driver_libs_are_made_known_inside_after_the_restart(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch, driver_580: None, hangs: bool
) -> None:
    tree.add_ct("200", ALLOWED)
    ct = running(monkeypatch, RunningCt([ALL_OPEN, ALL_OPEN]))
    ct.inside.ldconfig_fails = hangs
    said: list[str] = []
    done = run_fix(LocalHost(), options(tree, yes=True, driver_libs="bind"), progress=said.append)
    assert done.status == "applied", done.message
    assert "inside the CT: ld.so.conf.d names /usr/lib/gpudoctor-driver; ldconfig" in said
    failed = [s for s in said if s.startswith("ldconfig inside the CT failed: ")]
    tail = ("E" * 250 + "\nldconfig: no such dir")[-200:]  # its error's last 200 characters
    assert failed == ([f"ldconfig inside the CT failed: {tail}"] if hangs else [])
    assert ct.inside.commands_run == [(["sh", "-c", ldconfig_script()], 60)]  # bounded


def test_the_api_must_show_the_same_ct_as_ssh(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Proxmox API (it cannot run here; tests/pve/test_api_controller.py has its
    recorded answers) as the fixer sees it: a controller whose config digest is asked."""
    from gpudoctor.pve.apply import Snapshot, Target

    class Api:
        def __init__(self, host, target, layout, session) -> None:
            self.session = session

        def digest(self) -> str:
            return "0123456789abcdef" + "0" * 24

    monkeypatch.setattr(fixer, "connect", lambda settings: ("session", settings.url))
    monkeypatch.setattr(fixer, "ApiController", Api)
    target = Target("pve", "200", "/c", "/l")
    api = FixOptions(ct="200", api=ApiSettings("https://pve1:8006"))
    same = fixer.make_controller(
        LocalHost(), target, api, Snapshot(b"", "0123456789abcdef" + "0" * 24, None)
    )  # type: ignore[arg-type]
    assert isinstance(same, Api) and same.session == ("session", "https://pve1:8006")
    with pytest.raises(ApplyError) as other:
        fixer.make_controller(
            LocalHost(), target, api, Snapshot(b"", "fedcba9876543210" + "0" * 24, None)
        )  # type: ignore[arg-type]
    assert (other.value.code, str(other.value)) == (
        "api_mismatch", "the API's config digest of CT 200 (0123456789ab) differs from the file "
        "read over SSH (fedcba987654): --api and --host do not show the same CT")  # fmt: skip


def test_a_ct_that_cannot_be_entered_after_a_restart_is_not_fixed(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree.add_ct("200", ALLOWED)
    ct = running(monkeypatch, RunningCt([GPU_DENIED, ALL_OPEN]))
    real_come_up = ct._come_up

    def come_up_unreachable() -> None:
        real_come_up()
        ct.inside.unreachable = True

    ct._come_up = come_up_unreachable  # type: ignore[method-assign]
    done = run_fix(LocalHost(), options(tree, yes=True))
    assert (done.status, done.exit_code) == ("not_fixed", 3)
    assert "the CT cannot be looked at (pct exec 200: container is not running)" in done.message
    assert done.message.startswith("restart planned and CT 200 restarted, but inside it: ")


def test_a_node_the_host_made_too_late_names_the_host_and_its_cure(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch, sysroot: Path
) -> None:
    """The CT's state as ctstate reads it on a CT that autostarted before the host made
    /dev/nvidia-uvm (this GPU-less machine has none): the plan names the host's cause and
    ``--host-prep`` on the host as the user reached it (its label, else its name)."""
    from gpudoctor.pve import ctstate

    tree.add_ct("200", ALLOWED)
    running(monkeypatch, RunningCt([ALL_OPEN]))
    gap = ctstate.StateGap("/dev/nvidia-uvm", "missing", "/dev/nvidia-uvm does not exist inside")
    monkeypatch.setattr(ctstate, "restart_reasons", lambda inside, nodes: (gap,))
    cure = ("the cause is on the host: /dev/nvidia-uvm did not exist there when the CT started "
            "(nvidia-uvm loads on the first CUDA use, after CTs autostart); the durable cure is "
            "the boot unit that makes them before guests start: gpudoctor fix --host {} "
            "--host-prep")  # fmt: skip
    dry = run_fix(LocalHost(name="pve-a"), options(tree, dry_run=True), host_label="root@pve1")
    assert dry.plan.host_cause == cure.format("root@pve1")
    assert dry.plan.explanation[-2:] == (
        "restart CT 200: /dev/nvidia-uvm does not exist inside", cure.format("root@pve1"))  # fmt: skip
    unlabelled = run_fix(LocalHost(name="pve-a"), options(tree, dry_run=True))
    assert unlabelled.plan.host_cause == cure.format("pve-a")
