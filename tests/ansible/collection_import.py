"""Import the gpudoctor.gpu collection's Python in this process (its fast unit tests).

The modules are imported under their names in the gpudoctor package
(``gpudoctor.ansible_collection.plugins.modules.ct_gpu``: a folder without ``__init__.py``,
so a namespace package inside gpudoctor), which is where mutation testing plants its
mutants; ``ansible_collections.gpudoctor.gpu.plugins.module_utils``, the name the modules
import their module_utils by (as Ansible lays the collection out on the node), is the same
module object in ``sys.modules``."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

PACKAGE = "gpudoctor.ansible_collection.plugins"
ON_THE_NODE = "ansible_collections.gpudoctor.gpu.plugins"

_utils = importlib.import_module(f"{PACKAGE}.module_utils.gpudoctor_cli")
sys.modules[f"{ON_THE_NODE}.module_utils"] = sys.modules[f"{PACKAGE}.module_utils"]
sys.modules[f"{ON_THE_NODE}.module_utils.gpudoctor_cli"] = _utils


def plugin(kind: str, name: str) -> ModuleType:
    """Return the collection's ``plugins/<kind>/<name>.py``, imported."""
    return importlib.import_module(f"{PACKAGE}.{kind}.{name}")
