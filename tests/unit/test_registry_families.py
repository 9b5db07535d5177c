"""A check's module is its family: the registry refuses, at load, a check outside its
family, for the shipped catalogue (module name) and for plug-ins (entry-point name).
Real packages and a real installed distribution (dist-info on sys.path), imported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpudoctor import checks
from gpudoctor.registry import CatalogueError, load_catalogue, plugin_modules, shipped_specs

CHECK = """
@check(id={id!r}, title="It is fine", severity=Severity.HIGH, proves="x", remediation="y")
def {name}(ctx):
    yield ctx.passed("s", "ok")
"""
HEAD = "from gpudoctor.model import Severity\nfrom gpudoctor.registry import check\n"


def package(root: Path, name: str, modules: dict[str, list[str]]) -> str:
    """Write package ``name`` under ``root`` with a module per key defining checks of the
    listed ids; return its name (importable once ``root`` is on sys.path)."""
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for module, ids in modules.items():
        body = "".join(CHECK.format(id=i, name=i.replace(".", "_")) for i in ids)
        (pkg / f"{module}.py").write_text(HEAD + body)
    return name


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("fam_")]:
        del sys.modules[name]


def load(root: Path, name: str, catalogue: tuple[str, ...]):
    return shipped_specs(catalogue, [str(root / name)], name)


def test_shipped_checks_live_in_the_module_of_their_family():
    specs = load_catalogue(include_plugins=False)
    assert [s.id for s in specs] == list(checks.CATALOGUE)
    for s in specs:
        assert s.module == f"gpudoctor.checks.{s.family}", s.id
    families = {s.family for s in specs}
    assert families == {"proc", "driver", "device", "cuda", "nvml", "gpu", "shm", "model",
                        "nccl", "ct", "host"}  # fmt: skip


def test_a_module_holding_another_familys_check_is_refused(on_path):
    name = package(on_path, "fam_a", {"gpu": ["gpu.count", "nccl.p2p"], "nccl": []})
    with pytest.raises(CatalogueError, match=r"'nccl.p2p' does not belong in fam_a.gpu"):
        load(on_path, name, ("gpu.count", "nccl.p2p"))


def test_the_catalogue_order_is_the_report_order(on_path):
    name = package(on_path, "fam_b", {"a": ["a.one", "a.two"], "b": ["b.one"]})
    assert [s.id for s in load(on_path, name, ("a.two", "b.one", "a.one"))] == [
        "a.two",
        "b.one",
        "a.one",
    ]


def test_an_unlisted_or_missing_check_and_a_stray_module_are_refused(on_path):
    name = package(on_path, "fam_c", {"a": ["a.one", "a.two"], "b": ["b.one"], "_util": []})
    with pytest.raises(CatalogueError, match=r"'a.two' is not listed in fam_c.CATALOGUE"):
        load(on_path, name, ("a.one", "b.one"))
    with pytest.raises(CatalogueError, match=r"lists a.three, defined nowhere"):
        load(on_path, name, ("a.one", "a.two", "a.three", "b.one"))
    with pytest.raises(CatalogueError, match=r"module\(s\) b hold no check of CATALOGUE"):
        load(on_path, name, ("a.one", "a.two"))  # _util: a helper, allowed


def install_plugin(root: Path, entry: str, ids: list[str]) -> None:
    """Install a distribution whose ``gpudoctor.checks`` entry point ``entry`` is module
    ``fam_plugin`` defining checks ``ids``."""
    body = "".join(CHECK.format(id=i, name=i.replace(".", "_")) for i in ids)
    (root / "fam_plugin.py").write_text(HEAD + body)
    dist = root / "fam_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fam-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[gpudoctor.checks]\n{entry} = fam_plugin\n")
    plugin_modules.cache_clear()


@pytest.mark.parametrize(
    ("entry", "ids", "message"),
    [
        ("acme", ["acme.fan", "fan.speed"], r"'fan.speed' does not belong in the 'acme' entry"),
        ("gpu", ["gpu.fan"], r"'gpu' is a shipped check family"),
    ],
)
def test_a_plugin_check_outside_its_entry_point_family_is_refused(on_path, entry, ids, message):
    install_plugin(on_path, entry, ids)
    try:
        with pytest.raises(CatalogueError, match=message):
            load_catalogue()
    finally:
        plugin_modules.cache_clear()


def test_a_plugin_of_its_own_family_loads_after_the_shipped_checks(on_path):
    install_plugin(on_path, "acme", ["acme.fan", "acme.pump"])
    try:
        ids = [s.id for s in load_catalogue()]
    finally:
        plugin_modules.cache_clear()
    assert ids == [*checks.CATALOGUE, "acme.fan", "acme.pump"]
