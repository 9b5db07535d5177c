"""gpudoctor: diagnose and fix NVIDIA GPU access in LXC/Proxmox containers."""

import importlib.util as _importlib_util
import sys as _sys
from pathlib import Path as _Path

__version__ = "0.1.0"


def _alias_source_catalogue() -> None:
    """Make the repo's top-level ``checks/`` importable as ``gpudoctor.checks`` in a checkout.

    The wheel installs the catalogue inside gpudoctor's namespace (``gpudoctor/checks``,
    pyproject's ``force-include``), so no top-level ``checks`` package is ever installed. A
    source checkout (editable install, or the tests) keeps the user's layout, ``checks/``
    beside ``gpudoctor/``: register that folder under the same name. Returns nothing.
    """
    package_dir = _Path(__file__).resolve().parent
    if (package_dir / "checks").is_dir() or "gpudoctor.checks" in _sys.modules:
        return
    source = package_dir.parent / "checks" / "__init__.py"
    if not source.is_file():
        return
    spec = _importlib_util.spec_from_file_location(
        "gpudoctor.checks", source, submodule_search_locations=[str(source.parent)]
    )
    if spec is None or spec.loader is None:
        return
    module = _importlib_util.module_from_spec(spec)
    _sys.modules["gpudoctor.checks"] = module
    spec.loader.exec_module(module)


_alias_source_catalogue()
