"""Kernel/DKMS parsing on recorded real outputs (tests/data/recorded/kernel/SOURCES.md), and
the host.kernel_modules / host.xid / driver.loaded / cuda.init verdicts on recorded hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.context import CheckOptions
from gpudoctor.facts.kernel import (
    grub_default,
    parse_dkms_status,
    parse_kernel_list,
    version_key,
)
from gpudoctor.hosts.base import FileStat
from gpudoctor.model import Report, Status
from gpudoctor.runner import run_checks
from tests.fakes.kernel_records import JOURNAL, KMSG, journal_json, kmsg
from tests.fakes.recorded_host import RecordedHost
from tests.unit.scenarios import h200_host, healthy_probe

DATA = Path(__file__).parent.parent / "data" / "recorded"


def text(name: str) -> str:
    return (DATA / "kernel" / name).read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "negativo17-56_dkms2-status.txt",
            [("nvidia", "396.45", k, "installed") for k in
             ("4.17.11-200.fc28.x86_64", "4.17.12-200.fc28.x86_64", "4.17.14-202.fc28.x86_64")],
        ),
        ("negativo17-56_dkms2-status-original-module.txt",
         [("nvidia", "396.45", "4.17.14-202.fc28.x86_64", "installed")]),
        ("pve-foxi_dkms2-status.txt", [("nvidia", "460.73.01", "5.4.203-1-pve", "installed")]),
        (
            "askubuntu_dkms3-status-two-kernels.txt",
            [("8812au", "5.6.4.2_35491.20191025", "5.15.0-86-generic", "installed"),
             ("8812au", "5.6.4.2_35491.20191025", "6.2.0-34-generic", "installed"),
             ("nvidia", "535.113.01", "6.2.0-34-generic", "installed")],
        ),
        ("blog-kernel-6.6_dkms3-status-added-only.txt", [("nvidia", "535.154.05", "", "added")]),
        ("pve-llm-guide_dkms3-status.txt", [("nvidia", "570.133.07", "7.0.6-2-pve", "installed")]),
        ("pve-zfs-notes_dkms3-status-original-modules.txt",
         [("zfs", "2.4.99", "7.0.0-3-pve", "installed")]),
    ],
)  # fmt: skip
def test_dkms_status_formats(name: str, expected: list[tuple[str, str, str, str]]) -> None:
    got = [(e.module, e.version, e.kernel, e.state) for e in parse_dkms_status(text(name))]
    assert got == expected


def test_dkms_note_kept() -> None:
    (entry,) = parse_dkms_status(text("negativo17-56_dkms2-status-original-module.txt"))
    assert entry.note == "(original_module exists)"


@pytest.mark.parametrize(
    ("name", "kernel", "why"),
    [
        ("pve-blog-tw_pbt-kernel-list-pinned.txt", "6.5.13-6-pve", "pinned"),
        ("pxvirt-docs_pbt-kernel-list.txt", "6.8.12-4-pve", "newest"),
        ("pve-homelab-notes_pbt-kernel-list-indented.txt", "7.0.0-3-pve", "newest"),
        ("pve-kernel-cleanup-tests_pbt-kernel-list-next-boot.txt", "6.8.12-17-pve", "next boot"),
    ],
)
def test_proxmox_boot_tool_next_kernel(name: str, kernel: str, why: str) -> None:
    got, reason = parse_kernel_list(text(name)).boots_next()
    assert got == kernel
    assert why in reason


def test_kernel_list_sections() -> None:
    listing = parse_kernel_list(text("pve-blog-tw_pbt-kernel-list-pinned.txt"))
    assert listing.manual == ()
    assert listing.automatic == ("6.11.11-2-pve", "6.14.8-2-pve", "6.5.13-6-pve")
    assert listing.pinned == "6.5.13-6-pve"


def test_version_order_and_grub() -> None:
    assert (
        max(["6.8.12-9-pve", "6.8.12-10-pve", "6.5.13-6-pve"], key=version_key) == "6.8.12-10-pve"
    )
    cfg = 'set default="0"\nmenuentry "Debian" {\n\tlinux\t/boot/vmlinuz-6.1.0-28-amd64 root=UUID=x ro\n}\n'
    assert grub_default(cfg) == "6.1.0-28-amd64"
    assert grub_default(cfg.replace('"0"', '"saved"')) == ""


def pve_host(running: str, listing: str, dkms: str, with_module: set[str]) -> RecordedHost:
    host = h200_host()
    host.files["/proc/sys/kernel/osrelease"] = running + "\n"
    host.commands["proxmox-boot-tool kernel list"] = (0, listing)
    host.commands["dkms status"] = (0, dkms)
    for kernel in {running, *parse_kernel_list(listing).automatic}:
        host.nodes[f"/lib/modules/{kernel}"] = FileStat(f"/lib/modules/{kernel}", "dir", 0o755)
        if kernel in with_module:
            path = f"/lib/modules/{kernel}/updates/dkms/nvidia.ko"
            host.commands[f"modinfo -k {kernel} -F filename nvidia"] = (0, path + "\n")
        else:
            host.commands[f"modinfo -k {kernel} -F filename nvidia"] = (
                1, "modinfo: ERROR: Module nvidia not found.\n")  # fmt: skip
    return host


def run(host: RecordedHost, only: tuple[str, ...] = ()) -> Report:
    return run_checks(host, CheckOptions(only=only))


def test_next_boot_kernel_without_module_warns_with_build_and_pin() -> None:
    listing = text("pxvirt-docs_pbt-kernel-list.txt").replace(
        "6.8.12-4-pve\n", "6.8.12-4-pve\n6.8.12-5-pve\n")  # fmt: skip
    dkms = "nvidia/580.159.04, 6.8.12-4-pve, x86_64: installed\n"
    host = pve_host("6.8.12-4-pve", listing, dkms, {"6.8.12-4-pve"})
    report = run(host, ("host.kernel_modules",))
    by_subject = {f.subject: f for f in report.findings}
    assert by_subject["6.8.12-4-pve"].status is Status.PASS
    nxt = by_subject["6.8.12-5-pve"]
    assert nxt.status is Status.WARN
    assert "DKMS holds nvidia 580.159.04 but did not build it for 6.8.12-5-pve" in nxt.message
    assert "dkms autoinstall -k 6.8.12-5-pve" in nxt.remediation
    assert "proxmox-headers-6.8.12-5-pve" in nxt.remediation
    assert "proxmox-boot-tool kernel pin 6.8.12-4-pve" in nxt.remediation


def test_after_reboot_without_module_driver_loaded_names_dkms() -> None:
    listing = text("pxvirt-docs_pbt-kernel-list.txt")
    dkms = text("blog-kernel-6.6_dkms3-status-added-only.txt")
    host = pve_host("6.8.12-4-pve", listing, dkms, set())
    del host.files["/proc/driver/nvidia/version"]
    report = run(host, ("host.kernel_modules", "driver.loaded"))
    (kernel,) = [f for f in report.findings if f.check_id == "host.kernel_modules"]
    assert (
        kernel.status is Status.FAIL
        and "running kernel 6.8.12-4-pve has no NVIDIA module" in kernel.message
    )
    (loaded,) = [f for f in report.findings if f.check_id == "driver.loaded"]
    assert loaded.status is Status.FAIL
    assert "DKMS did not build the module for this kernel" in loaded.message
    assert "host.kernel_modules" in loaded.caused_by
    assert "dkms autoinstall" in loaded.remediation


def test_kernel_checks_skip_inside_a_container() -> None:
    host = h200_host()
    host.files["/run/systemd/container"] = "lxc\n"
    report = run(host, ("host",))
    assert {f.status for f in report.findings} == {Status.SKIP}
    assert all("inside a container (lxc)" in f.message for f in report.findings)


def test_a_loaded_driver_from_outside_lib_modules_is_not_a_missing_module() -> None:
    """Seen on the H200 (a Firecracker VM whose nvidia module is loaded from its image, not
    from /lib/modules/K): the driver works, so the running kernel must not FAIL."""
    listing = text("pxvirt-docs_pbt-kernel-list.txt")
    host = pve_host("6.8.12-4-pve", listing, "", set())
    report = run(host, ("host.kernel_modules",))
    (running,) = [f for f in report.findings if f.subject == "6.8.12-4-pve"]
    assert running.status is Status.PASS
    assert "has the NVIDIA driver loaded, from outside /lib/modules/6.8.12-4-pve" in running.message
    assert any(e.startswith("/proc/driver/nvidia/version: ") for e in running.evidence)


def test_an_lxc_ct_without_systemd_is_known_by_its_init_environment() -> None:
    """Seen on the H200: an LXC CT whose init is `sleep infinity` has no
    /run/systemd/container; LXC sets container=lxc in its init's environment."""
    host = h200_host()
    host.files["/proc/1/environ"] = "PATH=/usr/bin\0container=lxc\0HOME=/\0"
    report = run(host, ("host",))
    assert {f.status for f in report.findings} == {Status.SKIP}
    assert all("inside a container (lxc)" in f.message for f in report.findings)


def test_xid79_explains_cuinit_failure() -> None:
    host = h200_host()
    log = (DATA / "kernel_log" / "nvswitch-host_dmesg-xid79-unknown-pid.txt").read_text()
    host.commands[JOURNAL] = (0, journal_json(log))
    host.probe_lines = healthy_probe(cuda_rc=999)
    report = run(host)
    (xid,) = [f for f in report.findings if f.check_id == "host.xid"]
    assert xid.status is Status.FAIL and xid.subject == "Xid 79 on 0000:91:00"
    assert "events since boot: 1" in xid.evidence
    assert "reboot the node" in xid.remediation.lower()
    (cuda,) = [f for f in report.findings if f.check_id == "cuda.init"]
    assert cuda.status is Status.FAIL
    assert cuda.caused_by == ("host.xid",)
    assert "a GPU problem, not a config problem" in cuda.message


def test_app_xids_warn_and_kmsg_fallback() -> None:
    host = h200_host()
    log = (DATA / "kernel_log" / "pastebin-fTNHmgzB_journalctl-xid69-xid31.txt").read_text()
    host.commands[JOURNAL] = (1, "No journal files were found.")
    host.commands[KMSG] = (1, kmsg(log))  # dd ends at EAGAIN: exit 1 after every record
    report = run(host, ("host.xid",))
    statuses = {f.subject: f.status for f in report.findings}
    assert statuses == {"Xid 69 on 0000:08:00": Status.WARN, "Xid 31 on 0000:08:00": Status.WARN}
    assert all("source: /dev/kmsg" in f.evidence for f in report.findings)


def test_no_xid_passes_and_unreadable_log_skips() -> None:
    host = h200_host()
    host.commands[JOURNAL] = (0, journal_json("[ 1.0] Linux version 6.8\n"))
    (finding,) = run(host, ("host.xid",)).findings
    assert finding.status is Status.PASS
    assert finding.evidence == ("journalctl -k -b -o json: 1 records read",)
    host = h200_host()
    host.commands[KMSG] = (1, "dd: failed to open '/dev/kmsg': Operation not permitted")
    (finding,) = run(host, ("host.xid",)).findings
    assert finding.status is Status.SKIP and "Operation not permitted" in finding.message
