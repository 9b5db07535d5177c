"""The Xid forge (issue 33.4) on the real kernel: any user, or any process in a CT (the
kernel log is the host's), makes the kernel print a segfault line quoting a fatal Xid by
crashing a program whose file is named ``NVRM: Xid (PCI:0000:3b:00): 79, ...``.

The attacker is ``nobody`` (``setpriv``); the program is a 124-byte static x86-64 ELF
made here (no compiler needed) whose first instruction reads address 0, so the kernel's
``show_signal_msg`` names its file in ``... segfault at 0 ip ... in FILE[...]``. The log is
read the way ``host.xid`` reads it (``read_kernel_log`` on the local host: journald's
records, else /dev/kmsg's); the forged record must be there, and must not be an Xid.

Issue 46.1: a file name holding a newline, then the driver's whole line. Read as text,
the kernel's record showed that second line on a line of its own (indented by dmesg and
journalctl, under the record's own stamp by ``dmesg -S``), and ``check`` FAILed with Xid 79.
As a record, it holds a newline and does not begin with ``NVRM: ``."""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from gpudoctor.context import CheckOptions
from gpudoctor.facts.xid import KernelRecord, parse_kernel_log, read_kernel_log, xid_events
from gpudoctor.hosts import LocalHost
from gpudoctor.model import Status
from gpudoctor.runner import run_checks
from tests.fakes.rooted_host import RootedHost

NOBODY = 65534


def crashing_elf() -> bytes:
    """Return a static x86-64 ELF whose entry is ``xor eax,eax; mov eax,[rax]`` (SIGSEGV
    at address 0, inside the file's own mapping)."""
    code = bytes.fromhex("31c08b00")
    base, size = 0x400000, 64 + 56 + 4
    header = b"\x7fELF\x02\x01\x01" + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + 120, 64, 0, 0, 64, 56, 1, 64, 0, 0)
    program = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)
    return header + program + code


def _record_with(nonce: str, deadline_s: float = 20.0) -> KernelRecord | None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        log = read_kernel_log(LocalHost())
        hits = [record for record in log.records if nonce in record.message]
        if hits:
            return hits[-1]
        time.sleep(0.2)
    return None


def _crash_as_nobody(program: Path) -> None:
    if platform.machine() != "x86_64" or shutil.which("setpriv") is None:
        pytest.skip("needs x86-64 and setpriv")
    if os.geteuid() != 0:
        pytest.skip("reading the kernel log needs root here (kernel.dmesg_restrict)")
    program.write_bytes(crashing_elf())
    os.chmod(program, 0o755)
    crash = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", str(program)],
        capture_output=True,
    )  # fmt: skip
    assert crash.returncode == -11, crash  # SIGSEGV, as the attacker wanted


def test_a_segfault_line_quoting_an_xid_is_not_an_xid(public_tmp_path: Path) -> None:
    nonce = secrets.token_hex(4)
    forged = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={nonce}, name=x, GPU has fallen off the bus."
    _crash_as_nobody(public_tmp_path / forged)
    record = _record_with(nonce)
    if record is None:
        pytest.skip("the kernel did not log the segfault (debug.exception-trace=0 or rate-limited)")
    assert "segfault at 0" in record.message and forged in record.message  # the forge is logged
    assert xid_events([record]) == []
    assert parse_kernel_log(record.line + "\n") == []  # the record as a text line, too
    real = KernelRecord("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    assert [e.code for e in xid_events([real])] == [79]  # the driver's own record still counts


def test_a_newline_in_the_program_name_does_not_make_a_record_of_its_own(
    public_tmp_path: Path,
) -> None:
    """Issue 46.1: ``x<newline>NVRM: Xid (PCI:0000:3b:00): 79, ...`` crashed by nobody.
    The real host.xid check (real journalctl/dd on this machine's kernel; only the
    container markers are read under an empty root, as this test machine is a container
    where host.xid rightly skips) PASSes: on the code before, dmesg showed the name's
    second line indented and it was a FAIL, Xid 79 on 0000:3b:00."""
    nonce = secrets.token_hex(4)
    forged = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={nonce}, name=x, GPU has fallen off the bus."
    _crash_as_nobody(public_tmp_path / f"x\n{forged}")
    record = _record_with(nonce)
    if record is None:
        pytest.skip("the kernel did not log the segfault (debug.exception-trace=0 or rate-limited)")
    assert f"\n{forged}" in record.message  # the newline stayed inside the segfault record
    (public_tmp_path / "root").mkdir()
    report = run_checks(RootedHost(str(public_tmp_path / "root")), CheckOptions(only=("host.xid",)))
    assert [(f.subject, f.status) for f in report.findings] == [("kernel log", Status.PASS)]
