"""What `host.kernel_modules` is told about a host's kernels: the running one, the one the
next boot uses and why, and whether each has an nvidia module (where, or what was looked
at). A real host root (tests/fakes/rooted_host.py: a directory tree with /lib/modules,
/boot and /proc files), and `modinfo`, `dkms`, `proxmox-boot-tool` as stand-in scripts on
PATH printing recorded real outputs (tests/data/recorded/kernel/SOURCES.md): this machine
has no nvidia module and is no Proxmox host."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.facts.kernel import (
    DkmsEntry,
    KernelFacts,
    ModuleState,
    build_command,
    gather,
    grub_default,
    in_container,
    next_boot_kernel,
    parse_dkms_status,
    parse_kernel_list,
    version_key,
)
from tests.fakes.rooted_host import RootedHost

DATA = Path(__file__).parent.parent / "data" / "recorded" / "kernel"
NOT_FOUND = "modinfo: ERROR: Module nvidia not found."
WHERE = "updates/dkms,extra,updates,kernel/drivers/video,misc"


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    return tools


def tool(bin_dir: Path, name: str, script: str) -> None:
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def prints(bin_dir: Path, name: str, recorded: str) -> None:
    tool(bin_dir, name, f'cat "{DATA / recorded}"\n')


def modinfo_finds(bin_dir: Path, found: dict[str, str]) -> None:
    """modinfo -k K -F filename nvidia: the path for the kernels in ``found``, else the
    real "not found" error (exit 1); other arguments: its usage error."""
    cases = "".join(f'  {k}) echo "{p}";;\n' for k, p in found.items())
    tool(bin_dir, "modinfo",
         '[ "$1 $3 $4 $5 $#" = "-k -F filename nvidia 5" ] || { echo "modinfo: bad usage" >&2; exit 1; }\n'
         f'case "$2" in\n{cases}  *) echo "{NOT_FOUND}" >&2; exit 1;;\nesac\n')  # fmt: skip


def root_with(tmp_path: Path, running: str, files: dict[str, str] = {}) -> RootedHost:  # noqa: B006
    root = tmp_path / "root"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(running + "\n")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return RootedHost(str(root))


def test_a_proxmox_host_whose_next_kernel_has_no_module(tmp_path: Path, bin_dir: Path) -> None:
    """Running 6.8.12-9 (built by DKMS), next boot pinned to 6.8.12-17 (DKMS did not build
    it): the user is told both, which one boots next and why, and what was looked at."""
    prints(bin_dir, "proxmox-boot-tool", "pve-kernel-cleanup-tests_pbt-kernel-list-next-boot.txt")
    tool(bin_dir, "dkms", 'echo "nvidia/570.133.07, 6.8.12-9-pve, x86_64: installed"\n'
         'echo "nvidia/570.133.07: added"\necho "zfs/2.2.7, 6.8.12-9-pve, x86_64: installed"\n')  # fmt: skip
    modinfo_finds(bin_dir, {"6.8.12-9-pve": "/lib/modules/6.8.12-9-pve/updates/dkms/nvidia.ko"})
    host = root_with(tmp_path, "6.8.12-9-pve")
    (tmp_path / "root/lib/modules/6.8.12-17-pve/kernel").mkdir(parents=True)
    built = DkmsEntry("nvidia", "570.133.07", "6.8.12-9-pve", "installed")
    added = DkmsEntry("nvidia", "570.133.07", "", "added")
    assert gather(host) == KernelFacts(
        running="6.8.12-9-pve",
        next_boot="6.8.12-17-pve",
        next_why="pinned for the next boot (proxmox-boot-tool kernel pin --next-boot)",
        modules={
            "6.8.12-9-pve": ModuleState(
                "6.8.12-9-pve", True, "/lib/modules/6.8.12-9-pve/updates/dkms/nvidia.ko",
                ("modinfo -k 6.8.12-9-pve nvidia: /lib/modules/6.8.12-9-pve/updates/dkms/nvidia.ko",),
                (built,),
            ),
            "6.8.12-17-pve": ModuleState(
                "6.8.12-17-pve", False, "",
                (f"modinfo -k 6.8.12-17-pve nvidia: {NOT_FOUND}",
                 f"no nvidia.ko* under /lib/modules/6.8.12-17-pve/{{{WHERE}}}"),
            ),
        },
        dkms=(built, added),
        dkms_versions=("570.133.07",),
        proxmox=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("sub", "name"),
    [("extra", "nvidia.ko.zst"), ("updates", "nvidia.ko.xz"), ("misc", "nvidia.ko"),
     ("kernel/drivers/video", "nvidia.ko.gz")],
)  # fmt: skip
def test_a_module_modinfo_does_not_know_is_found_on_disk(
    tmp_path: Path, bin_dir: Path, sub: str, name: str
) -> None:
    """modinfo without depmod's index says "not found"; the module file is there anyway
    (a packaged driver's extra/, a hand-built one's misc/): present, with where and why."""
    modinfo_finds(bin_dir, {})
    tool(bin_dir, "dkms", 'echo "nvidia/535.183.01, 6.1.0-28-amd64, x86_64: built"\n')
    host = root_with(tmp_path, "6.1.0-28-amd64")
    where = tmp_path / "root/lib/modules/6.1.0-28-amd64" / sub
    where.mkdir(parents=True)
    (where / "nvidia-uvm.ko").write_text("")
    (where / name).write_text("")
    facts = gather(host)
    path = f"/lib/modules/6.1.0-28-amd64/{sub}/{name}"
    assert facts.modules["6.1.0-28-amd64"] == ModuleState(
        "6.1.0-28-amd64", True, path,
        (f"modinfo -k 6.1.0-28-amd64 nvidia: {NOT_FOUND}", f"found {path}"),
        (DkmsEntry("nvidia", "535.183.01", "6.1.0-28-amd64", "built"),),
    )  # fmt: skip
    assert (facts.dkms_versions, facts.proxmox) == (("535.183.01",), False)


def test_a_kernel_without_a_modules_directory_and_without_modinfo(
    tmp_path: Path, bin_dir: Path
) -> None:
    """No modinfo at all (exit 127, kmod not installed) and no /lib/modules/K: the user
    reads that the directory does not exist, and what DKMS holds for that kernel."""
    tool(bin_dir, "modinfo", "exit 127\n")
    prints(bin_dir, "dkms", "askubuntu_dkms3-status-two-kernels.txt")
    host = root_with(tmp_path, "6.2.0-34-generic")
    (tmp_path / "root/lib/modules").mkdir(parents=True)
    facts = gather(host)
    mine = DkmsEntry("nvidia", "535.113.01", "6.2.0-34-generic", "installed")
    assert facts.dkms == (mine,)  # the 8812au wifi module is not the NVIDIA driver's
    assert facts.modules == {
        "6.2.0-34-generic": ModuleState(
            "6.2.0-34-generic", False, "",
            ("/lib/modules/6.2.0-34-generic does not exist",
             "dkms: nvidia/535.113.01, 6.2.0-34-generic: installed"),
            (mine,),
        )
    }  # fmt: skip


def test_a_failing_modinfo_says_its_last_line_or_exit_status(tmp_path: Path, bin_dir: Path) -> None:
    tool(bin_dir, "modinfo", 'echo "libkmod: warning" >&2\necho "' + "m" * 250 + '" >&2\nexit 1\n')
    tool(bin_dir, "dkms", "exit 1\n")
    host = root_with(tmp_path, "6.8.12-4-pve")
    (tmp_path / "root/lib/modules/6.8.12-4-pve").mkdir(parents=True)
    state = gather(host).modules["6.8.12-4-pve"]
    assert state.evidence[0] == f"modinfo -k 6.8.12-4-pve nvidia: {'m' * 200}"
    tool(bin_dir, "modinfo", "exit 2\n")
    state = gather(host).modules["6.8.12-4-pve"]
    assert state.evidence[0] == "modinfo -k 6.8.12-4-pve nvidia: exit 2"


GRUB = (
    "#\n# DO NOT EDIT THIS FILE\n#\n# It is automatically generated by grub-mkconfig\n#\n"
    'set default="0"\nmenuentry "Debian GNU/Linux" {\n'
    "\tlinux\t/boot/vmlinuz-6.1.0-28-amd64 root=UUID=x ro quiet\n}\n"
    "menuentry 'Debian, with Linux 6.1.0-27-amd64' {\n"
    "\tlinux\t/boot/vmlinuz-6.1.0-27-amd64 root=UUID=x ro quiet\n}\n"
)


@pytest.mark.parametrize(
    ("pbt", "files", "expected"),
    [
        # Proxmox with systemd-boot listing kernels: the newest selected one
        ("pxvirt-docs_pbt-kernel-list.txt", {},
         ("6.8.12-4-pve", "the newest kernel proxmox-boot-tool selected", True)),
        ("pve-blog-tw_pbt-kernel-list-pinned.txt", {},
         ("6.5.13-6-pve", "pinned (proxmox-boot-tool kernel pin)", True)),
        # Proxmox whose proxmox-boot-tool lists nothing (GRUB, not managed): grub's default
        ("", {"boot/grub/grub.cfg": GRUB},
         ("6.1.0-28-amd64", "the default entry of /boot/grub/grub.cfg", True)),
        # plain Debian: grub.cfg's first entry
        (None, {"boot/grub/grub.cfg": GRUB},
         ("6.1.0-28-amd64", "the default entry of /boot/grub/grub.cfg", False)),
        # grub boots a saved entry: unknown from grub.cfg, so the newest installed kernel
        (None, {"boot/grub/grub.cfg": GRUB.replace('"0"', '"saved"'),
                "boot/vmlinuz-6.1.0-9-amd64": "", "boot/vmlinuz-6.1.0-10-amd64": "",
                "lib/modules/6.1.0-10-amd64/modules.dep": "",
                "lib/modules/6.1.0-9-amd64/modules.dep": "",
                "lib/modules/6.1.0-11-amd64/modules.dep": ""},  # removed: no vmlinuz left
         ("6.1.0-10-amd64", "the newest kernel in /boot (no boot loader default was readable)", False)),
        # nothing readable at all
        (None, {}, ("", "", False)),
        ("", {}, ("", "", True)),
    ],
)  # fmt: skip
def test_which_kernel_boots_next_and_why(
    tmp_path: Path, bin_dir: Path, pbt: str | None, files: dict[str, str], expected: tuple
) -> None:
    if pbt is not None:
        if pbt:
            prints(bin_dir, "proxmox-boot-tool", pbt)
        else:
            tool(bin_dir, "proxmox-boot-tool", 'echo "Manually selected kernels:"\necho "None."\n')
    host = root_with(tmp_path, "6.1.0-9-amd64", files)
    assert next_boot_kernel(host) == expected


def test_boot_kernels_sections_and_version_order() -> None:
    """The next-boot pin wins over the pin; a kernel list is ordered as versions
    (6.8.12-10 after 6.8.12-9; 6.14 after 6.5)."""
    listing = parse_kernel_list(
        (DATA / "pve-kernel-cleanup-tests_pbt-kernel-list-next-boot.txt").read_text()
    )
    assert (listing.manual, listing.automatic, listing.pinned, listing.next_boot) == (
        (), ("6.8.12-9-pve", "6.8.12-17-pve"), "6.8.12-9-pve", "6.8.12-17-pve")  # fmt: skip
    manual = parse_kernel_list(
        "Manually selected kernels:\n6.5.13-6-pve\n\nAutomatically selected kernels:\n6.14.8-2-pve\n"
    )
    assert manual.manual == ("6.5.13-6-pve",) and manual.boots_next()[0] == "6.14.8-2-pve"
    # a line before any section heading (a warning, a stray version) belongs to no section
    stray = parse_kernel_list(
        "6.8.12-4-pve\nE: warning\nAutomatically selected kernels:\n6.8.12-5-pve\n"
    )
    assert stray == parse_kernel_list("Automatically selected kernels:\n6.8.12-5-pve\n")
    assert stray.automatic == ("6.8.12-5-pve",)
    assert parse_kernel_list("Manually selected kernels:\nNone.\n").boots_next() == ("", "")
    assert sorted(["6.8.12-10-pve", "6.8.12-9-pve", "6.14.8-2-pve", "6.5.13-6-pve"], key=version_key) == [
        "6.5.13-6-pve", "6.8.12-9-pve", "6.8.12-10-pve", "6.14.8-2-pve"]  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "kernel"),
    [(GRUB, "6.1.0-28-amd64"), (GRUB.replace('set default="0"\n', ""), "6.1.0-28-amd64"),
     (GRUB.replace('"0"', "0"), "6.1.0-28-amd64"), (GRUB.replace('"0"', '"1"'), ""),
     (GRUB.replace('"0"', '""'), "6.1.0-28-amd64"),
     ("set default=\"0\"\n", "")],
)  # fmt: skip
def test_grub_default_entry(cfg: str, kernel: str) -> None:
    assert grub_default(cfg) == kernel


def test_dkms_states_are_read_in_lower_case_and_the_build_command() -> None:
    (entry,) = parse_dkms_status("nvidia/550.54.14, 6.8.4-2-pve, x86_64: Installed\n")
    assert entry.state == "installed"
    assert build_command("6.8.12-5-pve", True) == (
        "apt install proxmox-headers-6.8.12-5-pve && dkms autoinstall -k 6.8.12-5-pve")  # fmt: skip
    assert build_command("6.1.0-28-amd64", False) == (
        "apt install linux-headers-6.1.0-28-amd64 && dkms autoinstall -k 6.1.0-28-amd64")  # fmt: skip


@pytest.mark.parametrize(
    ("files", "manager"),
    [({"run/systemd/container": "lxc\n"}, "lxc"),
     ({"run/systemd/container": "", "run/host/container-manager": "podman\n"}, "podman"),
     ({"run/host/container-manager": "podman\n"}, "podman"),
     ({".dockerenv": ""}, "docker"),
     ({"proc/1/environ": "PATH=/usr/bin\0container=lxc \0HOME=/\0"}, "lxc"),
     ({"proc/1/environ": "PATH=/usr/bin\0HOME=/\0"}, ""),
     ({}, "")],
)  # fmt: skip
def test_a_container_is_known_as_one(tmp_path: Path, files: dict[str, str], manager: str) -> None:
    """systemd's and podman's markers, Docker's /.dockerenv, then LXC's container= in
    PID 1's environment; a host has none of them."""
    assert in_container(root_with(tmp_path, "6.8.12-4-pve", files)) == manager


class TimeoutsSeen(RootedHost):
    """The real root tree and commands, noting the time limit each command ran under."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.timeouts: dict[str, float] = {}

    def run(self, argv, timeout=30.0, input=None):
        self.timeouts[argv[0]] = timeout
        return super().run(argv, timeout, input)


def test_without_proc_the_running_kernel_comes_from_uname_and_every_command_is_bounded(
    tmp_path: Path, bin_dir: Path
) -> None:
    """/proc/sys/kernel/osrelease unreadable: `uname -r` names the running kernel; no
    tool can hang the check (uname 10 s, modinfo 15 s, the others 20 s)."""
    tool(bin_dir, "uname", '[ "$*" = "-r" ] && echo "6.8.12-4-pve" || exit 1\n')
    prints(bin_dir, "proxmox-boot-tool", "pxvirt-docs_pbt-kernel-list.txt")
    prints(bin_dir, "dkms", "pve-llm-guide_dkms3-status.txt")
    modinfo_finds(bin_dir, {"6.8.12-4-pve": "/lib/modules/6.8.12-4-pve/updates/dkms/nvidia.ko"})
    (tmp_path / "root").mkdir()
    host = TimeoutsSeen(str(tmp_path / "root"))
    facts = gather(host)
    assert (facts.running, facts.next_boot, facts.proxmox) == ("6.8.12-4-pve", "6.8.12-4-pve", True)
    assert list(facts.modules) == ["6.8.12-4-pve"] and facts.modules["6.8.12-4-pve"].present
    assert facts.dkms_versions == ("570.133.07",)
    assert host.timeouts == {"uname": 10, "dkms": 20, "proxmox-boot-tool": 20, "modinfo": 15}
    tool(bin_dir, "uname", "exit 1\n")
    assert gather(host).running == ""
