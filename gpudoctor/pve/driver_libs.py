"""``fix --driver-libs``: make a CT's NVIDIA user-space driver follow the host's. Pure.

``bind`` (the durable way): one read-only bind mount per driver file the host's driver
lists (:mod:`gpudoctor.facts.driver_files`), as ``lxc.mount.entry`` lines, which Proxmox
(``/etc/pve/lxc/ID.conf``) and plain LXC apply the same way, privileged or not:

- libraries go to one dedicated directory, ``/usr/lib/gpudoctor-driver``, and the CT's
  loader finds them through ``/etc/ld.so.conf.d/00-gpudoctor-driver.conf`` (+ ``ldconfig``,
  run once inside the CT after the start). Why a directory of its own rather than binding
  over the CT's own paths: the CT's distribution may hold its own (older) copies under
  /usr/lib/x86_64-linux-gnu, as symlinks or files; a bind over them follows the CT's
  symlinks and mixes versions, and a package upgrade inside the CT would write through the
  read-only mount and fail. The ``00-`` file sorts first, so ldconfig prefers the host's.
- where the driver ships a soname link (``libcuda.so.1 -> libcuda.so.580.159.04``), the
  entry binds the LINK's path: mount(2) resolves it on the host at every CT start, so after
  a host driver upgrade a restart of the CT binds the new version, with the same entry and
  the same ld.so cache. Files without such a link are bound by their versioned name; after
  an upgrade ``optional`` skips them and ``driver.libs_mode`` WARNs (run ``fix`` again).
- ``nvidia-smi`` (and the other binaries listed) over the same path, read-only; firmware
  ``/lib/firmware/nvidia/VERSION`` as a directory.

``copy``: the exact host version installed inside the CT (the same ``.run`` with
``--no-kernel-module``, or the distribution's packages pinned to that version): the plan
prints the commands; a CT with copies breaks at the next host driver upgrade, which
``driver.libs_mode`` says (a fragile-config WARN).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpudoctor.facts.driver_files import DriverFiles
from gpudoctor.pve.config import Config, Kind, unified_diff
from gpudoctor.pve.config import parse as parse_config
from gpudoctor.pve.entries import MOUNT_KEY, parse_mount
from gpudoctor.pve.planner import Edit, FixPlan

LIB_DIR = "/usr/lib/gpudoctor-driver"
LD_CONF = "/etc/ld.so.conf.d/00-gpudoctor-driver.conf"
BIND = "bind"
COPY = "copy"
MODES = (BIND, COPY)


@dataclass(frozen=True)
class Bind:
    """One planned bind mount: ``source`` on the host, ``target`` in the CT, and why."""

    source: str
    target: str
    is_dir: bool
    reason: str

    @property
    def value(self) -> str:
        """Return the ``lxc.mount.entry`` value (relative target, as Proxmox writes them)."""
        create = "dir" if self.is_dir else "file"
        return f"{self.source} {self.target.lstrip('/')} none bind,ro,optional,create={create}"


def binds_for(files: DriverFiles) -> list[Bind]:
    """Return the bind mounts that put the host's driver files into a CT."""
    binds = []
    for f in files.files:
        if f.kind == "lib":
            source = f.stable or f.path
            name = source.rpartition("/")[2]
            why = (
                f"{f.name} ({files.source}); bound through its soname link {name}, so a CT "
                "restart after a host driver upgrade binds the new version"
                if f.stable
                else f"{f.name} ({files.source}); versioned name: re-run fix after an upgrade"
            )
            binds.append(Bind(source, f"{LIB_DIR}/{name}", False, why))
        elif f.kind == "bin":
            binds.append(
                Bind(f.path, f.path, False, f"{f.name} of the host's driver ({files.source})")
            )
        elif f.kind == "firmware":
            binds.append(Bind(f.path, f.path, True, f"the driver's firmware ({files.source})"))
    return binds


def managed(target: str) -> bool:
    """Return True for a CT path that ``--driver-libs bind`` manages."""
    return target.startswith(LIB_DIR + "/") or target.startswith("/lib/firmware/nvidia/")


def bind_entries(config: Config) -> list[tuple[int, str, str]]:
    """Return (line index, source, absolute target) of every live bind mount of the config."""
    found = []
    for index, line in config.main():
        if line.kind is Kind.RAW and line.key == MOUNT_KEY:
            mount = parse_mount(line.value)
            if mount and mount.is_bind:
                found.append((index, mount.source, mount.target))
    return found


def bound_entries(config: Config) -> list[tuple[int, str, str]]:
    """Return (line index, source, target) of the config's driver-library bind mounts."""
    return [entry for entry in bind_entries(config) if managed(entry[2])]


def add_binds(plan: FixPlan, files: DriverFiles, label: str) -> FixPlan:
    """Return ``plan`` with the bind mounts of the host's driver files added to its new
    config (after its last mount entry), and stale driver binds (a file the host's driver
    no longer lists, such as an old versioned name) removed; each edit says why."""
    config = parse_config(plan.new_text)
    wanted = binds_for(files)
    have = {(s, t) for _, s, t in bind_entries(config)}  # a binary's bind is not managed
    mounts = [i for i, ln in config.main() if ln.kind is Kind.RAW and ln.key == MOUNT_KEY]
    content = [i for i, ln in config.main() if ln.kind is not Kind.BLANK]
    anchor = max(mounts) if mounts else (max(content) if content else -1)
    like = config.lines[anchor] if anchor >= 0 else None
    inserts: list = []
    edits: list[Edit] = []
    notes: list[str] = []
    for bind in wanted:
        if (bind.source, bind.target) in have:
            continue
        line = config.make_line(MOUNT_KEY, bind.value, like)
        inserts.append(line)
        edits.append(Edit("add", line.text, bind.reason))
        notes.append(f"add `{line.text}`: {bind.reason}")
    keep = {(b.source, b.target) for b in wanted}
    removes = set()
    for index, source, target in bound_entries(config):
        if (source, target) not in keep:
            removes.add(index)
            why = f"{source} is not a file of the host's driver {files.version} any more"
            edits.append(Edit("remove", config.lines[index].text, why))
            notes.append(f"remove `{config.lines[index].text}`: {why}")
    new = config.edit({anchor: inserts}, removes)
    notes.append(
        f"after the start, inside the CT: {LD_CONF} names {LIB_DIR}, then `ldconfig` "
        "(once; later restarts need nothing)"
    )
    return replace(
        plan,
        new_text=new.text,
        edits=(*plan.edits, *edits),
        diff=unified_diff(plan.old_text, new.text, label),
        explanation=(*plan.explanation, *notes),
    )


def ldconfig_script() -> str:
    """Return the POSIX sh run inside the CT after a bind plan's start: the ld.so.conf.d
    file (written atomically: temp file + mv) and ``ldconfig``."""
    return (
        "set -e; mkdir -p /etc/ld.so.conf.d; "
        f"printf '%s\\n' {LIB_DIR} > {LD_CONF}.tmp.$$ && mv -f {LD_CONF}.tmp.$$ {LD_CONF}; "
        "ldconfig"
    )


def copy_commands(files: DriverFiles) -> list[str]:
    """Return the commands that install the host's exact driver version inside a CT (the
    ``.run`` without its kernel module, or pinned distribution packages)."""
    version = files.version
    branch = version.partition(".")[0]
    return [
        "# the NVIDIA .run installer of the host's version, without the kernel module:",
        f"sh NVIDIA-Linux-x86_64-{version}.run --no-kernel-module --silent",
        f"# or Debian/Ubuntu packages pinned to {version} (the CT's apt must offer it):",
        f"apt-get install -y libnvidia-compute-{branch}={version}-* nvidia-utils-{branch}={version}-*",
        f"apt-mark hold libnvidia-compute-{branch} nvidia-utils-{branch}",
    ]


def add_copy(plan: FixPlan, files: DriverFiles) -> FixPlan:
    """Return ``plan`` with the copy way's commands as explanation and its fragility as a
    warning (nothing in the config changes)."""
    notes = [f"inside the CT, install driver {files.version} (copies):", *copy_commands(files)]
    warning = (
        f"copies of driver {files.version} in the CT break at the next host driver upgrade "
        "(Driver/library version mismatch); `fix --driver-libs bind` follows the host instead"
    )
    return replace(
        plan, explanation=(*plan.explanation, *notes), warnings=(*plan.warnings, warning)
    )
