"""A fleet in the lab (test support): many real LXC containers on one pure-cgroup2 host,
reached through the lab's real sshd on 127.0.0.1, plus an unreachable "node".

Built from tests/lab (reused, not changed). What this module adds, because the lab does
not have it:

* a container whose probe HANGS: ``python3``, ``head``, ``stat``... wrappers that only
  sleep, bind-mounted over the container's ``/usr/local/bin`` (first on the CT's PATH), so
  the agent (python or POSIX-sh) never answers: a real blocked command, nothing mocked;
* a container whose NEXT start fails once: a real LXC ``lxc.hook.pre-start`` script that
  exits 1 while a marker file exists (and removes it), like a failing Proxmox hookscript;
* a dead node: a TCP port on 127.0.0.1 that nothing listens on.

Nodes are plain LXC (flavor ``lxc``): in the lab namespace ``/var/lib/lxc`` is the lab's
lxcpath, so ``lxc-ls``/``lxc-attach -n NAME`` over SSH find the containers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.fleet.inventory import CtSpec, Inventory, NodeSpec
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab, LabContainer
from tests.lab.sshd import LabSSHD, free_port

HANG_SCRIPT = "#!/bin/sh\n# stands for a hung probe: never answers\nexec sleep 600\n"
# The programs the in-CT agents run (python3 for the python agent; the sh agent's tools).
HUNG_TOOLS = ("python3", "head", "stat", "tail", "ls", "df")
HOOK_SCRIPT = """#!/bin/sh
# lxc.hook.pre-start: fail once while the marker exists (an injected start failure)
if [ -e "{marker}" ]; then rm -f "{marker}"; echo "injected pre-start failure" >&2; exit 1; fi
exit 0
"""


def lab_node(sshd: LabSSHD, name: str = "lab") -> NodeSpec:
    """Return the lab sshd as a fleet node (flavor lxc, the lab's client key and host key)."""
    return NodeSpec(name, sshd.spec, flavor="lxc", known_hosts=str(sshd.known_hosts),
                    identity_file=str(sshd.client_key))  # fmt: skip


def dead_node(sshd: LabSSHD, name: str = "dead") -> NodeSpec:
    """Return a node whose SSH port is closed (nothing listens on it)."""
    return NodeSpec(name, f"root@127.0.0.1:{free_port()}", flavor="lxc",
                    known_hosts=str(sshd.known_hosts), identity_file=str(sshd.client_key))  # fmt: skip


@dataclass
class LabFleet:
    """Containers made for one test module, by kind; destroyed by :meth:`destroy`."""

    lab: Lab
    workdir: Path
    prefix: str = field(default_factory=lambda: f"fl{os.getpid()}")
    made: dict[str, LabContainer] = field(default_factory=dict)

    def _name(self, kind: str) -> str:
        return f"{self.prefix}-{kind}"

    def devices(self) -> dict[str, str]:
        """Return the stand-in GPU bind mount every fleet container gets."""
        return {FAKE_GPU_INSIDE: str(self.lab.fake_gpu)}

    def healthy(self, kind: str) -> LabContainer:
        """A running container whose rules allow the stand-in GPU."""
        ct = self.lab.container(name=self._name(kind), devices=self.devices(),
                                allow=[f"c {self.lab.fake_gpu_major}:* rwm"])  # fmt: skip
        self.made[kind] = ct
        return ct

    def denied(self, kind: str, extra_config: tuple[str, ...] = ()) -> LabContainer:
        """A running container with the stand-in GPU and no rule for it (EPERM inside)."""
        ct = self.lab.container(name=self._name(kind), devices=self.devices(),
                                extra_config=extra_config)  # fmt: skip
        self.made[kind] = ct
        return ct

    def stopped(self, kind: str) -> LabContainer:
        """A container created with the stand-in GPU but never started."""
        ct = self.lab.container(name=self._name(kind), devices=self.devices(), start=False)
        self.made[kind] = ct
        return ct

    def hung(self, kind: str) -> LabContainer:
        """A running container whose ``python3`` (first on PATH) blocks forever."""
        hang_dir = self.workdir / f"hang-{kind}"
        hang_dir.mkdir(parents=True, exist_ok=True)
        for tool in HUNG_TOOLS:
            wrapper = hang_dir / tool
            wrapper.write_text(HANG_SCRIPT)
            wrapper.chmod(0o755)
        mount = f"lxc.mount.entry = {hang_dir} usr/local/bin none ro,bind 0 0"
        return self.denied(kind, (mount,))

    def flaky_start(self, kind: str) -> tuple[LabContainer, Path]:
        """A denied container whose next start fails once when the returned marker exists."""
        marker = self.workdir / f"fail-next-start-{kind}"
        hook = self.workdir / f"pre-start-{kind}.sh"
        hook.write_text(HOOK_SCRIPT.format(marker=marker))
        hook.chmod(0o755)
        return self.denied(kind, (f"lxc.hook.pre-start = {hook}",)), marker

    def inventory(self, node: NodeSpec, kinds: list[str], extra_nodes: tuple = ()) -> Inventory:
        """Return an inventory of ``node`` with the containers ``kinds`` (in that order),
        plus ``extra_nodes`` as ``(NodeSpec, [ct names])``."""
        cts = [CtSpec(node.name, self.made[k].name) for k in kinds]
        nodes = [node]
        for other, names in extra_nodes:
            nodes.append(other)
            cts += [CtSpec(other.name, n) for n in names]
        return Inventory(tuple(nodes), tuple(cts), "lab")

    def destroy(self) -> None:
        """Destroy every container made."""
        for ct in self.made.values():
            ct.destroy()
        self.made.clear()
