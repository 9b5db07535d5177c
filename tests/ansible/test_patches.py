"""ansible-core's process-wide patches stay inside the Ansible tests (tests/ansible/patches.py):
left on, torch's dynamo refused the ``sys.intern`` wrapper and the tiny model of every later
bench test could not be made (the whole suite's tests after tests/ansible errored)."""

from __future__ import annotations

import sys
import types

from ansible.module_utils._internal._patches._sys_intern_patch import SysInternPatch

from tests.ansible import patches


def test_an_applied_patch_is_taken_off_again() -> None:
    patches.undo()  # whatever the fixture applied
    original = sys.intern
    assert isinstance(original, types.BuiltinFunctionType)
    SysInternPatch.unpatched_implementation = original
    sys.intern = SysInternPatch()  # what ansible's patch() installs where it is needed
    try:
        assert SysInternPatch.is_patched()
        patches.undo()
        assert sys.intern is original and not SysInternPatch.is_patched()
    finally:
        sys.intern = original
