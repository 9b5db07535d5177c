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

:func:`load_catalogue` imports the shipped modules (one per family of ``checks.CATALOGUE``,
``gpudoctor.checks.<family>``) and every module registered under the ``gpudoctor.checks``
entry-point group, collects their CheckSpecs and validates the metadata at load: a check's
module is its family (a shipped module's name, a plug-in's entry-point name: ``acme =
"acme_checks"`` registers ``acme.*`` checks only, and no plug-in adds to a shipped family),
ids unique and well formed, titles that state the healthy condition, a remediation, known
dependencies and no cycles.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from gpudoctor.model import Finding, Severity

if TYPE_CHECKING:
    from gpudoctor.context import CheckContext

CheckFunc = Callable[["CheckContext"], Iterable[Finding]]

ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
SCOPES = ("target", "ct_host", "node")


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
            Proxmox/LXC host that owns the container; only with ``--ct``) or ``node``
            (the machine's own kernel: on the CT's host with ``--ct``, else on the target).
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
    """Return every check (shipped + ``gpudoctor.checks`` entry points), validated and ordered:
    the shipped ones in ``checks.CATALOGUE``'s order, then each plug-in's."""
    from gpudoctor import checks

    specs = shipped_specs(checks.CATALOGUE, checks.__path__, checks.__name__)
    if include_plugins:
        shipped = {s.family for s in specs}
        for name, module in plugin_modules(tuple(sys.path)):
            specs += plugin_specs(name, module, shipped)
    return validate(specs)


def require_family(spec: CheckSpec, family: str, where: str) -> None:
    """Raise CatalogueError unless ``spec``'s id is of ``family`` (its module's name, or a
    plug-in's entry-point name). Returns nothing."""
    if spec.family != family:
        raise CatalogueError(
            f"{spec.module}.{spec.func.__name__}: id {spec.id!r} does not belong in {where}: "
            f"a check's module is its family (define it in the {spec.family!r} module, "
            f"or name it '{family}.*')"
        )


def shipped_specs(catalogue: Sequence[str], path: Iterable[str], package: str) -> list[CheckSpec]:
    """Return the shipped checks in ``catalogue``'s order. Each id's module is
    ``<package>.<family>``; raise CatalogueError when a module holds a check of another
    family, defines a check the catalogue does not list, or a listed id (or a module of the
    package) has no counterpart."""
    families = list(dict.fromkeys(i.split(".", 1)[0] for i in catalogue))
    found: dict[str, CheckSpec] = {}
    for family in families:
        module = importlib.import_module(f"{package}.{family}")
        for spec in specs_in(module):
            require_family(spec, family, f"{module.__name__}")
            if spec.id not in catalogue:
                raise CatalogueError(
                    f"{spec.module}.{spec.func.__name__}: id {spec.id!r} is not listed in "
                    f"{package}.CATALOGUE (add it there, in report order)"
                )
            found[spec.id] = spec
    missing = [i for i in catalogue if i not in found]
    if missing:
        raise CatalogueError(f"{package}.CATALOGUE lists {', '.join(missing)}, defined nowhere")
    strays = [n for _, n, _ in pkgutil.iter_modules(path) if not n.startswith("_")]
    strays = [n for n in strays if n not in families]
    if strays:
        raise CatalogueError(
            f"{package}: module(s) {', '.join(strays)} hold no check of CATALOGUE: a module "
            "of the catalogue is one family (list its checks, or name a helper '_name')"
        )
    return [found[i] for i in dict.fromkeys(catalogue)]


def plugin_specs(name: str, module: ModuleType, shipped: set[str]) -> list[CheckSpec]:
    """Return the checks of the plug-in registered as entry point ``name``: every id must be
    ``name.*`` (the entry-point name is the family, as a shipped module's name is), and no
    plug-in may add to a shipped family; raise CatalogueError otherwise."""
    if name in shipped:
        raise CatalogueError(
            f"entry point {name!r} ({module.__name__}): {name!r} is a shipped check family; "
            "a plug-in names its own family"
        )
    specs = specs_in(module)
    for spec in specs:
        require_family(spec, name, f"the {name!r} entry point's module {module.__name__}")
    return specs


@functools.lru_cache(maxsize=4)
def plugin_modules(search_path: tuple[str, ...]) -> list[tuple[str, ModuleType]]:
    """Return (entry-point name, module) of each ``gpudoctor.checks`` entry point, found once
    per ``sys.path`` (scanning every installed distribution costs ~5 ms; a fleet run loads
    the catalogue once per container)."""
    from importlib.metadata import entry_points

    return [(ep.name, ep.load()) for ep in entry_points(group="gpudoctor.checks")]
