"""Fixtures shared by the pve tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def dev_node():
    """A real char node in the host's /dev (misc 10:232, like /dev/kvm), removed after."""
    path = f"/dev/gpudoctor-fake-{os.getpid()}"
    if os.path.exists(path):
        os.unlink(path)
    os.mknod(path, 0o020666, os.makedev(10, 232))
    os.chmod(path, 0o666)
    yield path
    os.unlink(path)
