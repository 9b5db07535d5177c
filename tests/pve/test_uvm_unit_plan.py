"""``gpudoctor fix --host-prep`` as its user sees it: the boot unit's exact text, the plan's
reasons and warnings, each outcome (nothing to change, dry run, declined, applied) with its
exit code and JSON, the backups, which files root may be asked to run at every trigger, and
the steps on a node's real root (daemon-reload, enable, start, udev reload), all in-process.

Scratch roots are written by the real code and enabled by the real ``systemctl --root``
(tests/pve/test_uvm_unit.py has the end-to-end runs); what runs on a node's real root
(PID 1's systemctl, udevadm) and a node reached over SSH cannot be driven here: ``Node``
below stands for them."""

from __future__ import annotations

import ast
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import gpudoctor
from gpudoctor.hosts.base import CommandResult
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve import follow_units, uvm_unit
from gpudoctor.pve.apply import ApplyError, Layout
from gpudoctor.pve.uvm_unit import UNIT_NAME, run_host_prep
from tests.fakes.pvetree import PveTree
from tests.fakes.recorded_host import RecordedHost

BOOT_UNIT = """\
[Unit]
Description=Create /dev/nvidia-uvm before containers start (gpudoctor)
After=systemd-modules-load.service
Before=pve-guests.service lxc.service

[Service]
Type=oneshot
ExecStart=/opt/nv/nvidia-modprobe -u -c=0
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""
SERVICE, PATH_UNIT = follow_units.SERVICE, follow_units.PATH_UNIT
GPUDOCTOR = "/usr/local/bin/gpudoctor"


@dataclass
class Node(RecordedHost):
    """A Proxmox node reached over SSH (not this machine), as far as ``--host-prep`` sees
    it: its installed commands (``command -v``), its files' owners and modes (``readlink
    -f``, ``stat -L -c '%u %a %n'``), PID 1's ``systemctl`` (``enable`` makes the
    ``multi-user.target.wants`` link that ``test -L`` then finds; ``is-active``) and
    ``udevadm``. ``fail``: argv joined by spaces -> stderr of a command that fails there.
    Every command is recorded in ``ran`` with its timeout; files are a RecordedHost's."""

    installed: dict[str, str] = field(default_factory=dict)  # name -> path
    owners: dict[str, tuple[int, int]] = field(default_factory=dict)  # path -> (uid, mode)
    links: dict[str, str] = field(default_factory=dict)  # readlink -f answers
    active: set[str] = field(default_factory=set)
    enabled: set[str] = field(default_factory=set)  # the wants links that exist
    fail: dict[str, str] = field(default_factory=dict)
    ran: list[tuple[list[str], float]] = field(default_factory=list)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        argv = list(argv)
        self.ran.append((argv, timeout))
        joined = " ".join(argv)
        if joined in self.fail:
            return CommandResult(tuple(argv), 1, "", self.fail[joined])
        if argv[:2] == ["sh", "-c"] and argv[2].startswith("command -v "):
            path = self.installed.get(argv[2].split()[-1], "")
            return CommandResult(tuple(argv), 0 if path else 1, f"{path}\n" if path else "")
        if argv[:2] == ["readlink", "-f"]:
            return CommandResult(tuple(argv), 0, self.links.get(argv[2], argv[2]) + "\n")
        if argv[:4] == ["stat", "-L", "-c", "%u %a %n"]:
            if any(n not in self.owners for n in argv[4:]):
                return CommandResult(tuple(argv), 1, "", "stat: cannot statx: No such file")
            rows = [f"{self.owners[n][0]} {self.owners[n][1]:o} {n}\n" for n in argv[4:]]
            return CommandResult(tuple(argv), 0, "".join(rows))
        if argv[:2] == ["test", "-L"]:
            return CommandResult(tuple(argv), 0 if argv[2] in self.enabled else 1)
        if argv[:2] == ["systemctl", "is-active"]:
            state = "active" if argv[2] in self.active else "inactive"
            return CommandResult(tuple(argv), 0 if argv[2] in self.active else 3, state + "\n")
        if argv[0] == "systemctl" and "enable" in argv:
            root = next((a[7:] for a in argv if a.startswith("--root=")), "/")
            names = argv[argv.index("enable") + 1 :]
            self.enabled |= {uvm_unit._wants(root, n) for n in names}
        return CommandResult(tuple(argv), 0)

    def changes(self) -> list[list[str]]:
        """Return the argv of each command run that changes the node (not a look)."""
        looks = ("sh", "readlink", "stat", "test", "find")
        return [a for a, _ in self.ran if a[0] not in looks and a[:2] != ["systemctl", "is-active"]]


def trusted_node(**extra: object) -> Node:
    """Return a node with nvidia-modprobe and a root-owned gpudoctor in /usr/local/bin."""
    owners = {p: (0, 0o755) for p in ("/", "/usr", "/usr/local", "/usr/local/bin", GPUDOCTOR)}
    return Node(installed={"nvidia-modprobe": "/usr/bin/nvidia-modprobe", "gpudoctor": GPUDOCTOR},
                owners=owners, **extra)  # type: ignore[arg-type]  # fmt: skip


def installed_files(root: str = "/") -> dict[str, str]:
    """Return the texts --host-prep writes on a trusted_node, by path."""
    units = f"{root.rstrip('/')}/etc/systemd/system"
    return {
        f"{units}/{UNIT_NAME}": uvm_unit.unit_text("/usr/bin/nvidia-modprobe"),
        f"{units}/{SERVICE}": follow_units.service_text(GPUDOCTOR, "/usr/bin/nvidia-modprobe"),
        f"{units}/{PATH_UNIT}": follow_units.path_text(follow_units.WATCHED),
        f"{root.rstrip('/')}/{follow_units.UDEV_RULE}": follow_units.udev_text(),
    }


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return PveTree(tmp_path).layout()


@pytest.fixture
def sysroot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch systemd root, with a stand-in nvidia-modprobe first on PATH (this machine
    has no NVIDIA driver; only its path is written into the unit)."""
    if not shutil.which("systemctl"):
        pytest.skip("systemctl is not installed")
    root = tmp_path / "sysroot"
    (root / "etc/systemd/system").mkdir(parents=True)
    tools = tmp_path / "nvbin"
    tools.mkdir()
    (tools / "nvidia-modprobe").write_text("#!/bin/sh\nexit 0\n")
    (tools / "nvidia-modprobe").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    return root


def test_the_boot_unit_runs_nvidia_modprobe_once_before_the_guests_start() -> None:
    assert uvm_unit.unit_text("/opt/nv/nvidia-modprobe") == BOOT_UNIT


@pytest.mark.parametrize(
    ("paths", "needed"),
    [
        (("/dev/nvidia-uvm",), True),
        (("/dev/nvidia0", "/dev/nvidia-uvm-tools"), True),
        (("/dev/nvidia-caps/nvidia-cap1",), True),
        (("/dev/nvidia-caps",), True),
        (("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvmx", "/dev/nvidia-capsule"), False),
        ((), False),
    ],
)
def test_only_the_nodes_the_drivers_first_user_makes_need_the_boot_unit(
    paths: tuple[str, ...], needed: bool
) -> None:
    assert uvm_unit.needs_boot_nodes(paths) is needed


def test_the_systemd_root_is_the_real_one_unless_the_environment_names_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert uvm_unit.systemd_root({}) == "/"
    assert uvm_unit.systemd_root({"GPUDOCTOR_SYSTEMD_ROOT": "/scratch"}) == "/scratch"
    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", "/from-env")
    assert uvm_unit.systemd_root() == "/from-env"
    monkeypatch.delenv("GPUDOCTOR_SYSTEMD_ROOT")
    assert uvm_unit.systemd_root() == "/"


def test_the_plan_names_each_file_and_unit_with_its_reason(sysroot: Path, layout: Layout) -> None:
    modprobe = shutil.which("nvidia-modprobe")
    prep = uvm_unit.plan_host_prep(LocalHost(), f"{sysroot}/", layout)  # a trailing / is fine
    units = f"{sysroot}/etc/systemd/system"
    assert [f.path for f in prep.files] == [
        f"{units}/{UNIT_NAME}", f"{units}/{SERVICE}", f"{units}/{PATH_UNIT}",
        f"{sysroot}/etc/udev/rules.d/71-gpudoctor-follow-driver.rules",
    ]  # fmt: skip
    assert [(f.old, f.sha) for f in prep.files] == [("", "absent")] * 4
    assert prep.plan.explanation == (
        f"write {units}/{UNIT_NAME}: runs `{modprobe} -u -c=0` before pve-guests.service, so "
        "/dev/nvidia-uvm exists when containers autostart",
        f"write {units}/{SERVICE}: after a driver reload, runs `gpudoctor fix --follow-driver "
        "--yes`: every CT of this node against the host's devices now, restarting only those "
        "whose devices changed",
        f"write {units}/{PATH_UNIT}: starts {SERVICE} when /dev/nvidia-uvm, "
        "/dev/nvidia-uvm-tools, /dev/nvidia-caps change",
        f"write {sysroot}/etc/udev/rules.d/71-gpudoctor-follow-driver.rules: starts {SERVICE} "
        "when an NVIDIA module is loaded (udev add event)",
        f"enable {UNIT_NAME} (systemctl enable)",
        f"enable {PATH_UNIT} (systemctl enable)",
    )
    assert prep.plan.warnings == ()
    assert prep.enable == (UNIT_NAME, PATH_UNIT) and prep.start == ()  # a scratch root
    assert f"ExecStart={modprobe} -u -c=0\n" in prep.files[0].new
    assert f"ExecStartPre=-{modprobe} -u -c=0\n" in prep.files[1].new
    assert prep.plan.old_text == "" and prep.plan.new_text == "".join(f.new for f in prep.files)
    for unit in prep.files:
        assert f"+++ b{unit.path}\n" in prep.plan.diff


def test_the_follow_unit_runs_with_the_flavor_host_prep_was_given(
    sysroot: Path, layout: Layout
) -> None:
    """Issue 47: the follow-driver unit of `--host-prep --flavor lxc` runs with it."""
    follow = ("--flavor", "lxc", "--lxcpath", "/srv/lxc")
    prep = uvm_unit.plan_host_prep(LocalHost(), f"{sysroot}/", layout, follow_args=follow)
    assert "--yes --flavor lxc --lxcpath /srv/lxc $GPUDOCTOR_FOLLOW_ARGS\n" in prep.files[1].new
    done = uvm_unit.run_host_prep(LocalHost(), dry_run=True, layout=layout, root=str(sysroot),
                                  follow_args=follow)  # fmt: skip
    assert "--yes --flavor lxc --lxcpath /srv/lxc $GPUDOCTOR_FOLLOW_ARGS\n" in done.plan.new_text


def test_without_nvidia_modprobe_the_boot_unit_names_its_usual_path_and_says_to_install_it(
    tmp_path: Path, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("nvidia-modprobe", path="/usr/bin:/bin:/usr/sbin:/sbin"):
        pytest.skip("this machine has nvidia-modprobe")
    monkeypatch.setenv("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
    prep = uvm_unit.plan_host_prep(LocalHost(), str(tmp_path / "root"), layout)
    assert "ExecStart=/usr/bin/nvidia-modprobe -u -c=0\n" in prep.files[0].new
    assert prep.plan.warnings[0] == (
        "nvidia-modprobe is not installed on the host (apt install nvidia-modprobe)"
    )
    assert "nvidia-modprobe" not in prep.files[1].new  # nothing to remake before gpudoctor
    assert prep.plan.explanation[0].endswith(
        "runs `/usr/bin/nvidia-modprobe -u -c=0` before pve-guests.service, so /dev/nvidia-uvm "
        "exists when containers autostart"
    )


def test_each_outcome_with_its_exit_code_and_json(sysroot: Path, layout: Layout) -> None:
    host, root = LocalHost(), str(sysroot)
    dry = run_host_prep(host, dry_run=True, yes=True, layout=layout, root=root)
    assert (dry.status, dry.exit_code, dry.message) == ("dry_run", 4, "dry run: nothing written")
    declined = run_host_prep(host, layout=layout, root=root)  # no --yes, no prompt: declined
    assert (declined.status, declined.exit_code) == ("declined", 4)
    assert declined.message == "not applied: nothing written"
    assert declined.to_dict() == {**dry.to_dict(), "status": "declined",
                                  "message": "not applied: nothing written"}  # fmt: skip
    assert list((sysroot / "etc/systemd/system").iterdir()) == []
    assert dry.to_dict() == {
        "status": "dry_run", "exit_code": 4, "message": "dry run: nothing written",
        "unit": f"{root}/etc/systemd/system/{UNIT_NAME}", "changed": True,
        "diff": dry.plan.diff, "explanation": list(dry.plan.explanation), "warnings": [],
        "backup": "", "backups": [],
    }  # fmt: skip
    asked, said = [], []
    done = run_host_prep(host, confirm=lambda plan: asked.append(plan) or True,
                         progress=said.append, layout=layout, root=root)  # fmt: skip
    assert asked == [done.plan]
    assert (done.status, done.exit_code) == ("applied", 0)
    assert done.message == f"{UNIT_NAME} and {PATH_UNIT} installed and enabled"
    assert done.to_dict()["unit"] == f"{root}/etc/systemd/system/{UNIT_NAME}"
    units = f"{root}/etc/systemd/system"
    assert said == [
        f"writing {units}/{UNIT_NAME}", f"writing {units}/{SERVICE}",
        f"writing {units}/{PATH_UNIT}", f"writing {root}/{follow_units.UDEV_RULE}",
        f"enabling {UNIT_NAME}, {PATH_UNIT}"]  # fmt: skip
    assert (done.backup, done.backups) == ("", ())  # nothing was there before
    assert done.to_dict()["status"] == "applied" and done.to_dict()["exit_code"] == 0
    nothing = run_host_prep(host, yes=True, layout=layout, root=root)
    assert (nothing.status, nothing.exit_code, nothing.message) == (
        "nothing_to_change", 0, "nothing to change")  # fmt: skip
    assert nothing.to_dict()["changed"] is False and nothing.plan.diff == ""
    assert nothing.to_dict()["unit"] == f"{units}/{UNIT_NAME}"


def test_without_a_root_given_the_environments_systemd_root_is_used(
    sysroot: Path, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUDOCTOR_SYSTEMD_ROOT", str(sysroot))
    dry = run_host_prep(LocalHost(), dry_run=True, layout=layout)
    assert dry.unit_path == f"{sysroot}/etc/systemd/system/{UNIT_NAME}"
    assert dry.plan.explanation[0].startswith(f"write {sysroot}/etc/systemd/system/")


def test_only_what_differs_is_written_and_each_old_text_is_backed_up(
    sysroot: Path, layout: Layout
) -> None:
    host, root = LocalHost(), str(sysroot)
    run_host_prep(host, yes=True, layout=layout, root=root)
    path_unit = sysroot / "etc/systemd/system" / PATH_UNIT
    path_unit.write_bytes(b"[Path]\nPathChanged=/dev/nvidia-uvm\n\xff\n")  # not UTF-8
    prep = uvm_unit.plan_host_prep(host, root, layout)
    assert prep.plan.explanation == (
        f"write {path_unit}: starts {SERVICE} when /dev/nvidia-uvm, /dev/nvidia-uvm-tools, "
        "/dev/nvidia-caps change",
    )
    assert "-\ufffd\n" in prep.plan.diff  # the undecodable byte shown, not a traceback
    done = run_host_prep(host, yes=True, layout=layout, root=root)
    assert done.status == "applied" and done.backup == ""  # the boot unit was already right
    [backup] = done.backups
    assert Path(backup).read_bytes() == b"[Path]\nPathChanged=/dev/nvidia-uvm\n\xff\n"
    assert Path(backup).parent == Path(layout.backup_dir) / "ct-host-prep"
    assert path_unit.read_text() == follow_units.path_text(follow_units.WATCHED)

    boot = sysroot / "etc/systemd/system" / UNIT_NAME
    boot.write_text("[Service]\nExecStart=/bin/true\n")
    path_unit.write_text("[Path]\n")
    again = run_host_prep(host, yes=True, layout=layout, root=root)
    assert Path(again.backup).read_text() == "[Service]\nExecStart=/bin/true\n"
    assert [Path(b).read_text() for b in again.backups] == [
        "[Service]\nExecStart=/bin/true\n", "[Path]\n"]  # fmt: skip
    assert boot.read_text() == uvm_unit.unit_text(shutil.which("nvidia-modprobe") or "")


def test_a_unit_path_that_cannot_be_read_is_an_error_not_a_fresh_unit(
    sysroot: Path, layout: Layout
) -> None:
    (sysroot / "etc/systemd/system" / UNIT_NAME).mkdir()
    with pytest.raises(ApplyError) as failed:
        uvm_unit.plan_host_prep(LocalHost(), str(sysroot), layout)
    assert failed.value.code == "io" and UNIT_NAME in str(failed.value)


def test_the_write_takes_gpudoctors_host_prep_lock(sysroot: Path, layout: Layout) -> None:
    """The units are written under ``<own lock dir>/host-prep.lock`` (never followed
    through a link): a link planted there stops the write, nothing is written."""
    os.makedirs(layout.own_lock_dir, mode=0o700, exist_ok=True)
    os.symlink(f"{sysroot}/elsewhere", f"{layout.own_lock_dir}/host-prep.lock")
    with pytest.raises(ApplyError) as refused:
        run_host_prep(LocalHost(), yes=True, layout=layout, root=str(sysroot))
    assert refused.value.code == "io"
    assert list((sysroot / "etc/systemd/system").iterdir()) == []
    os.unlink(f"{layout.own_lock_dir}/host-prep.lock")
    held = os.open(f"{layout.own_lock_dir}/host-prep.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert uvm_unit.plan_host_prep(LocalHost(), str(sysroot), layout).files  # a plan reads
    finally:
        os.close(held)


def test_this_machines_gpudoctor_is_this_interpreter_isolated() -> None:
    """The interpreter, the package, and every directory its isolated path imports from
    (the standard library, site-packages, what a .pth file adds): root runs all of it."""
    command, runs = uvm_unit.gpudoctor_command(LocalHost())
    assert command.split() == [sys.executable, "-I", "-m", "gpudoctor"]
    package = os.path.dirname(os.path.abspath(gpudoctor.__file__))
    isolated = subprocess.run([sys.executable, "-I", "-c", "import sys; print(sys.path)"],
                              capture_output=True, text=True, check=True)  # fmt: skip
    on_path = [p for p in ast.literal_eval(isolated.stdout) if p and os.path.exists(p)]
    # the package the isolated interpreter imports: this test's own, except where a runner
    # (mutmut's mutants/ copy) put another gpudoctor first on this process's path
    its_package = subprocess.run(
        [sys.executable, "-I", "-c", "import gpudoctor, os; print(os.path.dirname(os.path.abspath(gpudoctor.__file__)))"],
        capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert runs == tuple(dict.fromkeys([sys.executable, package, its_package, *on_path]))
    assert any(p.endswith("site-packages") for p in runs)


@pytest.mark.parametrize(
    ("installed", "expected"),
    [({"gpudoctor": GPUDOCTOR}, (GPUDOCTOR, (GPUDOCTOR,))),
     ({"gpudoctor": "gpudoctor"}, ("", ())),  # an alias or function, not a file
     ({}, ("", ()))],
)  # fmt: skip
def test_a_remote_nodes_gpudoctor_is_the_file_on_its_path(
    installed: dict[str, str], expected: tuple[str, tuple[str, ...]]
) -> None:
    node = Node(installed=installed)
    assert uvm_unit.gpudoctor_command(node) == expected
    assert node.ran == [(["sh", "-c", "command -v gpudoctor"], 15)]


def test_files_root_would_run_must_be_roots_alone(tmp_path: Path) -> None:
    host = LocalHost()
    tool = tmp_path / "my tools" / "gpudoctor"  # a space in a name is read whole
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert uvm_unit.untrusted(host, (str(tool),)) == ""
    os.chown(tool, 65534, 0)
    assert uvm_unit.untrusted(host, (str(tool),)) == (
        f"{tool} (uid 65534, mode 0755) can be changed by a user other than root"
    )
    os.chown(tool, 0, 0)
    tool.chmod(0o775)
    assert uvm_unit.untrusted(host, (str(tool),)) == (
        f"{tool} (uid 0, mode 0775) can be changed by a user other than root"
    )
    tool.chmod(0o757)
    assert "(uid 0, mode 0757)" in uvm_unit.untrusted(host, (str(tool),))
    tool.chmod(0o1777)  # sticky protects a directory's entries, not the file itself
    assert "(uid 0, mode 1777)" in uvm_unit.untrusted(host, (str(tool),))
    tool.chmod(0o755)
    tool.parent.chmod(0o1777)  # a sticky directory above (as /tmp) is fine
    assert uvm_unit.untrusted(host, (str(tool),)) == ""
    tool.parent.chmod(0o775)
    assert uvm_unit.untrusted(host, (str(tool),)) == (
        f"{tool.parent} (uid 0, mode 0775) can be changed by a user other than root"
    )
    tool.parent.chmod(0o755)
    link = tmp_path / "gpudoctor-link"
    other = tmp_path / "other"
    other.mkdir()
    os.chown(other, 65534, 0)
    (other / "gpudoctor").write_text("#!/bin/sh\n")
    link.symlink_to(other / "gpudoctor")  # the link is root's; what it leads to is not
    assert uvm_unit.untrusted(host, (str(link),)).startswith(f"{other} (uid 65534, mode ")
    gone = tmp_path / "gone"
    why = uvm_unit.untrusted(host, (str(gone), str(tool)))
    assert why.startswith(f"cannot stat {gone}, {tool}: stat: cannot stat")  # stat's last line
    assert why.endswith(f"'{gone}': No such file or directory")


def test_every_directory_up_to_the_root_is_looked_at() -> None:
    node = trusted_node()
    node.owners["/"] = (0, 0o777)
    assert uvm_unit.untrusted(node, (GPUDOCTOR,)) == (
        "/ (uid 0, mode 0777) can be changed by a user other than root"
    )
    node.owners["/"] = (0, 0o755)
    node.owners["/usr/local"] = (1000, 0o755)
    assert uvm_unit.untrusted(node, (GPUDOCTOR + "/",)).startswith("/usr/local (uid 1000")


def test_a_remote_gpudoctor_others_can_change_plans_only_the_boot_unit(layout: Layout) -> None:
    node = trusted_node()
    node.owners[GPUDOCTOR] = (1000, 0o755)
    prep = uvm_unit.plan_host_prep(node, "/", layout)
    assert [f.path for f in prep.files] == [f"/etc/systemd/system/{UNIT_NAME}"]
    assert prep.plan.warnings == (
        "not installing the unit that follows a driver reload: it would run gpudoctor as root "
        f"at every trigger, and {GPUDOCTOR} (uid 1000, mode 0755) can be changed by a user "
        "other than root (install gpudoctor as root, e.g. pipx)",
    )
    assert prep.enable == (UNIT_NAME,) and prep.start == ()
    assert not any(a[:2] == ["systemctl", "is-active"] for a, _ in node.ran)


def test_a_node_without_gpudoctor_gets_the_boot_unit_and_says_why_only_that(
    layout: Layout,
) -> None:
    node = Node(installed={"nvidia-modprobe": "/usr/bin/nvidia-modprobe"})
    prep = uvm_unit.plan_host_prep(node, "/", layout)
    assert [f.path for f in prep.files] == [f"/etc/systemd/system/{UNIT_NAME}"]
    assert prep.plan.warnings == (
        "gpudoctor is not installed on the host (command -v gpudoctor): the unit that follows "
        "a driver reload needs it there; only the boot unit is planned",
    )
    assert not any(a[0] == "stat" for a, _ in node.ran)  # nothing to judge


def test_on_the_real_root_the_units_are_enabled_started_and_udev_reloaded(layout: Layout) -> None:
    node = trusted_node(files=installed_files())
    prep = uvm_unit.plan_host_prep(node, "/", layout)
    assert prep.plan.explanation == (
        f"enable {UNIT_NAME} (systemctl enable)", f"enable {PATH_UNIT} (systemctl enable)",
        f"start {PATH_UNIT} (systemctl start)")  # fmt: skip
    assert prep.start == (PATH_UNIT,)
    said: list[str] = []
    done = run_host_prep(node, yes=True, progress=said.append, layout=layout, root="/")
    assert (done.status, done.message) == (
        "applied", f"{UNIT_NAME} and {PATH_UNIT} installed and enabled")  # fmt: skip
    assert said == [f"enabling {UNIT_NAME}, {PATH_UNIT}"]  # every file already right
    assert node.changes() == [
        ["systemctl", "daemon-reload"], ["systemctl", "enable", UNIT_NAME, PATH_UNIT],
        ["systemctl", "start", PATH_UNIT], ["udevadm", "control", "--reload"]]  # fmt: skip
    node.active.add(PATH_UNIT)
    assert run_host_prep(node, yes=True, layout=layout, root="/").status == "nothing_to_change"


def test_an_enabled_but_stopped_path_unit_is_only_started(layout: Layout) -> None:
    node = trusted_node(files=installed_files())
    node.enabled |= {uvm_unit._wants("/", UNIT_NAME), uvm_unit._wants("/", PATH_UNIT)}
    prep = uvm_unit.plan_host_prep(node, "/", layout)
    assert prep.plan.explanation == (f"start {PATH_UNIT} (systemctl start)",)
    assert (prep.enable, prep.start) == ((), (PATH_UNIT,))


@pytest.mark.parametrize("root", ["/scratch/", "/X"])  # any root but / itself
def test_a_scratch_root_is_enabled_with_systemctl_root_and_nothing_is_started(
    layout: Layout, root: str
) -> None:
    node = trusted_node(files=installed_files(root))
    done = run_host_prep(node, yes=True, layout=layout, root=root)
    assert done.status == "applied"
    assert node.changes() == [["systemctl", f"--root={root}", "enable", UNIT_NAME, PATH_UNIT]]
    assert not any("start" in step for step in done.plan.explanation)  # nothing runs there
    assert not any(a[:2] == ["systemctl", "is-active"] for a, _ in node.ran)
    assert f"{root.rstrip('/')}/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}" in (
        node.enabled
    )


def test_on_the_real_root_a_running_path_unit_is_enabled_but_not_started_again(
    layout: Layout,
) -> None:
    node = trusted_node(files=installed_files(), active={PATH_UNIT})
    done = run_host_prep(node, yes=True, layout=layout, root="/")
    assert done.status == "applied"
    assert node.changes() == [["systemctl", "daemon-reload"],
                              ["systemctl", "enable", UNIT_NAME, PATH_UNIT],
                              ["udevadm", "control", "--reload"]]  # fmt: skip


@pytest.mark.parametrize(
    ("failing", "stderr", "message"),
    [("systemctl daemon-reload", "Failed to connect to bus", "systemctl daemon-reload failed: "
      "Failed to connect to bus"),
     (f"systemctl enable {UNIT_NAME} {PATH_UNIT}", "", f"systemctl enable {UNIT_NAME} "
      f"{PATH_UNIT} failed: exit status 1"),
     (f"systemctl start {PATH_UNIT}", "first line\nUnit not found.", f"systemctl start "
      f"{PATH_UNIT} failed: Unit not found.")],
)  # fmt: skip
def test_a_failing_systemctl_step_is_one_error_naming_it(
    layout: Layout, failing: str, stderr: str, message: str
) -> None:
    node = trusted_node(files=installed_files(), fail={failing: stderr})
    with pytest.raises(ApplyError) as failed:
        run_host_prep(node, yes=True, layout=layout, root="/")
    assert (failed.value.code, str(failed.value)) == ("io", message)
    assert ["udevadm", "control", "--reload"] not in node.changes()


def test_a_node_without_gpudoctor_enables_the_boot_unit_alone(layout: Layout) -> None:
    boot = f"/etc/systemd/system/{UNIT_NAME}"
    node = Node(installed={"nvidia-modprobe": "/usr/bin/nvidia-modprobe"},
                files={boot: installed_files()[boot]})  # fmt: skip
    done = run_host_prep(node, yes=True, layout=layout, root="/")
    assert (done.status, done.message) == ("applied", f"{UNIT_NAME} installed and enabled")
    assert node.changes() == [["systemctl", "daemon-reload"], ["systemctl", "enable", UNIT_NAME],
                              ["udevadm", "control", "--reload"]]  # fmt: skip


def test_a_failing_udev_reload_is_not_an_error(layout: Layout) -> None:
    node = trusted_node(files=installed_files(), fail={"udevadm control --reload": "no udevd"})
    assert run_host_prep(node, yes=True, layout=layout, root="/").status == "applied"


def test_an_enable_that_makes_no_link_is_an_error(layout: Layout) -> None:
    node = trusted_node(files=installed_files())
    node.run = _without_links(node)  # type: ignore[method-assign]
    with pytest.raises(ApplyError) as failed:
        run_host_prep(node, yes=True, layout=layout, root="/")
    assert (failed.value.code, str(failed.value)) == (
        "io",
        f"systemctl enable did not create /etc/systemd/system/multi-user.target.wants/{UNIT_NAME}",
    )


def _without_links(node: Node):
    real = node.run

    def run(argv: Sequence[str], timeout: float = 30.0, input: str | None = None) -> CommandResult:
        result = real(argv, timeout, input)
        node.enabled.clear()  # a systemctl that says it enabled but made no link
        return result

    return run


def test_a_directory_that_cannot_be_made_stops_before_any_write(layout: Layout) -> None:
    node = trusted_node(fail={"mkdir -p -m 0755 /etc/systemd/system": "mkdir: read-only"})
    with pytest.raises(ApplyError) as failed:
        run_host_prep(node, yes=True, layout=layout, root="/")
    assert (failed.value.code, str(failed.value)) == (
        "io", "mkdir -p /etc/systemd/system failed: mkdir: read-only")  # fmt: skip
    assert node.changes() == [["mkdir", "-p", "-m", "0755", "/etc/systemd/system"]]
    assert node.ran[-1][1] == 15  # bounded, as every look


def test_every_command_on_the_node_is_bounded_in_time(layout: Layout) -> None:
    """A hung command on the node cannot hang the fix: a look gets 15 s (60 s for the walk
    of every file under what root would run), a systemctl step 60 s, udev's reload 30 s."""
    node = trusted_node(files=installed_files())
    run_host_prep(node, yes=True, layout=layout, root="/")
    bounds = {a[0] if a[0] not in ("systemctl", "sh") or a[1] == "is-active" else
              f"{a[0]} {a[-1]}": t for a, t in node.ran}  # fmt: skip
    assert bounds == {"sh command -v nvidia-modprobe": 15, "sh command -v gpudoctor": 15,
                      "readlink": 15, "stat": 15, "find": 60, "test": 15, "systemctl": 15,
                      "systemctl daemon-reload": 60, f"systemctl {PATH_UNIT}": 60,
                      "udevadm": 30}  # fmt: skip


# -- issue 46.9: the files inside what root would run ---------------------------------------


def test_every_file_under_a_package_and_site_packages_is_roots_alone(tmp_path: Path) -> None:
    """A package file nobody owns, a ``.pth`` file (run at every start) others may write,
    or nobody's link inside: refused, naming the file. Root's files and root's links
    (whatever their own mode) are fine."""
    host = LocalHost()
    site = tmp_path / "site-packages"
    package = site / "gpudoctor"
    package.mkdir(parents=True)
    (package / "cli.py").write_text("x = 1\n")
    (site / "extra.pth").write_text("import os\n")
    (site / "root-link").symlink_to(package / "cli.py")
    assert uvm_unit.untrusted(host, (str(package), str(site))) == ""
    os.chown(package / "cli.py", 65534, 65534)
    assert uvm_unit.untrusted(host, (str(package), str(site))) == (
        f"{package}/cli.py (uid 65534, mode 0644) can be changed by a user other than root"
    )
    os.chown(package / "cli.py", 0, 0)
    (site / "extra.pth").chmod(0o664)
    assert uvm_unit.untrusted(host, (str(package), str(site))) == (
        f"{site}/extra.pth (uid 0, mode 0664) can be changed by a user other than root"
    )
    (site / "extra.pth").chmod(0o644)
    os.lchown(site / "root-link", 65534, 65534)
    assert uvm_unit.untrusted(host, (str(site),)).startswith(f"{site}/root-link (uid 65534, mode ")


def test_a_walk_that_fails_is_no_pass() -> None:
    """``find`` failing with nothing found (a directory it cannot read) refuses, naming
    the paths and find's last words."""
    node = trusted_node()
    find = ["find", "-H", GPUDOCTOR, "(", "!", "-uid", "0", "-o", "(", "!", "-type", "l",
            "-perm", "/022", ")", ")", "-printf", "%U %m %p\\n", "-quit"]  # fmt: skip
    node.fail[" ".join(find)] = "find: '/usr/local/bin/x': Permission denied"
    assert uvm_unit.untrusted(node, (GPUDOCTOR,)) == (
        f"cannot look at every file under {GPUDOCTOR}: find: '/usr/local/bin/x': Permission denied"
    )


class CodeNode(Node):
    """A node whose interpreters answer gpudoctor's question about their path
    (``PYTHON -c ...``): ``answers`` maps the interpreter to its stdout."""

    answers: dict[str, str] = field(default_factory=dict)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        if argv[0] in self.answers and argv[1] == "-c":
            self.ran.append((list(argv), timeout))
            return CommandResult(tuple(argv), 0, self.answers[argv[0]])
        return super().run(argv, timeout, input)


CodeNode = dataclass(CodeNode)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("first_line", "python"),
    [("#!/opt/gd/bin/python3", "/opt/gd/bin/python3"),
     ("#!/usr/bin/env python3 -u", "/usr/bin/python3"),  # env: as command -v finds it
     ("#!/usr/bin/env", ""), ("#! python3", ""), ("no shebang", "")],
)  # fmt: skip
def test_a_remote_scripts_interpreter_and_its_path_are_judged(first_line: str, python: str) -> None:
    """Over SSH the unit runs ``command -v gpudoctor``: the interpreter of its ``#!`` line
    and every directory that interpreter imports from are judged with it."""
    answer = "/opt/gd/lib/python3.11/site-packages/gpudoctor\n/usr/lib/python3.11\nrelative\n/usr/lib/python3.11\n"
    node = CodeNode(installed={"gpudoctor": GPUDOCTOR, "python3": "/usr/bin/python3"},
                    files={GPUDOCTOR: f"{first_line}\nimport gpudoctor\n"},
                    answers={"/opt/gd/bin/python3": answer, "/usr/bin/python3": answer})  # fmt: skip
    command, runs = uvm_unit.gpudoctor_command(node)
    assert command == GPUDOCTOR
    dirs = ("/opt/gd/lib/python3.11/site-packages/gpudoctor", "/usr/lib/python3.11")
    assert runs == ((GPUDOCTOR, python, *dirs) if python else (GPUDOCTOR,))
    asked = [a for a, _ in node.ran if a[1:2] == ["-c"] and a[0] != "sh"]
    assert [a[0] for a in asked] == ([python] if python else [])
    assert not asked or "sys.path" in asked[0][2]


def test_a_scripts_interpreter_is_read_from_its_shebang_line(tmp_path: Path) -> None:
    """``#!/usr/bin/env python3`` (two words) is python3 as ``command -v`` finds it; a
    bare ``#!/usr/bin/env`` names nothing; ``#!/usr/bin/python3 -I`` is its first word."""
    script = tmp_path / "gpudoctor"
    script.write_text("#!/usr/bin/env sh\n")
    assert uvm_unit._shebang(LocalHost(), str(script)) == shutil.which("sh")
    script.write_text("#!/usr/bin/env\n")
    assert uvm_unit._shebang(LocalHost(), str(script)) == ""
    script.write_text("#!/opt/py/bin/python3 -I\n")
    assert uvm_unit._shebang(LocalHost(), str(script)) == "/opt/py/bin/python3"
