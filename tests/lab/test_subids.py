"""The lab's subordinate-id grant, on real files (no containers needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lab.subids import SubordinateIds, range_granted


def test_range_granted_reads_lines_as_newuidmap_does() -> None:
    text = "alice:100000:65536\nroot:200000:1000\nroot:100000:65536\n"
    assert range_granted(text, "root", 100000, 65536)
    assert not range_granted(text, "root", 100000, 65537)
    assert not range_granted("alice:100000:65536\n", "root", 100000, 65536)
    assert not range_granted("root:100001:65536\nroot:x:y\n", "root", 100000, 65536)


def test_grant_adds_one_line_and_release_takes_back_only_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty /etc/subuid (uidmap installed, nothing set up) gets root's range for the
    session; a file that already grants it is left alone; release restores the bytes."""
    empty, granted = tmp_path / "subuid", tmp_path / "subgid"
    empty.write_text("alice:300000:65536")  # no trailing newline
    granted.write_text("root:100000:65536\n")
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    grant = SubordinateIds(100000, 65536, files=(empty, granted))
    assert grant.grant() == [empty]
    assert empty.read_text() == "alice:300000:65536\nroot:100000:65536\n"
    assert granted.read_text() == "root:100000:65536\n"
    grant.release()
    assert empty.read_text() == "alice:300000:65536\n"
    assert granted.read_text() == "root:100000:65536\n"


def test_no_grant_without_newuidmap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without uidmap, LXC as root writes uid_map itself: the files are not touched."""
    subuid = tmp_path / "subuid"
    subuid.write_text("")
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert SubordinateIds(100000, 65536, files=(subuid,)).grant() == []
    assert subuid.read_text() == ""
