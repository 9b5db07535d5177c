"""Pure parsers for model directories: safetensors headers and index files."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
HEADER_PREFIX = 8
MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class SafetensorsIndex:
    """``model.safetensors.index.json``: the shards a checkpoint needs.

    Attributes:
        shards: shard file names, sorted.
        total_size: ``metadata.total_size`` (tensor bytes), when given.
    """

    shards: tuple[str, ...]
    total_size: int | None


def parse_index(text: str) -> SafetensorsIndex:
    """Return the shards named by a safetensors index; raise ValueError when malformed."""
    try:
        doc = json.loads(text)
        weight_map = doc["weight_map"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a safetensors index ({exc})") from exc
    total = (doc.get("metadata") or {}).get("total_size")
    return SafetensorsIndex(tuple(sorted(set(weight_map.values()))), int(total) if total else None)


def header_length(prefix: bytes) -> int:
    """Return the JSON header length stored in a safetensors file's first 8 bytes."""
    if len(prefix) < HEADER_PREFIX:
        raise ValueError("shorter than the 8-byte safetensors header length")
    (length,) = struct.unpack("<Q", prefix[:HEADER_PREFIX])
    if length > MAX_HEADER:
        raise ValueError(f"implausible header length {length}")
    return length


def expected_file_size(prefix: bytes, header: bytes) -> int:
    """Return the size in bytes a safetensors file must have, from its 8-byte prefix and its
    JSON header (``8 + header length + the largest tensor end offset``)."""
    length = header_length(prefix)
    try:
        doc = json.loads(header[:length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"unreadable safetensors header ({exc})") from exc
    ends = [v["data_offsets"][1] for k, v in doc.items() if k != "__metadata__"]
    return HEADER_PREFIX + length + max(ends, default=0)
