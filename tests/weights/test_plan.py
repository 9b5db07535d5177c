"""Pure decisions: revision matching and what to keep, delete and fetch."""

from __future__ import annotations

import pytest

from gpudoctor.weights.manifest import ManifestFile
from gpudoctor.weights.plan import plan_work, revision_matches

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (None, True),
        (SHA, True),
        (SHA[:7], True),
        ("fedcba9", None),  # a short hex could also be a branch name: ask the Hub
        ("f" * 40, False),
        ("main", None),
        ("v1.0", None),
        ("0123", None),
    ],
)
def test_revision_matches(requested: str | None, expected: bool | None) -> None:
    assert revision_matches(requested, SHA) is expected


A = ManifestFile("a.safetensors", 100, "a" * 64)
B = ManifestFile("b.safetensors", 200, "b" * 64)
C = ManifestFile("config.json", 10, None)


def test_empty_dir_fetches_everything() -> None:
    plan = plan_work((A, B, C), {}, trusted=True)
    assert plan.fetch == (A, B, C) and plan.fetch_bytes == 310
    assert plan.keep == () and plan.delete == ()


def test_trusted_dir_keeps_right_sizes_and_replaces_wrong_ones() -> None:
    plan = plan_work(
        (A, B, C), {"a.safetensors": 100, "b.safetensors": 7, "config.json": None}, True
    )
    assert plan.keep == ("a.safetensors",)
    assert plan.delete == ("b.safetensors",)
    assert plan.fetch == (B, C)
    assert plan.hash_first == ()


def test_known_bad_files_are_refetched_even_with_the_right_size() -> None:
    sizes = {"a.safetensors": 100, "b.safetensors": 200, "config.json": 10}
    plan = plan_work((A, B, C), sizes, True, known_bad=frozenset({"b.safetensors"}))
    assert plan.fetch == (B,) and plan.delete == ("b.safetensors",)


def test_untrusted_lfs_files_are_hashed_first_and_small_files_refetched() -> None:
    sizes = {"a.safetensors": 100, "b.safetensors": 200, "config.json": 10}
    plan = plan_work((A, B, C), sizes, trusted=False)
    assert plan.keep == ("a.safetensors", "b.safetensors")
    assert plan.hash_first == (A, B)
    assert plan.fetch == (C,) and plan.delete == ("config.json",)


def test_revision_change_keeps_identical_shards_and_drops_removed_files() -> None:
    old = (
        A,
        ManifestFile("b.safetensors", 200, "c" * 64),
        C,
        ManifestFile("gone.bin", 5, "d" * 64),
    )
    sizes = {"a.safetensors": 100, "b.safetensors": 200, "config.json": 10}
    plan = plan_work((A, B, C), sizes, trusted=False, previous=old)
    assert plan.keep == ("a.safetensors",)
    assert set(plan.delete) == {"b.safetensors", "config.json", "gone.bin"}
    assert plan.fetch == (B, C)
