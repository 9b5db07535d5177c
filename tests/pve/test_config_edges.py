"""The config parser's edges that the round-trip and fuzz tests cannot see: line kinds
of blank and indented lines, the separators edits copy, section bounds, the 1 MiB limit,
the first NUL, and the diff's labels and no-newline marker (mutation survivors of
gpudoctor/pve/config.py, each pinned to the behaviour of the tool that owns the file)."""

from __future__ import annotations

import pytest

from gpudoctor.pve.config import (
    LXC,
    PMXCFS_MAX_BYTES,
    PVE,
    Config,
    ConfigError,
    Kind,
    Section,
    classify,
    parse,
    separator_of,
    split_lines,
    unified_diff,
)


@pytest.mark.parametrize("flavor", [PVE, LXC])
@pytest.mark.parametrize("text", ["", " ", "\t \r"])
def test_blank_lines_are_blank(text: str, flavor: str) -> None:
    assert classify(text, "\n", flavor).kind is Kind.BLANK


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("  # indented comment", Kind.DESCRIPTION),  # LXC skips blanks (space, tab) first
        ("\t# tab", Kind.DESCRIPTION),
        ("\f# form feed", Kind.INVALID),  # not a blank for LXC's parser (isblank)
        ("X# not a comment", Kind.INVALID),
        ("# c  ", Kind.DESCRIPTION),
        ("lxc.a = b  ", Kind.RAW),
    ],
)
def test_lxc_comments_after_leading_blanks(text: str, kind: Kind) -> None:
    assert classify(text, "\n", LXC).kind is kind


def test_pve_lines_that_no_grammar_takes_are_invalid() -> None:
    assert classify("  # indented", "\n", PVE).kind is Kind.INVALID  # description only at col 0
    assert classify("!!", "\n", PVE).kind is Kind.INVALID


def test_separator_is_read_as_written() -> None:
    assert separator_of(classify("lxc.a: b", "\n", PVE)) == ": "
    assert separator_of(classify("lxc.a=b", "\n", PVE)) == "="
    assert separator_of(classify("  lxc.a=b", "\n", LXC)) == "="
    assert separator_of(classify("lxc.a \t= b", "\n", LXC)) == " \t= "
    assert separator_of(classify("# no separator", "\n", PVE)) == ""
    assert separator_of(classify("", "\n", LXC)) == ""


def test_new_lines_copy_the_neighbours_separator() -> None:
    cfg = parse("  lxc.a=b\n", LXC)
    assert cfg.make_line("lxc.c", "d", cfg.lines[0]).text == "lxc.c=d"
    assert cfg.make_line("lxc.c", "d").text == "lxc.c = d"
    assert Config((), LXC).make_line("x", "1").text == "x = 1"  # LXC's only syntax
    pve = parse("lxc.a = b\narch: amd64\n")
    assert pve.make_line("lxc.c", "d", pve.lines[0]).text == "lxc.c = d"
    assert pve.make_line("dev0", "/dev/x", pve.lines[0]).text == "dev0: /dev/x"


def test_remove_drops_exactly_the_given_lines() -> None:
    cfg = parse("a: 1\nb: 2\nc: 3\n")
    assert cfg.remove({1}).text == "a: 1\nc: 3\n"
    assert cfg.remove(set()).text == cfg.text
    assert cfg.remove({0, 2}).text == "b: 2\n"


def test_sections_span_to_the_next_header_or_the_end() -> None:
    cfg = parse("arch: amd64\n\n[snap1]\narch: amd64\n[snap2]\narch: amd64\nmemory: 1\n")
    assert cfg.sections() == [Section("snap1", 2, 4), Section("snap2", 4, 7)]
    assert cfg.main_end == 2


def test_the_pmxcfs_limit_is_one_mebibyte_inclusive() -> None:
    line = "#" + "x" * 1022 + "\n"  # 1 KiB
    exact = line * 1024
    assert len(exact.encode()) == PMXCFS_MAX_BYTES
    assert parse(exact).text == exact  # pmxcfs stores a file of exactly 1 MiB
    with pytest.raises(ConfigError, match="1048577 bytes"):
        parse(exact + "x")
    assert parse(exact + "x", LXC).text == exact + "x"  # no such limit for plain LXC


def test_a_nul_is_reported_on_the_line_of_the_first_one() -> None:
    with pytest.raises(ConfigError, match=r"^line 2: NUL character"):
        parse("a: 1\nb\0\nc\nd\0\n")


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("", []),
        ("a", ["a"]),
        ("a\n", ["a\n"]),
        ("a\nb", ["a\n", "b"]),
        ("a\nb\nc", ["a\n", "b\n", "c"]),
        ("a\n\nb\n", ["a\n", "\n", "b\n"]),
    ],
)
def test_split_lines_keeps_every_newline(text: str, pieces: list[str]) -> None:
    assert split_lines(text) == pieces
    assert "".join(split_lines(text)) == text


def test_diff_labels_and_the_missing_newline_marker() -> None:
    diff = unified_diff("a: 1\nb: 2", "a: 1\nb: 3\n", "/etc/pve/lxc/200.conf")
    assert diff == (
        "--- a/etc/pve/lxc/200.conf\n"
        "+++ b/etc/pve/lxc/200.conf\n"
        "@@ -1,2 +1,2 @@\n"
        " a: 1\n"
        "-b: 2\n"
        "\\ No newline at end of file\n"
        "+b: 3\n"
    )
    assert unified_diff("x\n", "x\n", "200.conf") == ""
    assert unified_diff("x\n", "y\n", "lxc/200.conf/").startswith("--- a/lxc/200.conf/\n")


def test_diff_labels_lose_only_leading_slashes() -> None:
    diff = unified_diff("x\n", "y\n", "//X.conf")
    assert diff.startswith("--- a/X.conf\n+++ b/X.conf\n")
