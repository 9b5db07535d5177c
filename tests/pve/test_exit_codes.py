"""``gpudoctor fix`` exit codes as scripts see them: real subprocesses, stdin from
/dev/null (no terminal), on an /etc/pve-like tree (tests/fakes/pvetree.py).

0 nothing to change, 4 changes pending (``--dry-run``, or no ``--yes`` and no terminal),
3 nothing to pass through; ``--help`` and docs/fix.md list the same codes.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

from tests.fakes.pvetree import PveTree
from tests.pve.support import fix

ROOT = Path(__file__).resolve().parents[2]
CONF = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"


def test_dry_run_is_0_when_nothing_changes_and_4_when_changes_are_pending(tmp_path) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    env = tree.env()
    pending = fix(["--ct", "200", "--device", "/dev/fakegpu", "--dry-run"], env)
    assert pending.returncode == 4, pending.stderr
    assert "+lxc.cgroup2.devices.allow: c 1:3 rwm" in pending.stdout
    assert conf.read_text() == CONF
    conf.write_text(CONF + "lxc.cgroup2.devices.allow: c 1:3 rwm\n")
    clean = fix(["--ct", "200", "--device", "/dev/fakegpu", "--dry-run"], env)
    assert clean.returncode == 0, clean.stderr
    assert "nothing to change" in clean.stdout


def test_no_yes_and_no_terminal_writes_nothing_and_exits_4(tmp_path) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    result = fix(["--ct", "200", "--device", "/dev/fakegpu"], tree.env())
    assert result.returncode == 4, result.stderr
    assert "pass --yes" in result.stderr and "Traceback" not in result.stderr
    assert conf.read_text() == CONF and tree.backups() == []


def test_no_driver_and_no_device_says_nothing_to_pass_through(tmp_path) -> None:
    if glob.glob("/dev/nvidia*"):
        pytest.skip("this machine has NVIDIA nodes: the no-driver case cannot happen here")
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", "arch: amd64\nhostname: ct\n")
    result = fix(["--ct", "200", "--dry-run"], tree.env())
    assert result.returncode == 3, result.stdout + result.stderr
    assert "nothing to pass through" in result.stdout
    assert "nothing to change" not in result.stdout
    assert conf.read_text() == "arch: amd64\nhostname: ct\n"


def _codes(text: str) -> set[str]:
    """Return the exit codes listed as ``  N  what`` lines (help) or ``| N |`` rows (docs)."""
    return set(re.findall(r"^\s+([0-9])\s{2}\S", text, re.M)) | set(
        re.findall(r"^\|\s*`?([0-9])`?\s*\|", text, re.M)
    )


def test_help_and_docs_list_the_same_exit_codes() -> None:
    result = fix(["--help"], {})
    section = result.stdout.split("Exit codes:", 1)[1]
    docs = (ROOT / "docs" / "fix.md").read_text()
    table = docs.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    assert _codes(section) == _codes(table) == {"0", "1", "2", "3", "4"}
    from gpudoctor.exit_codes import ExitCode

    assert f"{ExitCode.NOTHING_DONE}  changes pending" in section
