"""`gpudoctor service install` / `install-timer` write units that systemd accepts.

Verified with the real `systemd-analyze verify` (Debian's ``systemd`` package). This
machine's PID 1 is not systemd, and the wrapper lives in the TARGET system's
/usr/local/sbin, so the campaign unit is verified with ``--root=ROOT``: ROOT holds the
installed files plus a copy of this machine's /usr/lib/systemd/system (the targets the
unit names). ``--man=no``: the Documentation= check would need man pages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.cli import cli

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    not ANALYZE, reason="systemd-analyze missing (apt-get install systemd; tests/run.sh does)"
)

PLAN = """\
name = "q"
[model]
repo = "org/tiny"
dir = "/dev/shm/tiny"
mirror = "/var/lib/models"
[engine]
name = "command"
command = ["/usr/bin/true", "{model}", "{host}", "{port}"]
version = "1"
[axes]
concurrency = [1]
[workload]
input_len = 16
output_len = 4
num_prompts = 2
[[configs]]
name = "a"
"""


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["service", *args], catch_exceptions=False)


def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    return path


def verify(root: Path | None, *units: str) -> subprocess.CompletedProcess:
    """Run ``systemd-analyze verify --man=no [--root=ROOT] UNITS``."""
    argv = [str(ANALYZE), "verify", "--man=no"]
    if root is not None:
        argv.append(f"--root={root}")
    return subprocess.run([*argv, *units], capture_output=True, text=True, timeout=60)


def add_interpreter(root: Path) -> Path:
    """Copy this interpreter into ``root`` at its own path (as a CT with gpudoctor
    installed at the same path has it: `service install --root` looks for it there)."""
    python = root / sys.executable.lstrip("/")
    python.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.realpath(sys.executable), python)
    return python


def systemd_root(tmp_path: Path) -> Path:
    """Return a root directory holding a copy of this machine's systemd unit directory."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    return root


@needs_analyze
def test_campaign_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    root = systemd_root(tmp_path)
    (root / "root").mkdir()
    (root / "root/plan.toml").write_text(PLAN)  # PLAN is read inside ROOT, as the CT sees it
    add_interpreter(root)
    result = invoke("install", "/root/plan.toml", "--out", "/var/lib/runs/q",
                    "--device", "/dev/nvidia-uvm", "--root", str(root))  # fmt: skip
    assert result.exit_code == 0, result.output
    unit = "/etc/systemd/system/gpudoctor-campaign.service"
    done = verify(root, unit)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    wants = root / "etc/systemd/system/multi-user.target.wants/gpudoctor-campaign.service"
    assert os.readlink(wants) == unit
    wrapper = root / "usr/local/sbin/gpudoctor-campaign"
    assert wrapper.stat().st_mode & 0o777 == 0o755
    text = wrapper.read_text()
    # the steps, in order, with the plan's weights (repo, dir, mirror) and the check's args
    steps = [
        f"{sys.executable} -I -m gpudoctor check --device /dev/nvidia-uvm 2>&1",
        "weights ensure org/tiny --to /dev/shm/tiny --mirror /var/lib/models ||",
        "bench /root/plan.toml --out /var/lib/runs/q\n",
    ]
    positions = [text.index(step) for step in steps]
    assert positions == sorted(positions)
    # the check runs through a real shell parse: `sh -n` accepts the script
    assert subprocess.run(["sh", "-n", str(wrapper)]).returncode == 0

    # the verifier does catch a broken unit: the wrapper gone -> not executable
    wrapper.unlink()
    broken = verify(root, unit)
    assert broken.returncode != 0 and "is not executable" in broken.stderr


@needs_analyze
def test_textfile_timer_and_service_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    root = tmp_path / "root"
    result = invoke("install-timer", "--dir", str(tmp_path / "prom"), "--every", "2",
                    "--ct", "200", "--check-arg=--flavor", "--check-arg", "lxc",
                    "--root", str(root))  # fmt: skip
    assert result.exit_code == 0, result.output
    units = root / "etc/systemd/system"
    # ExecStart runs this interpreter, which exists on this machine: verify against /
    done = verify(None, str(units / "gpudoctor-textfile.timer"),
                  str(units / "gpudoctor-textfile.service"))  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    service = (units / "gpudoctor-textfile.service").read_text()
    node = f"{tmp_path}/prom/gpudoctor.prom"
    ct = f"{tmp_path}/prom/gpudoctor-ct-200.prom"
    assert f"check --format prometheus --flavor lxc -o {node}\n" in service
    assert f"check --format prometheus --flavor lxc --ct 200 -o {ct}\n" in service
    assert "OnUnitActiveSec=2min" in (units / "gpudoctor-textfile.timer").read_text()
    assert "SuccessExitStatus=3 4\n" in service  # findings (3) and nothing checked (4) are runs
    assert os.readlink(units / "timers.target.wants/gpudoctor-textfile.timer") == (
        "/etc/systemd/system/gpudoctor-textfile.timer"
    )


def test_unit_values_that_would_break_a_unit_are_refused(tmp_path: Path) -> None:
    plan = str(plan_file(tmp_path))
    root = str(tmp_path / "root")
    bad = [
        ("install", plan, "--out", "/runs/a b", "--root", root),  # whitespace splits ExecStart
        ("install", plan, "--out", "/runs/q", "--name", "a/b", "--root", root),
        ("install", plan, "--out", "/runs/q", "--backoff", "9:3", "--root", root),
        ("install-timer", "--every", "0", "--root", root),
        ("install", plan, "--out", "/runs/q", "--root", root),  # no plan inside ROOT
        ("install-timer", "--ct", "200;reboot", "--root", root),
        ("install-timer", "--ct", "abc", "--root", root),  # a Proxmox CT id is a number
    ]
    for args in bad:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
    assert not (tmp_path / "root").exists()


def test_rules_command_writes_the_shipped_rules(tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    result = invoke("rules", "-o", str(out))
    assert result.exit_code == 0, result.output
    shipped = Path(__file__).parents[2] / "gpudoctor" / "service" / "alerts.yml"
    assert out.read_text() == shipped.read_text()
    assert invoke("rules").output == shipped.read_text()


def test_install_root_without_this_interpreter_is_refused_or_uses_its_own(tmp_path: Path) -> None:
    """Issue 26.5: `--root DIR` wrote a wrapper calling this machine's Python, absent
    inside DIR (the unit failed at boot, nothing said at install). Now: refused with the
    `--gpudoctor` to give, or the root's own `gpudoctor` console script is used."""
    root = tmp_path / "root"
    (root / "root").mkdir(parents=True)
    (root / "root/plan.toml").write_text(PLAN)
    args = ("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert (
        f"{sys.executable} (the interpreter the unit runs) is not an executable file inside {root}"
        in result.output
    )
    assert "--gpudoctor 'PYTHON -m gpudoctor'" in result.output
    assert not (root / "etc").exists()
    missing = invoke(*args, "--gpudoctor", "/opt/none/bin/python -m gpudoctor")
    assert missing.exit_code == 1 and "/opt/none/bin/python (the interpreter" in missing.output

    script = root / "usr/local/bin/gpudoctor"  # what `pip install gpudoctor` puts in the CT
    script.parent.mkdir(parents=True)
    script.write_text("#!/usr/bin/python3\n")
    script.chmod(0o755)
    found = invoke(*args)
    assert found.exit_code == 0, found.output
    wrapper = (root / "usr/local/sbin/gpudoctor-campaign").read_text()
    assert "\n  report=$(/usr/local/bin/gpudoctor check 2>&1)\n" in wrapper
    assert sys.executable not in wrapper


@needs_analyze
def test_network_ordering_only_when_the_weights_may_come_from_the_hub(tmp_path: Path) -> None:
    """Issue 26.13: `After=network-online.target` held the campaign 120 s at every boot of
    a CT without network although a disk mirror needs none. The unit orders after the
    network only without a mirror (the Hub), or with --after-network; systemd accepts
    all three forms."""
    root = systemd_root(tmp_path)
    add_interpreter(root)
    (root / "root").mkdir()
    (root / "root/mirror.toml").write_text(PLAN)
    (root / "root/hub.toml").write_text(PLAN.replace('mirror = "/var/lib/models"\n', ""))
    unit_file = root / "etc/systemd/system/gpudoctor-campaign.service"
    cases = [("/root/mirror.toml", (), False), ("/root/hub.toml", (), True),
             ("/root/mirror.toml", ("--after-network",), True)]  # fmt: skip
    for plan, extra, networked in cases:
        result = invoke("install", plan, "--out", "/var/lib/runs/q", "--root", str(root), *extra)
        assert result.exit_code == 0, result.output
        text = unit_file.read_text()
        assert ("network-online.target" in text) == networked, (plan, extra, text)
        assert (
            "After=local-fs.target" in text or "After=network-online.target local-fs.target" in text
        )
        done = verify(root, "/etc/systemd/system/gpudoctor-campaign.service")
        assert done.returncode == 0 and done.stderr == "", done.stderr


def test_reinstall_leaves_an_unchanged_unit_alone_and_names_it(tmp_path: Path) -> None:
    """Issue 26.13: re-running `service install` rewrote an unchanged unit (systemd then
    wants a daemon-reload). Unchanged files and links are left alone (same inode, same
    mtime) and reported `unchanged`; a changed option rewrites only what changed."""
    root = tmp_path / "root"
    (root / "root").mkdir(parents=True)
    (root / "root/plan.toml").write_text(PLAN)
    add_interpreter(root)
    args = ("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    first = invoke(*args)
    assert first.exit_code == 0 and first.output.count("wrote ") == 3, first.output
    paths = [
        Path(line.split(" ", 1)[1])
        for line in first.output.splitlines()
        if line.startswith("wrote ")
    ]
    before = [(os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in paths]
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert [line.split(" ", 1)[0] for line in again.output.splitlines()[:3]] == ["unchanged"] * 3
    assert [(os.lstat(p).st_ino, os.lstat(p).st_mtime_ns) for p in paths] == before
    changed = invoke(*args, "--backoff", "7:70")
    assert changed.exit_code == 0, changed.output
    assert f"wrote {root}/usr/local/sbin/gpudoctor-campaign\n" in changed.output
    assert f"unchanged {root}/etc/systemd/system/gpudoctor-campaign.service\n" in changed.output


def test_description_and_weights_restored_once(tmp_path: Path) -> None:
    """Issue 26.13: the default description read "gpudoctor campaign campaign", and a
    `--to` other than the plan's model directory restored the weights twice (the wrapper
    into --to, then bench into the plan's dir). The description names a non-default name
    only; a --to (or --repo) that bench would undo is refused naming both directories."""
    root = tmp_path / "root"
    (root / "root").mkdir(parents=True)
    (root / "root/plan.toml").write_text(PLAN)
    add_interpreter(root)
    base = ("install", "/root/plan.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    assert invoke(*base).exit_code == 0
    unit = (root / "etc/systemd/system/gpudoctor-campaign.service").read_text()
    assert "Description=gpudoctor campaign: wait for the GPU" in unit
    assert invoke(*base, "--name", "qwen").exit_code == 0
    unit = (root / "etc/systemd/system/gpudoctor-qwen.service").read_text()
    assert "Description=gpudoctor campaign qwen: wait for the GPU" in unit

    twice = invoke(*base, "--repo", "org/tiny", "--to", "/dev/shm/elsewhere")
    assert twice.exit_code == 2, twice.output
    assert "/dev/shm/elsewhere" in twice.output and "/dev/shm/tiny" in twice.output
    assert "restored twice" in twice.output
    same = invoke(*base, "--to", "/dev/shm/tiny", "--mirror", "/srv/mirror")
    assert same.exit_code == 0, same.output
    wrapper = (root / "usr/local/sbin/gpudoctor-campaign").read_text()
    assert wrapper.count("weights ensure org/tiny --to /dev/shm/tiny --mirror /srv/mirror ||") == 1

    local = PLAN.replace('repo = "org/tiny"\ndir = "/dev/shm/tiny"\nmirror = "/var/lib/models"\n',
                         'path = "/dev/shm/local"\n')  # fmt: skip
    (root / "root/local.toml").write_text(local)
    base = ("install", "/root/local.toml", "--out", "/var/lib/runs/q", "--root", str(root))
    wrong = invoke(*base, "--repo", "org/tiny", "--to", "/dev/shm/other")
    assert wrong.exit_code == 2 and "is not the directory the plan's servers load" in wrong.output
    right = invoke(*base, "--repo", "org/tiny", "--to", "/dev/shm/local")
    assert right.exit_code == 0, right.output
