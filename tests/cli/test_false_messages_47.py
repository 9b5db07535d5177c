"""Messages that were false or sent users the wrong way (issue 47, the table), each through
the real CLI in a subprocess: the case the issue names, and what the message says now."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

GD = [sys.executable, "-m", "gpudoctor"]


def run(*args: str, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    """Run ``gpudoctor ARGS``; return the finished process (text)."""
    return subprocess.run([*GD, *args], capture_output=True, text=True, timeout=300, **kw)


def model_finding(directory: str) -> dict:
    """Return the model.present finding of ``check --only model --model-dir DIRECTORY``."""
    done = run("check", "--only", "model", "--model-dir", directory, "--json")
    assert done.returncode == 3, (done.returncode, done.stderr)
    return json.loads(done.stdout)["findings"][0]


def test_a_tmpfs_mount_point_as_model_dir_is_not_told_to_ensure_into_it() -> None:
    """`check --model-dir /dev/shm` said `weights ensure ... --to /dev/shm`, which ensure
    refuses (a mount point). It names the mount point and a directory inside it."""
    with open("/proc/self/mounts") as fh:
        assert any(line.split()[1] == "/dev/shm" for line in fh)  # what the test stands on
    found = model_finding("/dev/shm")
    assert "/dev/shm is a mount point, not a model's directory" in found["message"]
    assert "--to /dev/shm/MODEL" in found["remediation"]
    assert "--to /dev/shm " not in found["remediation"] + " "


def test_a_file_as_model_dir_is_not_told_to_use_a_directory_without_a_model() -> None:
    """`check --model-dir /etc/passwd` said `e.g. --model-dir /etc`: /etc holds no model."""
    found = model_finding("/etc/passwd")
    assert "--model-dir /etc" not in found["remediation"]
    assert "a model's own directory" in found["remediation"]


def test_a_file_inside_a_model_dir_names_that_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    found = model_finding(str(tmp_path / "model.safetensors"))
    assert found["remediation"].endswith(f": --model-dir {tmp_path}.")


def test_a_failed_restore_is_not_blamed_on_a_reboot(tmp_path: Path) -> None:
    """After a failed `weights ensure`, `check --model-dir` said "a tmpfs is emptied by every
    reboot"; NAME.partial says otherwise: an unfinished restore, to run again."""
    partial = tmp_path / "qwen.partial"
    partial.mkdir()
    (partial / ".gpudoctor-partial.json").write_text('{"repo_id": "org/qwen", "revision": "abc"}')
    found = model_finding(str(tmp_path / "qwen"))
    assert "reboot" not in found["message"]
    assert f"but {partial} does: a restore (gpudoctor weights ensure) failed" in found["message"]
    assert found["remediation"].endswith(f"gpudoctor weights ensure org/qwen --to {tmp_path}/qwen")
    gone = model_finding(str(tmp_path / "other"))
    assert "a tmpfs is emptied by every reboot" in gone["message"]  # no .partial: as before


def test_check_ct_on_a_host_without_proxmox_says_so_and_names_flavor_lxc() -> None:
    """`check --ct 999` on a machine without Proxmox said "cannot start pct: No such file or
    directory", then "check the host named above"; fix said "not a Proxmox VE host (plain
    LXC: --flavor lxc)". check says so too now."""
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(d for d in dirs if not os.path.exists(os.path.join(d, "pct")))
    done = run("check", "--ct", "999", env={**os.environ, "PATH": path})
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line == (
        "gpudoctor: error: local/ct999: cannot start pct: this machine has no pct, it is not a"
        " Proxmox VE node; for a plain LXC container add --flavor lxc"
    )


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs filled to the last block (root: mount(8)); unmounted after."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        with open(mnt / "fill", "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\\0" * 4096)
                fh.flush()
        (mnt / "report").write_text("")  # an empty file fits: the -o probe passes
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize(
    "command",
    [["check", "--only", "proc", "-o"], ["bundle", "-o"], ["service", "rules", "-o"]],
    ids=["check", "bundle", "service-rules"],
)
def test_an_output_on_a_full_filesystem_names_the_path(full_fs: Path, command: list[str]) -> None:
    """`check -o` / `bundle -o` on a full filesystem said "No space left on device; check the
    path and its permissions" without the path; it names the path, as `report --out` does."""
    target = full_fs / "report"
    done = run(*command, str(target))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpudoctor: error: cannot write -o {target}: No space left on device; free space there"
        " or pick another path (a file already there is left as it was)"
    )


def _stub_plan(tmp_path: Path, model: Path, engine_extra: str = "") -> str:
    """Return a plan text for the stub server (tests/bench/stream_server.py)."""
    from tests.bench.campaign_support import stub_plan

    text = stub_plan(model, concurrency="[1]")
    return text.replace("stop_timeout_s = 5\n", f"stop_timeout_s = 5\n{engine_extra}")


def test_a_ready_path_without_a_slash_is_a_plan_error_not_a_gpudoctor_bug(tmp_path: Path) -> None:
    """`ready_path = "health"` said "InvalidURL ...; this is a gpudoctor bug" at the server's
    start; the plan is refused when it is read, naming the line and the key."""
    plan = tmp_path / "plan.toml"
    plan.write_text(_stub_plan(tmp_path, tmp_path, 'ready_path = "health"\n'))
    done = run("bench", str(plan), "--out", str(tmp_path / "run"))
    assert done.returncode == 1, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert "engine.ready_path: a path such as \"/health\" (starting with /), got 'health'" in line
    assert "gpudoctor bug" not in done.stderr and "InvalidURL" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_model_path_that_is_a_file_is_told_at_once(tmp_path: Path) -> None:
    """`[model] path` = a file failed after 9 s with "Repo id must be in the form ..."."""
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    plan = tmp_path / "plan.toml"
    plan.write_text(_stub_plan(tmp_path, weights))
    done = run("bench", str(plan), "--out", str(tmp_path / "run"))
    assert done.returncode == 1, done.stderr
    assert f"model.path {weights} is a file, not a model directory" in done.stderr
    assert "Repo id" not in done.stderr


@pytest.mark.parametrize("kind", ["bom", "latin1"])
def test_a_plan_with_a_bom_or_not_utf8_names_the_file_and_the_fix(
    tmp_path: Path, kind: str
) -> None:
    """A plan with a UTF-8 BOM said "Invalid statement (at line 1, column 1)"; one in
    Latin-1 a raw codec error without the file name. Both name the file and the fix, in
    `bench` and in `service install`."""
    text = _stub_plan(tmp_path, tmp_path).encode()
    data = b"\xef\xbb\xbf" + text if kind == "bom" else text.replace(b'"stub"', b'"st\xe9b"')
    plan = tmp_path / "plan.toml"
    plan.write_bytes(data)
    want = (
        f"{plan}: starts with a UTF-8 byte order mark (BOM)"
        if kind == "bom"
        else f"{plan}: not UTF-8: byte 0xe9 at line 1, column 11; save the plan as UTF-8"
    )
    for args in (["bench", str(plan), "--out", str(tmp_path / "run")],
                 ["service", "install", str(plan), "--out", str(tmp_path / "run"),
                  "--root", str(tmp_path / "root")]):  # fmt: skip
        (tmp_path / "root").mkdir(exist_ok=True)
        if args[0] == "service":  # the plan as the root's system sees it
            (tmp_path / "root" / "plan.toml").write_bytes(data)
            args[2] = "/plan.toml"
            want = want.replace(str(plan), f"{tmp_path / 'root'}/plan.toml")
        done = run(*args)
        assert done.returncode == 1, (args, done.stderr)
        assert want in done.stderr.strip().splitlines()[-1], done.stderr
        assert "Invalid statement" not in done.stderr and "codec" not in done.stderr


def test_compare_of_runs_of_different_plans_says_so(tmp_path: Path) -> None:
    """`bench compare` of runs of different plans: an empty table, hex keys only in A / only
    in B, exit 0. Now one line, exit 1: no cell in common, with each side's configs."""
    for name, config in (("a", "tp1-auto"), ("b", "ddtree-32")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        line = {"key": f"{name}" * 12, "config": config, "tp": 1, "concurrency": 4,
                "status": "ok", "measurement": {"metrics": {"output_throughput": 10.0},
                                                "completed": 4, "duration_s": 1.0}}  # fmt: skip
        (run_dir / "results.jsonl").write_text(json.dumps(line) + "\n")
    done = run("bench", "compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpudoctor: error: no cell in common: {tmp_path / 'a'} and {tmp_path / 'b'} ran"
        " different plans (A: config tp1-auto; B: config ddtree-32); compare two runs of the"
        " same plan"
    )
    assert "only in A" not in done.stdout


def test_a_server_failing_every_second_request_is_not_called_a_plan_error(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A server answering 500 to every 2nd request: bench said "fix the plan, not the load".
    It is an intermittent server error (half the requests succeeded), and says so."""
    from tests.bench.campaign_support import stub_plan

    plan = tmp_path / "plan.toml"
    plan.write_text(stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                              concurrency="[1, 2]", server_args="fail-every = 2"))  # fmt: skip
    done = run("bench", str(plan), "--out", str(tmp_path / "run"))
    text = done.stdout + done.stderr
    assert "all 2 cells: every cell failed the same way: HTTP 500" in text, text[-3000:]
    assert "fix the plan, not the load" not in text
    assert "succeeded: the server fails intermittently, not the plan: read its log" in text


def test_status_of_a_run_whose_cells_all_failed_is_not_ticked(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`bench status` of a run whose cells all FAILED showed the group box `[x]` (done and
    fine); it shows `[!]`."""
    from tests.bench.campaign_support import stub_plan

    plan = tmp_path / "plan.toml"
    plan.write_text(stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n',
                              concurrency="[1, 2]", server_args="reject-status = 500"))  # fmt: skip
    out = tmp_path / "run"
    run("bench", str(plan), "--out", str(out))
    done = run("bench", "status", str(out))
    assert done.returncode == 0, done.stderr
    assert "  [!] TP1: 0 done, 2 failed, 0 running, 0 pending" in done.stdout, done.stdout
    assert "[x] TP1" not in done.stdout


def test_status_shows_a_server_while_it_loads(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`bench status` showed nothing while a server loaded; "starting server X" is there,
    with no "on GPU -" on a machine without GPUs."""
    import signal
    import time

    from tests.bench.campaign_support import wait_no_leftovers
    from tests.cli.test_smaller_47 import loading_bench

    _, out, bench = loading_bench(tmp_path, tiny_model_dir)
    try:
        deadline = time.monotonic() + 120
        shown = ""
        while "starting server" not in shown and time.monotonic() < deadline:
            shown = run("bench", "status", str(out)).stdout  # polled: the launcher's own pace
        assert "        starting server a@tp1 (slot 0) since " in shown, shown
        assert "on GPU -" not in shown
    finally:
        bench.send_signal(signal.SIGINT)
        bench.wait(120)
    assert wait_no_leftovers(out) == []


def test_host_prep_for_plain_lxc_plans_a_follow_unit_that_runs_with_flavor_lxc(
    tmp_path: Path,
) -> None:
    """`fix --host-prep --flavor lxc --dry-run` planned a unit running `fix --follow-driver`
    without `--flavor lxc` / `--lxcpath`: on a plain LXC host that unit fails ("not a
    Proxmox VE node"). The unit passes them on. (A scratch systemd root: nothing of this
    machine's is touched.)"""
    root = tmp_path / "sysroot"
    (root / "etc/systemd/system").mkdir(parents=True)
    env = {**os.environ, "GPUDOCTOR_SYSTEMD_ROOT": str(root)}
    done = run("fix", "--host-prep", "--flavor", "lxc", "--lxcpath", "/srv/lxc", "--dry-run",
               env=env)  # fmt: skip
    assert done.returncode == 4, (done.stdout, done.stderr)
    starts = [ln for ln in done.stdout.splitlines() if "ExecStart=" in ln and "--follow" in ln]
    assert starts, done.stdout + done.stderr  # the unit is planned (gpudoctor is root's here)
    assert all("--flavor lxc --lxcpath /srv/lxc $GPUDOCTOR_FOLLOW_ARGS" in ln for ln in starts)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_fix_as_a_user_who_cannot_read_the_config_is_told_so(tmp_path: Path) -> None:
    """`fix` by a user who may not read the CT's config said "config does not exist"; it
    exists: permission denied. The CT's directory belongs to another user (nobody, 0700);
    gpudoctor runs as root without the capabilities that bypass file permissions
    (``setpriv --bounding-set -dac_override,-dac_read_search``), i.e. as a user does."""
    import shutil

    if not shutil.which("setpriv"):
        pytest.skip("setpriv is not installed (util-linux)")
    lxcpath = tmp_path / "lxc"
    (lxcpath / "ct1").mkdir(parents=True)
    (lxcpath / "ct1" / "config").write_text("lxc.uts.name = ct1\n")
    os.chown(lxcpath / "ct1", 65534, 65534)
    os.chmod(lxcpath / "ct1", 0o700)
    argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *GD, "fix",
            "--ct", "ct1", "--flavor", "lxc", "--lxcpath", str(lxcpath), "--dry-run"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpudoctor: error: cannot read {lxcpath}/ct1/config: permission denied; run it as root"
        " (sudo) or as the user who owns that file"
    )


def test_check_ct_on_a_host_without_a_driver_does_not_send_to_driver_libs_bind(
    tmp_path: Path,
) -> None:
    """`check --ct X --flavor lxc` on a host without a driver gave the remedy `fix ...
    --driver-libs bind`, which answers "no NVIDIA kernel module is loaded". The check says
    there is no host driver to bind yet (SKIP); with one loaded, the remedy stays."""
    lxcpath = tmp_path / "lxc"
    (lxcpath / "ct9").mkdir(parents=True)
    (lxcpath / "ct9" / "config").write_text("lxc.uts.name = ct9\n")
    args = ("check", "--ct", "ct9", "--flavor", "lxc", "--lxcpath", str(lxcpath), "--only",
            "driver.libs_mode", "--json")  # fmt: skip
    version = tmp_path / "version"  # the host's /proc/driver/nvidia/version, read through
    env = {**os.environ, "GPUDOCTOR_NVIDIA_VERSION_FILE": str(version)}  # this variable
    done = run(*args, env=env)
    (finding,) = json.loads(done.stdout)["findings"]
    assert finding["status"] == "SKIP", finding
    assert finding["message"].startswith(
        "the host has no NVIDIA kernel module loaded: there is no host driver to bind"
    )
    version.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Sep 25 2025\n"
    )
    (finding,) = json.loads(run(*args, env=env).stdout)["findings"]
    assert finding["status"] == "WARN" and finding["remediation"].endswith("--driver-libs bind")
