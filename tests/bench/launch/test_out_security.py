"""Attacks on ``bench --out`` (and ``bench report`` / ``compare``) through a world-writable
directory (issue 22.1).

Each test makes a real directory with mode 1777 (as /tmp and /dev/shm are), lets a
second user (``nobody``, through ``setpriv``) plant a run directory or links there, then
runs the real CLI as root in a subprocess and asserts that the attack fails: one error
line, and the victim file untouched. The pytest tmp directory (0700) is opened to
``nobody`` only down to the 1777 directory (``x`` for others, nothing more).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import RunDir, RunDirError
from tests.bench.campaign_support import stub_plan, write
from tests.fakes import mkdir_race

REPO_ROOT = Path(__file__).resolve().parents[3]

NOBODY = 65534
RUN_FILES = ("plan.toml", "results.jsonl", ".lock", "preflight.jsonl", "superseded.jsonl",
             "run.json")  # fmt: skip
VICTIM_TEXT = "root's precious file\n"


def as_nobody(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``sh -c script`` as uid/gid 65534 with no supplementary groups (the attacker)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as a second user")
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    return subprocess.run([*command, "sh", "-c", script], check=True, capture_output=True,
                          text=True)  # fmt: skip


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=180, env=env)  # fmt: skip


def _one_line_error(proc: subprocess.CompletedProcess[str], needle: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def public(public_tmp_path: Path) -> Path:
    """A real directory with mode 1777 (like /tmp), reachable by ``nobody`` (under the
    suite's 0711 ``public_tmp_path``, never pytest's tmp root)."""
    point = public_tmp_path / "public"
    point.mkdir()
    os.chmod(point, 0o1777)
    return point


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A root-owned file an attacker wants root to overwrite, append to or truncate."""
    path = tmp_path / "victim"
    path.write_text(VICTIM_TEXT + "torn tail without newline")
    return path


def _plant_run_dir(public: Path, victim: Path) -> Path:
    run = public / "run"
    links = " && ".join(f"ln -s {victim} {run}/{name}" for name in (*RUN_FILES, "plan.toml.tmp"))
    as_nobody(f"mkdir -m 0777 {run} {run}/logs {run}/raw && {links} && "
              f"ln -s {victim} {run}/logs/a.log && ln -s {victim} {run}/raw/k.jsonl")  # fmt: skip
    return run


def test_run_dir_planted_by_another_user_is_refused(
    public: Path, victim: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Attack: nobody runs `mkdir /tmp/x/run && ln -s /victim /tmp/x/run/plan.toml.tmp`
    (and results.jsonl, .lock, preflight.jsonl, superseded.jsonl, logs/<label>.log,
    raw/<key>.jsonl); root runs `gpudoctor bench plan.toml --out /tmp/x/run`, which wrote
    the plan (and appended, truncated the torn tail) through those links into /victim."""
    run = _plant_run_dir(public, victim)
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    before = victim.read_bytes()
    line = _one_line_error(_cli(str(plan), "--out", str(run)), "belongs to nobody (uid 65534)")
    assert str(run) in line and "choose another --out" in line
    dry = _cli(str(plan), "--out", str(run), "--dry-run", "--no-validate")
    _one_line_error(dry, "belongs to nobody (uid 65534)")
    assert victim.read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == sorted(
        [*RUN_FILES, "plan.toml.tmp", "logs", "raw"]
    )


def test_run_dir_that_others_can_write_is_refused(
    public: Path, victim: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Attack: root's own run directory left mode 0777 (or made 1777 like /tmp): nobody
    replaces results.jsonl by a link to /victim between two launches; the resume wrote
    through it. A run directory others can write is refused, sticky or not."""
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    for mode in (0o777, 0o1777):
        run = public / f"run-{mode:o}"
        run.mkdir()
        os.chmod(run, mode)
        as_nobody(f"ln -s {victim} {run}/results.jsonl")
        line = _one_line_error(_cli(str(plan), "--out", str(run)), "is writable by others")
        assert f"mode {mode:04o}" in line
    assert victim.read_text() == VICTIM_TEXT + "torn tail without newline"


def test_run_dir_that_is_a_planted_symlink_is_refused(
    public: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Attack: nobody plants /tmp/x/run -> /root/somewhere (a root-owned directory);
    root's `bench --out /tmp/x/run` wrote its plan, logs and results there."""
    target = tmp_path / "roots-dir"
    target.mkdir()
    as_nobody(f"ln -s {target} {public}/run")
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    _one_line_error(_cli(str(plan), "--out", str(public / "run")), "is a symlink")
    assert list(target.iterdir()) == []


def test_run_dir_under_a_directory_of_another_user_is_refused(
    public: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Attack: nobody makes /tmp/x (theirs, 0755) and root runs `--out /tmp/x/run`: root
    creates run/ itself, but nobody can rename it away and put a prepared one in place."""
    as_nobody(f"mkdir -m 0755 {public}/x")
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    line = _one_line_error(_cli(str(plan), "--out", str(public / "x" / "run")), "belongs to nobody")
    assert "above --out" in line
    assert not (public / "x" / "run").exists()


def test_a_link_planted_as_an_existing_parent_of_out_is_refused_not_followed(
    public: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Attack (issue 33.3): nobody plants /tmp/x/runs -> a root-only directory; root's
    `bench --out /tmp/x/runs/r1` (the parent exists: it is a link) made its run there, and
    `bench report --out` too. The link is judged (another user's: refused), not followed."""
    chosen = tmp_path / "root-only"
    chosen.mkdir(mode=0o700)
    as_nobody(f"ln -s {chosen} {public}/runs")
    plan = write(tmp_path, stub_plan(tiny_model_dir, concurrency="[1]"))
    line = _one_line_error(_cli(str(plan), "--out", str(public / "runs" / "r1")), "is a symlink")
    assert "nobody (uid 65534)" in line and "above --out" in line
    assert list(chosen.iterdir()) == []


@pytest.mark.parametrize("name", ["plan.toml", "run.json", "logs", "raw"])
def test_a_link_inside_a_trusted_run_dir_is_never_followed(
    name: str, victim: Path, tmp_path: Path
) -> None:
    """Attack: a link at a run file of root's own run directory (left by an earlier,
    untrusted copy of the directory): plan.toml -> /etc/shadow was copied into
    plan-before-*.toml, a logs/ or raw/ link to another directory got the server log and
    raw records written there. Every run file is opened without following links."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere if name in ("logs", "raw") else victim, run / name)
    before = victim.read_bytes()
    with pytest.raises(RunDirError) as caught, RunDir(run) as rundir:
        rundir.open("name = 'new'\n", resume=True)
        rundir.append({"key": "k1", "status": "ok"})
        rundir.append_preflight({"ok": True})
        rundir.write_run_json({"tag": "t"})
        rundir.drop_records({"k1"})
        rundir.log_path("a")
        rundir.raw_path("k1")
    assert "\n" not in str(caught.value) and "symlink" in str(caught.value)
    assert victim.read_bytes() == before
    assert list(elsewhere.iterdir()) == []
    assert not list(run.glob("plan-before-*"))


def _tiny_run(path: Path) -> Path:
    path.mkdir()
    record = {"key": "k1", "config": "a", "tp": 1, "concurrency": 1, "status": "ok",
              "measurement": {"output_throughput": 1.0, "duration_s": 1.0},
              "raw": "raw/k1.jsonl"}  # fmt: skip
    (path / "results.jsonl").write_text(json.dumps(record) + "\n")
    return path


def test_report_into_a_directory_of_another_user_is_refused(
    public: Path, victim: Path, tmp_path: Path
) -> None:
    """Attack: nobody makes /tmp/x/rep with report.md -> /victim; root runs
    `bench report RUN --out /tmp/x/rep`, which wrote report.md through the link."""
    run = _tiny_run(tmp_path / "run")
    as_nobody(f"mkdir {public}/rep && ln -s {victim} {public}/rep/report.md")
    before = victim.read_bytes()
    _one_line_error(_cli("report", str(run), "--out", str(public / "rep")), "belongs to nobody")
    assert victim.read_bytes() == before


def test_a_parent_of_out_nobody_makes_before_roots_mkdir_is_refused(
    public: Path, tmp_path: Path
) -> None:
    """Attack (issue 46.4): root runs ``bench report RUN --out /tmp/reports/r1``;
    ``reports`` is missing, root judged ``/tmp``, and nobody's real ``mkdir reports`` lands
    right before root's (that moment forced by tests/fakes/mkdir_race.py). On the code
    before, root wrote the report into ``reports/r1`` inside nobody's directory."""
    run = _tiny_run(tmp_path / "run")
    env = {**os.environ, "COLUMNS": "200", "GPUDOCTOR_RACE_NAME": "reports"}
    proc = subprocess.run(
        [sys.executable, "-c", mkdir_race.PRELUDE, "bench", "report", str(run), "--out",
         str(public / "reports" / "r1")],
        capture_output=True, text=True, timeout=180, env=env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert os.stat(public / "reports").st_uid == NOBODY  # nobody won the race, as forced
    _one_line_error(proc, f"{public}/reports (above --out) belongs to nobody (uid 65534)")
    assert os.listdir(public / "reports") == []


def test_report_and_compare_never_read_through_a_link(victim: Path, tmp_path: Path) -> None:
    """Attack: a run directory whose results.jsonl is a link to a file only root may read
    (/etc/shadow): `bench report` / `compare` read it through the link (and report.md,
    written next to it, showed what it parsed). A raw path of ../../victim was read too."""
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(victim, run / "results.jsonl")
    for args in (("report", str(run)), ("compare", str(run), str(run))):
        _one_line_error(_cli(*args), "is a symlink")
    assert not (run / "report.md").exists()

    from gpudoctor.bench.results.noise import load_sample

    victim.write_text(json.dumps({"run_id": None, "ok": True}) + "\n")
    assert load_sample(tmp_path / "run", "../victim", None, 1.0) is None
