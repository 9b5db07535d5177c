"""A Proxmox-like host in the lab (test support): a real LXC container driven by the pct
stand-in (tests/fakes/pct.py) from an /etc/pve-like tree (tests/fakes/pvetree.py).

The container is a real lab container (pure cgroup v2, eBPF device policy) named by its
VMID; ``base.conf`` holds what pve-container derives from ``rootfs:``/``arch:`` and its
common.conf (rootfs path, deny-all + the base device rules); the PVE config holds the
user's lines, the stand-in merges both at every ``pct start``.
"""

from __future__ import annotations

import itertools
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.hosts.base import CommandResult
from tests.fakes.pvetree import PveTree
from tests.lab.lxc import REPO_ROOT, Lab, LabContainer

PCT_STAND_IN = REPO_ROOT / "tests" / "fakes" / "pct.py"
_ids = itertools.count(1)


def unique_vmid() -> str:
    """Return a VMID unique on this machine (LXC container names are global)."""
    return f"{7000000 + os.getpid() % 1000000}{next(_ids):02d}"


def pve_config(fake_gpu: Path, extra: str = "") -> str:
    """Return a realistic PVE CT config passing the stand-in GPU with no rule for it,
    with a description line and a snapshot section."""
    return (
        "#GPU bench CT (lab)\n"
        "arch: amd64\n"
        "hostname: bench\n"
        "memory: 2048\n"
        "ostype: debian\n"
        "parent: before_gpu\n"
        f"{extra}"
        f"lxc.mount.entry: {fake_gpu} dev/fakegpu none bind,optional,create=file\n"
        "\n"
        "[before_gpu]\n"
        "arch: amd64\n"
        "hostname: bench\n"
        "memory: 2048\n"
        "snaptime: 1700000000\n"
    )


@dataclass
class PveCt:
    """One CT on the Proxmox-like lab host."""

    vmid: str
    tree: PveTree
    container: LabContainer
    pct: Path
    lab: Lab

    @property
    def conf(self) -> Path:
        """Return the PVE config path (``nodes/<node>/lxc/<vmid>.conf``)."""
        return self.tree.root / "nodes" / self.tree.node / "lxc" / f"{self.vmid}.conf"

    def pct_run(self, *args: str, timeout: float = 90.0) -> CommandResult:
        """Run the pct stand-in on the lab host (inside the pure-cgroup2 namespace)."""
        return self.lab.namespace.run([str(self.pct), *args], timeout)

    def open_inside(self, path: str = "/dev/fakegpu") -> CommandResult:
        """``open(path, O_RDWR)`` inside the CT through ``pct exec``."""
        code = f"import os; os.close(os.open({path!r}, os.O_RDWR)); print('opened')"
        return self.pct_run("exec", self.vmid, "--", "python3", "-I", "-c", code)

    def env(self) -> dict[str, str]:
        """Return the environment that points gpudoctor at this tree and stand-in."""
        return self.tree.env(
            GPUDOCTOR_PCT=str(self.pct), GPUDOCTOR_LXCPATH=str(self.container.lxcpath)
        )


def make_pve_ct(lab: Lab, container: LabContainer, base: Path, extra: str = "") -> PveCt:
    """Lay out the tree, the stand-in wrapper and the CT; start it with ``pct start``."""
    tree = PveTree(base)
    vmid = container.name
    (container.dir / "base.conf").write_text(container.render_config())
    tree.add_ct(vmid, pve_config(lab.fake_gpu, extra))
    pct = base / "bin" / "pct"
    pct.parent.mkdir(parents=True, exist_ok=True)
    pct.write_text(
        "#!/bin/sh\n"
        f"exec /usr/bin/python3 {PCT_STAND_IN} --pve-root {tree.root} "
        f'--lxcpath {container.lxcpath} "$@"\n'
    )
    pct.chmod(pct.stat().st_mode | stat.S_IXUSR)
    ct = PveCt(vmid, tree, container, pct, lab)
    started = ct.pct_run("start", vmid)
    if not started.ok:
        raise RuntimeError(f"pct start {vmid} failed: {started.stderr} {container.log_tail()}")
    return ct
