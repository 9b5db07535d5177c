"""The Xid forge (issue 33.4) on the real kernel: any user, or any process in a CT (the
kernel log is the host's), makes the kernel print a segfault line quoting a fatal Xid by
crashing a program whose file is named ``NVRM: Xid (PCI:0000:3b:00): 79, ...``.

The attacker is ``nobody`` (``setpriv``); the program is a 124-byte static x86-64 ELF
made here (no compiler needed) whose first instruction reads address 0, so the kernel's
``show_signal_msg`` names its file in ``... segfault at 0 ip ... in FILE[...]``. The log is
read the way ``host.xid`` reads it (``read_kernel_log`` on the local host: journalctl,
else dmesg); the forged line must be there, and must not be an Xid."""

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

from gpudoctor.facts.xid import parse_kernel_log, read_kernel_log
from gpudoctor.hosts import LocalHost

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


def _log_line_with(nonce: str, deadline_s: float = 20.0) -> str | None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        log = read_kernel_log(LocalHost())
        hits = [line for line in log.text.splitlines() if nonce in line]
        if hits:
            return hits[-1]
        time.sleep(0.2)
    return None


def test_a_segfault_line_quoting_an_xid_is_not_an_xid(public_tmp_path: Path) -> None:
    if platform.machine() != "x86_64" or shutil.which("setpriv") is None:
        pytest.skip("needs x86-64 and setpriv")
    if os.geteuid() != 0:
        pytest.skip("reading the kernel log needs root here (kernel.dmesg_restrict)")
    nonce = secrets.token_hex(4)
    forged = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={nonce}, name=x, GPU has fallen off the bus."
    program = public_tmp_path / forged
    program.write_bytes(crashing_elf())
    os.chmod(program, 0o755)
    crash = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", str(program)],
        capture_output=True,
    )  # fmt: skip
    assert crash.returncode == -11, crash  # SIGSEGV, as the attacker wanted
    line = _log_line_with(nonce)
    if line is None:
        pytest.skip("the kernel did not log the segfault (debug.exception-trace=0 or rate-limited)")
    assert "segfault at 0" in line and forged in line  # the forge reached the real kernel log
    events = parse_kernel_log(line + "\n")
    assert events == [], events  # on main: [XidEvent(79, '0000:3b:00', ...)]: a FAIL, an alert
    real = (
        line[: line.index("]") + 1]
        + " NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    )
    assert [e.code for e in parse_kernel_log(real)] == [79]  # the driver's own line still counts
