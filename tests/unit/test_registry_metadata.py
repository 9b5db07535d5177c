"""The registry keeps every piece of a check's metadata, and its load-time refusals say
exactly what is wrong and where (the survivors of tests/mutation in gpudoctor/registry.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpudoctor import checks
from gpudoctor.model import Severity
from gpudoctor.registry import (
    CatalogueError,
    CheckSpec,
    check,
    load_catalogue,
    plugin_modules,
    shipped_specs,
    validate,
)
from tests.unit.test_registry_families import HEAD, install_plugin, on_path, package  # noqa: F401


def probe(ctx):
    return [ctx]


def test_the_decorator_keeps_every_field() -> None:
    spec = check(
        id="a.b",
        title="A is b",
        severity=Severity.WARNING,
        proves="p",
        remediation="r",
        requires=["c.d"],
        after=("e.f",),
        uses_gpu_probe=True,
        scope="ct_host",
        fix="gpudoctor fix --ct ID",
    )(probe)
    assert spec == CheckSpec(
        id="a.b",
        title="A is b",
        severity=Severity.WARNING,
        proves="p",
        remediation="r",
        func=probe,
        requires=("c.d",),
        after=("e.f",),
        uses_gpu_probe=True,
        scope="ct_host",
        fix="gpudoctor fix --ct ID",
        module=__name__,
    )
    plain = check(id="a.c", title="A is c", severity=Severity.HIGH, proves="p", remediation="r")(
        probe
    )
    assert (plain.requires, plain.after, plain.uses_gpu_probe, plain.scope, plain.fix) == (
        (),
        (),
        False,
        "target",
        "",
    )
    ctx = object()
    assert plain(ctx) == [ctx]  # calling the spec calls the function with the context


def spec(id: str, **kw) -> CheckSpec:
    meta = dict(title=f"{id} is fine", severity=Severity.HIGH, proves="x", remediation="y")
    meta.update(kw)
    return check(id=id, **meta)(probe)


WHERE = f"{__name__}.probe: "


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([spec("a.b", title="Checks that a is b")], "title must state the healthy condition"),
        ([spec("a.b", title="VERIFY a is b")], "title must state the healthy condition"),
        ([spec("a.b", title="")], "title must state the healthy condition"),
        ([spec("a.b", proves=" ")], "'proves' is required"),
        ([spec("a.b", scope="cluster")], "scope must be one of ('target', 'ct_host', 'node')"),
        ([spec("a.b", remediation="")], "a remediation is required"),
    ],
)
def test_each_refusal_names_the_function_and_the_rule(bad, message: str) -> None:
    with pytest.raises(CatalogueError) as info:
        validate(bad)
    assert str(info.value).startswith(WHERE) and message in str(info.value), str(info.value)


def test_titles_that_state_the_condition_pass() -> None:
    for title in ("Checked-in nodes exist", "Verifying is not needed", "Checksum matches"):
        assert validate([spec("a.b", title=title)])[0].title == title


def test_a_cycle_is_named_in_full() -> None:
    with pytest.raises(CatalogueError) as info:
        validate([spec("a.b", requires=("c.d",)), spec("c.d", after=("a.b",))])
    assert str(info.value) == "dependency cycle: a.b -> c.d -> a.b"


def test_every_missing_id_and_every_stray_module_is_listed(on_path) -> None:  # noqa: F811
    name = package(on_path, "fam_m", {"a": ["a.one"], "b": ["b.one"], "c": ["c.one"]})
    root = [str(on_path / name)]
    with pytest.raises(CatalogueError) as info:
        shipped_specs(("a.one", "a.two", "a.three", "b.one", "c.one"), root, name)
    assert str(info.value) == "fam_m.CATALOGUE lists a.two, a.three, defined nowhere"
    with pytest.raises(CatalogueError) as info:
        shipped_specs(("a.one",), root, name)
    assert str(info.value) == (
        "fam_m: module(s) b, c hold no check of CATALOGUE: a module of the catalogue is one "
        "family (list its checks, or name a helper '_name')"
    )


def test_an_id_with_more_dots_belongs_to_its_first_part(on_path) -> None:  # noqa: F811
    name = package(on_path, "fam_d", {"a": ["a.b.c", "a.d"]})
    assert [s.id for s in shipped_specs(("a.b.c", "a.d"), [str(on_path / name)], name)] == [
        "a.b.c",
        "a.d",
    ]


def test_a_plugin_naming_a_shipped_family_is_told_to_name_its_own(on_path) -> None:  # noqa: F811
    install_plugin(on_path, "gpu", ["gpu.fan"])
    try:
        with pytest.raises(CatalogueError) as info:
            load_catalogue()
    finally:
        plugin_modules.cache_clear()
    assert str(info.value) == (
        "entry point 'gpu' (fam_plugin): 'gpu' is a shipped check family; a plug-in names "
        "its own family"
    )


def test_a_plugin_installed_after_a_load_is_found_on_the_next_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry-point scan is cached per sys.path: a new path is a new scan."""
    plugin_modules.cache_clear()
    assert [s.id for s in load_catalogue()] == list(checks.CATALOGUE)  # cached for this path
    body = HEAD + (
        '@check(id="late.one", title="It is fine", severity=Severity.HIGH, proves="x", '
        'remediation="y")\ndef late_one(ctx):\n    return []\n'
    )
    (tmp_path / "late_plugin.py").write_text(body)
    dist = tmp_path / "late_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: late-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.checks]\nlate = late_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # no cache_clear: the new path must do it
    try:
        assert [s.id for s in load_catalogue()][-1] == "late.one"
    finally:
        sys.modules.pop("late_plugin", None)
        plugin_modules.cache_clear()
