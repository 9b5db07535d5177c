"""``fix --follow-driver``'s own logic, in-process and fast: which CTs are this node's, what
each CT's result and the whole run's summary, exit code and JSON say, the passes made while
the host's devices move, the state that lets ``--if-host-changed`` skip a run, and the lock.

Real files (an /etc/pve-like tree, tests/fakes/pvetree.py) and this machine's real nodes
(/dev/null, /dev/zero) through LocalHost; the pct stand-in of tests/pve/support.py says
every CT is stopped. What cannot happen here has a stand-in, named where it is used: a
driver reload that moves majors mid-run (``ReloadingHost``), a node reached over SSH
(``Node``), and the fixer's run on a running CT (a restart needs a real container:
tests/ops/test_follow_driver_drill.py)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpudoctor.exit_codes import ExitCode
from gpudoctor.hosts.base import CommandResult, FileStat, HostError
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve import follow
from gpudoctor.pve.apply import ApplyError, Layout
from gpudoctor.pve.config import ConfigError
from gpudoctor.pve.follow import FollowedCt, FollowResult, follow_driver, follow_lock
from gpudoctor.pve.outcome import FixOutcome
from gpudoctor.pve.planner import FixPlan, FixPlanError
from tests.fakes.pvetree import PveTree
from tests.fakes.recorded_host import RecordedHost
from tests.pve.support import stopped_pct

PASSES_NULL = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"
ALLOWED = PASSES_NULL + "lxc.cgroup2.devices.allow: c 1:3 rwm\n"
PLAIN = "arch: amd64\nhostname: web\n"


class ReloadingHost(LocalHost):
    """This machine, whose /proc/devices is read from ``devices`` (a file the test
    rewrites): stands for a node whose NVIDIA driver is reloaded while the follow runs
    (the majors in /proc/devices move), which cannot happen on this GPU-less machine."""

    def __init__(self, devices: Path) -> None:
        super().__init__()
        self.devices = devices

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        if path == "/proc/devices":
            return self.devices.read_text()
        return super().read_text(path, limit)


class Node(RecordedHost):
    """A node reached over SSH: every command there (``lxc-ls``, ``readlink``) answers
    ``stdout`` (or fails with ``stderr``); each argv run is recorded in ``ran`` and its
    timeout in ``timeouts``; its files are a RecordedHost's (``.vmlist``)."""

    def __init__(self, stdout: str = "", stderr: str = "", **files: str) -> None:
        super().__init__(files=dict(files))
        self.out, self.err, self.ran, self.timeouts = stdout, stderr, [], []

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        self.ran.append(list(argv))
        self.timeouts.append(timeout)
        return CommandResult(tuple(argv), 1 if self.err else 0, self.out, self.err)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PveTree:
    """An /etc/pve-like tree whose CTs are all stopped (the pct stand-in)."""
    monkeypatch.setenv("GPUDOCTOR_PCT", stopped_pct(tmp_path))
    return PveTree(tmp_path)


def layout_of(tree: PveTree) -> Layout:
    return tree.layout(pct=os.environ["GPUDOCTOR_PCT"])


# -- the lock (first: a lock left held would make every later run here wait 900 s) ---


def test_the_lock_lets_one_follow_run_at_a_time(tree: PveTree) -> None:
    layout = tree.layout()
    held, release, failed = threading.Event(), threading.Event(), []

    def holder() -> None:
        try:
            with follow_lock(layout):
                held.set()
                release.wait(30)
        except Exception as exc:  # reported to the test below
            failed.append(exc)
            held.set()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30) and not failed, failed
        with pytest.raises(ApplyError) as busy, follow_lock(layout, wait_s=0.3):
            pass
        assert busy.value.code == "lock_busy"
        assert str(busy.value) == (
            f"another `fix --follow-driver` holds {layout.own_lock_dir}/follow-driver.lock"
        )
    finally:
        release.set()
        thread.join(30)
    assert oct(os.stat(layout.own_lock_dir).st_mode & 0o777) == "0o700"
    # free again once the first is done, and held while taken
    with follow_lock(layout, wait_s=0), pytest.raises(ApplyError), follow_lock(layout, wait_s=0):
        pass
    with follow_lock(layout, wait_s=0):
        pass


# -- what a CT's result and the run's result say ---------------------------------------


@pytest.mark.parametrize(
    ("status", "ok"),
    [("no_devices", True), ("unchanged", True), ("pending", True), ("refused", True),
     ("applied", True), ("applied_not_running", True), ("not_fixed", False),
     ("rolled_back", False), ("error", False)],
)  # fmt: skip
def test_a_ct_is_ok_unless_worse_off_or_not_handled(status: str, ok: bool) -> None:
    assert FollowedCt("200", status, "m").ok is ok


def test_a_cts_result_as_json() -> None:
    ct = FollowedCt("200", "applied", "done", ("allow c 1:3",), restarted=True)
    assert ct.to_dict() == {"ct": "200", "status": "applied", "message": "done",
                            "reasons": ["allow c 1:3"], "restarted": True}  # fmt: skip
    assert FollowedCt("201", "unchanged", "m").to_dict()["restarted"] is False


def test_the_runs_summary_exit_code_and_json() -> None:
    quiet = FollowResult(
        (FollowedCt("200", "no_devices", "m"), FollowedCt("201", "unchanged", "m")), 1
    )
    assert quiet.changed == ()
    assert quiet.summary() == "nothing changed: the 2 CT(s) of this node have the host's devices"
    assert quiet.exit_code == ExitCode.OK
    assert quiet.to_dict() == {"status": "ok", "exit_code": 0, "passes": 1,
                               "summary": quiet.summary(),
                               "cts": [c.to_dict() for c in quiet.cts]}  # fmt: skip

    skipped = FollowResult((), 0, unchanged_since_last=True)
    assert skipped.summary() == (
        "nothing changed: the host's devices are as the last follow left them"
    )
    done = FollowResult((FollowedCt("200", "applied", "m", restarted=True),
                         FollowedCt("201", "unchanged", "m"),
                         FollowedCt("202", "applied_not_running", "m")), 2)  # fmt: skip
    assert [c.ct for c in done.changed] == ["200", "202"]
    assert done.summary() == "3 CT(s) looked at, changed: 200, 202; restarted: 200"
    both = FollowResult(tuple(FollowedCt(c, "applied", "m", restarted=True) for c in "ab"), 1)
    assert both.summary() == "2 CT(s) looked at, changed: a, b; restarted: a, b"
    assert done.exit_code == ExitCode.OK and done.to_dict()["passes"] == 2

    pending = FollowResult((FollowedCt("200", "pending", "m"),), 1, dry_run=True)
    assert pending.summary() == "1 CT(s) looked at, would change: 200; none restarted"
    assert pending.exit_code == ExitCode.NOTHING_DONE
    assert (pending.to_dict()["status"], pending.to_dict()["exit_code"]) == ("pending", 4)
    assert FollowResult((FollowedCt("200", "unchanged", "m"),), 1, True).exit_code == 0

    failed = FollowResult((FollowedCt("200", "pending", "m"), FollowedCt("201", "error", "x")),
                          1, dry_run=True)  # fmt: skip
    assert failed.exit_code == ExitCode.FAILED
    assert (failed.to_dict()["status"], failed.to_dict()["exit_code"]) == ("failed", 3)


# -- which CTs are this node's ---------------------------------------------------------


def test_only_this_nodes_containers_in_numeric_order(tree: PveTree) -> None:
    for vmid in ("1000", "99", "101"):
        tree.add_ct(vmid, PLAIN)
    tree.add_ct("300", PLAIN, node="pve2")
    tree.add_ct("100", "", kind="qemu")
    assert follow.list_cts(LocalHost(), "pve", tree.layout()) == ("99", "101", "1000")


def test_a_vmlist_entry_naming_its_node_by_a_number_is_matched_as_text(tmp_path: Path) -> None:
    tree = PveTree(tmp_path, node="7")
    (tree.root / ".vmlist").write_text(json.dumps({"ids": {
        "200": {"node": 7, "type": "lxc"}, "201": {"type": "lxc"}}}))  # fmt: skip
    assert follow.list_cts(LocalHost(), "pve", tree.layout()) == ("200",)
    (tree.root / ".vmlist").write_text("{}")
    assert follow.list_cts(LocalHost(), "pve", tree.layout()) == ()


@pytest.mark.parametrize("vmlist", [None, "{not json"])
def test_a_node_without_a_readable_vmlist_is_not_proxmox(tree: PveTree, vmlist: str | None) -> None:
    (tree.root / ".vmlist").unlink()
    if vmlist is not None:
        (tree.root / ".vmlist").write_text(vmlist)
    with pytest.raises(ApplyError) as refused:
        follow.list_cts(LocalHost(), "pve", tree.layout())
    assert refused.value.code == "not_pve"
    assert str(refused.value) == (
        f"{tree.root}/.vmlist cannot be read: not a Proxmox VE node (plain LXC: --flavor lxc)"
    )


def test_a_node_whose_name_is_unknown_lists_no_ct(tree: PveTree) -> None:
    tree.add_ct("200", PLAIN)
    (tree.root / "local").unlink()
    with pytest.raises(ApplyError) as refused:
        follow.list_cts(LocalHost(), "pve", tree.layout())
    assert (refused.value.code, str(refused.value)) == (
        "not_pve",
        f"cannot tell this node's name: readlink {tree.root}/local failed",
    )


@pytest.mark.parametrize("link", ["nodes/pve1", "/etc/pve/nodes/pve1", "pve1"])
def test_this_nodes_name_is_the_last_part_of_the_local_link(link: str) -> None:
    vmlist = json.dumps({"ids": {"200": {"node": "pve1", "type": "lxc"},
                                 "201": {"node": "pve2", "type": "lxc"}}})  # fmt: skip
    node = Node(stdout=link + "\n", **{"/p/.vmlist": vmlist})
    assert follow.list_cts(node, "pve", Layout(pve_root="/p")) == ("200",)
    assert (node.ran, node.timeouts) == ([["readlink", "/p/local"]], [15])


def test_plain_lxc_containers_come_from_lxc_ls() -> None:
    node = Node(stdout="web\ndb\nweb\n")
    assert follow.list_cts(node, "lxc", Layout(lxcpath="/srv/lxc")) == ("db", "web")
    assert follow.list_cts(node, "lxc", Layout(lxcpath="")) == ("db", "web")
    assert node.ran == [["test", "-d", "/srv/lxc"], ["lxc-ls", "-1", "-P", "/srv/lxc"],
                        ["lxc-ls", "-1"]]  # fmt: skip
    assert node.timeouts == [15, 60, 60]  # a hung lxc-ls cannot hang the follow
    broken = Node(stderr="x" * 400 + "lxc-ls: permission denied\n")
    with pytest.raises(ApplyError) as failed:
        follow.list_cts(broken, "lxc", Layout(lxcpath=""))
    assert failed.value.code == "io"
    assert (
        str(failed.value) == "lxc-ls -1 failed: " + ("x" * 400 + "lxc-ls: permission denied")[-300:]
    )


def test_an_lxcpath_that_is_no_directory_is_an_error_not_an_empty_node() -> None:
    """Issue 45.3: ``lxc-ls -P /does/not/exist`` lists nothing and succeeds; the follow then
    said "nothing changed: the 0 CT(s) of this node have the host's devices", exit 0."""
    missing = Node(stderr="")
    missing.run = lambda argv, timeout=30.0, input=None: (  # type: ignore[method-assign]
        missing.ran.append(list(argv)) or CommandResult(tuple(argv), 1, "", "")
    )
    with pytest.raises(ApplyError) as failed:
        follow.list_cts(missing, "lxc", Layout(lxcpath="/does/not/exist"))
    assert failed.value.code == "missing" and missing.ran == [["test", "-d", "/does/not/exist"]]
    assert str(failed.value) == (
        "--lxcpath /does/not/exist: no such directory on this host: no CT can be followed there"
    )


def test_a_node_with_no_ct_says_so_in_words() -> None:
    assert FollowResult((), 1).summary() == (
        "no CT found on this node: nothing to follow (is --lxcpath right?)"
    )


def test_a_plain_lxc_node_is_followed_through_lxc_ls(tmp_path: Path) -> None:
    node = Node(stdout="web\n")  # its config is not there: nothing to follow
    layout = Layout(lxcpath="/srv/lxc", own_lock_dir=str(tmp_path / "own"),
                    client_backup_dir=str(tmp_path / "copies"))  # fmt: skip
    done = follow_driver(node, "lxc", layout)
    assert [(c.ct, c.status) for c in done.cts] == [("web", "no_devices")]
    assert node.ran[:2] == [["test", "-d", "/srv/lxc"], ["lxc-ls", "-1", "-P", "/srv/lxc"]]


def test_a_plain_lxc_containers_passed_nodes_are_watched(tmp_path: Path) -> None:
    lxcpath = tmp_path / "lxc"
    (lxcpath / "web").mkdir(parents=True)
    config = lxcpath / "web" / "config"
    config.write_text("lxc.uts.name = web\nlxc.mount.entry = /dev/null dev/fakegpu none bind\n")
    layout = Layout(lxcpath=str(lxcpath), own_lock_dir=str(tmp_path / "own"),
                    client_backup_dir=str(tmp_path / "copies"))  # fmt: skip
    done = follow_driver(LocalHost(), "lxc", layout)  # one pass
    assert (done.passes, [(c.ct, c.status) for c in done.cts]) == (
        1, [("web", "applied_not_running")])  # fmt: skip
    assert "/dev/null dev/fakegpu none bind,create=file\n" in config.read_text()  # as planned
    watched = json.loads(Path(follow.state_path(layout, "")).read_text())[1]
    assert [w[0] for w in watched] == ["/dev/null"]

    devices = tmp_path / "proc-devices"
    devices.write_text("Character devices:\n  1 mem\n")

    def reload_once(text: str) -> None:  # a reload during the first pass: LXC's CTs again
        if text == "follow-driver: pass 1: 1 CT(s) on this node":
            devices.write_text("Character devices:\n  1 mem\n511 nvidia-uvm\n")

    again = follow_driver(ReloadingHost(devices), "lxc", layout, progress=reload_once)
    assert (again.passes, [(c.ct, c.status) for c in again.cts]) == (2, [("web", "unchanged")])


# -- what the host's devices are -------------------------------------------------------


def test_the_fingerprint_is_proc_devices_and_each_paths_numbers() -> None:
    host = RecordedHost(
        files={"/proc/devices": "Character devices:\n195 nvidia\n"},
        nodes={"/dev/nvidia0": FileStat("/dev/nvidia0", "char", 0o666, 195, 0),
               "/dev/nvidia-caps": FileStat("/dev/nvidia-caps", "dir", 0o755),
               "/dev/nvidia-caps/nvidia-cap1": FileStat("/dev/nvidia-caps/nvidia-cap1", "char",
                                                        0o400, 508, 1)},
    )  # fmt: skip
    devices, nodes = follow.fingerprint(host, ("/dev/nvidia0", "/dev/gone"))
    assert devices == "Character devices:\n195 nvidia\n"
    assert nodes[0] == ("/dev/nvidia0", "char", 195, 0, ())
    assert nodes[1][0] == "/dev/gone" and nodes[1][1] != "char"
    _, (caps,) = follow.fingerprint(host, ("/dev/nvidia-caps",))
    assert caps[:2] == ("/dev/nvidia-caps", "dir")
    assert caps[4] == (("/dev/nvidia-caps/nvidia-cap1", 508, 1),)
    assert follow.fingerprint(RecordedHost(), ())[0] == ""  # /proc/devices unreadable


def test_where_the_last_follows_state_is_kept() -> None:
    layout = Layout(own_lock_dir="/run/gpudoctor")
    assert follow.state_path(layout, "") == "/run/gpudoctor/follow-driver.json"
    assert follow.state_path(layout, "root@PVE-1.lan:22/x y") == (
        "/run/gpudoctor/follow-driver-root@PVE-1.lan_22_x_y.json"
    )


# -- the passes ------------------------------------------------------------------------


def test_a_run_changes_only_what_moved_and_a_second_finds_nothing(tree: PveTree) -> None:
    moved = tree.add_ct("200", PASSES_NULL)
    tree.add_ct("201", PLAIN)
    tree.add_ct("202", ALLOWED)
    layout, said = layout_of(tree), []
    dry = follow_driver(LocalHost(), "pve", layout, dry_run=True, progress=said.append)
    assert [(c.ct, c.status) for c in dry.cts] == [
        ("200", "pending"), ("201", "no_devices"), ("202", "unchanged")]  # fmt: skip
    assert dry.passes == 1 and dry.dry_run
    assert [c.message for c in dry.cts] == ["dry run: nothing written",
                                            "passes no device node: not followed",
                                            "its devices are the host's now: not touched"]  # fmt: skip
    assert said == ["follow-driver: pass 1: 3 CT(s) on this node"]
    assert not Path(follow.state_path(layout, "")).exists()  # a dry run leaves no state
    assert moved.read_text() == PASSES_NULL

    said.clear()
    done = follow_driver(LocalHost(), "pve", layout, progress=said.append)
    assert [(c.ct, c.status) for c in done.cts] == [
        ("200", "applied_not_running"), ("201", "no_devices"), ("202", "unchanged")]  # fmt: skip
    assert done.cts[0].reasons and not done.cts[0].restarted and not done.dry_run
    assert said[0] == "follow-driver: pass 1: 3 CT(s) on this node"
    assert said[1].startswith("follow-driver: CT 200: ") and "c 1:3" in said[1]
    assert "saving the backup copy here, before anything is written" in said  # the fixer's own
    assert "lxc.cgroup2.devices.allow: c 1:3 rwm" in moved.read_text()
    assert done.passes == 1
    state = Path(follow.state_path(layout, ""))
    assert json.loads(state.read_text())[1][0][:4] == ["/dev/null", "char", 1, 3]
    assert [p.name for p in state.parent.iterdir() if p.name.endswith(".tmp")] == []

    again = follow_driver(LocalHost(), "pve", layout, if_host_changed=True)
    assert again.unchanged_since_last and again.cts == () and again.passes == 0
    assert again.dry_run is False
    looked = follow_driver(LocalHost(), "pve", layout, dry_run=True, if_host_changed=True)
    assert (looked.unchanged_since_last, looked.passes, looked.dry_run) == (True, 0, True)
    full = follow_driver(LocalHost(), "pve", layout)  # without --if-host-changed: a full look
    assert [c.status for c in full.cts] == ["unchanged", "no_devices", "unchanged"]


def test_the_state_is_per_host_and_a_changed_host_is_looked_at_again(tree: PveTree) -> None:
    conf = tree.add_ct("200", ALLOWED)
    layout = layout_of(tree)
    first = follow_driver(LocalHost(), "pve", layout, host_label="pve1", if_host_changed=True)
    assert [c.status for c in first.cts] == ["unchanged"]  # no state yet: a full look
    assert Path(follow.state_path(layout, "pve1")).exists()
    assert not follow_driver(LocalHost(), "pve", layout, host_label="pve2",
                             if_host_changed=True).unchanged_since_last  # fmt: skip
    conf.write_text(ALLOWED + "lxc.mount.entry: /dev/zero dev/z none bind,create=file\n")
    second = follow_driver(LocalHost(), "pve", layout, host_label="pve1", if_host_changed=True)
    assert [c.status for c in second.cts] == ["applied_not_running"]
    assert second.cts[0].message == (
        "applied; the CT is stopped: the new rules apply at its next start"
    )
    assert "c 1:5 rwm" in conf.read_text()
    assert [p.name for p in tree.client_backup_dir.iterdir()] == ["pve1"]  # the node's label


def test_devices_that_move_during_a_pass_make_another_pass_at_most_three(
    tree: PveTree, tmp_path: Path
) -> None:
    tree.add_ct("200", ALLOWED)
    devices = tmp_path / "proc-devices"
    devices.write_text("Character devices:\n  1 mem\n511 nvidia-uvm\n")
    host, layout = ReloadingHost(devices), layout_of(tree)
    reloads = iter(["510 nvidia-uvm\n"])

    def reload_once(text: str) -> None:  # the driver reloads during the first pass
        if text.startswith("follow-driver: pass "):
            devices.write_text("Character devices:\n  1 mem\n" + next(reloads, "510 nvidia-uvm\n"))

    said: list[str] = []
    twice = follow_driver(host, "pve", layout, progress=lambda t: (said.append(t), reload_once(t)))
    assert twice.passes == 2
    assert said == ["follow-driver: pass 1: 1 CT(s) on this node",
                    "follow-driver: the host's devices changed during the pass: again",
                    "follow-driver: pass 2: 1 CT(s) on this node"]  # fmt: skip
    assert json.loads(Path(follow.state_path(layout, "")).read_text())[0].endswith(
        "510 nvidia-uvm\n"
    )

    count = iter(range(100))

    def reload_every_pass(text: str) -> None:
        if text.startswith("follow-driver: pass "):
            devices.write_text(f"Character devices:\n  1 mem\n{next(count)} nvidia-uvm\n")

    busy = follow_driver(host, "pve", layout, progress=reload_every_pass)
    assert busy.passes == follow.MAX_PASSES == 3
    assert [c.status for c in busy.cts] == ["unchanged"]
    dry = follow_driver(host, "pve", layout, dry_run=True, progress=reload_every_pass)
    assert dry.passes == 1  # a dry run changes nothing: one look is the answer


def test_a_ct_changed_in_an_earlier_pass_keeps_that_result(tree: PveTree, tmp_path: Path) -> None:
    """The second pass finds nothing to follow on CT 200 (its config gone since): the run
    reports what the first pass did to it."""
    conf = tree.add_ct("200", PASSES_NULL)
    devices = tmp_path / "proc-devices"
    devices.write_text("Character devices:\n  1 mem\n")
    reloads = iter(["511 nvidia-uvm\n"])

    def reload_once(text: str) -> None:
        if text.startswith("follow-driver: pass "):
            devices.write_text("Character devices:\n  1 mem\n" + next(reloads, "511 nvidia-uvm\n"))
        if text.startswith("follow-driver: pass 2"):  # and its config goes away meanwhile
            conf.unlink()

    done = follow_driver(ReloadingHost(devices), "pve", layout_of(tree), progress=reload_once)
    assert done.passes == 2
    assert [(c.ct, c.status) for c in done.cts] == [("200", "applied_not_running")]
    assert done.changed == done.cts


def test_the_watched_paths_are_those_the_cts_pass_once_each(tree: PveTree) -> None:
    tree.add_ct("200", ALLOWED)
    tree.add_ct("201", ALLOWED + "lxc.mount.entry: /dev/zero dev/z none bind,create=file\n")
    tree.add_ct("202", PLAIN)
    tree.add_ct("203", "lxc.mount.entry: /dev/full dev/f none bind\n", node="pve2")
    # a CT that cannot be read (404) adds nothing, and the others are still looked at
    paths = follow._watched_paths(LocalHost(), "pve", tree.layout(), ("404", "200", "201", "202"))
    assert paths == ("/dev/null", "/dev/zero")


# -- one CT ----------------------------------------------------------------------------


def test_a_listed_ct_without_a_config_is_not_followed(tree: PveTree) -> None:
    tree.add_ct("200", PASSES_NULL).unlink()
    done = follow.follow_ct(LocalHost(), "200", "pve", layout_of(tree))
    assert done.status == "no_devices" and done.message.startswith("not a CT with a config: ")
    assert done.ok


def test_a_locked_ct_is_refused_not_changed(tree: PveTree) -> None:
    conf = tree.add_ct("200", PASSES_NULL + "lock: backup\n")
    done = follow.follow_ct(LocalHost(), "200", "pve", layout_of(tree))
    assert (done.ct, done.status, done.reasons) == ("200", "refused", ())
    assert done.message.startswith("CT 200 is locked (backup)")
    assert conf.read_text() == PASSES_NULL + "lock: backup\n"
    dry = follow.follow_ct(LocalHost(), "200", "pve", layout_of(tree), dry_run=True)
    assert dry.status == "refused"  # not a change pending: nothing can be done now


def test_a_ct_changed_without_a_label_keeps_its_copy_under_the_hosts_name(tree: PveTree) -> None:
    tree.add_ct("200", PASSES_NULL)
    done = follow.follow_ct(LocalHost(name="pve-a"), "200", "pve", layout_of(tree))
    assert done.status == "applied_not_running"
    assert [p.name for p in tree.client_backup_dir.iterdir()] == ["pve-a"]
    tree.add_ct("201", PASSES_NULL)
    follow.follow_ct(LocalHost(), "201", "pve", layout_of(tree), host_label="root@pve1")
    assert sorted(p.name for p in tree.client_backup_dir.iterdir()) == ["pve-a", "root@pve1"]


@pytest.mark.parametrize(
    "error",
    [ApplyError("io", "cannot read the config"), FixPlanError("no plan"),
     ConfigError("not a config"), HostError("pve1 cannot be reached")],
)  # fmt: skip
def test_a_ct_that_cannot_be_handled_is_an_error_with_its_reason(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def failing(*args: object, **kwargs: object) -> FixOutcome:
        raise error

    monkeypatch.setattr(follow, "run_fix", failing)  # the fixer's run, failing as it can
    done = follow.follow_ct(LocalHost(), "200", "pve", layout_of(tree))
    assert (done.ct, done.status, done.message, done.ok) == ("200", "error", str(error), False)


def test_a_ct_is_restarted_only_when_its_init_pid_changed(
    tree: PveTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixer's run on a running CT, as it reports it (a restart needs a real
    container; the lab drill has one): the init PID before and after."""
    plan = FixPlan("a", "b", diff="diff", explanation=("allow c 511:0", "restart"),
                   probe_nodes=(("/dev/nvidia-uvm", 511, 0),))  # fmt: skip
    for pids, restarted in (((10, 42), True), ((10, 10), False), ((10, None), False),
                            ((None, 42), True), ((None, None), False)):  # fmt: skip
        runs: list[tuple[bool, bool, str, bool]] = []
        said: list[str] = []

        def fixer(host, options, progress=None, host_label="", pids=pids, runs=runs, said=said):
            runs.append((options.dry_run, options.yes, host_label, progress == said.append))
            if options.dry_run:
                return FixOutcome("dry_run", 4, "dry run", plan=plan)
            return FixOutcome("applied", 0, "restarted", plan=plan, init_pids=pids)

        monkeypatch.setattr(follow, "run_fix", fixer)
        done = follow.follow_ct(LocalHost(), "200", "pve", layout_of(tree), progress=said.append,
                                host_label="root@pve1")  # fmt: skip
        assert (done.status, done.restarted, done.reasons) == (
            "applied",
            restarted,
            plan.explanation,
        )
        # looked at first, then applied with --yes; the node's label reaches both (it names
        # the host in the host cause and the client copy); the fixer's steps are shown
        assert runs == [(True, False, "root@pve1", False), (False, True, "root@pve1", True)]
        assert said == ["follow-driver: CT 200: allow c 511:0; restart"]
