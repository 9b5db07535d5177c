"""Where a CT's config is and the one locked write of it, in-process and fast: each
refusal's one-line text, the layout read from the environment, the backup's name, the
write's argv, each failure of the host program as the error the user reads, and the
client-side backup copy (real files in tmp_path through LocalHost).

What cannot be produced here has a stand-in, named where it is used: a host program that
exits with each of its documented codes (a read-back that differs needs a pmxcfs that
loses a write; Proxmox holding its config lock for 10 s would make the test 10 s long),
and a node reached over SSH whose ``lxc-config`` and ``readlink`` answer as told."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpudoctor.hosts.base import CommandResult
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve import apply
from gpudoctor.pve.apply import (
    ApplyError,
    Layout,
    Target,
    backup_name,
    compare_and_swap,
    discard_client_copy,
    read_bytes,
    read_config,
    refusal,
    resolve_target,
    save_client_copy,
    sha1_hex,
    write_command,
)
from gpudoctor.pve.conf_program import HOST_PROGRAM
from tests.fakes.pvetree import PveTree
from tests.fakes.recorded_host import RecordedHost

CONF = "arch: amd64\nhostname: ct\n"


class Node(RecordedHost):
    """A node reached over SSH: each command whose argv starts with a key of ``answers``
    gives that (returncode, stdout, stderr); others exit 0 with no output. Every
    command is recorded in ``ran`` as (argv, timeout, stdin)."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]] | None = None,
                 **files: str) -> None:  # fmt: skip
        super().__init__(files=dict(files))
        self.answers = answers or {}
        self.ran: list[tuple[list[str], float, str | None]] = []

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        self.ran.append((list(argv), timeout, input))
        for key, (rc, out, err) in self.answers.items():
            if tuple(argv[: len(key)]) == key:
                return CommandResult(tuple(argv), rc, out, err)
        return CommandResult(tuple(argv), 0)


@pytest.fixture
def tree(tmp_path: Path) -> PveTree:
    return PveTree(tmp_path)


# -- the layout ------------------------------------------------------------------------


def test_the_layout_is_a_real_proxmox_hosts_unless_the_environment_says_otherwise() -> None:
    default = Layout.from_env({"XDG_STATE_HOME": "/state"})
    assert default == Layout(client_backup_dir="/state/gpudoctor/backups")
    assert (default.pve_root, default.lock_dir, default.backup_dir, default.pct) == (
        "/etc/pve", "/run/lock/lxc", "/var/lib/gpudoctor/backups", "pct")  # fmt: skip
    assert (default.lxcpath, default.python, default.own_lock_dir, default.pveversion) == (
        None, "python3", "/run/gpudoctor", "pveversion")  # fmt: skip
    env = {
        "GPUDOCTOR_PVE_ROOT": "/r", "GPUDOCTOR_PVE_LOCK_DIR": "/l", "GPUDOCTOR_HOST_BACKUP_DIR": "/b",
        "GPUDOCTOR_CLIENT_BACKUP_DIR": "/c", "GPUDOCTOR_PCT": "/bin/pct", "GPUDOCTOR_LXCPATH": "/x",
        "GPUDOCTOR_LOCK_DIR": "/o", "GPUDOCTOR_PVEVERSION": "/bin/pvev",
    }  # fmt: skip
    assert Layout.from_env(env) == Layout("/r", "/l", "/b", "/c", "/bin/pct", "/x", "python3",
                                          "/o", "/bin/pvev")  # fmt: skip
    assert Layout.from_env({"GPUDOCTOR_LXCPATH": "", "XDG_STATE_HOME": "/s"}).lxcpath is None


def test_without_xdg_state_home_the_copy_goes_under_the_home_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", "")
    assert Layout.from_env().client_backup_dir == f"{tmp_path}/.local/state/gpudoctor/backups"
    monkeypatch.setenv("GPUDOCTOR_PCT", "/opt/pct")
    assert Layout.from_env().pct == "/opt/pct"


# -- where the config is ---------------------------------------------------------------


def test_a_proxmox_ct_is_found_on_its_node(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    target = resolve_target(LocalHost(), "pve", "200", tree.layout())
    assert target == Target("pve", "200", str(path), f"{tree.lock_dir}/pve-config-200.lock",
                            "pve1")  # fmt: skip


@pytest.mark.parametrize(
    ("ct", "message"),
    [("web", "--ct 'web': a Proxmox CT id is a number (plain LXC: --flavor lxc)"),
     ("999", "CT 999 does not exist in this cluster (ROOT/.vmlist)"),
     ("300", "guest 300 is a qemu VM, not a container"),
     ("201", "CT 201 lives on node 'pve2', not 'pve1': run with --host pve2")],
)  # fmt: skip
def test_each_ct_that_cannot_be_fixed_here_is_refused_in_one_line(
    tree: PveTree, ct: str, message: str
) -> None:
    tree.add_ct("201", CONF, node="pve2")
    tree.add_ct("300", "memory: 512\n", kind="qemu")
    with pytest.raises(ApplyError) as refused:
        resolve_target(LocalHost(), "pve", ct, tree.layout())
    assert str(refused.value) == message.replace("ROOT", str(tree.root))
    codes = {"web": "usage", "201": "other_node"}
    assert refused.value.code == codes.get(ct, "unknown_ct")


def test_a_vmlist_that_is_missing_or_not_json_means_not_proxmox(tree: PveTree) -> None:
    (tree.root / ".vmlist").write_text("{")
    with pytest.raises(ApplyError) as bad:
        resolve_target(LocalHost(), "pve", "200", tree.layout())
    assert (bad.value.code, str(bad.value)) == ("not_pve", f"{tree.root}/.vmlist is not valid JSON")
    (tree.root / ".vmlist").unlink()
    with pytest.raises(ApplyError) as missing:
        resolve_target(LocalHost(), "pve", "200", tree.layout())
    assert (missing.value.code, str(missing.value)) == ("not_pve", f"{tree.root}/.vmlist is "
                                                        "missing: not a Proxmox VE host (plain "
                                                        "LXC: --flavor lxc)")  # fmt: skip
    (tree.root / ".vmlist").write_text("{}")
    with pytest.raises(ApplyError) as empty:
        resolve_target(LocalHost(), "pve", "200", tree.layout())
    assert empty.value.code == "unknown_ct"


def test_a_node_whose_own_name_is_unknown_takes_the_owner_from_vmlist(tree: PveTree) -> None:
    tree.add_ct("201", CONF, node="pve2")
    (tree.root / "local").unlink()
    target = resolve_target(LocalHost(), "pve", "201", tree.layout())
    assert (target.node, target.config_path) == ("pve2", f"{tree.root}/nodes/pve2/lxc/201.conf")
    vmlist = '{"ids": {"202": {"type": "lxc"}}}'
    node = Node({("readlink",): (0, "nodes/pve1\n", "")}, **{"/p/.vmlist": vmlist})
    with pytest.raises(ApplyError) as other:  # an entry without a node is nobody's
        resolve_target(node, "pve", "202", Layout(pve_root="/p"))
    assert str(other.value) == "CT 202 lives on node '', not 'pve1': run with --host "
    assert node.ran[0][:2] == (["readlink", "/p/local"], 15)


@pytest.mark.parametrize("link", ["nodes/pve1", "/etc/pve/nodes/pve1", "pve1"])
def test_this_nodes_name_is_the_last_part_of_the_local_link(link: str) -> None:
    vmlist = '{"ids": {"201": {"type": "lxc", "node": "pve2"}}}'
    node = Node({("readlink",): (0, link + "\n", "")}, **{"/p/.vmlist": vmlist})
    with pytest.raises(ApplyError) as other:
        resolve_target(node, "pve", "201", Layout(pve_root="/p"))
    assert "not 'pve1'" in str(other.value)


def test_a_plain_lxc_container_is_its_lxcpaths_folder(tmp_path: Path) -> None:
    (tmp_path / "lxcX" / "web").mkdir(parents=True)  # any name: one ending in X too
    (tmp_path / "lxcX" / "web" / "config").write_text("lxc.uts.name = web\n")
    layout = Layout(lxcpath=f"{tmp_path}/lxcX/", own_lock_dir="/run/gd")
    assert resolve_target(LocalHost(), "lxc", "web", layout) == Target(
        "lxc", "web", f"{tmp_path}/lxcX/web/config", "/run/gd/lxc-web.lock")  # fmt: skip
    snap = read_config(LocalHost(), resolve_target(LocalHost(), "lxc", "web", layout), layout)
    assert snap.config.flavor == "lxc" and snap.config.get("lxc.uts.name") == "web"
    with pytest.raises(ApplyError) as unknown:
        resolve_target(LocalHost(), "lxc", "db", layout)
    assert (unknown.value.code, str(unknown.value)) == (
        "unknown_ct",
        f"no LXC container 'db': {tmp_path}/lxcX/db/config does not exist",
    )


@pytest.mark.parametrize(
    ("answer", "lxcpath"),
    [((0, "/srv/lxc\n", ""), "/srv/lxc"), ((0, "\n", ""), "/var/lib/lxc"),
     ((1, "/srv/lxc\n", "no lxc-config"), "/var/lib/lxc")],
)  # fmt: skip
def test_without_an_lxcpath_lxcs_own_default_is_asked(
    answer: tuple[int, str, str], lxcpath: str
) -> None:
    node = Node({("lxc-config",): answer}, **{f"{lxcpath}/web/config": "lxc.uts.name = web\n"})
    target = resolve_target(node, "lxc", "web", Layout())
    assert target.config_path == f"{lxcpath}/web/config"
    assert node.ran == [(["lxc-config", "lxc.lxcpath"], 15, None)]


# -- reading it ------------------------------------------------------------------------


def test_reading_gives_the_exact_bytes_and_their_sha1(tree: PveTree) -> None:
    path = tree.add_ct("200", "")
    path.write_bytes(b"arch: amd64\r\n\xff\n")
    data, sha = read_bytes(LocalHost(), str(path), tree.layout())
    assert (data, sha) == (b"arch: amd64\r\n\xff\n", sha1_hex(b"arch: amd64\r\n\xff\n"))
    assert sha1_hex(b"") == "da39a3ee5e6b4b0d3255bfef95601890afd80709"  # sha1sum of nothing
    with pytest.raises(ApplyError) as missing:
        read_bytes(LocalHost(), f"{path}.gone", tree.layout())
    assert (missing.value.code, str(missing.value)) == ("missing", f"{path}.gone does not exist")
    with pytest.raises(ApplyError) as folder:
        read_bytes(LocalHost(), str(path.parent), tree.layout())
    assert (folder.value.code, str(folder.value)) == (
        "io",
        f"cannot read {path.parent}: Is a directory",
    )


def test_a_file_larger_than_any_config_is_refused_not_read_in_part(tmp_path: Path) -> None:
    huge = tmp_path / "200.conf"
    with huge.open("wb") as fh:  # sparse: no 64 MiB written
        fh.truncate(apply.MAX_READ + 1)
    with pytest.raises(ApplyError) as refused:
        read_bytes(LocalHost(), str(huge), Layout())
    assert (refused.value.code, str(refused.value)) == (
        "io", f"{huge} is larger than 64 MiB: refused, a plan needs the whole file")  # fmt: skip
    with huge.open("wb") as fh:
        fh.truncate(apply.MAX_READ)
    data, _ = read_bytes(LocalHost(), str(huge), Layout())
    assert len(data) == apply.MAX_READ == 64 << 20  # read whole up to the limit


def test_an_apply_error_carries_its_code_and_no_details_unless_given() -> None:
    plain = ApplyError("io", "cannot read")
    assert (plain.code, str(plain), plain.details) == ("io", "cannot read", ())
    assert ApplyError("start_failed", "m", ("hook: x",)).details == ("hook: x",)


def test_a_config_that_vanished_is_an_unknown_ct(tree: PveTree) -> None:
    path = tree.add_ct("200", CONF)
    target = resolve_target(LocalHost(), "pve", "200", tree.layout())
    snap = read_config(LocalHost(), target, tree.layout())
    assert (snap.data, snap.sha1, snap.config.get("hostname")) == (
        CONF.encode(), sha1_hex(CONF.encode()), "ct")  # fmt: skip
    path.unlink()
    with pytest.raises(ApplyError) as gone:
        read_config(LocalHost(), target, tree.layout())
    assert (gone.value.code, str(gone.value)) == ("unknown_ct", f"{path} does not exist")
    path.mkdir()
    with pytest.raises(ApplyError) as folder:
        read_config(LocalHost(), target, tree.layout())
    assert folder.value.code == "io"


def test_a_locked_ct_or_a_template_is_not_touched(tree: PveTree) -> None:
    host, layout = LocalHost(), tree.layout()
    cases = {"200": ("lock: backup\n", "CT 200 is locked (backup): wait for that task to "
                     "finish, or run `pct unlock 200` if the lock is stale"),
             "201": ("template: 1\n", "CT 201 is a template: templates never run, convert "
                     "it or fix a clone"),
             "202": ("template: 0\n", None), "203": ("", None)}  # fmt: skip
    for vmid, (line, why) in cases.items():
        tree.add_ct(vmid, CONF + line)
        target = resolve_target(host, "pve", vmid, layout)
        assert refusal(read_config(host, target, layout).config, target) == why, vmid


@pytest.fixture
def local_tokyo(monkeypatch: pytest.MonkeyPatch):
    """This process's local time is Tokyo's (UTC+9) during the test."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# -- the write -------------------------------------------------------------------------


def test_the_backups_name_says_which_ct_when_and_what_it_held(local_tokyo: None) -> None:
    target = Target("pve", "200", "/c", "/l")
    when = dt.datetime(2026, 12, 4, 1, 2, 3, 4, tzinfo=dt.timezone.utc)
    assert backup_name(target, "0123456789abcdef", when) == (
        "ct-200/20261204T010203.000004Z-0123456789ab.conf"
    )
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    name = backup_name(target, "f" * 40)  # local time is Tokyo's here: still UTC
    stamp = re.fullmatch(r"ct-200/(\d{8}T\d{6})\.\d{6}Z-f{12}\.conf", name)
    assert stamp, name
    taken = dt.datetime.strptime(stamp[1], "%Y%m%dT%H%M%S").replace(tzinfo=dt.timezone.utc)
    assert before <= taken <= dt.datetime.now(dt.timezone.utc)  # UTC, not local time


def test_the_write_takes_proxmoxs_lock_with_flock_or_gpudoctors_own_itself() -> None:
    layout = Layout(python="/usr/bin/python3", own_lock_dir="/run/gdX/")
    proxmox = Target("pve", "200", "/etc/pve/lxc/200.conf", "/run/lock/lxc/pve-config-200.lock")
    program = ["/usr/bin/python3", "-I", "-c", HOST_PROGRAM, "write", "/etc/pve/lxc/200.conf",
               "abc"]  # fmt: skip
    assert write_command(proxmox, layout, "abc", "/b/x.conf") == [
        "flock", "-E", "75", "-w", "10", "/run/lock/lxc/pve-config-200.lock", *program,
        "/b/x.conf"]  # fmt: skip
    own = Target("lxc", "web", "/var/lib/lxc/web/config", "/run/gdX/lxc-web.lock")
    assert write_command(own, layout, "abc", "") == [
        "/usr/bin/python3", "-I", "-c", HOST_PROGRAM, "write", "/var/lib/lxc/web/config", "abc",
        "-", "/run/gdX/lxc-web.lock"]  # fmt: skip
    beside = Target("lxc", "web", "/c", "/run/gdX-other/lxc-web.lock")  # not inside the dir
    assert write_command(beside, layout, "abc", "")[0] == "flock"


def test_a_written_config_is_verified_and_proxmoxs_lock_dir_is_left_as_proxmox_makes_it(
    tree: PveTree,
) -> None:
    path = tree.add_ct("200", CONF)
    host, layout = LocalHost(), tree.layout(own_lock_dir=str(tree.lock_dir.parent / "own"))
    target = resolve_target(host, "pve", "200", layout)
    old = os.umask(0o022)
    try:
        done = compare_and_swap(host, target, layout, sha1_hex(CONF.encode()), b"arch: amd64\n")
    finally:
        os.umask(old)
    assert done == apply.WriteResult(sha1_hex(CONF.encode()), sha1_hex(b"arch: amd64\n"), "")
    assert path.read_bytes() == b"arch: amd64\n"
    assert tree.lock_dir.stat().st_mode & 0o777 == 0o755  # not gpudoctor's private 0700
    assert tree.backups() == []  # no backup asked for, none made


@pytest.mark.parametrize(
    ("rc", "stderr", "code", "message"),
    [(10, "", "changed", "CONF changed since the plan was made; nothing written. Run again."),
     (75, "", "lock_busy", "LOCK is held by another task for 10 s"),
     (12, "", "unknown_ct", "CONF disappeared"),
     (11, "", "verify", "CONF read back different from what was written; the old bytes were "
      "put back, nothing changed. Check the filesystem (pmxcfs: `pvecm status`)"),
     (13, "", "verify", "CONF read back different from what was written, and putting the old "
      "bytes back failed too: the old config is saved in /b/x.conf"),
     (1, "Traceback (most recent call last):\n  File x\nOSError: [Errno 28] No space left on device", "io",
      "writing CONF failed: OSError: [Errno 28] No space left on device"),
     (1, "flock: failed", "io", "writing CONF failed: flock: failed"),
     (137, "", "io", "writing CONF failed: exit status 137")],
)  # fmt: skip
def test_each_way_the_host_program_fails_is_one_error_the_user_can_act_on(
    rc: int, stderr: str, code: str, message: str
) -> None:
    """The host program's exit codes, as a host where each happens reports them."""
    layout = Layout(python="python3")
    target = Target("pve", "200", "/etc/pve/lxc/200.conf", "/run/lock/lxc/pve-config-200.lock")
    node = Node({("flock",): (rc, "", stderr)})
    with pytest.raises(ApplyError) as failed:
        compare_and_swap(node, target, layout, "abc", b"new\n", "/b/x.conf")
    expected = message.replace("CONF", target.config_path).replace("LOCK", target.lock_path)
    assert (failed.value.code, str(failed.value)) == (code, expected)
    mkdir, write = node.ran
    assert mkdir == (["mkdir", "-p", "/run/lock/lxc"], 15, None)  # Proxmox's: its own mode
    assert write[0] == write_command(target, layout, "abc", "/b/x.conf")
    assert write[1:] == (40, "bmV3Cg==")  # 10 s for the lock, 30 for the write; base64


def test_a_read_back_that_failed_without_a_backup_says_nothing_of_one() -> None:
    node = Node({("flock",): (13, "", "")})
    target = Target("pve", "200", "/c.conf", "/l/pve-config-200.lock")
    with pytest.raises(ApplyError) as failed:
        compare_and_swap(node, target, Layout(), "abc", b"new\n")
    assert str(failed.value).endswith("putting the old bytes back failed too")


def test_gpudoctors_own_lock_dir_is_made_private(tmp_path: Path) -> None:
    node = Node({("python3",): (0, '{"old_sha1": "a", "new_sha1": "b"}', "")})
    target = Target("lxc", "web", "/c", f"{tmp_path}/ownX/lxc-web.lock")
    done = compare_and_swap(node, target, Layout(own_lock_dir=f"{tmp_path}/ownX/"), "a", b"x", "/b")
    assert done == apply.WriteResult("a", "b", "/b")
    assert node.ran[0] == (["mkdir", "-p", "-m", "0700", f"{tmp_path}/ownX"], 15, None)


# -- the copy on this machine ----------------------------------------------------------


def test_the_client_copy_is_private_and_named_after_its_host(tmp_path: Path) -> None:
    layout = Layout(client_backup_dir=str(tmp_path / "copies"))
    path = save_client_copy(layout, "root@pve1.lan:22/x y", "ct-200/a.conf", b"old\n")
    assert path == f"{tmp_path}/copies/root@pve1.lan_22_x_y/ct-200/a.conf"
    assert Path(path).read_bytes() == b"old\n"
    assert Path(path).stat().st_mode & 0o777 == 0o600
    assert Path(path).parent.stat().st_mode & 0o777 == 0o700
    assert save_client_copy(layout, "h-1_2", "b.conf", b"") == f"{tmp_path}/copies/h-1_2/b.conf"


def test_a_client_copy_dir_reached_through_a_link_is_used(tmp_path: Path) -> None:
    """~/.local/state is often a link to a larger disk: the copy goes there."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "disk")
    layout = Layout(client_backup_dir=str(tmp_path / "state" / "copies"))
    path = save_client_copy(layout, "pve1", "ct-200/a.conf", b"old\n")
    assert (tmp_path / "disk" / "copies" / "pve1" / "ct-200" / "a.conf").read_bytes() == b"old\n"
    assert path == f"{tmp_path}/state/copies/pve1/ct-200/a.conf"


def test_a_folder_of_copies_moved_elsewhere_and_linked_back_is_followed(tmp_path: Path) -> None:
    base = tmp_path / "copies"
    (base / "pve1").mkdir(parents=True)
    (tmp_path / "moved").mkdir()
    (base / "pve1" / "ct-200").symlink_to(tmp_path / "moved")
    save_client_copy(Layout(client_backup_dir=str(base)), "pve1", "ct-200/a.conf", b"old\n")
    assert (tmp_path / "moved" / "a.conf").read_bytes() == b"old\n"


def test_a_link_at_the_copys_path_is_replaced_never_written_through(tmp_path: Path) -> None:
    base = tmp_path / "copies"
    (base / "pve1").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (base / "pve1" / "a.conf").symlink_to(victim)
    path = save_client_copy(Layout(client_backup_dir=str(base)), "pve1", "a.conf", b"old\n")
    assert not Path(path).is_symlink() and Path(path).read_bytes() == b"old\n"
    assert victim.read_text() == "keep\n"


def test_a_client_copy_that_cannot_be_saved_stops_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder\n")
    layout = Layout(client_backup_dir=str(blocker / "copies"))
    with pytest.raises(ApplyError) as failed:
        save_client_copy(layout, "pve1", "ct-200/a.conf", b"old\n")
    assert (failed.value.code, str(failed.value)) == (
        "backup", f"cannot save the backup copy in {blocker}/copies (Not a directory); nothing "
        "written. Point GPUDOCTOR_CLIENT_BACKUP_DIR at a writable directory")  # fmt: skip


def test_a_discarded_copy_takes_its_empty_folders_but_never_the_base(tmp_path: Path) -> None:
    base = tmp_path / "copies"
    layout = Layout(client_backup_dir=str(base))
    path = save_client_copy(layout, "pve1", "ct-200/a.conf", b"old\n")
    keep = save_client_copy(layout, "pve2", "ct-300/b.conf", b"old\n")
    discard_client_copy(layout, path)
    assert not (base / "pve1").exists() and Path(keep).exists() and base.is_dir()
    discard_client_copy(layout, keep)
    assert list(base.iterdir()) == [] and base.is_dir()
    discard_client_copy(layout, keep)  # already gone: nothing to do
    one = save_client_copy(layout, "pve1", "ct-200/a.conf", b"old\n")
    two = save_client_copy(layout, "pve1", "ct-200/b.conf", b"old\n")
    discard_client_copy(layout, one)
    assert [p.name for p in Path(two).parent.iterdir()] == ["b.conf"]
    outside = tmp_path / "elsewhere" / "deep" / "c.conf"
    outside.parent.mkdir(parents=True)
    outside.write_text("x")
    discard_client_copy(layout, str(outside))  # a path outside the base: no folder removed
    assert not outside.exists() and outside.parent.is_dir()


class DeniedHost(LocalHost):
    """This machine as a user who may not read the CT's directory: each stat and read of a
    path under ``denied`` fails with EACCES, as the kernel answers such a user."""

    def __init__(self, denied: str) -> None:
        super().__init__()
        self.denied = denied

    def stat(self, path: str):  # type: ignore[no-untyped-def]
        if path.startswith(self.denied):
            raise PermissionError(13, "Permission denied", path)
        return super().stat(path)

    def read_bytes(self, path: str, limit: int) -> bytes:  # type: ignore[override]
        if path.startswith(self.denied):
            raise PermissionError(13, "Permission denied", path)
        return super().read_bytes(path, limit)


def test_a_config_the_user_may_not_read_is_not_called_missing(tmp_path: Path) -> None:
    """Issue 47: `fix` as a user who cannot read the config said "does not exist"."""
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "config").write_text("lxc.uts.name = web\n")
    layout = Layout(lxcpath=str(tmp_path), own_lock_dir="/run/gd")
    host = DeniedHost(str(tmp_path / "web"))
    with pytest.raises(ApplyError) as denied:
        resolve_target(host, "lxc", "web", layout)
    why = "permission denied; run it as root (sudo) or as the user who owns that file"
    assert (denied.value.code, str(denied.value)) == (
        "io", f"cannot read {tmp_path}/web/config: {why}")  # fmt: skip
    with pytest.raises(ApplyError) as unreadable:
        read_bytes(host, f"{tmp_path}/web/config", layout)
    assert (unreadable.value.code, str(unreadable.value)) == (
        "io", f"cannot read {tmp_path}/web/config: {why}")  # fmt: skip
