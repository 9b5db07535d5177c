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
