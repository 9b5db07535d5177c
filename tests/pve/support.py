"""Helpers shared by the pve tests: run `gpudoctor fix` for real, and a stopped-CT `pct`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path


def fix(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpudoctor fix ARGS`` as a subprocess, stdin from /dev/null (no
    terminal: nothing can be asked), ``env`` added to this environment; return it."""
    with open(os.devnull) as devnull:
        return subprocess.run([sys.executable, "-m", "gpudoctor", "fix", *args], stdin=devnull,
                              capture_output=True, text=True, env={**os.environ, **env},
                              timeout=120)  # fmt: skip


def fix_in_process(args: list[str], env: dict[str, str]):
    """Run ``gpudoctor fix ARGS`` in this process (click's CliRunner); return its Result."""
    from click.testing import CliRunner

    from gpudoctor.cli import cli

    return CliRunner().invoke(cli, ["fix", *args], env=env, catch_exceptions=False)


def stopped_pct(tmp_path: Path) -> str:
    """Return the path of a ``pct`` stand-in for a stopped CT (``pct status`` -> ``status:
    stopped``), so a fix writes without restarting anything."""
    path = tmp_path / "pct-stopped"
    path.write_text('#!/bin/sh\n[ "$1" = status ] && echo "status: stopped" && exit 0\nexit 1\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)
