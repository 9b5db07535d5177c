"""What counts as gpudoctor's own output at an ``-o`` path (gpudoctor/commands/output_owner.py,
issue 47.1): each writer's real output is recognised, anything else is not."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from gpudoctor.commands import output_owner as owner


def tar_gz(first: str) -> bytes:
    """Return a gzip'd tar whose first member is the directory ``first``."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo(first)
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        data = tarfile.TarInfo(f"{first}/check.json")
        data.size = 2
        tar.addfile(data, io.BytesIO(b"{}"))
    return gzip.compress(raw.getvalue())


def test_check_reports_in_every_format_are_recognised() -> None:
    assert owner.check_report(b"# HELP gpudoctor_up 1 when...\n", b"")
    assert owner.check_report(b'{\n  "schema": "gpudoctor.check/1",\n', b"")
    assert owner.check_report(b"", b"PASS  proc.usable  ok\nPASS  local: 1 PASS in 0.01 s\n")
    assert owner.check_report(b"", b"FAIL  local, pve1: 2 PASS, 1 FAIL in 12.50 s")
    assert owner.check_report(b"", b"ERROR  root@h/ct200: 1 ERROR in 0.00 s\n\n")


def test_other_files_are_not_check_reports() -> None:
    assert not owner.check_report(b"# HELP node_load1\n", b"node_load1 0.1\n")
    assert not owner.check_report(b'{"schema": "other/1"}', b"")
    assert not owner.check_report(b' {"schema": "gpudoctor.check/1"}', b"")  # not at the start
    assert not owner.check_report(b"x", b"PASS local: 1 PASS in 0.01 s")  # one space
    assert not owner.check_report(b"x", b"PASS  local: 1 PASS in 0.01 s\nmy note\n")
    assert not owner.check_report(b"x", b"DONE  local: 1 PASS in 0.01 s")
    assert not owner.check_report(b"x", b"PASS  local: 1 PASS in 1 s")
    assert not owner.check_report(b"x", b"PASS  local 1 PASS in 0.01 s")
    assert not owner.check_report(b"x", b"my notes\n")
    three = b"PASS  a  ok\nWARN  b  hm\nPASS  local: 2 PASS in 0.01 s\n"
    assert owner.check_report(b"x", three)  # the last line of several
    assert not owner.check_report(b"x", b"x\nPASS  local: 1 PASS in 0.01 s\nnotes\n")
    assert not owner.check_report(b"x", b"PASS  local: 1 PASS in 0.01 s \n")  # a space after
    assert not owner.check_report(b"x", b"PASS  local: 1 PASS in 0.01 sX\n")


def test_a_bundle_is_a_gzip_tar_of_gpudoctor_bundle() -> None:
    assert owner.bundle_archive(tar_gz("gpudoctor-bundle"), b"")
    assert not owner.bundle_archive(tar_gz("gpudoctor-bundles"), b"")
    assert not owner.bundle_archive(tar_gz("photos"), b"")
    assert not owner.bundle_archive(gzip.compress(b"gpudoctor-bundle but no tar"), b"")
    assert not owner.bundle_archive(b"not gzip at all", b"")
    assert not owner.bundle_archive(tar_gz("gpudoctor-bundle")[:20], b"")  # cut short
    member = io.BytesIO()
    with tarfile.open(fileobj=member, mode="w") as tar:
        info = tarfile.TarInfo("gpudoctor-bundle/check.json")
        tar.addfile(info, io.BytesIO(b""))
    assert owner.bundle_archive(gzip.compress(member.getvalue()), b"")  # a file first


def test_the_rules_file_is_known_by_its_first_line() -> None:
    from gpudoctor.service import alert_rules_text

    assert owner.alert_rules(alert_rules_text().encode(), b"")
    assert not owner.alert_rules(b"groups:\n  - name: mine\n", b"")


def test_ends_of_reads_both_ends_and_none_for_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    assert owner.ends_of(str(path)) is None
    path.write_bytes(b"a" * owner.HEAD + b"b" * 10)
    head, tail = owner.ends_of(str(path))  # type: ignore[misc]
    assert head == b"a" * owner.HEAD
    assert tail == b"a" * (owner.HEAD - 10) + b"b" * 10
    path.write_bytes(b"abc")
    assert owner.ends_of(str(path)) == (b"abc", b"abc")  # a small file: both ends whole


def test_a_link_or_a_fifo_at_the_path_is_not_read_through(tmp_path: Path) -> None:
    import os

    mine = tmp_path / "mine"
    mine.write_bytes(owner.RULES_FIRST_LINE + b"\n")
    link = tmp_path / "link"
    link.symlink_to(mine)
    why = owner.foreign(str(link), owner.alert_rules)
    assert why is not None and why.startswith("it exists and cannot be read to tell")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened without waiting for a writer (never hangs), then refused
    why = owner.foreign(str(fifo), owner.alert_rules)
    assert why == "it exists and cannot be read to tell whether gpudoctor wrote it" + (
        " (UnsupportedOperation)")  # fmt: skip


def test_foreign_says_why_and_spares_absent_empty_and_own_files(tmp_path: Path) -> None:
    path = tmp_path / "out"
    assert owner.foreign(str(path), owner.alert_rules) is None  # absent
    path.write_bytes(b"")
    assert owner.foreign(str(path), owner.alert_rules) is None  # empty: nothing to lose
    path.write_bytes(b"groups: []\n")
    assert owner.foreign(str(path), owner.alert_rules) == (
        "it exists and gpudoctor did not write it"
    )
    path.write_bytes(owner.RULES_FIRST_LINE + b" (...)\n")
    assert owner.foreign(str(path), owner.alert_rules) is None


def test_foreign_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    directory = tmp_path / "dir"
    directory.mkdir()  # open() of a directory for reading fails: EISDIR
    why = owner.foreign(str(directory / "."), owner.alert_rules)
    assert why is not None and why.startswith("it exists and cannot be read to tell")
