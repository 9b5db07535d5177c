"""Keep ansible-core's in-process patches inside the Ansible tests.

Importing ``ansible.module_utils`` (the collection's fast unit tests import it in the
pytest process) replaces ``sys.intern``, ``socket.getaddrinfo`` and ``dataclasses._is_type``
process-wide with ansible's wrappers (``ansible/module_utils/_internal/_patches``). A later
test in the same session then meets them: torch's dynamo refuses the ``sys.intern`` wrapper
(``substitute_in_graph expects a function``), and the tiny model of the suite could not be
made. Ansible runs these patches in its own processes; the tests here apply them around
each Ansible test and take them off again, after collection and after each test."""

from __future__ import annotations

import sys


def _patch_classes() -> list:
    """Return ansible's patch classes (none when ansible was never imported here)."""
    if "ansible.module_utils._internal._patches" not in sys.modules:
        return []
    from ansible.module_utils._internal._patches import (
        CallablePatch,
        _dataclass_annotation_patch,  # noqa: F401 - each import defines its class
        _socket_patch,  # noqa: F401
        _sys_intern_patch,  # noqa: F401
    )

    return list(CallablePatch.__subclasses__())


def apply() -> None:
    """Apply ansible's patches (idempotent, as ansible's own import does)."""
    for cls in _patch_classes():
        cls.patch()


def undo() -> None:
    """Put back what each applied patch replaced (``sys.intern`` the builtin, ...)."""
    for cls in _patch_classes():
        if cls.is_patched():
            setattr(cls.target_container, cls.target_attribute, cls.unpatched_implementation)
