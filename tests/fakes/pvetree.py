"""An /etc/pve-like tree in a temp dir, laid out as pmxcfs shows it (test support).

Stands for Proxmox's pmxcfs mount: ``nodes/<node>/lxc/<vmid>.conf``, the ``lxc`` and
``local`` links to the local node's folder, and ``.vmlist`` (JSON) naming each guest's
owner node. Real files on a real filesystem; only pmxcfs's cluster sync is absent.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

from gpudoctor.pve.apply import Layout


class PveTree:
    """A fake /etc/pve under ``root`` whose local node is ``node``."""

    def __init__(self, base: Path, node: str = "pve1") -> None:
        self.root = base / "etc-pve"
        self.node = node
        self.guests: dict[str, dict[str, object]] = {}
        (self.root / "nodes" / node / "lxc").mkdir(parents=True)
        (self.root / "local").symlink_to(f"nodes/{node}")
        (self.root / "lxc").symlink_to(f"nodes/{node}/lxc")
        self.lock_dir = base / "run-lock-lxc"
        self.backup_dir = base / "host-backups"
        self.client_backup_dir = base / "client-backups"
        self._write_vmlist()

    def _write_vmlist(self) -> None:
        (self.root / ".vmlist").write_text(json.dumps({"version": 7, "ids": self.guests}))

    def add_ct(self, vmid: str, text: str, node: str | None = None, kind: str = "lxc") -> Path:
        """Write CT ``vmid``'s config on ``node`` (default: local) and list it in .vmlist."""
        node = node or self.node
        folder = self.root / "nodes" / node / ("lxc" if kind == "lxc" else "qemu-server")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{vmid}.conf"
        path.write_text(text)
        self.guests[vmid] = {"node": node, "type": kind, "version": 1}
        self._write_vmlist()
        return path

    def layout(self, **extra: object) -> Layout:
        """Return the Layout that points gpudoctor at this tree."""
        values: dict[str, object] = {
            "pve_root": str(self.root),
            "lock_dir": str(self.lock_dir),
            "backup_dir": str(self.backup_dir),
            "client_backup_dir": str(self.client_backup_dir),
            "own_lock_dir": str(self.lock_dir),
        }
        values.update(extra)
        return Layout(**values)  # type: ignore[arg-type]

    def env(self, **extra: str) -> dict[str, str]:
        """Return the GPUDOCTOR_* environment that points the CLI at this tree."""
        env = {
            "GPUDOCTOR_PVE_ROOT": str(self.root),
            "GPUDOCTOR_PVE_LOCK_DIR": str(self.lock_dir),
            "GPUDOCTOR_HOST_BACKUP_DIR": str(self.backup_dir),
            "GPUDOCTOR_CLIENT_BACKUP_DIR": str(self.client_backup_dir),
            "GPUDOCTOR_LOCK_DIR": str(self.lock_dir),
        }
        env.update(extra)
        return env

    def pveversion(self, version: str) -> str:
        """Return the path of a ``pveversion`` that reports ``version`` (a wrapper around
        tests/fakes/pveversion.py), for ``GPUDOCTOR_PVEVERSION``."""
        script = Path(__file__).resolve().parents[1] / "fakes" / "pveversion.py"
        path = self.root.parent / "bin" / f"pveversion-{version}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\nexec /usr/bin/python3 {script} {version}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    def backups(self) -> list[Path]:
        """Return every backup file on the "host" side."""
        return sorted(p for p in self.backup_dir.rglob("*") if p.is_file())
