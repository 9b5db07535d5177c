"""`gpudoctor fix` asks before it writes a CT's config and restarts it, and the safe answer
is the default: pressing Enter at the question changes nothing (exit 4, changes pending);
only a typed "y" applies. A real `gpudoctor fix` process on a real pseudo-terminal
(python's ``pty``: its "is stdin a terminal?" check takes the asking side), on an
/etc/pve-like tree of real files (tests/fakes/pvetree.py); `pct` is a stand-in for a
stopped CT (tests/pve/support.py), so an applied fix writes without restarting anything."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.pvetree import PveTree
from tests.pve.support import stopped_pct

CONF = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"
QUESTION = b"Apply this change"
REPO = Path(__file__).resolve().parents[2]


def _answer(args: list[str], env: dict[str, str], reply: bytes) -> tuple[int, bytes]:
    """Run ``gpudoctor fix ARGS`` on a pty; when it asks, type ``reply``; return (exit
    code, everything it wrote)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", "fix", *args],
                            stdin=follower, stdout=follower, stderr=follower, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), **env},
                            start_new_session=True)  # fmt: skip
    os.close(follower)
    seen, asked = b"", False
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 120)
            if not ready:
                raise AssertionError(f"no output for 120 s: {seen[-800:]!r}")
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the pty
                break
            if not data:
                break
            seen += data
            if not asked and QUESTION in seen:
                os.write(leader, reply)
                asked = True
    finally:
        os.close(leader)
        if proc.poll() is None and not asked:
            proc.kill()
    assert asked, seen.decode(errors="replace")[-800:]
    return proc.wait(timeout=120), seen


@pytest.mark.parametrize(("reply", "code", "written"), [
    (b"\r", 4, False),  # Enter: the default, nothing applied
    (b"n\r", 4, False),
    (b"y\r", 0, True),  # the control: a yes really writes
])  # fmt: skip
def test_enter_at_the_question_changes_nothing(
    tmp_path: Path, reply: bytes, code: int, written: bool
) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))
    status, seen = _answer(["--ct", "200", "--device", "/dev/fakegpu"], env, reply)
    shown = seen.decode(errors="replace")
    assert "[y/N]" in shown, shown[-800:]  # the question says which answer is the default
    assert status == code, shown[-800:]
    assert (conf.read_text() != CONF) is written, shown[-800:]
    if not written:
        assert tree.backups() == []
