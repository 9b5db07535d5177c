"""Where a CT's config lives, and the one locked compare-and-swap write of it.

Every step that touches the CT's host goes through ``host.run`` with coreutils/flock and
one small ``python3`` program (:data:`HOST_PROGRAM`), so it behaves the same on this
machine and over SSH. The write, in the order Proxmox itself uses:

1. ``flock -w 10 /run/lock/lxc/pve-config-<vmid>.lock`` (Proxmox's own config lock);
2. under it, re-read the file and compare its SHA-1 with the one the plan was made from
   (abort "changed since plan", nothing written);
3. copy the old bytes to the backup directory (outside /etc/pve);
4. write ``<vmid>.conf.tmp.<pid>``, fsync, rename it over the config (atomic on pmxcfs
   and on local filesystems), re-read and verify (a read-back that differs puts the old
   bytes back the same way: :mod:`conf_program`).

So the file is always either the old or the new bytes, whatever moment the writer dies.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.hosts.base import Host
from gpudoctor.pve.conf_program import (
    HOST_PROGRAM,
    LOCK_BUSY_RC,
    LOCK_WAIT_S,
    RC_CHANGED,
    RC_MISSING,
    RC_VERIFY,
    RC_VERIFY_UNRESTORED,
)
from gpudoctor.pve.config import LXC, PVE, Config


class ApplyError(RuntimeError):
    """A refusal or a failed write; ``code`` says which (``changed``, ``locked``, ...)."""

    def __init__(self, code: str, message: str, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.details = details  # e.g. the log lines that say why a start failed


@dataclass(frozen=True)
class Layout:
    """Where things are on the CT's host (defaults = a real Proxmox VE / LXC host).

    Attributes:
        pve_root: the pmxcfs mount (``/etc/pve``; env ``GPUDOCTOR_PVE_ROOT``).
        lock_dir: Proxmox's config lock directory (``/run/lock/lxc``; env
            ``GPUDOCTOR_PVE_LOCK_DIR``).
        backup_dir: backups on the host (``/var/lib/gpudoctor/backups``; env
            ``GPUDOCTOR_HOST_BACKUP_DIR``).
        client_backup_dir: the copy on this machine (env ``GPUDOCTOR_CLIENT_BACKUP_DIR``,
            default ``$XDG_STATE_HOME/gpudoctor/backups``).
        pct: the ``pct`` command (env ``GPUDOCTOR_PCT``; tests point it at a stand-in).
        lxcpath: LXC's container directory (``lxc-start -P``; env ``GPUDOCTOR_LXCPATH``;
            None = LXC's default).
        python: the interpreter on the host that runs :data:`HOST_PROGRAM`.
        own_lock_dir: gpudoctor's own locks (plain LXC configs, the host-prep unit;
            ``/run/gpudoctor``, created 0700: never a world-writable directory such as
            ``/run/lock``, where another user could plant the lock file; env
            ``GPUDOCTOR_LOCK_DIR``).
        pveversion: the ``pveversion`` command (env ``GPUDOCTOR_PVEVERSION``; tests point
            it at a stand-in).
    """

    pve_root: str = "/etc/pve"
    lock_dir: str = "/run/lock/lxc"
    backup_dir: str = "/var/lib/gpudoctor/backups"
    client_backup_dir: str = ""
    pct: str = "pct"
    lxcpath: str | None = None
    python: str = "python3"
    own_lock_dir: str = "/run/gpudoctor"
    pveversion: str = "pveversion"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Layout:
        """Return the layout with the ``GPUDOCTOR_*`` overrides of ``env`` (os.environ)."""
        env = dict(os.environ if env is None else env)
        state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return cls(
            pve_root=env.get("GPUDOCTOR_PVE_ROOT", cls.pve_root),
            lock_dir=env.get("GPUDOCTOR_PVE_LOCK_DIR", cls.lock_dir),
            backup_dir=env.get("GPUDOCTOR_HOST_BACKUP_DIR", cls.backup_dir),
            client_backup_dir=env.get(
                "GPUDOCTOR_CLIENT_BACKUP_DIR", str(Path(state) / "gpudoctor" / "backups")
            ),
            pct=env.get("GPUDOCTOR_PCT", cls.pct),
            lxcpath=env.get("GPUDOCTOR_LXCPATH") or None,
            own_lock_dir=env.get("GPUDOCTOR_LOCK_DIR", cls.own_lock_dir),
            pveversion=env.get("GPUDOCTOR_PVEVERSION", cls.pveversion),
        )


@dataclass(frozen=True)
class Target:
    """The CT's config file on its host.

    Attributes:
        flavor: ``pve`` or ``lxc``.
        ct: the VMID or LXC name.
        config_path: ``/etc/pve/nodes/<node>/lxc/<vmid>.conf`` or ``<lxcpath>/<name>/config``.
        lock_path: the flock file guarding the config.
        node: the Proxmox node that owns the CT ("" for plain LXC).
    """

    flavor: str
    ct: str
    config_path: str
    lock_path: str
    node: str = ""


@dataclass(frozen=True)
class Snapshot:
    """The config's exact bytes as read, their SHA-1 (Proxmox's ``digest``) and the parse."""

    data: bytes
    sha1: str
    config: Config


@dataclass(frozen=True)
class WriteResult:
    """A completed compare-and-swap write.

    Attributes:
        old_sha1: the SHA-1 the file had (and the plan was made from).
        new_sha1: the SHA-1 it has now (verified by re-reading).
        host_backup: the backup path on the host ("" when none was asked for).
    """

    old_sha1: str
    new_sha1: str
    host_backup: str = ""


def sha1_hex(data: bytes) -> str:
    """Return the SHA-1 of ``data`` in hex (``sha1sum``; Proxmox's config ``digest``)."""
    return hashlib.sha1(data).hexdigest()


def resolve_target(host: Host, flavor: str, ct: str, layout: Layout) -> Target:
    """Return where CT ``ct``'s config is: Proxmox finds the owning node in ``.vmlist``
    (``cat /etc/pve/.vmlist``) and refuses a CT owned by another node; plain LXC uses
    ``<lxcpath>/<name>/config``. Raise ApplyError when the CT does not exist."""
    if flavor == LXC:
        lxcpath = layout.lxcpath or _default_lxcpath(host)
        path = f"{lxcpath.rstrip('/')}/{ct}/config"
        try:
            host.stat(path)
        except PermissionError:  # issue 47: "does not exist" sent the user looking for the CT
            raise ApplyError("io", f"cannot read {path}: {DENIED}") from None
        except OSError:
            raise ApplyError(
                "unknown_ct", f"no LXC container {ct!r}: {path} does not exist"
            ) from None
        return Target(LXC, ct, path, f"{layout.own_lock_dir}/lxc-{ct}.lock")
    if not ct.isdigit():
        raise ApplyError(
            "usage", f"--ct {ct!r}: a Proxmox CT id is a number (plain LXC: --flavor lxc)"
        )
    vmlist_path = f"{layout.pve_root}/.vmlist"
    try:
        vmlist = json.loads(host.read_text(vmlist_path))
    except OSError:
        raise ApplyError(
            "not_pve", f"{vmlist_path} is missing: not a Proxmox VE host (plain LXC: --flavor lxc)"
        ) from None
    except ValueError:
        raise ApplyError("not_pve", f"{vmlist_path} is not valid JSON") from None
    entry = vmlist.get("ids", {}).get(ct)
    if entry is None:
        raise ApplyError("unknown_ct", f"CT {ct} does not exist in this cluster ({vmlist_path})")
    if entry.get("type") != "lxc":
        raise ApplyError("unknown_ct", f"guest {ct} is a {entry.get('type')} VM, not a container")
    node = str(entry.get("node", ""))
    local = _local_node(host, layout)
    if local and node != local:
        raise ApplyError(
            "other_node", f"CT {ct} lives on node {node!r}, not {local!r}: run with --host {node}"
        )
    path = f"{layout.pve_root}/nodes/{node}/lxc/{ct}.conf"
    return Target(PVE, ct, path, f"{layout.lock_dir}/pve-config-{ct}.lock", node)


def _default_lxcpath(host: Host) -> str:
    result = host.run(["lxc-config", "lxc.lxcpath"], timeout=15)
    return result.stdout.strip() if result.ok and result.stdout.strip() else "/var/lib/lxc"


def _local_node(host: Host, layout: Layout) -> str:
    """Return this node's name from the ``/etc/pve/local`` link (``readlink``), or ""."""
    result = host.run(["readlink", f"{layout.pve_root}/local"], timeout=15)
    return result.stdout.strip().rsplit("/", 1)[-1] if result.ok else ""


DENIED = "permission denied; run it as root (sudo) or as the user who owns that file"
MAX_READ = 64 << 20  # far above pmxcfs's 1 MiB file limit


def read_bytes(host: Host, path: str, layout: Layout) -> tuple[bytes, str]:
    """Return a file's exact bytes and SHA-1 (``cat PATH; sha1sum PATH``); raise
    ApplyError ``missing`` when it does not exist, ``io`` when it cannot be read or is
    larger than :data:`MAX_READ` (no CT config or unit file is: its head alone would be planned
    from)."""
    # Through the Host's own file read (the SSH agent's channel): no process per read on the
    # node, which matters when a fleet check reads hundreds of CT configs. The locked write
    # re-reads and re-hashes on the host itself, so this SHA-1 is only the plan's witness.
    try:
        data = host.read_bytes(path, MAX_READ + 1)
    except FileNotFoundError:
        raise ApplyError("missing", f"{path} does not exist") from None
    except PermissionError:
        raise ApplyError("io", f"cannot read {path}: {DENIED}") from None
    except OSError as exc:
        raise ApplyError("io", f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_READ:  # never a config: refused whole, not planned from its head
        raise ApplyError(
            "io",
            f"{path} is larger than {MAX_READ >> 20} MiB: refused, a plan needs the whole file",
        )
    return data, hashlib.sha1(data).hexdigest()


def read_config(host: Host, target: Target, layout: Layout) -> Snapshot:
    """Return the config's exact bytes, SHA-1 and parse (``cat CONF; sha1sum CONF``)."""
    from gpudoctor.pve.config import parse

    try:
        data, sha = read_bytes(host, target.config_path, layout)
    except ApplyError as exc:
        if exc.code == "missing":
            raise ApplyError("unknown_ct", str(exc)) from None
        raise
    return Snapshot(data, sha, parse(data, target.flavor))


def refusal(config: Config, target: Target) -> str | None:
    """Return why the CT must not be touched now (``lock:`` line, template), or None."""
    lock = config.get("lock")
    if lock:
        return (
            f"CT {target.ct} is locked ({lock}): wait for that task to finish, or run "
            f"`pct unlock {target.ct}` if the lock is stale"
        )
    if config.get("template") == "1":
        return f"CT {target.ct} is a template: templates never run, convert it or fix a clone"
    return None


def backup_name(target: Target, old_sha1: str, now: dt.datetime | None = None) -> str:
    """Return the backup file name: ``ct-<id>/<UTC time>-<sha1[:12]>.conf``."""
    stamp = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"ct-{target.ct}/{stamp}-{old_sha1[:12]}.conf"


def write_command(
    target: Target, layout: Layout, expected_sha1: str, backup_path: str
) -> list[str]:
    """Return the argv of the locked compare-and-swap write (``flock -w 10 LOCK python3 ...``);
    the new content goes on its stdin, base64-encoded. gpudoctor's own lock (in
    ``layout.own_lock_dir``) is taken by the program itself, which removes the file when it
    is done; Proxmox's lock file is Proxmox's, held by ``flock`` and left in place."""
    program = [layout.python, "-I", "-c", HOST_PROGRAM, "write", target.config_path,
               expected_sha1, backup_path or "-"]  # fmt: skip
    if target.lock_path.startswith(layout.own_lock_dir.rstrip("/") + "/"):
        return [*program, target.lock_path]
    flock = ["flock", "-E", str(LOCK_BUSY_RC), "-w", str(LOCK_WAIT_S), target.lock_path]
    return [*flock, *program]


def compare_and_swap(
    host: Host,
    target: Target,
    layout: Layout,
    expected_sha1: str,
    new_data: bytes,
    backup_path: str = "",
) -> WriteResult:
    """Replace the config with ``new_data`` iff it still has ``expected_sha1``, under the
    config lock, backing the old bytes up to ``backup_path`` first; return the result.
    Raise ApplyError: ``changed`` (nothing written), ``lock_busy``, ``verify`` (the
    read-back differed: the old bytes were put back), ``io``."""
    lock_dir = target.lock_path.rsplit("/", 1)[0]
    # gpudoctor's own lock directory is private (0700); Proxmox's is Proxmox's own.
    private = ["-m", "0700"] if lock_dir == layout.own_lock_dir.rstrip("/") else []
    host.run(["mkdir", "-p", *private, lock_dir], timeout=15)
    argv = write_command(target, layout, expected_sha1, backup_path)
    result = host.run(argv, timeout=LOCK_WAIT_S + 30, input=base64.b64encode(new_data).decode())
    if result.returncode == RC_CHANGED:
        raise ApplyError(
            "changed",
            f"{target.config_path} changed since the plan was made; nothing written. Run again.",
        )
    if result.returncode == LOCK_BUSY_RC:
        raise ApplyError(
            "lock_busy", f"{target.lock_path} is held by another task for {LOCK_WAIT_S} s"
        )
    if result.returncode == RC_MISSING:
        raise ApplyError("unknown_ct", f"{target.config_path} disappeared")
    if result.returncode == RC_VERIFY:
        raise ApplyError(
            "verify",
            f"{target.config_path} read back different from what was written; the old bytes "
            "were put back, nothing changed. Check the filesystem (pmxcfs: `pvecm status`)",
        )
    if result.returncode == RC_VERIFY_UNRESTORED:
        where = f": the old config is saved in {backup_path}" if backup_path else ""
        raise ApplyError(
            "verify",
            f"{target.config_path} read back different from what was written, and putting "
            f"the old bytes back failed too{where}",
        )
    if not result.ok:
        raise ApplyError("io", f"writing {target.config_path} failed: {_why(result)}")
    reply = json.loads(result.stdout)
    return WriteResult(reply["old_sha1"], reply["new_sha1"], backup_path)


def save_client_copy(layout: Layout, host_name: str, relative: str, data: bytes) -> str:
    """Write the backup's copy on this machine (``.part`` + fsync + rename); return its
    path (``<dir>/<host>/<name>``). Raise ApplyError("backup") when it cannot be saved:
    the caller writes nothing then."""
    safe_host = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in host_name)
    path = Path(layout.client_backup_dir) / safe_host / relative
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fsio.atomic_replace(path, data, mode=0o600, refuse_non_regular=False, follow_dir_link=True)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ApplyError(
            "backup",
            f"cannot save the backup copy in {layout.client_backup_dir} ({why}); nothing "
            "written. Point GPUDOCTOR_CLIENT_BACKUP_DIR at a writable directory",
        ) from None
    return str(path)


def discard_client_copy(layout: Layout, path: str) -> None:
    """Remove a client backup copy whose write did not happen, and the directories left
    empty under ``layout.client_backup_dir`` (``rm PATH; rmdir -p ...``); that directory
    itself, the one the user named, stays."""
    base = Path(layout.client_backup_dir)
    try:
        Path(path).unlink()
    except OSError:
        return
    folder = Path(path).parent
    while base in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def _why(result: object) -> str:
    stderr = getattr(result, "stderr", "").strip().splitlines()
    rc = getattr(result, "returncode", "?")
    return stderr[-1] if stderr else f"exit status {rc}"
