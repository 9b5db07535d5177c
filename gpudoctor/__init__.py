"""gpudoctor: diagnose and fix NVIDIA GPU access in LXC/Proxmox containers."""

import importlib.util as _importlib_util
import os.path as _ospath
import sys as _sys

__version__ = "0.1.0"


def _alias_source_catalogue() -> None:
    """Make the repo's top-level ``checks/`` importable as ``gpudoctor.checks`` in a checkout.

    The wheel installs the catalogue inside gpudoctor's namespace (``gpudoctor/checks``,
    pyproject's ``force-include``), so no top-level ``checks`` package is ever installed. A
    source checkout (editable install, or the tests) keeps the user's layout, ``checks/``
    beside ``gpudoctor/``: register that folder under the same name. Returns nothing.
    """
    # os.path, not pathlib: this runs before `gpudoctor check` starts its GPU probe
    # (gpudoctor/early_probe.py), and pathlib's import alone costs ~6 ms
    package_dir = _ospath.dirname(_ospath.realpath(__file__))
    if _ospath.isdir(_ospath.join(package_dir, "checks")) or "gpudoctor.checks" in _sys.modules:
        return
    source = _ospath.join(_ospath.dirname(package_dir), "checks", "__init__.py")
    if not _ospath.isfile(source):
        return
    spec = _importlib_util.spec_from_file_location(
        "gpudoctor.checks", source, submodule_search_locations=[_ospath.dirname(source)]
    )
    if spec is None or spec.loader is None:
        return
    module = _importlib_util.module_from_spec(spec)
    _sys.modules["gpudoctor.checks"] = module
    spec.loader.exec_module(module)


_alias_source_catalogue()
