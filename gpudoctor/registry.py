"""The check catalogue: how a check declares itself, and how the catalogue is loaded.

A check is a module-level :class:`CheckSpec` made by the :func:`check` decorator, its
metadata beside its logic::

    @check(
        id="device.open",
        title="Every GPU device node can be opened",
        severity=Severity.CRITICAL,
        proves="the container's cgroup device policy and the node modes allow CUDA's opens",
        remediation="Allow the node's major in the CT config: lxc.cgroup2.devices.allow: c M:* rwm",
        requires=("device.nodes",),
    )
    def device_open(ctx: CheckContext) -> Iterable[Finding]: ...

:func:`load_catalogue` imports the shipped modules (``checks.CATALOGUE``) and every module
registered under the ``gpudoctor.checks`` entry-point group, collects their CheckSpecs and
validates the metadata at load: ids unique and well formed, titles that state the healthy
condition, a remediation, known dependencies and no cycles.
"""

from __future__ import annotations

import functools
import importlib
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from gpudoctor.model import Finding, Severity

if TYPE_CHECKING:
    from gpudoctor.context import CheckContext

CheckFunc = Callable[["CheckContext"], Iterable[Finding]]

ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
SCOPES = ("target", "ct_host")


class CatalogueError(ValueError):
    """A check's metadata is invalid (raised at load, never at run time)."""


@dataclass(frozen=True)
class CheckSpec:
    """One check: its metadata and its function.

    Attributes:
        id: dotted id, ``family.name`` (``device.open``).
        title: the healthy condition, as a statement ("Every GPU device node can be opened").
        severity: how much a FAIL matters.
        proves: what a PASS proves, in one sentence.
        remediation: the general remedy (findings carry the exact one).
        func: ``(ctx) -> Iterable[Finding]``.
        requires: checks that must be healthy (PASS/WARN) for this one to run; else SKIP.
        after: checks to run first (their results are readable through ``ctx.result``)
            without being required, e.g. to attribute a cause.
        uses_gpu_probe: True when the check reads the CUDA/NVML child-process probe.
        scope: ``target`` (runs where the workload runs) or ``ct_host`` (runs on the
            Proxmox/LXC host that owns the container; only with ``--ct``).
        fix: the gpudoctor command that fixes a FAIL, when one exists.
        module: the module that defines it.
    """

    id: str
    title: str
    severity: Severity
    proves: str
    remediation: str
    func: CheckFunc
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    uses_gpu_probe: bool = False
    scope: str = "target"
    fix: str = ""
    module: str = ""

    @property
    def family(self) -> str:
        """Return the id's family (``device`` for ``device.open``)."""
        return self.id.split(".", 1)[0]

    def __call__(self, ctx: CheckContext) -> Iterable[Finding]:
        return self.func(ctx)


def check(
    *,
    id: str,
    title: str,
    severity: Severity,
    proves: str,
    remediation: str,
    requires: Iterable[str] = (),
    after: Iterable[str] = (),
    uses_gpu_probe: bool = False,
    scope: str = "target",
    fix: str = "",
) -> Callable[[CheckFunc], CheckSpec]:
    """Return a decorator that turns a check function into a module-level CheckSpec."""

    def wrap(func: CheckFunc) -> CheckSpec:
        return CheckSpec(
            id=id,
            title=title,
            severity=severity,
            proves=proves,
            remediation=remediation,
            func=func,
            requires=tuple(requires),
            after=tuple(after),
            uses_gpu_probe=uses_gpu_probe,
            scope=scope,
            fix=fix,
            module=func.__module__,
        )

    return wrap


def specs_in(module: ModuleType) -> list[CheckSpec]:
    """Return the CheckSpecs defined at module level in ``module``, in definition order."""
    return [
        v for v in vars(module).values() if isinstance(v, CheckSpec) and v.module == module.__name__
    ]


def validate(specs: list[CheckSpec]) -> list[CheckSpec]:
    """Return ``specs`` in dependency order; raise CatalogueError on any invalid metadata."""
    seen: dict[str, CheckSpec] = {}
    for spec in specs:
        where = f"{spec.module}.{spec.func.__name__}"
        if not ID_PATTERN.match(spec.id):
            raise CatalogueError(f"{where}: id {spec.id!r} must look like 'family.name'")
        if spec.id in seen:
            raise CatalogueError(
                f"{where}: id {spec.id!r} already defined in {seen[spec.id].module}"
            )
        if not spec.title or spec.title.lower().startswith(("check ", "checks ", "verify ")):
            raise CatalogueError(f"{where}: title must state the healthy condition: {spec.title!r}")
        if not spec.remediation.strip():
            raise CatalogueError(f"{where}: a remediation is required")
        if not spec.proves.strip():
            raise CatalogueError(f"{where}: 'proves' is required")
        if spec.scope not in SCOPES:
            raise CatalogueError(f"{where}: scope must be one of {SCOPES}")
        seen[spec.id] = spec
    for spec in specs:
        for dep in spec.requires + spec.after:
            if dep not in seen:
                raise CatalogueError(f"{spec.id}: depends on unknown check {dep!r}")
    return topological(specs)


def topological(specs: list[CheckSpec]) -> list[CheckSpec]:
    """Return specs ordered so every dependency comes first (stable); raise on a cycle."""
    by_id = {s.id: s for s in specs}
    ordered: list[CheckSpec] = []
    state: dict[str, int] = {}

    def visit(spec: CheckSpec, path: tuple[str, ...]) -> None:
        if state.get(spec.id) == 2:
            return
        if state.get(spec.id) == 1:
            raise CatalogueError("dependency cycle: " + " -> ".join((*path, spec.id)))
        state[spec.id] = 1
        for dep in spec.requires + spec.after:
            visit(by_id[dep], (*path, spec.id))
        state[spec.id] = 2
        ordered.append(spec)

    for spec in specs:
        visit(spec, ())
    return ordered


def load_catalogue(include_plugins: bool = True) -> list[CheckSpec]:
    """Return every check (shipped + ``gpudoctor.checks`` entry points), validated and ordered."""
    from gpudoctor import checks

    modules = [importlib.import_module(f"gpudoctor.checks.{name}") for name in checks.CATALOGUE]
    if include_plugins:
        modules += plugin_modules(tuple(sys.path))
    return validate([spec for module in modules for spec in specs_in(module)])


@functools.lru_cache(maxsize=4)
def plugin_modules(search_path: tuple[str, ...]) -> list[ModuleType]:
    """Return the modules of the ``gpudoctor.checks`` entry points, found once per
    ``sys.path`` (scanning every installed distribution costs ~5 ms; a fleet run loads
    the catalogue once per container)."""
    from importlib.metadata import entry_points

    return [ep.load() for ep in entry_points(group="gpudoctor.checks")]
