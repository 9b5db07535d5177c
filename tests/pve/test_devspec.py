"""``devN`` values read by Proxmox's own rules (pve-container's ``Config.pm``, pve-common's
``JSONSchema.pm``): what Proxmox accepts, and for what it rejects, its words, one rule at a
time. A value Proxmox rejects stops the CT's start, so every refusal must be caught before
a fix writes it."""

from __future__ import annotations

import pytest

from gpudoctor.pve.devspec import (
    DevValue,
    dev_index,
    is_true,
    key_problem,
    mode_text,
    parse_dev_value,
    path_problem,
    unwritable,
)

DUP = "duplicate key in comma-separated list property: "
INVALID = "invalid key in comma-separated list property: "


def test_dev_keys_are_dev0_to_dev255_in_ascii_digits() -> None:
    assert [dev_index(k) for k in ("dev0", "dev7", "dev255", "dev256", "dev01")] == [
        0, 7, 255, 256, 1]  # fmt: skip
    assert [dev_index(k) for k in ("dev", "devX", "dev\u0660", "mp0", "xdev0", "dev0 ")] == [
        None] * 6  # fmt: skip
    assert key_problem("dev0") is None and key_problem("dev255") is None
    assert key_problem("mp0") is None and key_problem("devX") is None  # not devN keys at all
    for key in ("dev256", "dev01", "dev1000"):
        assert key_problem(key) == (
            f"unknown setting '{key}': Proxmox knows dev0 to dev255 only "
            "(it warns at every read of the config; pct set refuses it)"
        )


def test_a_device_path_starts_with_dev_and_has_no_dot_components() -> None:
    assert path_problem("/dev/nvidia0") is None
    assert path_problem("/dev/.hidden") is None and path_problem("/dev/a..b") is None
    for bad in ("/dev/../etc/shadow", "/dev/./nvidia0", "/dev/nvidia-caps/..", "/dev/x/."):
        assert path_problem(bad) == f"{bad} is not a valid device path (with a . or .. component)"
    for outside in ("/tmp/nvidia0", "dev/nvidia0", "/dev", "/devices/x"):
        assert path_problem(outside) == f"{outside} is not a valid device path (outside /dev)"


def test_a_good_value_gives_its_path_and_options_in_order() -> None:
    value = parse_dev_value("/dev/nvidia0,gid=44,mode=0666,uid=+0,deny-write=Yes")
    assert value == DevValue(
        "/dev/nvidia0", (("gid", "44"), ("mode", "0666"), ("uid", "+0"), ("deny-write", "Yes"))
    )
    assert value.get("mode") == "0666" and value.get("deny-write") == "Yes"
    assert value.get("path") is None and value.get("nope") is None
    assert parse_dev_value("mode=0600,path=/dev/nvidia-uvm") == DevValue(
        "/dev/nvidia-uvm", (("mode", "0600"),))  # fmt: skip
    assert parse_dev_value("/dev/nvidia0,, \t,gid=44") == DevValue(
        "/dev/nvidia0", (("gid", "44"),))  # fmt: skip  # blank parts skipped, the rest read


def test_a_line_break_in_a_value_is_refused() -> None:
    for value in ("/dev/nvidia0\n", "/dev/nvidia0\r", "/dev/nvidia0,gid=4\r\n"):
        assert "property contains a line feed" in parse_dev_value(value).problems


def test_each_key_rule_is_reported_and_the_parts_after_it_still_read() -> None:
    assert parse_dev_value("/dev/a,gid=1,gid=2,mode=0666") == DevValue(
        "/dev/a", (("gid", "1"), ("mode", "0666")), (DUP + "gid",))  # fmt: skip
    assert parse_dev_value("/dev/a,foo=1,gid=44") == DevValue(
        "/dev/a", (("gid", "44"),), (INVALID + "foo",))  # fmt: skip
    assert parse_dev_value("/dev/a,/dev/b,gid=4") == DevValue(
        "/dev/a", (("gid", "4"),), (DUP + "path",))  # fmt: skip
    assert parse_dev_value("path=/dev/a,/dev/b").problems == (DUP + "path",)
    assert parse_dev_value("/dev/a,path=/dev/b").problems == (DUP + "path",)
    assert parse_dev_value("/dev/a,mode=,gid=4") == DevValue(
        "/dev/a", (("gid", "4"),),
        ("missing key in comma-separated list property ('mode=')",))  # fmt: skip
    assert parse_dev_value("/dev/a,=5").problems == (
        "missing key in comma-separated list property ('=5')",)  # fmt: skip
    assert parse_dev_value(" gid=4,/dev/a").problems == (INVALID + " gid",)  # nothing trimmed


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("gid=44", "Path has to be defined"),
        ("", "Path has to be defined"),
        ("/tmp/x", "path: /tmp/x is not a valid device path (outside /dev)"),
        ("/dev/a,mode=666", "mode: '666' does not match 0[0-7]{3} (write 0666, not 666)"),
        ("/dev/a,mode=0888", "mode: '0888' does not match 0[0-7]{3} (write 0666, not 666)"),
        ("/dev/a,mode=06660", "mode: '06660' does not match 0[0-7]{3} (write 0666, not 666)"),
        ("/dev/a,uid=abc", "uid: type check ('integer') failed - got 'abc'"),
        ("/dev/a,gid=4x", "gid: type check ('integer') failed - got '4x'"),
        ("/dev/a,uid=-1", "uid: -1 is below the minimum value of 0"),
        ("/dev/a,gid=-5", "gid: -5 is below the minimum value of 0"),
        ("/dev/a,deny-write=maybe", "deny-write: type check ('boolean') failed - got 'maybe'"),
    ],
)
def test_each_schema_rule_in_proxmoxs_words(value: str, problem: str) -> None:
    assert parse_dev_value(value).problems == (problem,)


def test_values_proxmox_accepts_have_no_problems() -> None:
    for value in ("/dev/a,uid=0,gid=0", "/dev/a,gid=+44", "/dev/a,mode=0000",
                  "/dev/a,deny-write=off", "/dev/a,deny-write=TRUE"):  # fmt: skip
        assert parse_dev_value(value).problems == (), value


def test_a_path_that_no_devn_value_or_mount_entry_can_carry() -> None:
    assert unwritable("/dev/nvidia0") is None and unwritable("/dev/nvidia-caps/cap1") is None
    tail = ": neither a devN entry nor an lxc.mount.entry can carry it"
    assert unwritable("/dev/a,b") == "'/dev/a,b' holds a ','" + tail
    assert unwritable("/dev/a=b") == "'/dev/a=b' holds a '='" + tail
    assert unwritable("/dev/a b") == "'/dev/a b' holds whitespace" + tail
    assert unwritable("/dev/a\tb") == "'/dev/a\\tb' holds whitespace" + tail
    assert unwritable("/dev/a\x01") == "'/dev/a\\x01' holds a control character" + tail
    assert unwritable("/dev/a\x7f") == "'/dev/a\\x7f' holds a control character" + tail


def test_the_mode_written_is_the_permission_bits_in_four_digits() -> None:
    assert mode_text(0o2666) == "0666"  # setgid dropped
    assert mode_text(0o600) == "0600"
    assert mode_text(0o7) == "0007"
    assert mode_text(0o20666) == "0666"  # a char node's st_mode


def test_deny_write_reads_as_true_the_way_proxmox_reads_it() -> None:
    assert [is_true(v) for v in ("1", "on", "YES", "True", "yes")] == [True] * 5
    assert [is_true(v) for v in ("0", "off", "No", "false", "maybe", "", None)] == [False] * 7
