"""The Xid forge from inside a real LXC container (issue 33.4, suspected there): a process
in the CT crashes a program whose file is named like a fatal Xid; the HOST's kernel log
gets the segfault line (the kernel and its log are shared), and host.xid's parser must not
read it as an Xid. The program is the 124-byte ELF of tests/hosts/test_xid_forge.py,
copied into the CT's rootfs and run with ``lxc-attach``. Issue 46.1: also with a newline in
the file's name before the driver's whole line (read as records, it stays inside the
segfault record)."""

from __future__ import annotations

import os
import platform
import secrets
from collections.abc import Callable

import pytest

from gpudoctor.facts.xid import xid_events
from tests.hosts.test_xid_forge import _record_with, crashing_elf

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("before", ["", "x\n"])
def test_a_segfault_in_a_ct_quoting_an_xid_is_not_an_xid(
    lab_container: Callable, before: str
) -> None:
    if platform.machine() != "x86_64" or os.geteuid() != 0:
        pytest.skip("needs x86-64 and root (the kernel log)")
    ct = lab_container()
    nonce = secrets.token_hex(4)
    forged = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={nonce}, name=ct, GPU has fallen off the bus."
    name = before + forged
    program = ct.rootfs / "srv" / name
    program.parent.mkdir(exist_ok=True)
    program.write_bytes(crashing_elf())
    os.chmod(program, 0o755)
    crashed = ct.attach([f"/srv/{name}"], timeout=30)
    assert crashed.returncode != 0, crashed
    record = _record_with(nonce)
    if record is None:
        pytest.skip(f"the kernel did not log the segfault: {crashed}")
    assert "segfault at 0" in record.message and name in record.message  # the host's log
    assert xid_events([record]) == []
