"""Lab timings: ``.venv/bin/python -m tests.lab.bench_lab`` (root; prints one line each).

Measures the lab's own cost (namespace, container create/start/probe/destroy, restart),
``gpudoctor check`` inside a container, and the latency of one Host call through each
transport (local agent, SSH, container via lxc-attach, container via SSH).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from gpudoctor.hosts.agent.client import local_agent_host
from gpudoctor.hosts.container import ContainerHost
from tests.lab.lxc import Lab
from tests.lab.sshd import LabSSHD


def timed(label: str, func: Callable[[], object], repeat: int = 1) -> object:
    """Run ``func`` ``repeat`` times; print the median wall time in ms; return a result."""
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = func()
        samples.append((time.perf_counter() - started) * 1000)
    print(f"{label:<55} {statistics.median(samples):8.1f} ms  (n={repeat})")
    return result


def main() -> int:
    """Print the lab timings; return the exit status."""
    lab = timed("lab setup (namespace + rootfs template + node)", lambda: Lab().setup())
    assert isinstance(lab, Lab)
    try:
        devices = {"/dev/fakegpu": str(lab.fake_gpu)}

        def cycle() -> None:
            ct = lab.container(devices=devices)
            ct.attach(["python3", "-I", "-c", "import os; os.stat('/dev/fakegpu')"])
            ct.destroy()

        timed("container create + start + probe + destroy", cycle, repeat=5)
        ct = lab.container(devices=devices)
        timed("container restart (stop + start)", ct.restart, repeat=5)
        timed(
            "gpudoctor check --only device inside (python -m)",
            lambda: ct.gpudoctor("check", "--device", "/dev/fakegpu:misc", "--only", "device"),
            repeat=3,
        )
        timed(
            "gpudoctor check (whole catalogue) inside",
            lambda: ct.gpudoctor("check", "--device", "/dev/fakegpu:misc"),
            repeat=3,
        )
        sshd = timed(
            "sshd start (keygen x2 + listen)", LabSSHD(lab.root / "sshd", lab.namespace).start
        )
        assert isinstance(sshd, LabSSHD)
        ssh = sshd.host()
        timed("SSH connect (TCP + kex + auth)", ssh.connect)
        hosts = {
            "local agent": local_agent_host(),
            "SSH": ssh,
            "container via lxc-attach": ContainerHost(lab.host, ct.name, flavor="lxc"),
            "container via SSH + lxc-attach": ContainerHost(ssh, ct.name, flavor="lxc"),
        }
        for label, host in hosts.items():
            timed(f"{label}: agent start (first stat)", lambda h=host: h.stat("/dev/null"))
            timed(f"{label}: one stat", lambda h=host: h.stat("/dev/null"), repeat=50)
            timed(f"{label}: run(['true'])", lambda h=host: h.run(["true"]), repeat=10)
        for host in hosts.values():
            host.close()
        sshd.stop()
    finally:
        lab.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
