"""The config parser/writer: byte-exact round trip on real files, Proxmox's line classes,
edits that stay in the live section, and fuzzing (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpudoctor.pve.config import (
    LXC,
    PVE,
    Config,
    ConfigError,
    Kind,
    classify,
    parse,
    write,
)
from tests.recorded import RECORDED as DATA

ALL_FILES = sorted(p for p in DATA.rglob("*") if p.is_file())
CONFIGS = sorted(p for p in ALL_FILES if p.suffix == ".conf" or p.name == "config")


def data(rel: str) -> str:
    return (DATA / rel).read_text()


def test_shared_data_is_there() -> None:
    assert len(CONFIGS) >= 100, "expected the pve-container, pve-docs and community configs"


@pytest.mark.parametrize("flavor", [PVE, LXC])
@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_shared_file_round_trips_byte_for_byte(path: Path, flavor: str) -> None:
    raw = path.read_bytes()
    assert parse(raw, flavor).text.encode() == raw


def test_sections_description_and_legacy_keys_of_a_real_snapshot_config() -> None:
    cfg = parse(data("community/charlzyx-102-snapshot-cgroupv1.conf"))
    assert [s.name for s in cfg.sections()] == ["bbr"]
    main = [line for _, line in cfg.main()]
    assert main[0].kind is Kind.DESCRIPTION and main[2].text.endswith("eth0 ")
    assert cfg.get("memory") == "1024"  # the snapshot's 512 is not the live value
    assert cfg.get("lxc.cgroup.devices.allow") == "c 10:200 rwm"
    assert cfg.get("lxc.cgroup2.devices.allow") == "c 10:200 rwm"
    assert all(ln.key != "snaptime" for ln in main)
    snap = cfg.lines[cfg.sections()[0].start :]
    assert snap[1].kind is Kind.DESCRIPTION and snap[1].text == "#%E4%BC%98%E5%8C%96 sysctl"


def test_equals_and_colon_raw_keys_parse_to_the_same_pairs() -> None:
    colon = parse(data("pve-docs/pct-adoc-lxc-raw-colon.conf"))
    equals = parse(data("pve-docs/pct-adoc-lxc-raw-equals.conf"))
    assert colon.pairs() == equals.pairs() == [("lxc.init_cmd", "/sbin/my_own_init")]
    assert colon.text != equals.text
    chrnnk = parse(data("community/chrnnk-equals-syntax.conf"))
    allows = [ln.value for _, ln in chrnnk.get_all("lxc.cgroup2.devices.allow")]
    assert allows == ["c 195:* rw", "c 506:* rw", "c 510:* rw"]


def test_duplicate_keys_keep_their_order_and_empty_raw_values() -> None:
    cfg = parse(data("community/frigate-4857-ct101-intel-legacy.conf"))
    drops = cfg.get_all("lxc.cap.drop")
    assert len(drops) == 2 and all(ln.value == "" for _, ln in drops)
    assert [ln.value for _, ln in cfg.get_all("lxc.cgroup2.devices.allow")][-1] == "a"
    assert len(cfg.get_all("lxc.apparmor.profile")) == 2


def test_devn_and_mpn_are_options() -> None:
    cfg = parse(data("community/hewittmd97-100-description-devN.conf"))
    assert cfg.get("dev0") == "/dev/dri/renderD128,gid=993"
    assert sum(1 for _, ln in cfg.main() if ln.kind is Kind.DESCRIPTION) == 32
    frig = parse(data("community/frigate-8652-ct2051.conf"))
    assert frig.get("mp103") == "/media/amunra,mp=/media/amunra"


def test_inline_comment_stays_in_the_value_as_proxmox_reads_it() -> None:
    cfg = parse(data("community/schmidt-silas-inline-comments.conf"))
    assert cfg.get_all("lxc.cgroup2.devices.allow")[0][1].value == "c 195:* rwm # Die 195 anpassen"


def test_no_trailing_newline_is_kept_and_fixed_only_by_an_insert() -> None:
    text = data("pve-container/src/test/test-debian-007/config")
    assert not text.endswith("\n")
    cfg = parse(text)
    assert write(cfg) == text
    last = len(cfg.lines) - 1
    edited = cfg.insert_after(last, [cfg.make_line("lxc.cgroup2.devices.allow", "c 1:1 rwm")])
    assert edited.text == text + "\nlxc.cgroup2.devices.allow: c 1:1 rwm\n"


def test_lines_proxmox_cannot_parse_are_kept_as_invalid() -> None:
    cfg = parse(data("pve-docs/pct-adoc-example-snapshot.conf"))
    assert [ln.text for ln in cfg.lines if ln.kind is Kind.INVALID] == ["...", "..."]
    assert cfg.main_end == 5


def test_pending_section_is_a_section_case_insensitively() -> None:
    cfg = parse("memory: 512\n[PVE:pending]\nmemory: 1024\n[snap_1]\nmemory: 256\n")
    assert [s.name for s in cfg.sections()] == ["PVE:pending", "snap_1"]
    assert cfg.get("memory") == "512"


def test_plain_lxc_flavor() -> None:
    text = "# comment\nlxc.uts.name = web1\n  lxc.net.0.type=empty\nbogus line\n"
    cfg = parse(text, LXC)
    kinds = [ln.kind for ln in cfg.lines]
    assert kinds == [Kind.DESCRIPTION, Kind.RAW, Kind.RAW, Kind.INVALID]
    assert cfg.pairs() == [("lxc.uts.name", "web1"), ("lxc.net.0.type", "empty")]
    assert cfg.make_line("lxc.cgroup2.devices.allow", "c 10:232 rwm").text == (
        "lxc.cgroup2.devices.allow = c 10:232 rwm"
    )


def test_new_lines_copy_the_neighbours_separator_and_crlf() -> None:
    cfg = parse("arch: amd64\r\nlxc.cgroup2.devices.allow = c 195:* rwm\r\n")
    line = cfg.make_line("lxc.cgroup2.devices.allow", "c 238:* rwm", cfg.lines[1])
    assert line.text == "lxc.cgroup2.devices.allow = c 238:* rwm\r"
    assert line.value == "c 238:* rwm"


@pytest.mark.parametrize(
    ("data_in", "message"),
    [
        (b"arch: amd64\n\xff\xfe\n", "not valid UTF-8"),
        ("arch: amd64\nmemory: 5\x0012\n", "line 2: NUL"),
        ("a" * (1024 * 1024 + 1), "1 MiB"),
        ("arch: \ud800\n", "surrogate"),
    ],
)
def test_clear_errors(data_in: str | bytes, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse(data_in)


def test_unknown_flavor_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown config flavor"):
        parse("", "docker")


# --- fuzzing ------------------------------------------------------------------------------

KEYS = st.sampled_from(
    ["arch", "memory", "dev0", "mp3", "lock", "lxc.cgroup2.devices.allow", "lxc.mount.entry"]
)
SEPS = st.sampled_from([": ", ":", " = ", "=", ":  ", "\t= "])
VALUES = st.text(
    st.characters(blacklist_characters="\n\0", blacklist_categories=["Cs"]), max_size=30
)
LINE_TEXT = st.one_of(
    st.builds(lambda k, s, v: f"{k}{s}{v}", KEYS, SEPS, VALUES),
    st.builds(lambda v: "#" + v, VALUES),
    st.sampled_from(["", "  ", "[snap1]", "[pve:pending]", "[Bad name]", "\r"]),
    VALUES,
)


@st.composite
def configs(draw: st.DrawFn) -> Config:
    flavor = draw(st.sampled_from([PVE, LXC]))
    texts = draw(st.lists(LINE_TEXT, max_size=25))
    final_newline = draw(st.booleans())
    lines = [classify(t, "\n", flavor) for t in texts]
    if lines and not final_newline and lines[-1].text:
        lines[-1] = classify(lines[-1].text, "", flavor)
    return Config(tuple(lines), flavor)


@settings(max_examples=400, deadline=None)
@given(configs())
def test_fuzz_parse_of_write_is_identity(cfg: Config) -> None:
    assert parse(write(cfg), cfg.flavor) == cfg


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400), st.sampled_from([PVE, LXC]))
@example(b"  # indented comment\nlxc.a = b\ntail", LXC)  # LXC reads the comment, PVE does not
def test_fuzz_arbitrary_bytes_round_trip_or_give_a_clear_error(raw: bytes, flavor: str) -> None:
    try:
        cfg = parse(raw, flavor)
    except ConfigError as exc:
        assert str(exc)  # a one-line reason, never another exception type
        assert "\n" not in str(exc)
        return
    assert cfg.text.encode() == raw
    # one Line per newline-terminated piece (plus an unterminated tail), none holding a
    # newline, each classified as classify() does on its own
    pieces = raw.decode().split("\n")
    assert len(cfg.lines) == len(pieces) - 1 + (1 if pieces[-1] else 0)
    assert [line.text for line in cfg.lines] == pieces[: len(cfg.lines)]
    assert all(line.eol == "\n" for line in cfg.lines[:-1])
    assert all(line == classify(line.text, line.eol, flavor) for line in cfg.lines)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text_and_edits_stay_in_the_live_section(text: str) -> None:
    try:
        cfg = parse(text)
    except ConfigError:
        return
    new = cfg.make_line("lxc.cgroup2.devices.allow", "c 238:* rwm")
    anchor = cfg.main_end - 1
    edited = cfg.insert_after(anchor, [new])
    assert edited.main_end == cfg.main_end + 1
    assert edited.lines[anchor + 1].text == new.text
    # everything from the first section on is unchanged, byte for byte
    tail = "".join(ln.raw for ln in cfg.lines[cfg.main_end :])
    assert edited.text.endswith(tail)
