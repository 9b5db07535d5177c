"""``fix --follow-driver`` on a Proxmox-like tree (LocalHost, real files and real char nodes
of this machine; the pct stand-in of tests/pve/support.py says every CT is stopped, so
nothing is restarted): only the CT whose passed node no rule allows is changed, a CT that
passes no node and one whose node is allowed are never touched, a second run and a
``--if-host-changed`` run change nothing; the lock lets one run at a time.

The restart of a running CT whose node moved, under a real systemd trigger, is in
tests/ops/test_follow_driver_drill.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpudoctor.pve.apply import ApplyError
from gpudoctor.pve.follow import follow_lock, state_path
from tests.fakes.pvetree import PveTree
from tests.pve.support import fix_in_process, stopped_pct

PASSES_NULL = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"
PLAIN = "arch: amd64\nhostname: web\n"


def test_only_the_ct_whose_node_is_not_allowed_is_changed_and_a_rerun_is_a_no_op(tmp_path) -> None:
    tree = PveTree(tmp_path)
    moved = tree.add_ct("200", PASSES_NULL)  # /dev/null is 1:3 and no rule allows it
    plain = tree.add_ct("201", PLAIN)  # passes no device: never looked at further
    right = tree.add_ct("202", PASSES_NULL + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    tree.add_ct("300", PASSES_NULL, node="pve2")  # another node's CT: not this node's
    before = {p: p.read_bytes() for p in (moved, plain, right)}
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))

    dry = fix_in_process(["--follow-driver", "--dry-run", "--json"], env)
    assert dry.exit_code == 4, dry.output
    doc = json.loads(dry.stdout)
    statuses = {c["ct"]: c["status"] for c in doc["cts"]}
    assert statuses == {"200": "pending", "201": "no_devices", "202": "unchanged"}
    assert any("c 1:3 rwm" in r for r in doc["cts"][0]["reasons"])
    assert {p: p.read_bytes() for p in before} == before and tree.backups() == []

    done = fix_in_process(["--follow-driver", "--yes"], env)
    assert done.exit_code == 0, done.output
    assert "CT 200: applied_not_running" in done.stdout
    assert "lxc.cgroup2.devices.allow: c 1:3 rwm" in moved.read_text()
    assert (plain.read_bytes(), right.read_bytes()) == (before[plain], before[right])
    assert len(tree.backups()) == 1

    again = fix_in_process(["--follow-driver", "--yes"], env)
    assert again.exit_code == 0 and "follow-driver: nothing changed: the 3 CT(s)" in again.stdout
    assert len(tree.backups()) == 1
    quick = fix_in_process(["--follow-driver", "--if-host-changed", "--yes"], env)
    assert "as the last follow left them" in quick.stdout, quick.output


def test_if_host_changed_looks_again_when_a_passed_node_changed(tmp_path) -> None:
    """The fingerprint of the last follow covers the nodes the CTs pass: a CT config that
    now passes another node (/dev/zero) makes the next --if-host-changed run look."""
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", PASSES_NULL + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))
    first = fix_in_process(["--follow-driver", "--if-host-changed", "--yes"], env)
    assert "nothing changed: the 1 CT(s)" in first.stdout, first.output  # no state: a full look
    conf.write_text(conf.read_text() + "lxc.mount.entry: /dev/zero dev/z none bind,create=file\n")
    second = fix_in_process(["--follow-driver", "--if-host-changed", "--yes"], env)
    assert "CT 200: applied_not_running" in second.stdout, second.output
    assert "c 1:5 rwm" in conf.read_text()
    layout = tree.layout()
    saved = json.loads(Path(state_path(layout, "")).read_text())
    assert saved[1][-1][0] == "/dev/zero"


def test_follow_driver_usage_errors() -> None:
    bad = fix_in_process(["--follow-driver", "--ct", "200"], {})
    assert bad.exit_code == 2 and "--follow-driver looks at every CT" in bad.output
    lone = fix_in_process(["--if-host-changed"], {})
    assert lone.exit_code == 2 and "goes with --follow-driver" in lone.output


def test_one_follow_at_a_time(tmp_path) -> None:
    layout = PveTree(tmp_path).layout()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with follow_lock(layout):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        with pytest.raises(ApplyError) as busy, follow_lock(layout, wait_s=0.3):
            pass
        assert busy.value.code == "lock_busy"
    finally:
        release.set()
        thread.join(30)
    with follow_lock(layout, wait_s=0.3):  # free again once the first is done
        pass


def test_a_node_whose_name_cannot_be_read_touches_no_ct(tmp_path) -> None:
    """pmxcfs shows every node's configs: without /etc/pve/local (this node's name) the
    follow refuses (exit 1) instead of following other nodes' CTs."""
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", PASSES_NULL)
    (tree.root / "local").unlink()
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))
    result = fix_in_process(["--follow-driver", "--yes"], env)
    assert result.exit_code == 1 and "cannot tell this node's name" in result.output
    assert conf.read_text() == PASSES_NULL


def test_cts_are_followed_and_reported_in_numeric_order(tmp_path) -> None:
    tree = PveTree(tmp_path)
    for vmid in ("1000", "99", "101"):
        tree.add_ct(vmid, PLAIN)
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))
    done = fix_in_process(["--follow-driver", "--dry-run", "--json"], env)
    assert [c["ct"] for c in json.loads(done.stdout)["cts"]] == ["99", "101", "1000"]


def test_a_follow_on_an_lxcpath_that_does_not_exist_is_an_error(tmp_path) -> None:
    """Issue 45.3: `fix --follow-driver --flavor lxc --lxcpath /does/not/exist` said
    "nothing changed: the 0 CT(s) of this node have the host's devices", exit 0: a unit
    installed with that typo would never do anything and never say so."""
    env = {"GPUDOCTOR_LOCK_DIR": str(tmp_path / "own"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "copies")}  # fmt: skip
    missing = str(tmp_path / "does" / "not" / "exist")
    done = fix_in_process(
        ["--follow-driver", "--flavor", "lxc", "--lxcpath", missing, "--yes"], env
    )
    assert done.exit_code == 1, done.output
    assert f"--lxcpath {missing}: no such directory on this host" in done.output
    empty = tmp_path / "empty"  # a directory with no CT: said in words, not "nothing changed"
    empty.mkdir()
    none = fix_in_process(
        ["--follow-driver", "--flavor", "lxc", "--lxcpath", str(empty), "--yes"], env
    )
    assert none.exit_code == 0, none.output
    assert "follow-driver: no CT found on this node: nothing to follow" in none.stdout


@pytest.mark.parametrize("args", [["--ct", "web"], ["--follow-driver", "--yes"]])
def test_a_relative_lxcpath_is_refused_as_check_refuses_it(tmp_path, args, monkeypatch) -> None:
    """Issue 45.4: `fix --flavor lxc --lxcpath lxc` on a running CT wrote the config, said
    "the CT is stopped" (the state was asked elsewhere) and exited 0; check refuses it."""
    (tmp_path / "lxc" / "web").mkdir(parents=True)
    config = tmp_path / "lxc" / "web" / "config"
    config.write_text("lxc.uts.name = web\nlxc.mount.entry = /dev/null dev/fakegpu none bind\n")
    before = config.read_bytes()
    env = {"GPUDOCTOR_LOCK_DIR": str(tmp_path / "own"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "copies")}  # fmt: skip
    monkeypatch.chdir(tmp_path)  # "lxc" names tmp_path/lxc from here
    refused = fix_in_process([*args, "--flavor", "lxc", "--lxcpath", "lxc"], env)
    assert refused.exit_code == 2, refused.output
    assert "--lxcpath 'lxc': give an absolute directory" in refused.output
    assert config.read_bytes() == before


def test_an_lxcpath_for_a_proxmox_ct_is_refused_not_ignored(tmp_path) -> None:
    """Beyond issue 45's list: `fix --ct 200 --lxcpath /srv/lxc` (Proxmox flavor) ignored
    the path without a word and fixed /etc/pve's CT 200; check refuses the same line."""
    env = {"GPUDOCTOR_LOCK_DIR": str(tmp_path / "own"),
           "GPUDOCTOR_CLIENT_BACKUP_DIR": str(tmp_path / "copies")}  # fmt: skip
    refused = fix_in_process(["--ct", "200", "--lxcpath", str(tmp_path), "--dry-run"], env)
    assert refused.exit_code == 2, refused.output
    assert "--lxcpath is for plain LXC containers: add --flavor lxc" in refused.output


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="the attack needs root as the victim and setpriv")  # fmt: skip
@pytest.mark.parametrize("plant", ["mkfifo {state}", "ln -s {victim} {state}"])
def test_a_state_file_nobody_planted_is_never_read_nor_written_through(
    public_tmp_path: Path, plant: str
) -> None:
    """Issue 46.12: the fingerprint state was read with ``open()`` and written with its own
    ``open(..., "w")``, outside fsio. With a lock directory others can write (sticky, as
    ``/tmp``), nobody's FIFO there held ``fix --follow-driver --if-host-changed`` for good,
    and a link was followed. Through fsio: a FIFO is not waited on, a link not followed;
    the state is replaced by root's own file (rename), the victim untouched."""
    tree = PveTree(public_tmp_path / "tree")
    tree.add_ct("200", PASSES_NULL + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    run = public_tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o1777)
    victim = public_tmp_path / "victim"
    victim.write_text("root's file\n")
    state = run / "follow-driver.json"
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c"]
    subprocess.run([*command, plant.format(state=state, victim=victim)], check=True)
    env = {**os.environ, **tree.env(GPUDOCTOR_PCT=stopped_pct(public_tmp_path)),
           "GPUDOCTOR_LOCK_DIR": str(run)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "fix", "--follow-driver", "--if-host-changed", "--yes"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing changed: the 1 CT(s)" in done.stdout  # a full look: no state was read
    assert victim.read_text() == "root's file\n"
    assert state.is_file() and not state.is_symlink() and os.stat(state).st_uid == 0
    assert json.loads(state.read_text())[1][0][0] == "/dev/null"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
