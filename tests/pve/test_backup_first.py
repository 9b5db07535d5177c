"""``fix`` saves its client-side backup BEFORE it writes, and a backup it cannot save means
nothing is written (real files, real subprocess, LocalHost on an /etc/pve-like tree).

The fault it guards against: the old code wrote the config first and saved the copy
after, so a full or read-only backup directory left a changed config and no copy of the
old one on the client.
"""

from __future__ import annotations

import pytest

from tests.fakes.pvetree import PveTree
from tests.pve.support import fix, stopped_pct

CONF = "arch: amd64\nlxc.mount.entry: /dev/null dev/fakegpu none bind,optional,create=file\n"


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_an_unwritable_backup_dir_means_nothing_written(tmp_path, where: str) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    if where == "proc":
        backup_dir = "/proc/gpudoctor-backups"  # nobody, root included, can mkdir there
    else:
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("a file where the backup directory should be\n")
        backup_dir = str(blocker / "backups")
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path), GPUDOCTOR_CLIENT_BACKUP_DIR=backup_dir)
    result = fix(["--ct", "200", "--device", "/dev/fakegpu", "--yes"], env)
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    # refused up front by the CLI (GPUDOCTOR_CLIENT_BACKUP_DIR unwritable) or at the save
    assert "backup" in last.lower() and ("nothing written" in last or "nothing was done" in last)
    assert "Traceback" not in result.stderr
    assert conf.read_text() == CONF
    assert tree.backups() == []


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_run_fix_saves_the_copy_first_and_writes_nothing_without_it(tmp_path, where) -> None:
    """The fixer itself (past any CLI pre-check, e.g. the directory broke meanwhile): the
    copy is saved before the compare-and-swap; when it cannot be, nothing is written."""
    from gpudoctor.hosts.local import LocalHost
    from gpudoctor.pve.apply import ApplyError
    from gpudoctor.pve.fixer import FixOptions, run_fix
    from gpudoctor.pve.planner import PlanOptions

    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    if where == "proc":
        backup_dir = "/proc/gpudoctor-backups"
    else:
        (tmp_path / "not-a-dir").write_text("a file where the backup directory should be\n")
        backup_dir = str(tmp_path / "not-a-dir" / "backups")
    layout = tree.layout(client_backup_dir=backup_dir, pct=stopped_pct(tmp_path))
    options = FixOptions(ct="200", layout=layout, yes=True,
                         plan=PlanOptions(devices=("/dev/fakegpu",), include_host_nvidia=False))  # fmt: skip
    with pytest.raises(ApplyError, match=r"cannot save the backup copy.*nothing written") as info:
        run_fix(LocalHost(), options)
    assert info.value.code == "backup"
    assert conf.read_text() == CONF
    assert tree.backups() == []


def test_with_a_writable_backup_dir_the_copy_exists_and_holds_the_old_bytes(tmp_path) -> None:
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    env = tree.env(GPUDOCTOR_PCT=stopped_pct(tmp_path))
    result = fix(["--ct", "200", "--device", "/dev/fakegpu", "--yes", "--json"], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "c 1:3 rwm" in conf.read_text()
    copies = [p for p in tree.client_backup_dir.rglob("*.conf")]
    assert len(copies) == 1 and copies[0].read_text() == CONF
    assert oct(copies[0].stat().st_mode & 0o777) == "0o600"
