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
from tests.ops.test_units import PLAN, add_interpreter, needs_analyze, verify

NOBODY = 65534


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["service", *args], catch_exceptions=False)


@pytest.fixture
def tmp_path(public_tmp_path: Path) -> Path:
    """Files here must be reachable by ``nobody`` (see tests/conftest.py public_tmp_path)."""
    return public_tmp_path


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
    add_interpreter(root)
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
        (*base, "--out", "/runs/q", "--revision", "v1\x1b[2J"),
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
    text = wrapper.read_text()
    assert f"{sys.executable} -I -m gpudoctor check" in text
    assert text.index("cd / ") < text.index(" -m gpudoctor")


# -- 22.4: the install root's own symlinks ----------------------------------------------


def test_install_root_symlinks_do_not_lead_out_of_the_root(tmp_path: Path) -> None:
    """Attack (22.4): a compromised CT plants absolute symlinks in its rootfs
    (``usr/local/sbin -> /etc/cron.hourly``, ``etc/systemd/system -> /etc/systemd/system``,
    here with a relative ``../../..`` escape too) and links its plan to a host file; the
    host's root runs `service install --root ROOTFS`, which then writes the wrapper and
    the enabled unit into the HOST and reads the host's plan. The host directories are
    stand-ins under tmp_path (never the real /etc: main would write a root cron job).
    Paths resolve inside ROOT like chroot: the links land inside ROOT, the host is untouched.
    """
    root = install_root(tmp_path)
    host = tmp_path / "host"
    cron, units = host / "etc/cron.hourly", host / "etc/systemd/system"
    cron.mkdir(parents=True)
    units.mkdir(parents=True)
    host_plan = host / "plan.toml"
    host_plan.write_text(PLAN.replace("org/tiny", "org/host-secret"))
    (root / "usr/local").mkdir(parents=True)
    (root / "usr/local/sbin").symlink_to(cron)  # absolute: the host's path
    (root / "etc/systemd").mkdir(parents=True)
    escape = "../" * (len(root.parts) + 2) + str(units).lstrip("/")
    (root / "etc/systemd/system").symlink_to(escape)  # relative, climbing above ROOT
    (root / "root/plan.toml").unlink()
    (root / "root/plan.toml").symlink_to(host_plan)
    # the CT's own copy, where the link points when read inside the CT
    inside = root / str(host_plan).lstrip("/")
    inside.parent.mkdir(parents=True)
    inside.write_text(PLAN)

    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    assert result.exit_code == 0, result.output
    assert list(cron.iterdir()) == [] and list(units.iterdir()) == [], "wrote into the host"
    wrapper = root / str(cron).lstrip("/") / "gpudoctor-campaign"  # the link, read in ROOT
    assert "weights ensure org/tiny" in wrapper.read_text()  # the CT's plan, not the host's
    unit_dir = root / str(units).lstrip("/")
    assert (unit_dir / "gpudoctor-campaign.service").is_file()
    wants = unit_dir / "multi-user.target.wants/gpudoctor-campaign.service"
    assert os.readlink(wants) == "/etc/systemd/system/gpudoctor-campaign.service"
    for line in result.output.splitlines():
        assert line.split()[-1].startswith(str(root)) or "installed under" in line, line


def test_a_plan_linked_to_a_host_file_is_not_read(tmp_path: Path) -> None:
    """Attack (22.4): the CT links its plan to a host file it wants read (``root/plan.toml
    -> /etc/host-plan.toml``); inside ROOT that path does not exist, so install refuses
    (exit 2, "no plan file") instead of reading the host's file."""
    root = install_root(tmp_path)
    host_plan = tmp_path / "host-plan.toml"
    host_plan.write_text(PLAN)
    (root / "root/plan.toml").unlink()
    (root / "root/plan.toml").symlink_to(host_plan)
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    assert result.exit_code == 2, result.output
    assert "no plan file" in result.output and str(root) in result.output
    assert not (root / "etc").exists()


# -- 22.5: what the boot unit runs as root -----------------------------------------------


def refused(result, path: Path, owner: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 1, result.output
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert "refusing to install" in line and str(path) in line and owner in line, line


def test_a_plan_that_nobody_can_change_is_refused(tmp_path: Path) -> None:
    """Attack (22.5): nobody owns the plan (mode 666, in a sticky world-writable ROOT/srv):
    after install, nobody changes engine.command and root runs it at the next boot.
    Refused at install time, naming the plan and its owner; nothing installed."""
    needs_root()
    root = install_root(tmp_path)
    srv = root / "srv"
    srv.mkdir(mode=0o1777)
    os.chmod(srv, 0o1777)
    open_to_others(srv)
    as_nobody(f"cat > {srv}/plan.toml <<'EOF'\n{PLAN}EOF\nchmod 666 {srv}/plan.toml")
    result = invoke("install", "/srv/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    refused(result, srv / "plan.toml", "nobody (uid 65534)")
    assert not (root / "etc").exists() and not (root / "usr/local").exists()

    # root's own plan in the same sticky directory is accepted (others cannot swap it)
    (srv / "mine.toml").write_text(PLAN)
    ok = invoke("install", "/srv/mine.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    assert ok.exit_code == 0, ok.output


def test_a_plan_in_a_directory_nobody_owns_is_refused(tmp_path: Path) -> None:
    """Attack (22.5): root's plan lies in a directory nobody owns (ROOT/home/nobody):
    nobody renames it away and puts their own plan in its place."""
    needs_root()
    root = install_root(tmp_path)
    home = root / "home/nobody"
    home.mkdir(parents=True)
    os.chown(home, NOBODY, NOBODY)
    (home / "plan.toml").write_text(PLAN)
    result = invoke("install", "/home/nobody/plan.toml", "--out", "/var/lib/runs/q",
                    "--root", str(root))  # fmt: skip
    refused(result, home, "nobody (uid 65534)")


def test_a_program_the_plan_names_that_nobody_can_replace_is_refused(tmp_path: Path) -> None:
    """Attack (22.5): the plan's engine.command names /opt/engine/serve (and, found on the
    wrapper's PATH, `serve2`) in a directory nobody owns: nobody swaps the program and root
    runs it at boot."""
    needs_root()
    root = install_root(tmp_path)
    engine = root / "opt/engine"
    engine.mkdir(parents=True)
    os.chown(engine, NOBODY, NOBODY)
    (engine / "serve").write_text("#!/bin/sh\n")
    (engine / "serve").chmod(0o755)
    (root / "root/plan.toml").write_text(PLAN.replace("/usr/bin/true", "/opt/engine/serve"))
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    refused(result, engine, "nobody (uid 65534)")

    bin_dir = root / "usr/local/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "serve2").write_text("#!/bin/sh\n")
    os.chown(bin_dir / "serve2", NOBODY, NOBODY)
    (root / "root/plan.toml").write_text(PLAN.replace("/usr/bin/true", "serve2"))
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    refused(result, bin_dir / "serve2", "nobody (uid 65534)")


def test_an_interpreter_or_out_that_others_can_write_is_refused(tmp_path: Path) -> None:
    """Attack (22.5): the interpreter the unit runs is writable by others (mode 0777), or
    --out lies in a directory nobody owns (nobody plants results.jsonl links or the done
    marker there). Both refused, naming the path and its owner or mode."""
    needs_root()
    root = install_root(tmp_path)
    python = root / "opt/py/python3"
    python.parent.mkdir(parents=True)
    shutil.copy(os.path.realpath(sys.executable), python)
    python.chmod(0o777)
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root),
                    "--gpudoctor", "/opt/py/python3 -m gpudoctor")  # fmt: skip
    refused(result, python, "mode 0777")

    runs = root / "var/lib/runs"
    runs.mkdir(parents=True)
    os.chown(runs, NOBODY, NOBODY)
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    refused(result, runs, "nobody (uid 65534)")


def test_a_planted_done_marker_link_is_never_followed(tmp_path: Path) -> None:
    """Attack (22.5): nobody plants ``OUT/.gpudoctor-service-done -> /victim`` in a sticky
    world-writable run directory; once bench exits 0 the wrapper's ``: > "$DONE"`` created a
    root-owned /victim. The wrapper runs `gpudoctor service mark-done` (O_EXCL|O_NOFOLLOW):
    the link is refused and /victim never appears.

    The wrapper is the real one `service install` wrote; the gpudoctor it calls is a
    stand-in for `check`, `weights` and `bench` (each exits 0 at once: a real campaign is the lab
    drill's job) that runs the real gpudoctor for `service mark-done`."""
    needs_root()
    root = install_root(tmp_path)
    standin = tmp_path / "gd"
    standin.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        # stand-in for gpudoctor's check, weights and bench (exit 0); the real one for the rest
        case "$1" in check|weights|bench) exit 0 ;; esac
        exec {sys.executable} -I -m gpudoctor "$@"
        """)
    )
    standin.chmod(0o755)
    inside = root / str(standin).lstrip("/")
    inside.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(standin, inside)
    out = tmp_path / "out"
    result = invoke("install", "/root/plan.toml", "--out", str(out), "--root", str(root),
                    "--gpudoctor", str(standin), "--backoff", "1:1")  # fmt: skip
    assert result.exit_code == 0, result.output
    out.mkdir(mode=0o1777)
    os.chmod(out, 0o1777)
    open_to_others(out)
    victim = tmp_path / "victim"
    as_nobody(f"ln -s {victim} {out}/.gpudoctor-service-done")
    wrapper = root / "usr/local/sbin/gpudoctor-campaign"
    run = subprocess.run(["sh", str(wrapper)], capture_output=True, text=True, timeout=60)
    assert not victim.exists(), "the wrapper wrote through nobody's link"
    assert run.returncode != 0, run.stdout + run.stderr
    assert "already exists (a symlink)" in run.stderr, run.stderr
    assert "campaign done" not in run.stdout

    # without the link, the same wrapper leaves the marker and the next run does nothing
    os.unlink(out / ".gpudoctor-service-done")
    os.chmod(out, 0o755)
    run = subprocess.run(["sh", str(wrapper)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "campaign done" in run.stdout, run.stdout + run.stderr
    marker = out / ".gpudoctor-service-done"
    assert marker.is_file() and not marker.is_symlink() and marker.stat().st_uid == 0
    again = subprocess.run(["sh", str(wrapper)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already done" in again.stdout
