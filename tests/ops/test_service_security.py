"""Attacks on `gpudoctor service install` and the boot unit it writes (issue 22, items 4-7).

Each test performs the attack on the real path: a real install root on this machine's
disk, a second user (``nobody``, through ``setpriv``) planting files, the real CLI run as
root, the real wrapper run by ``sh``, the real ``systemd-analyze verify``. Each docstring
names the attack it blocks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.cli import cli
from tests.ops.test_units import PLAN, needs_analyze, verify

NOBODY = 65534


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["service", *args], catch_exceptions=False)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the attacks are root (the installer) against nobody: run as root")


def as_nobody(script: str) -> None:
    """Run ``sh -c script`` as uid/gid 65534 with no supplementary groups (the attacker)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as a second user")
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         "sh", "-c", script],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def open_to_others(path: Path) -> None:
    """Give others search (x) permission on ``path``'s parents so nobody can reach it."""
    for parent in (path, *path.parents):
        if parent == Path("/"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o011)


def install_root(tmp_path: Path) -> Path:
    """Return an install root holding the plan at /root/plan.toml and this interpreter at
    its own path (a copy), as a CT's rootfs with gpudoctor installed would."""
    root = tmp_path / "root"
    (root / "root").mkdir(parents=True)
    (root / "root/plan.toml").write_text(PLAN)
    python = root / sys.executable.lstrip("/")
    python.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.realpath(sys.executable), python)
    return root


# -- 22.7: control characters ----------------------------------------------------------


INJECTED = "x\nExecStartPost=/bin/touch /tmp/gpudoctor-injected"


@needs_analyze
def test_a_newline_in_a_check_arg_cannot_inject_a_directive(tmp_path: Path) -> None:
    """Attack (22.7): `--check-arg $'x\\nExecStartPost=/bin/touch ...'` reaches the unit
    file raw; systemd-analyze accepts the injected ExecStartPost=, so the textfile timer
    would run it as root. Every word with a control character is refused (exit 2)."""
    root = tmp_path / "root"
    result = invoke("install-timer", "--dir", str(tmp_path / "prom"), f"--check-arg={INJECTED}",
                    "--root", str(root))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "control character ('\\n')" in result.output
    assert not root.exists()
    # the same install without the newline gives a unit that the real verifier accepts
    clean = invoke("install-timer", "--dir", str(tmp_path / "prom"), "--check-arg=--only=shm",
                   "--root", str(root))  # fmt: skip
    assert clean.exit_code == 0, clean.output
    units = root / "etc/systemd/system"
    done = verify(None, str(units / "gpudoctor-textfile.timer"),
                  str(units / "gpudoctor-textfile.service"))  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "ExecStartPost" not in (units / "gpudoctor-textfile.service").read_text()


def test_control_characters_in_any_word_of_a_unit_are_refused(tmp_path: Path) -> None:
    """Attack (22.7): a newline, CR, tab, ESC or DEL in --check-arg, --gpudoctor (quoted),
    --out, the weights options or the textfile directory, each of which ends up in a unit
    or its wrapper. Each is refused with one line naming the option; nothing is written."""
    root = tmp_path / "root"
    (root / "root").mkdir(parents=True)
    (root / "root/plan.toml").write_text(PLAN)
    base = ("install", "/root/plan.toml", "--root", str(root))
    bad = [
        (*base, "--out", "/runs/q", f"--check-arg={INJECTED}"),
        (
            *base,
            "--out",
            "/runs/q",
            "--gpudoctor",
            f"'{sys.executable}\nExecStartPost=/x' -m gpudoctor",
        ),
        (*base, "--out", "/runs/q\rExecStartPost=/x"),
        (*base, "--out", "/runs/q", "--repo", "org/tiny", "--to", "/dev/shm/t\x1b[2J"),
        (*base, "--out", "/runs/q", "--mirror", "/var/lib/m\x7f"),
        (*base, "--out", "/runs/q", "--check-arg", "--only\tshm"),
        ("install-timer", "--dir", "/var/lib/prom\nExecStartPost=/x", "--root", str(root)),
        ("install-timer", "--gpudoctor", f"'{sys.executable}\n' -m gpudoctor", "--root", str(root)),
    ]
    for args in bad:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "control character" in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert sorted(p.name for p in root.iterdir()) == ["root"]  # nothing installed


# -- 22.6: the working directory -------------------------------------------------------


def test_the_wrapper_run_by_hand_does_not_import_the_working_directory(tmp_path: Path) -> None:
    """Attack (22.6): nobody leaves a `gpudoctor/` package in a directory they control
    (/tmp/x); root runs the wrapper by hand from there, and `python -m gpudoctor` imports
    nobody's package as root. The wrapper runs `python -I -m gpudoctor` after `cd /`."""
    needs_root()
    root = install_root(tmp_path)
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--only", "shm",
                    "--backoff", "1:1", "--root", str(root))  # fmt: skip
    assert result.exit_code == 0, result.output
    wrapper = root / "usr/local/sbin/gpudoctor-campaign"
    text = wrapper.read_text()
    assert f"{sys.executable} -I -m gpudoctor check" in text
    assert text.index("cd / ") < text.index(" -m gpudoctor")

    evil = tmp_path / "evil"
    evil.mkdir()
    open_to_others(evil)
    os.chmod(evil, 0o1777)
    marker = tmp_path / "evil" / "ran-as-root"
    package = textwrap.dedent(f"""\
        import os
        open({str(marker)!r}, "w").write(str(os.geteuid()))
        """)
    as_nobody(f"mkdir {evil}/gpudoctor && cat > {evil}/gpudoctor/__init__.py <<'EOF'\n"
              f"{package}EOF\n: > {evil}/gpudoctor/__main__.py")  # fmt: skip
    proc = subprocess.Popen(["sh", str(wrapper)], cwd=evil, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first check has ended: ready, or waiting
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "gpudoctor check" in first, first
    assert not marker.exists(), f"nobody's package ran as uid {marker.read_text()}"
