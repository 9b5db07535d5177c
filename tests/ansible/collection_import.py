"""Import the gpudoctor.gpu collection's Python in this process (its fast unit tests): a
directory ``ansible_collections/gpudoctor/gpu`` linking to the repo's collection, put on
``sys.path``, as Ansible lays a collection out on the node."""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from tests.ansible.playbook import COLLECTION_SRC

_ROOT = Path(tempfile.mkdtemp(prefix="gpudoctor-collections-"))
(_ROOT / "ansible_collections" / "gpudoctor").mkdir(parents=True)
(_ROOT / "ansible_collections" / "gpudoctor" / "gpu").symlink_to(COLLECTION_SRC)
sys.path.insert(0, str(_ROOT))


def plugin(kind: str, name: str) -> ModuleType:
    """Return ``ansible_collections.gpudoctor.gpu.plugins.<kind>.<name>``, imported."""
    return importlib.import_module(f"ansible_collections.gpudoctor.gpu.plugins.{kind}.{name}")
