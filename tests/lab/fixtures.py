"""Lab fixtures: real LXC containers on pure cgroup v2 and a real sshd on 127.0.0.1.

Registered by ``tests/conftest.py`` (``pytest_plugins``). Session-scoped pieces:

* ``lab`` -> :class:`tests.lab.lxc.Lab`: the pure-cgroup2 namespace, a private lxcpath,
  ``lab.container(allow=..., devices=...)`` to make real containers, ``lab.host`` (this
  machine as a pure-cgroup2 container host), ``lab.fake_gpu`` (stand-in GPU node).
* ``lab_sshd`` -> :class:`tests.lab.sshd.LabSSHD`: an OpenSSH server inside the same
  namespace; ``lab_sshd.host()`` gives a ready SSHHost to it.

Function-scoped helpers: ``lab_container`` (a factory whose containers are destroyed
after the test), ``denied_container`` / ``allowed_container`` (the stand-in GPU
bind-mounted as /dev/fakegpu, its major denied / allowed).

When the lab cannot start, every lab test skips with the reason, or FAILS when
``GPUDOCTOR_REQUIRE_LAB=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.lab.lxc import Lab, LabContainer, LabError
from tests.lab.sshd import LabSSHD

APT_PACKAGES = {"lxc-start": "lxc", "busybox": "busybox-static", "sshd": "openssh-server"}
FAKE_GPU_INSIDE = "/dev/fakegpu"


def _unavailable(reason: str) -> None:
    from tests.conftest import lab_unavailable

    lab_unavailable(reason)


def missing_tools() -> list[str]:
    """Return the apt packages whose programs are missing (``lxc``, ``busybox-static``...)."""
    search = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return sorted(
        {pkg for tool, pkg in APT_PACKAGES.items() if not shutil.which(tool, path=search)}
    )


def install_missing() -> str | None:
    """Install missing lab packages with apt-get; return an error text, or None."""
    packages = missing_tools()
    if not packages:
        return None
    if os.geteuid() != 0:
        return f"not root, cannot install {' '.join(packages)}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *packages]):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{' '.join(argv)}: {exc}"
        if done.returncode != 0:
            return f"{' '.join(argv)} failed: {done.stderr.strip()[-400:]}"
    return None if not missing_tools() else f"still missing: {', '.join(missing_tools())}"


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """Yield the session's :class:`Lab` (real LXC on pure cgroup v2), proven to start a
    container and to enforce a device rule; torn down (every container, the namespace,
    the lab directory) at session end."""
    if os.geteuid() != 0:
        _unavailable("the lab needs root (LXC containers, mount namespaces)")
    error = install_missing()
    if error:
        _unavailable(f"lab packages unavailable: {error}")
    the_lab = Lab()
    try:
        the_lab.setup()
        probe = the_lab.container(devices={FAKE_GPU_INSIDE: str(the_lab.fake_gpu)})
        opened = probe.attach(
            ["python3", "-I", "-c", f"import os; os.open({FAKE_GPU_INSIDE!r}, os.O_RDWR)"]
        )
        probe.destroy()
        if "Operation not permitted" not in opened.stderr:
            raise LabError(
                "the cgroup2 device policy is not enforced in lab containers "
                f"(open of a denied node: rc {opened.returncode}, {opened.stderr.strip()[-300:]})"
            )
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        the_lab.teardown()
        _unavailable(f"LXC containers cannot start here: {exc}")
    try:
        yield the_lab
    finally:
        the_lab.teardown()


@pytest.fixture(scope="session")
def lab_sshd(lab: Lab) -> Iterator[LabSSHD]:
    """Yield a running :class:`LabSSHD` (OpenSSH on 127.0.0.1, inside the lab's pure
    cgroup2 namespace, per-run host and client keys); stopped at session end."""
    server = LabSSHD(lab.root / "sshd", lab.namespace)
    try:
        server.start()
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        server.stop()
        _unavailable(f"the lab sshd cannot start: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def lab_container(lab: Lab) -> Iterator[Callable[..., LabContainer]]:
    """Return ``make(**kwargs) -> LabContainer`` (same arguments as
    :meth:`Lab.container`); every container it made is destroyed after the test."""
    made: list[LabContainer] = []

    def make(**kwargs: Any) -> LabContainer:
        ct = lab.container(**kwargs)
        made.append(ct)
        return ct

    yield make
    for ct in made:
        ct.destroy()


@pytest.fixture
def denied_container(lab_container: Callable[..., LabContainer], lab: Lab) -> LabContainer:
    """Return a running container with the stand-in GPU at /dev/fakegpu and NO rule for
    its major (the incident: the node exists, open() gives EPERM)."""
    return lab_container(devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)})


@pytest.fixture
def allowed_container(lab_container: Callable[..., LabContainer], lab: Lab) -> LabContainer:
    """Return a running container with the stand-in GPU at /dev/fakegpu and
    ``lxc.cgroup2.devices.allow = c 10:* rwm`` (open() succeeds)."""
    return lab_container(
        devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)},
        allow=[f"c {lab.fake_gpu_major}:* rwm"],
    )
