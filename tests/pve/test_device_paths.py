"""``fix --device PATH`` accepts only character devices, or directories under /dev that hold
them, checked on real paths of this machine (LocalHost on an /etc/pve-like tree).

The attack it blocks: ``--device /root`` planned a read-write bind mount of the host's
/root into the CT (and ``--device /etc/shadow`` a file); a typo or a hostile wrapper could
hand a container the host's files.
"""

from __future__ import annotations

import os

import pytest

from tests.fakes.pvetree import PveTree
from tests.pve.support import fix

CONF = "arch: amd64\nhostname: ct\n"


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/root", "a directory outside /dev"),
        ("/etc/passwd", "a regular file, not a character device"),
        ("/dev/shm", "a directory that holds no character device"),
        ("/dev/../root", "without '.', '..'"),
        ("/dev", "a directory outside /dev"),
        ("/dev/doesnotexist", "does not exist on the host: check the path"),
    ],
)
def test_non_devices_are_refused_and_nothing_is_written(tmp_path, path: str, why: str) -> None:
    """The attack: ``fix --device /root --yes`` bind-mounting the host's /root read-write."""
    if path != "/dev/doesnotexist" and not os.path.exists(path.replace("/dev/../", "/")):
        pytest.skip(f"{path} does not exist on this machine")
    tree = PveTree(tmp_path)
    conf = tree.add_ct("200", CONF)
    result = fix(["--ct", "200", "--device", path, "--yes"], tree.env())
    assert result.returncode == 2, result.stdout + result.stderr
    assert why in result.stdout + result.stderr
    assert "nothing to change" not in result.stdout  # once a warning, then exit 0 (issue 34.7)
    assert "Traceback" not in result.stderr
    assert conf.read_text() == CONF and tree.backups() == []


@pytest.mark.parametrize("path", ["/dev/null", "/dev/pts"])
def test_char_devices_and_dev_directories_holding_them_are_accepted(tmp_path, path) -> None:
    tree = PveTree(tmp_path)
    tree.add_ct("200", CONF)
    result = fix(["--ct", "200", "--device", path, "--dry-run"], tree.env())
    assert result.returncode == 4, result.stdout + result.stderr  # a plan, pending
    assert f"+lxc.mount.entry: {path} {path.lstrip('/')} none bind" in result.stdout
