"""A plug-in's family is its entry-point name, matched whole: a plug-in cannot add checks
to a shipped family by an entry point that is a prefix of it (or one that starts with it),
and a family that merely starts like a shipped one is its own. A real installed
distribution (dist-info on sys.path), imported by the real registry."""

from __future__ import annotations

import pytest

from gpudoctor import checks
from gpudoctor.registry import CatalogueError, load_catalogue, plugin_modules
from tests.unit.test_registry_families import install_plugin, on_path

__all__ = ["on_path"]


@pytest.mark.parametrize(
    ("entry", "ids"),
    [
        ("nv", ["nvml.fan"]),  # a prefix of the shipped "nvml"
        ("dev", ["device.extra"]),  # a prefix of the shipped "device"
        ("gpu", ["gpux.fan"]),  # the shipped name itself, adding to another family
    ],
)
def test_a_plugin_cannot_add_checks_to_a_shipped_family(on_path, entry, ids) -> None:
    install_plugin(on_path, entry, ids)
    try:
        with pytest.raises(CatalogueError):
            load_catalogue()
    finally:
        plugin_modules.cache_clear()


def test_a_plugin_family_that_starts_like_a_shipped_one_is_its_own(on_path) -> None:
    install_plugin(on_path, "gpux", ["gpux.fan"])
    try:
        ids = [s.id for s in load_catalogue()]
    finally:
        plugin_modules.cache_clear()
    assert ids == [*checks.CATALOGUE, "gpux.fan"]
    assert not any(i.startswith("gpu.") and i not in checks.CATALOGUE for i in ids)
