"""What the fixer sees inside a running CT, on real nodes: char nodes made with ``mknod`` in
tmp_path (the test runs as root, as the lab does), real files and directories where a node
belongs, read through a real LocalHost. What cannot exist here is the CT's cgroup device
policy (the EPERM/EACCES a CT's ``open()`` gets): :class:`PolicyHost` stands for it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.hosts.base import HostError, OpenResult
from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.apply import Layout, Target
from gpudoctor.pve.ctstate import StateGap, host_made, restart_reasons
from gpudoctor.pve.inside import container_host, device_checks, probe, safe_probe, worse

NULL = os.major(os.stat("/dev/null").st_rdev), os.minor(os.stat("/dev/null").st_rdev)


class PolicyHost(LocalHost):
    """A LocalHost whose ``open()`` of some paths fails as a CT's device cgroup makes it
    fail (``denied``: errno per path and write mode); ``gone``: the CT cannot be entered
    (``pct exec`` failing: HostError on every call)."""

    def __init__(self, denied: dict[tuple[str, bool], int] | None = None, gone: bool = False):
        super().__init__()
        self.denied = denied or {}
        self.gone = gone
        self.opened: list[tuple[str, bool]] = []

    def stat(self, path: str):  # type: ignore[no-untyped-def]
        if self.gone:
            raise HostError("pct exec 101: CT 101 not running")
        return super().stat(path)

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        self.opened.append((path, write))
        code = self.denied.get((path, write))
        if code is not None:
            return OpenResult(path, "O_RDWR" if write else "O_RDONLY", code)
        return super().try_open(path, write)


def char_node(tmp_path: Path, name: str, numbers: tuple[int, int] = NULL) -> str:
    path = tmp_path / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*numbers))
    return str(path)


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root (the suite runs as root)")


def test_each_node_a_restart_would_cure_is_said_with_its_cause(tmp_path) -> None:
    placeholder = tmp_path / "nvidia-uvm"
    placeholder.write_text("")
    placeholder.chmod(0o644)
    stale = char_node(tmp_path, "nvidia-uvm-tools", (NULL[0], NULL[1] + 100))
    denied = char_node(tmp_path, "nvidia0")
    fine = char_node(tmp_path, "nvidiactl")
    missing = str(tmp_path / "nvidia-caps")
    host = PolicyHost({(denied, True): errno.EPERM})
    want = f"{NULL[0]}:{NULL[1]}"
    gaps = restart_reasons(host, [(missing, *NULL), (str(placeholder), *NULL), (stale, *NULL),
                                  (denied, *NULL), (fine, *NULL)])  # fmt: skip
    assert gaps == (
        StateGap(missing, "missing",
                 f"{missing} does not exist inside the CT, the host's is char {want} now: it was "
                 "missing on the host (or not passed yet) when the CT started"),
        StateGap(str(placeholder), "placeholder",
                 f"{placeholder} is a regular file inside the CT (mode 0644), a placeholder where "
                 f"the host's char {want} belongs: the host's node was missing when the CT "
                 "started, and the bind mount's create= made this instead"),
        StateGap(stale, "stale",
                 f"{stale} is char {NULL[0]}:{NULL[1] + 100} inside the CT, the host's is {want} "
                 "now: the CT's node was made for an earlier driver load"),
        StateGap(denied, "rules_older",
                 f"open({denied}) gives EPERM inside the CT although its config allows {want} "
                 "now: the running CT's device rules are older than its config (a fix not "
                 "restarted, or interrupted)"),
    )  # fmt: skip
    assert [g.host_was_missing for g in gaps] == [True, True, False, False]
    assert (fine, True) in host.opened  # the node as the host gives it: opened, no gap


def test_a_node_with_another_major_or_only_another_minor_is_stale(tmp_path) -> None:
    other_major = char_node(tmp_path, "a", (NULL[0] + 1, NULL[1]))
    other_minor = char_node(tmp_path, "b", (NULL[0], NULL[1] + 1))
    gaps = restart_reasons(PolicyHost(), [(other_major, *NULL), (other_minor, *NULL)])
    assert [g.kind for g in gaps] == ["stale", "stale"]
    assert restart_reasons(PolicyHost(), []) == ()


def test_an_open_refused_otherwise_than_by_the_policy_is_no_restart_reason(tmp_path) -> None:
    node = char_node(tmp_path, "nvidia0")
    host = PolicyHost({(node, True): errno.ENXIO})  # no device behind it: not the rules
    assert restart_reasons(host, [(node, *NULL)]) == ()


def test_only_the_nodes_the_host_makes_on_first_use_are_the_hosts_cause() -> None:
    paths = ["/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
             "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidiactl", "/dev/nvidia-modeset"]  # fmt: skip
    assert host_made(paths) == [
        "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps/nvidia-cap1"]  # fmt: skip
    assert host_made([]) == []


def test_probe_says_per_path_what_open_gives_inside(tmp_path) -> None:
    ok = char_node(tmp_path, "nvidia0")
    read_only = char_node(tmp_path, "nvidia-cap1")
    denied = char_node(tmp_path, "nvidia1")
    placeholder = tmp_path / "nvidia-uvm"
    placeholder.write_text("")
    directory = tmp_path / "nvidia-caps"
    directory.mkdir()
    under_a_file = str(placeholder / "x")  # stat fails with ENOTDIR: open() says what it is
    host = PolicyHost({(read_only, True): errno.EACCES, (denied, True): errno.EPERM})
    paths = (ok, read_only, denied, str(placeholder), str(directory), under_a_file,
             str(tmp_path / "missing"))  # fmt: skip
    assert probe(host, paths) == (
        (ok, "OK"),
        (read_only, "OK"),  # O_RDWR refused with EACCES: O_RDONLY tried, and it opens
        (denied, "EPERM"),  # the policy: no read-only retry
        (str(placeholder), "NOT_A_DEVICE (file)"),
        (str(directory), "NOT_A_DEVICE (dir)"),
        (under_a_file, "ENOTDIR"),
        (str(tmp_path / "missing"), "ENOENT"),
    )
    assert (read_only, False) in host.opened and (denied, False) not in host.opened
    assert safe_probe(host, (ok,)) == ((ok, "OK"),)
    gone = PolicyHost(gone=True)
    assert safe_probe(gone, (ok, "/dev/nvidia1")) == (
        (ok, "UNREACHABLE (pct exec 101: CT 101 not running)"),
        ("/dev/nvidia1", "UNREACHABLE (pct exec 101: CT 101 not running)"),
    )


def test_worse_names_what_opened_before_and_not_now_and_a_new_policy_denial() -> None:
    before = (("/dev/nvidia0", "OK"), ("/dev/nvidia1", "OK"), ("/dev/tty", "ENXIO"),
              ("/dev/nvidia-uvm", "ENOENT"), ("/dev/null", "OK"), ("/dev/zero", "EPERM"),
              ("/dev/nvidiactl", "UNREACHABLE (gone)"), ("/dev/urandom", "OK"))  # fmt: skip
    after = (("/dev/nvidia0", "OK"), ("/dev/nvidia1", "EPERM"), ("/dev/tty", "EPERM"),
             ("/dev/nvidia-uvm", "OK"), ("/dev/zero", "EPERM"),
             ("/dev/nvidiactl", "EPERM"), ("/dev/urandom", "ENOENT"))  # fmt: skip
    assert worse(before, after) == ["/dev/nvidia1", "/dev/tty", "/dev/null", "/dev/urandom"]
    # ENXIO both times (no controlling terminal) is not worse; better is not worse
    assert worse((("/dev/tty", "ENXIO"),), (("/dev/tty", "ENXIO"),)) == []
    assert worse((("/dev/nvidia0", "EACCES"),), (("/dev/nvidia0", "ENOENT"),)) == []
    assert worse((("/dev/nvidia0", "ENOENT"),), ()) == []  # failed before, not probed now


def test_the_ct_is_entered_the_way_its_flavor_is(tmp_path) -> None:
    layout = Layout(pct="/usr/sbin/pct-test", lxcpath=str(tmp_path))
    lxc = container_host(LocalHost(), Target("lxc", "gpu1", "c", "l"), layout)
    assert (lxc.flavor, lxc.ct, lxc.lxcpath) == ("lxc", "gpu1", str(tmp_path))
    assert lxc.enter[:5] == ["lxc-attach", "-n", "gpu1", "-P", str(tmp_path)]
    pve = container_host(LocalHost(), Target("pve", "101", "c", "l"), layout)
    assert (pve.flavor, pve.ct) == ("pve", "101")
    assert pve.enter[:4] == ["/usr/sbin/pct-test", "exec", "101", "--"]


def test_the_device_checks_run_inside_for_each_path_and_name_the_cts_config() -> None:
    found = device_checks(LocalHost(), Target("lxc", "gpu1", "c", "l"), ("/dev/null", "/dev/nope"))
    assert {f["check"] for f in found} == {"device.nodes", "device.open", "device.unchanged"}
    by = {(f["check"], f["subject"]): f for f in found}
    assert by[("device.nodes", "/dev/null")]["status"] == "PASS"
    assert by[("device.open", "/dev/null")]["status"] == "PASS"
    missing = by[("device.nodes", "/dev/nope")]
    assert missing["status"] == "FAIL" and "/var/lib/lxc/gpu1/config" in missing["remediation"]
    on_pve = device_checks(LocalHost(), Target("pve", "101", "c", "l"), ("/dev/nope",))
    assert "/etc/pve/lxc/101.conf" in on_pve[0]["remediation"]


def test_a_ct_the_checks_cannot_run_in_gives_one_error_finding() -> None:
    (finding,) = device_checks(None, Target("pve", "101", "c", "l"), ("/dev/nope",))  # type: ignore[arg-type]
    assert (finding["check"], finding["status"]) == ("device", "ERROR")
    assert "NoneType" in finding["message"]  # the failure's own words, not a traceback


def test_a_block_node_is_opened_and_a_missing_path_does_not_end_the_probe(tmp_path) -> None:
    block = tmp_path / "nvme-ish"
    os.mknod(block, 0o660 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device's numbers
    host = PolicyHost({(str(block), True): errno.ENXIO})  # no such loop device is set up
    missing = str(tmp_path / "missing")
    assert probe(host, (missing, str(block), "/dev/null")) == (
        (missing, "ENOENT"), (str(block), "ENXIO"), ("/dev/null", "OK"))  # fmt: skip
