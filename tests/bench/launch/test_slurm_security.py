"""Attacks on ``bench submit --slurm --out DIR`` (issue 33.2, 33.11) against a real Slurm on
127.0.0.1 (tests/lab/slurm.py): a second user (``nobody`` through ``setpriv``) prepares the
campaign directory in a real 1777 directory, or names the plan; root submits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpudoctor.bench.plan import load_plan
from tests.bench.campaign_support import write
from tests.bench.launch import test_slurm_lab
from tests.bench.launch.test_out_security import _one_line_error, as_nobody
from tests.bench.launch.test_packing import packed_plan, tp1_configs
from tests.bench.launch.test_slurm_lab import _bench, _env, _wait_job_gone
from tests.lab.slurm import SlurmCluster

slurm = test_slurm_lab.slurm  # the real one-node Slurm fixture
VICTIM_TEXT = "root's precious file\n"


def _public(public_tmp_path: Path) -> Path:
    point = public_tmp_path / "public"
    point.mkdir()
    os.chmod(point, 0o1777)
    return point


def _queue(cluster: SlurmCluster) -> str:
    return cluster.run("squeue", "-h", "-o", "%i %j").stdout.strip()


def test_a_campaign_dir_another_user_prepared_is_refused_before_sbatch(
    slurm: SlurmCluster,
    public_tmp_path: Path,
    tmp_path: Path,
    tiny_model_dir: Path,
) -> None:
    """Attack: nobody makes DIR first in /tmp, with ``slurm/logs/shard-1-<id>.log`` links to
    a root file for the next job ids (the task truncated and wrote it as root) and an
    ``array.sh`` they may swap before ``sbatch`` reads it. Root's ``bench submit --slurm
    --out DIR`` is refused with one line, before any job is queued, the victim untouched."""
    public = _public(public_tmp_path)
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    campaign = public / "campaign"
    links = " && ".join(
        f"ln -s {victim} {campaign}/slurm/logs/shard-1-{job}.log" for job in range(1, 40)
    )
    as_nobody(f"mkdir -p -m 0777 {campaign}/slurm/logs && {links} && "
              f"printf '#!/bin/sh\\necho pwned > {public}/pwned\\n' > {campaign}/slurm/array.sh")  # fmt: skip
    plan_path = write(tmp_path, packed_plan(tiny_model_dir, tp1_configs(2)))
    (tmp_path / "locks").mkdir()
    env = _env(slurm, tmp_path / "locks")
    done = _bench(env, "submit", "--slurm", str(plan_path), "--out", str(campaign), "--shards", "1")
    line = _one_line_error(done, "belongs to nobody (uid 65534)")
    assert str(campaign) in line and "--out" in line
    assert _queue(slurm) == ""  # nothing reached Slurm
    assert victim.read_text() == VICTIM_TEXT
    # a root-owned DIR whose slurm/ another user owns (left behind, or chown'ed) is refused too
    mine = tmp_path / "mine"
    (mine / "slurm").mkdir(parents=True)
    os.chown(mine / "slurm", 65534, 65534)
    again = _bench(env, "submit", "--slurm", str(plan_path), "--out", str(mine), "--shards", "1")
    assert "/slurm (the campaign's slurm/) belongs to nobody" in _one_line_error(again, "slurm")
    assert _queue(slurm) == ""


def test_the_plan_name_cannot_add_a_line_to_the_array_script(
    slurm: SlurmCluster,
    tmp_path: Path,
    tiny_model_dir: Path,
) -> None:
    """Attack: a plan named ``x\\ntouch MARKER`` (TOML allows the escape): its name went raw
    into a comment line of array.sh, so every array task ran ``touch MARKER`` as root. The
    script Slurm stored (``scontrol write batch_script``) holds no such line."""
    marker = tmp_path / "pwned"
    text = packed_plan(tiny_model_dir, tp1_configs(1))
    assert text.count('name = "') >= 1
    plan_path = write(tmp_path, text.replace('name = "', f'name = "x\\ntouch {marker}\\n', 1))
    assert "\n" in load_plan(plan_path).name
    (tmp_path / "locks").mkdir()
    env = _env(slurm, tmp_path / "locks")
    out = tmp_path / "campaign"
    done = _bench(env, "submit", "--slurm", str(plan_path), "--out", str(out), "--shards", "1",
                  "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    sub = json.loads(done.stdout)
    job = sub["array_job"]
    stored = slurm.run("scontrol", "write", "batch_script", f"{job}_1", "-").stdout
    assert stored == (out / "slurm" / "array.sh").read_text()
    assert not any(ln.startswith("touch") for ln in stored.splitlines()), stored
    assert "x\\x0atouch" in stored
    _wait_job_gone(slurm, job)
    _wait_job_gone(slurm, sub["merge_job"])
    assert not marker.exists()


def test_edited_submissions_never_reach_slurm_as_anything_but_job_ids(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Suspected (issue 33): a submissions.jsonl whose ``array_job`` is ``--help``,
    ``1,2`` or ``1 --me`` fed squeue/scontrol/sacct arguments. Only digit job ids are read;
    ``bench status`` answers from the real Slurm with the rest left out."""
    out = tmp_path / "campaign"
    (out / "slurm").mkdir(parents=True)
    (out / "shards" / "1").mkdir(parents=True)
    lines = [
        {"array_job": bad, "shards": 1, "tasks": [1]} for bad in ("--help", "1,2", "1 --me", True)
    ]
    lines.append({"array_job": "4242", "shards": 1, "tasks": [1]})
    (out / "slurm" / "submissions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    from gpudoctor.bench.launch.slurm import read_submissions

    assert [s["array_job"] for s in read_submissions(out)] == ["4242"]
    env = _env(slurm, tmp_path)
    shown = _bench(env, "status", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    seen = json.loads(shown.stdout)["slurm"]
    assert [s["array_job"] for s in seen["submissions"]] == ["4242"]
    assert "--help" not in json.dumps(seen) and "--me" not in json.dumps(seen)


def test_a_submit_without_slurm_clients_makes_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`bench submit --slurm` on a machine without sbatch (not a Slurm login node): one line
    naming sbatch and the package, exit 1, and no --out directory or slurm/ left behind."""
    plan_path = write(tmp_path, packed_plan(tiny_model_dir, tp1_configs(2)))
    out = tmp_path / "campaign"
    empty_path = tmp_path / "bin"
    empty_path.mkdir()  # PATH with no Slurm client in it
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "bench", "submit", "--slurm", str(plan_path),
         "--out", str(out), "--shards", "2"],
        capture_output=True, text=True, env={**os.environ, "PATH": str(empty_path)}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "gpudoctor: error: sbatch not found: is this a Slurm login node? (apt install"
        " slurm-client); run it again with --debug for the details"
    )
    assert not out.exists()
