"""The CT host's device facts the planner works from, gathered through a Host from a real
tree: char nodes made with ``mknod`` (the suite runs as root) under a tmp root, the H200's
recorded /proc/devices there, and ``pveversion`` as a script, read through
:class:`tests.fakes.rooted_host.RootedHost` (a GPU host's tree: this machine has no
/dev/nvidia*)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpudoctor.pve.facts import (
    HostNode,
    gather,
    look_at,
    look_at_file,
    nvidia_paths,
    parse_pveversion,
)
from tests.fakes.rooted_host import RootedHost
from tests.pve.captures import H200_PROC_DEVICES


class FailingRootedHost(RootedHost):
    """A RootedHost whose listing of ``broken_dirs`` fails (EIO, as a dying disk does) and,
    when ``gone``, whose commands cannot start (an SSH connection that dropped)."""

    def __init__(self, root: Path, broken_dirs: tuple[str, ...] = (), gone: bool = False) -> None:
        super().__init__(str(root))
        self.broken_dirs = broken_dirs
        self.gone = gone

    def list_dir(self, path: str) -> list[str]:
        if path in self.broken_dirs:
            raise OSError(5, "Input/output error", path)
        return super().list_dir(path)

    def run(self, argv, timeout: float = 30.0, input: str | None = None):  # type: ignore[no-untyped-def]
        if self.gone:
            raise OSError(104, "Connection reset by peer")
        return super().run(argv, timeout, input)


@pytest.fixture
def gpu_root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root (the suite runs as root)")
    root = tmp_path / "root"
    (root / "dev" / "nvidia-caps").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc" / "devices").write_text(H200_PROC_DEVICES.read_text())
    for name, major, minor, mode in (("nvidia0", 195, 0, 0o666), ("nvidiactl", 195, 255, 0o666),
                                     ("nvidia-uvm", 238, 0, 0o666),
                                     ("nvidia-caps/nvidia-cap1", 241, 1, 0o400),
                                     ("nvidia-caps/nvidia-cap2", 241, 2, 0o444)):  # fmt: skip
        os.mknod(root / "dev" / name, mode | stat.S_IFCHR, os.makedev(major, minor))
        os.chmod(root / "dev" / name, mode)
    os.chown(root / "dev" / "nvidia0", 0, 44)
    (root / "dev" / "nvidia-caps" / "README").write_text("not a node\n")
    (root / "dev" / "null-ish").write_text("")
    return root


def test_gather_reads_proc_devices_the_nvidia_nodes_and_the_paths_asked_for(
    gpu_root, tmp_path
) -> None:
    pveversion = tmp_path / "pveversion"
    pveversion.write_text(
        "#!/bin/sh\necho 'pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)'\n"
    )
    pveversion.chmod(0o755)
    host = FailingRootedHost(gpu_root)
    facts = gather(host, ["/dev/nvidia0", "/dev/fakegpu0"], True, str(pveversion))
    assert facts.nvidia == ("/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl")
    assert [n.path for n in facts.nodes] == [*facts.nvidia, "/dev/fakegpu0"]  # each once
    assert facts.pve_version == "8.2.4"
    assert facts.hooks == ()
    assert facts.devices.char_major("nvidia-uvm") == 238
    assert facts.node("/dev/nvidia0") == HostNode("/dev/nvidia0", "char", 195, 0, 0o666, 44)
    assert facts.node("/dev/fakegpu0") == HostNode("/dev/fakegpu0", "missing")
    assert not facts.node("/dev/fakegpu0").exists and facts.node("/dev/nvidia0").exists
    assert facts.node("/dev/nvidia1") is None  # not looked at
    caps = facts.node("/dev/nvidia-caps")
    assert caps.kind == "dir" and caps.mode == 0o755
    assert caps.children == (
        HostNode("/dev/nvidia-caps/nvidia-cap1", "char", 241, 1, 0o400),
        HostNode("/dev/nvidia-caps/nvidia-cap2", "char", 241, 2, 0o444),
    )  # the README is no node
    assert caps.char_nodes == caps.children
    assert facts.node("/dev/nvidia0").char_nodes == (facts.node("/dev/nvidia0"),)


def test_without_pveversion_or_when_it_fails_the_version_is_unknown(gpu_root, tmp_path) -> None:
    host = FailingRootedHost(gpu_root)
    assert gather(host, []).pve_version is None  # not asked
    assert gather(host, [], True, str(tmp_path / "no-such-command")).pve_version is None
    failing = tmp_path / "pveversion"
    failing.write_text("#!/bin/sh\necho 'pve-manager/8.2.4/x'\nexit 1\n")
    failing.chmod(0o755)
    assert gather(host, [], True, str(failing)).pve_version is None  # a failed run says nothing
    not_pve = tmp_path / "pveversion2"
    not_pve.write_text("#!/bin/sh\necho 'proxmox-ve: 8.2.0'\n")
    not_pve.chmod(0o755)
    assert gather(host, [], True, str(not_pve)).pve_version is None


def test_an_unlistable_dev_still_gives_the_paths_asked_for(gpu_root) -> None:
    facts = gather(FailingRootedHost(gpu_root, broken_dirs=("/dev",)), ["/dev/nvidia0"])
    assert facts.nvidia == () and [n.path for n in facts.nodes] == ["/dev/nvidia0"]
    caps = look_at(
        FailingRootedHost(gpu_root, broken_dirs=("/dev/nvidia-caps",)), "/dev/nvidia-caps"
    )
    assert caps.kind == "dir" and caps.children == ()


def test_only_directories_under_dev_are_opened(gpu_root, tmp_path) -> None:
    (gpu_root / "srv" / "models").mkdir(parents=True)
    os.mknod(gpu_root / "srv" / "models" / "n", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    node = look_at(FailingRootedHost(gpu_root), "/srv/models")
    assert node.kind == "dir" and node.children == ()  # a bind-mounted data dir: not walked
    assert look_at(FailingRootedHost(gpu_root), "/dev/null-ish").kind == "file"
    assert look_at(FailingRootedHost(gpu_root), "/dev/nvidia-caps/").children[0].path == (
        "/dev/nvidia-caps/nvidia-cap1")  # fmt: skip
    assert look_at_file(FailingRootedHost(gpu_root), "/dev/nvidia-caps").children == ()
    assert look_at_file(FailingRootedHost(gpu_root), "/dev/nope") == HostNode(
        "/dev/nope", "missing"
    )


def test_the_nvidia_names_of_an_ls_dev_are_the_nodes_and_node_directories() -> None:
    names = ["nvidia-caps", "nvidiactl", "nvidia0", "nvidia12", "nvidia-uvm", "nvidia-uvm-tools",
             "nvidia-modeset", "nvidia-nvswitch0", "nvidia-caps-imex-channels", "nvidia-nvlink",
             "nvidiafoo", "null", "dri", "mynvidia0"]  # fmt: skip
    assert nvidia_paths(names) == [
        "/dev/nvidia-caps", "/dev/nvidia-caps-imex-channels", "/dev/nvidia-modeset",
        "/dev/nvidia-nvswitch0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0",
        "/dev/nvidia12", "/dev/nvidiactl",
    ]  # fmt: skip
    assert nvidia_paths([]) == []


def test_pveversion_output_gives_the_manager_version() -> None:
    assert parse_pveversion("pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8)") == "8.2.4"
    assert parse_pveversion("pve-manager/9/abc") == "9"
    assert parse_pveversion("proxmox-ve: 8.2.0 (running kernel: 6.8.12-1-pve)") is None
    assert parse_pveversion("") is None


def test_pveversion_is_the_command_on_the_path_and_only_run_when_asked(
    gpu_root, tmp_path, monkeypatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pveversion").write_text("#!/bin/sh\necho 'pve-manager/8.1.3/b46aac3b42da5d15'\n")
    (bin_dir / "pveversion").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert gather(FailingRootedHost(gpu_root), [], True).pve_version == "8.1.3"
    assert gather(FailingRootedHost(gpu_root), []).pve_version is None  # not asked: not run
    assert gather(FailingRootedHost(gpu_root, gone=True), [], True).pve_version is None
