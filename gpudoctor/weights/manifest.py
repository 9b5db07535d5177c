"""The manifest: a small JSON record that a model directory is complete.

``gpudoctor weights ensure`` writes ``.gpudoctor-manifest.json`` at the top of a model
directory once every file is in place and verified. ``model.present`` (``gpudoctor
check``) reads it through a Host and stats each file, so a directory can be called
complete without the network. This module is pure: it builds and parses text only.

Format (``schema`` = ``gpudoctor.manifest/1``)::

    {"schema": "gpudoctor.manifest/1", "repo_id": "Qwen/Qwen3-8B",
     "revision": "<40-hex commit sha>", "created_at": "2026-12-02T10:00:00Z",
     "files": [{"path": "model-00001-of-00002.safetensors", "size": 123, "sha256": "..."}]}

``sha256`` is the Hub's LFS hash when known, else ``null`` (small git files).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

MANIFEST_NAME = ".gpudoctor-manifest.json"
SCHEMA = "gpudoctor.manifest/1"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class ManifestFile:
    """One file of a model directory.

    Attributes:
        path: POSIX path relative to the model directory (``sub/file.bin``).
        size: size in bytes.
        sha256: lowercase hex sha256 of the content (the Hub's LFS oid), or None.
    """

    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Manifest:
    """What a complete model directory holds.

    Attributes:
        repo_id: Hub repository id (``org/name``).
        revision: the commit sha the files come from.
        files: every file, sorted by path.
        created_at: when the manifest was written, ISO 8601 UTC (``...Z``).
    """

    repo_id: str
    revision: str
    files: tuple[ManifestFile, ...]
    created_at: str

    def to_json(self) -> str:
        """Return the manifest as indented JSON text (ends with a newline)."""
        doc = {
            "schema": SCHEMA,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "created_at": self.created_at,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }
        return json.dumps(doc, indent=1) + "\n"

    @property
    def total_size(self) -> int:
        """Return the sum of all file sizes, in bytes."""
        return sum(f.size for f in self.files)


def utc_now_iso() -> str:
    """Return the current time as ISO 8601 UTC with second precision (``2026-12-02T10:00:00Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_relative_path(path: str) -> str:
    """Return ``path`` when it is a safe relative POSIX path inside the model dir.

    Raises:
        ValueError: for absolute paths, ``..`` parts, empty parts or backslashes.
    """
    if not isinstance(path, str) or not path:
        raise ValueError("file path must be a non-empty string")
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise ValueError(f"file path {path!r} must be relative (POSIX, no backslash)")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts) or posixpath.normpath(path) != path:
        raise ValueError(f"file path {path!r} must not contain empty, '.' or '..' parts")
    return path


def _fail(message: str) -> ValueError:
    return ValueError(f"invalid manifest: {message}")


def _parse_file(index: int, raw: Any) -> ManifestFile:
    if not isinstance(raw, dict):
        raise _fail(f"files[{index}] is not an object")
    try:
        path = check_relative_path(raw.get("path"))
    except ValueError as exc:
        raise _fail(f"files[{index}]: {exc}") from None
    size = raw.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise _fail(f"files[{index}] ({path}): size must be a non-negative integer")
    sha = raw.get("sha256")
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64 or set(sha) - _HEX):
        raise _fail(f"files[{index}] ({path}): sha256 must be 64 lowercase hex digits or null")
    return ManifestFile(path=path, size=size, sha256=sha)


def parse_manifest(text: str) -> Manifest:
    """Return the :class:`Manifest` that ``text`` (the file's JSON) describes.

    Raises:
        ValueError: one clear sentence on bad JSON, a wrong schema, missing or
            mistyped fields, unsafe or duplicate paths.
    """
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise _fail(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise _fail("top level is not an object")
    if doc.get("schema") != SCHEMA:
        raise _fail(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("repo_id", "revision", "created_at"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise _fail(f"{key!r} must be a non-empty string")
    raw_files = doc.get("files")
    if not isinstance(raw_files, list):
        raise _fail("'files' must be a list")
    files = tuple(_parse_file(i, raw) for i, raw in enumerate(raw_files))
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise _fail(f"file {f.path!r} is listed twice")
        seen.add(f.path)
    return Manifest(
        repo_id=doc["repo_id"],
        revision=doc["revision"],
        files=tuple(sorted(files, key=lambda f: f.path)),
        created_at=doc["created_at"],
    )
