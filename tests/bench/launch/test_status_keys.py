"""`bench status` counts cells by the keys the launcher gave them, whatever the depth of
--out, a copied run dir or a merge (issue 34.2).

The docs' example: a plan with a model path relative to the plan file, run with a
relative --out at another depth. `bench status` re-read RUN/plan.toml resolving that path
against the run dir, so every cell key differed: "0/2 cells, 2 pending" on a finished run.
Real launches of the stub server, the real CLI in subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.bench.campaign_support import stub_plan


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def _progress(run: Path, cwd: Path) -> dict:
    done = _cli("status", str(run), "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert all(g["pending"] == 0 for g in status["groups"]), status["groups"]
    return status["progress"]


def test_status_counts_a_finished_run_wherever_it_lies(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    project = tmp_path / "project"
    (project / "models").mkdir(parents=True)
    os.symlink(tiny_model_dir, project / "models" / "tiny")
    text = stub_plan(tiny_model_dir, configs='[[configs]]\nname = "a"\n', concurrency="[1, 2]")
    (project / "plan.toml").write_text(text.replace(f'"{tiny_model_dir}"', '"models/tiny"'))
    run = _cli("run", "plan.toml", "--out", "runs/deep/x", cwd=project)
    assert run.returncode == 0, run.stderr
    assert _progress(Path("runs/deep/x"), project) == {"recorded": 2, "total": 2}
    assert _progress(project / "runs" / "deep" / "x", tmp_path) == {"recorded": 2, "total": 2}
    copied = tmp_path / "elsewhere" / "copy"
    shutil.copytree(project / "runs" / "deep" / "x", copied)
    assert _progress(copied, tmp_path) == {"recorded": 2, "total": 2}
    merged = tmp_path / "merged"
    assert _cli("merge", str(copied), "--out", str(merged), cwd=tmp_path).returncode == 0
    assert _progress(merged, tmp_path) == {"recorded": 2, "total": 2}


def test_one_running_server_is_one_running_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    """34.8: a server sweeping `repeats = 3` at c=8 was listed as three identical lines
    ("running cb@tp1 c=8 on GPU 0 (slot 1) since ...") and "3 running". A server measures
    one cell at a time: one line, the other two pending. The launcher is a real process."""
    run = tmp_path / "run"
    run.mkdir()
    text = stub_plan(tiny_model_dir, configs='[[configs]]\nname = "cb"\n', concurrency="[8]")
    (run / "plan.toml").write_text("repeats = 3\n" + text)
    launcher = subprocess.Popen(["sleep", "300"])
    try:
        entry = {"label": "cb@tp1", "slot": 1, "gpus": ["GPU-0"], "gpu_indices": [0],
                 "concurrency": 8, "since": "2026-01-01T00:00:00Z",
                 "cell_since": "2026-01-01T00:01:00Z"}  # fmt: skip
        state = {"pid": launcher.pid, "running": [entry], "pool": {"gpus": ["GPU-0"]}}
        (run / "state.json").write_text(json.dumps(state))
        shown = _cli("status", str(run), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.count("running cb@tp1 c=8") == 1, shown.stdout
        assert "1 running, 2 pending" in shown.stdout, shown.stdout
    finally:
        launcher.kill()
        launcher.wait()
