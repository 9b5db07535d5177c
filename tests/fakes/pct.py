#!/usr/bin/python3
"""A small stand-in for Proxmox VE's ``pct`` (pve-container), for lab tests only.

Proxmox's own ``pct`` and pmxcfs cannot run here, so this script does the part of their
job that ``gpudoctor fix`` relies on, driving REAL LXC containers:

* ``pct start|stop|reboot|status|exec VMID`` like Proxmox's (``status: running``; start
  refuses a locked CT, as ``pct start`` does; ``reboot`` does not check the lock, as in
  Proxmox; ``start VMID --debug`` starts with LXC's DEBUG log and prints it when the
  start fails, as ``pct start --debug`` does);
* at every start it turns ``<pve-root>/nodes/<node>/lxc/<vmid>.conf`` into the LXC config
  ``<lxcpath>/<vmid>/config`` the way pve-container's ``update_lxc_config`` does for what
  matters here: only the live section (before the first ``[section]``) is read, raw
  ``lxc.*`` keys are passed through verbatim (``k: v`` and ``k = v`` alike), and each
  ``devN: /dev/X[,gid=,mode=]`` is re-stat'ed on the host and becomes a cgroup allow rule
  for its CURRENT major:minor plus the node inside the CT (here a bind mount; Proxmox
  mknods it through a hook). Everything else Proxmox derives from ``rootfs:``, ``net0:``,
  ``arch:`` and its ``common.conf`` comes from ``<lxcpath>/<vmid>/base.conf``, written by
  the test (rootfs path, deny-all + the base device rules).

Fault injection for the rollback tests: a file ``<lxcpath>/<vmid>/fail-next-start`` holding
N (default 1) makes the next N starts fail, as a failing pre-start ``hookscript:`` makes
Proxmox's ``pct start`` fail.

Stdlib only (it runs as /usr/bin/python3 on the "host" reached over SSH). Usage:
``pct.py --pve-root DIR --lxcpath DIR COMMAND VMID [-- ARGV...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

RAW = re.compile(r"(lxc\.[a-z0-9_\-.]+)(:|[ \t]*=)[ \t]*(.*?)[ \t\r]*")
OPTION = re.compile(r"([a-z][a-z_]*\d*):[ \t]*(.+?)[ \t\r]*")
SECTION = re.compile(r"\[[^\]]+\][ \t]*")
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def die(message: str, code: int = 255) -> None:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def config_path(pve_root: str, vmid: str) -> str:
    with open(os.path.join(pve_root, ".vmlist")) as fh:
        entry = json.load(fh)["ids"].get(vmid)
    if entry is None:
        die(f"Configuration file 'nodes/?/lxc/{vmid}.conf' does not exist")
    return os.path.join(pve_root, "nodes", entry["node"], "lxc", f"{vmid}.conf")


def live_section(path: str) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """Return (raw lxc pairs, options) of the live section, as parse_pct_config reads it."""
    raw: list[tuple[str, str]] = []
    options: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh.read().split("\n"):
            if SECTION.fullmatch(line):
                break
            if not line.strip() or line.startswith("#"):
                continue
            match = RAW.fullmatch(line)
            if match:
                raw.append((match.group(1), match.group(3)))
                continue
            match = OPTION.fullmatch(line)
            if match:
                options[match.group(1)] = match.group(2)
    return raw, options


def dev_lines(options: dict[str, str]) -> list[str]:
    """Return the LXC lines for devN entries: a rule for the node's CURRENT numbers + the node."""
    lines = []
    for key in sorted(k for k in options if re.fullmatch(r"dev\d+", k)):
        path = options[key].split(",")[0].removeprefix("path=")
        st = os.stat(path)
        kind = "c" if (st.st_mode & 0o170000) == 0o020000 else "b"
        lines.append(
            f"lxc.cgroup2.devices.allow = {kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} rw"
        )
        lines.append(f"lxc.mount.entry = {path} {path.lstrip('/')} none bind,create=file 0 0")
    return lines


def render(args: argparse.Namespace, vmid: str) -> None:
    """Write <lxcpath>/<vmid>/config from base.conf + the PVE config's live section."""
    ct_dir = os.path.join(args.lxcpath, vmid)
    raw, options = live_section(config_path(args.pve_root, vmid))
    with open(os.path.join(ct_dir, "base.conf")) as fh:
        base = fh.read()
    body = [f"{key} = {value}" for key, value in raw] + dev_lines(options)
    with open(os.path.join(ct_dir, "config"), "w") as fh:
        fh.write(base.rstrip("\n") + "\n" + "\n".join(body) + "\n")


def lxc(args: argparse.Namespace, tool: str, vmid: str, *rest: str) -> int:
    argv = [f"lxc-{tool}", "-P", args.lxcpath, "-n", vmid, *rest]
    return subprocess.call(argv)


def state(args: argparse.Namespace, vmid: str) -> str:
    out = subprocess.run(
        ["lxc-info", "-P", args.lxcpath, "-n", vmid, "-s", "-H"], capture_output=True, text=True
    ).stdout.strip()
    return "running" if out == "RUNNING" else "stopped"


def start(args: argparse.Namespace, vmid: str) -> int:
    _, options = live_section(config_path(args.pve_root, vmid))
    if options.get("lock"):
        die(f"CT is locked ({options['lock']})")
    marker = os.path.join(args.lxcpath, vmid, "fail-next-start")
    if os.path.exists(marker):
        with open(marker) as fh:
            left = int(fh.read().strip() or "1") - 1
        if left > 0:
            with open(marker, "w") as fh:
                fh.write(str(left))
        else:
            os.unlink(marker)
        die(f"hookscript error for {vmid} on pre-start")
    render(args, vmid)
    debug = "--debug" in args.rest
    log = os.path.join(args.lxcpath, vmid, "lxc-debug.log" if debug else "lxc.log")
    if debug and os.path.exists(log):
        os.unlink(log)
    rc = lxc(args, "start", vmid, "-l", "DEBUG" if debug else "INFO", "-o", log)
    if rc == 0:
        rc = lxc(args, "wait", vmid, "-s", "RUNNING", "-t", "30")
    if rc != 0 and debug and os.path.exists(log):  # pct start --debug prints LXC's log
        with open(log, errors="replace") as fh:
            sys.stdout.write(fh.read())
    return rc


def stop(args: argparse.Namespace, vmid: str) -> int:
    if state(args, vmid) == "stopped":
        return 0
    rc = lxc(args, "stop", vmid, "-t", "10")
    deadline = time.monotonic() + 30
    while state(args, vmid) != "stopped" and time.monotonic() < deadline:
        time.sleep(0.2)
    return rc if state(args, vmid) == "stopped" else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pct")
    parser.add_argument("--pve-root", required=True)
    parser.add_argument("--lxcpath", required=True)
    parser.add_argument("command", choices=["start", "stop", "reboot", "status", "exec"])
    parser.add_argument("vmid")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "status":
        print(f"status: {state(args, args.vmid)}")
        return 0
    if args.command == "start":
        return start(args, args.vmid)
    if args.command == "stop":
        return stop(args, args.vmid)
    if args.command == "reboot":
        return stop(args, args.vmid) or start(args, args.vmid)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    env = ["--clear-env", "-v", f"PATH={CONTAINER_PATH}", "-v", "HOME=/root"]
    os.execvp("lxc-attach", ["lxc-attach", "-P", args.lxcpath, "-n", args.vmid, *env, "--", *rest])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
