"""The manifest format: round trip, and one clear ValueError per kind of bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpudoctor.weights.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestFile,
    parse_manifest,
    utc_now_iso,
)

segment = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12
).filter(lambda s: s not in (".", ".."))
paths = st.lists(segment, min_size=1, max_size=3).map("/".join)
sha = st.one_of(st.none(), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
files = st.dictionaries(paths, st.tuples(st.integers(0, 10**12), sha), max_size=20)


@given(files=files)
def test_round_trip(files: dict[str, tuple[int, str | None]]) -> None:
    entries = tuple(ManifestFile(p, size, digest) for p, (size, digest) in sorted(files.items()))
    manifest = Manifest("org/name", "a" * 40, entries, utc_now_iso())
    parsed = parse_manifest(manifest.to_json())
    assert parsed == manifest
    assert parsed.total_size == sum(size for size, _ in files.values())


def test_json_shape_is_the_documented_one() -> None:
    manifest = Manifest(
        "o/n", "b" * 40, (ManifestFile("x.bin", 3, "c" * 64),), "2026-12-02T10:00:00Z"
    )
    doc = json.loads(manifest.to_json())
    assert doc == {
        "schema": "gpudoctor.manifest/1",
        "repo_id": "o/n",
        "revision": "b" * 40,
        "created_at": "2026-12-02T10:00:00Z",
        "files": [{"path": "x.bin", "size": 3, "sha256": "c" * 64}],
    }
    assert MANIFEST_NAME == ".gpudoctor-manifest.json"


def _doc(**changes: object) -> str:
    doc: dict[str, object] = {
        "schema": "gpudoctor.manifest/1",
        "repo_id": "o/n",
        "revision": "b" * 40,
        "created_at": "2026-12-02T10:00:00Z",
        "files": [{"path": "a.bin", "size": 1, "sha256": None}],
    }
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not JSON"),
        ("[]", "top level is not an object"),
        (_doc(schema="other/1"), "schema"),
        (_doc(repo_id=""), "'repo_id'"),
        (_doc(files={}), "'files' must be a list"),
        (_doc(files=[{"path": "/etc/passwd", "size": 1}]), "must be relative"),
        (_doc(files=[{"path": "a/../../b", "size": 1}]), "'..'"),
        (_doc(files=[{"path": "a", "size": -1}]), "non-negative integer"),
        (_doc(files=[{"path": "a", "size": True}]), "non-negative integer"),
        (_doc(files=[{"path": "a", "size": 1, "sha256": "XYZ"}]), "64 lowercase hex"),
        (_doc(files=[{"path": "a", "size": 1}, {"path": "a", "size": 2}]), "listed twice"),
        (_doc(files=["a"]), "not an object"),
    ],
)
def test_bad_input_is_a_clear_value_error(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="invalid manifest") as info:
        parse_manifest(text)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (None, "file path must be a non-empty string"),
        (5, "file path must be a non-empty string"),
        ("", "file path must be a non-empty string"),
        ("a\\b", "file path 'a\\\\b' must be relative (POSIX, no backslash)"),
        ("a\x00b", "file path 'a\\x00b' must be relative (POSIX, no backslash)"),
        (".", "file path '.' must not contain empty, '.' or '..' parts"),
        ("..", "file path '..' must not contain empty, '.' or '..' parts"),
        ("../a", "file path '../a' must not contain empty, '.' or '..' parts"),
        ("a//b", "file path 'a//b' must not contain empty, '.' or '..' parts"),
    ],
)
def test_unsafe_paths_are_refused_with_their_reason(path: object, message: str) -> None:
    """A manifest another party wrote must not make gpudoctor stat or write outside the
    model directory (``..``), nor name one file twice (``a//b`` is ``a/b``)."""
    from gpudoctor.weights.manifest import check_relative_path

    with pytest.raises(ValueError) as info:
        check_relative_path(path)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_safe_paths_are_kept_as_written() -> None:
    from gpudoctor.weights.manifest import check_relative_path

    for path in ("a", "sub/dir/model-00001-of-00002.safetensors", ".hidden", "a..b", "..a"):
        assert check_relative_path(path) == path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "invalid manifest: top level is not an object"),
        (
            _doc(schema="other/1"),
            "invalid manifest: schema is 'other/1', expected 'gpudoctor.manifest/1'",
        ),
        (_doc(files={}), "invalid manifest: 'files' must be a list"),
        (
            _doc(files=[{"path": "a", "size": 1}, {"path": "b", "size": -1}]),
            "invalid manifest: files[1] (b): size must be a non-negative integer",
        ),
        (
            _doc(files=[{"path": "a", "size": 1}, {"path": "..", "size": 1}]),
            "invalid manifest: files[1]: file path '..' must not contain empty, '.' or '..' parts",
        ),
        (
            _doc(files=[{"path": "a", "size": 1, "sha256": "A" * 64}]),
            "invalid manifest: files[0] (a): sha256 must be 64 lowercase hex digits or null",
        ),
        (
            _doc(files=[{"path": "a", "size": 1, "sha256": "abc"}]),
            "invalid manifest: files[0] (a): sha256 must be 64 lowercase hex digits or null",
        ),
        (
            _doc(files=[{"path": "a", "size": 1, "sha256": 5}]),
            "invalid manifest: files[0] (a): sha256 must be 64 lowercase hex digits or null",
        ),
    ],
)
def test_the_refusal_says_exactly_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_manifest(text)
    assert str(info.value) == message


def test_the_file_on_disk_is_one_key_per_line() -> None:
    """Readable and diffable by an admin (``cat .gpudoctor-manifest.json``)."""
    manifest = Manifest("o/n", "b" * 40, (ManifestFile("x", 3, None),), "2026-12-02T10:00:00Z")
    assert manifest.to_json() == (
        '{\n "schema": "gpudoctor.manifest/1",\n "repo_id": "o/n",\n'
        f' "revision": "{"b" * 40}",\n "created_at": "2026-12-02T10:00:00Z",\n'
        ' "files": [\n  {\n   "path": "x",\n   "size": 3,\n   "sha256": null\n  }\n ]\n}\n'
    )


def test_created_at_is_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import time
    from datetime import datetime, timezone

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+05:30: a local time would be 5.5 h off
    time.tzset()
    try:
        stamp = utc_now_iso()
        now = datetime.now(timezone.utc)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp), stamp
    written = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    assert abs((now - written).total_seconds()) < 3600  # the zone, not the clock's speed
