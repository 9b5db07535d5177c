"""ansible-core's process-wide patches stay inside the Ansible tests (tests/ansible/patches.py):
with them left on, torch's dynamo refused ``sys.intern`` and the tiny model of every later
bench test could not be made (tests of the whole suite errored after tests/ansible)."""

from __future__ import annotations

import socket
import sys
import types

from tests.ansible import collection_import, patches  # noqa: F401 - imports ansible


def test_the_patches_are_on_inside_a_test_and_off_again_after_undo() -> None:
    assert not isinstance(sys.intern, types.BuiltinFunctionType)  # the fixture applied them
    patches.undo()
    try:
        assert isinstance(sys.intern, types.BuiltinFunctionType)
        assert isinstance(socket.getaddrinfo, types.FunctionType)  # socket's own function
        assert sys.intern("a" * 3) == "aaa"
    finally:
        patches.apply()
    assert not isinstance(sys.intern, types.BuiltinFunctionType)
