"""Fixtures of the Ansible tests: ansible-core's process-wide patches only around them
(tests/ansible/patches.py says why)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ansible import patches


@pytest.fixture(autouse=True)
def ansible_patches_only_here() -> Iterator[None]:
    """Apply ansible's patches for the test, and take them off after it."""
    patches.apply()
    yield
    patches.undo()
