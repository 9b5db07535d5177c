"""gpudoctor/facts/models.py: the safetensors index and header parsers that ``model.present``
uses on a model directory without a manifest (what ``hf download`` leaves), on real files
written by the safetensors library."""

from __future__ import annotations

import json
import struct

import pytest

from gpudoctor.facts.models import (
    HEADER_PREFIX,
    MAX_HEADER,
    SafetensorsIndex,
    expected_file_size,
    header_length,
    parse_index,
)

np = pytest.importorskip("numpy")
st_numpy = pytest.importorskip("safetensors.numpy")


def real_safetensors(tensors: dict, metadata: dict[str, str] | None = None) -> bytes:
    """Return the bytes of a real .safetensors file written by the safetensors library."""
    return st_numpy.save(tensors, metadata=metadata)


def size_from_head(blob: bytes) -> int:
    """Return expected_file_size read the way model.present reads a shard: 8 bytes, then the
    header those bytes announce."""
    length = header_length(blob[:HEADER_PREFIX])
    return expected_file_size(blob[:HEADER_PREFIX], blob[HEADER_PREFIX : HEADER_PREFIX + length])


# ---------------------------------------------------------------------------- the index


def test_index_lists_each_shard_once_sorted_with_its_total_size():
    text = json.dumps(
        {
            "metadata": {"total_size": 4096},
            "weight_map": {
                "lm_head.weight": "model-00002-of-00002.safetensors",
                "embed.weight": "model-00001-of-00002.safetensors",
                "norm.weight": "model-00002-of-00002.safetensors",
            },
        }
    )
    assert parse_index(text) == SafetensorsIndex(
        ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"), 4096
    )


def test_index_total_size_given_as_text_is_a_number():
    text = json.dumps({"metadata": {"total_size": "123"}, "weight_map": {"a": "x.safetensors"}})
    assert parse_index(text).total_size == 123


@pytest.mark.parametrize("metadata", [{"format": "pt"}, {"total_size": None}, {"total_size": 0}])
def test_index_without_a_total_size_says_none(metadata):
    doc = {"weight_map": {"a": "x.safetensors"}, "metadata": metadata}
    assert parse_index(json.dumps(doc)) == SafetensorsIndex(("x.safetensors",), None)


@pytest.mark.parametrize("metadata", [{}, {"metadata": None}, {"metadata": {}}])
def test_index_without_a_metadata_section_says_no_total_size(metadata):
    doc = {"weight_map": {"a": "x.safetensors"}, **metadata}
    assert parse_index(json.dumps(doc)) == SafetensorsIndex(("x.safetensors",), None)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "Expecting property name"),
        ('{"metadata": {}}', "'weight_map'"),
        ('["weight_map"]', "list indices must be integers"),
    ],
)
def test_a_malformed_index_is_one_value_error_naming_what_is_wrong(text, why):
    with pytest.raises(ValueError) as info:
        parse_index(text)
    assert str(info.value).startswith("not a safetensors index (")
    assert why in str(info.value)


# ---------------------------------------------------------------------------- the header


def test_header_length_is_the_little_endian_u64_of_the_first_8_bytes():
    blob = real_safetensors({"w": np.zeros((2, 3), dtype=np.float32)})
    header = blob[HEADER_PREFIX:]
    length = header_length(blob)  # more than 8 bytes given: only the first 8 count
    assert json.loads(header[:length])["w"]["shape"] == [2, 3]
    assert header_length(struct.pack("<Q", 258)) == 258


def test_header_length_refuses_fewer_than_8_bytes():
    with pytest.raises(ValueError, match=r"^shorter than the 8-byte safetensors header length$"):
        header_length(struct.pack("<Q", 16)[:7])


def test_header_length_accepts_the_largest_plausible_header_and_refuses_one_byte_more():
    assert header_length(struct.pack("<Q", MAX_HEADER)) == MAX_HEADER == 100 * 1024 * 1024
    with pytest.raises(ValueError, match=f"^implausible header length {MAX_HEADER + 1}$"):
        header_length(struct.pack("<Q", MAX_HEADER + 1))


def test_a_length_with_its_top_bit_set_is_implausible_not_negative():
    """A corrupt file's first 8 bytes are an unsigned length: 0xff... is 2**64 - 1."""
    with pytest.raises(ValueError, match=f"^implausible header length {2**64 - 1}$"):
        header_length(b"\xff" * 8)


def test_expected_size_of_a_real_file_is_its_size():
    blob = real_safetensors(
        {
            "a": np.ones((4, 4), dtype=np.float16),
            "b": np.arange(10, dtype=np.int64),
        },
        metadata={"format": "pt"},
    )
    assert size_from_head(blob) == len(blob)


def test_a_truncated_file_is_shorter_than_its_header_says():
    blob = real_safetensors({"a": np.ones(1000, dtype=np.float32)})
    cut = blob[: len(blob) - 100]
    assert size_from_head(cut) == len(blob) > len(cut)


def test_a_header_without_tensors_needs_only_the_prefix_and_the_header():
    blob = real_safetensors({}, metadata={"format": "pt"})
    length = header_length(blob)
    assert size_from_head(blob) == HEADER_PREFIX + length == len(blob)


def test_bytes_past_the_announced_header_length_are_not_read_as_header():
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    prefix = struct.pack("<Q", len(header))
    assert expected_file_size(prefix, header + b"\x00garbage") == 8 + len(header) + 8


@pytest.mark.parametrize("header", [b"\xff\xfe{}", b"{not json"])
def test_an_unreadable_header_is_one_value_error(header):
    with pytest.raises(ValueError, match=r"^unreadable safetensors header \("):
        expected_file_size(struct.pack("<Q", len(header)), header)
