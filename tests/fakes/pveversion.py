#!/usr/bin/python3
"""A stand-in for Proxmox VE's ``pveversion`` (pve-manager), for tests only.

Proxmox's own ``pveversion`` cannot run here. The real one prints one line such as
``pve-manager/8.2.4/faa83925c9641325 (running kernel: 6.8.12-1-pve)``; this one prints the
same line for the version given as its first argument (tests wrap it in a tiny script per
version, see tests/fakes/pvetree.py). Stdlib only (it also runs on the lab "host" over SSH).
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    version = argv[0] if argv else "8.2.4"
    print(f"pve-manager/{version}/faa83925c9641325 (running kernel: 6.8.12-1-pve)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
