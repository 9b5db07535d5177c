"""`gpudoctor check --model-dir` (model.present) and `gpudoctor weights status` agree on
what "complete" means (one rule: gpudoctor.weights.complete), and the remedy of
model.present names the --mirror that `ensure` was given (issue 13.8)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.weights.complete import completeness_problems, unfinished_problems
from gpudoctor.weights.manifest import ManifestFile
from tests.weights.conftest import REPO_ROOT, WeightsCli, make_model_files
from tests.weights.test_ensure_cli import REPO, publish


def check_verdict(directory: Path, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "check", "--only", "model.present", "--json",
         "--model-dir", str(directory)],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120,
    )  # fmt: skip
    findings = json.loads(done.stdout)["findings"]
    return next(f for f in findings if f["subject"] == str(directory))


def test_rule_is_sizes_then_leftovers() -> None:
    files = [ManifestFile("a.safetensors", 10), ManifestFile("uv.lock", 3)]
    sizes = {"a.safetensors": 10, "uv.lock": 3}
    assert completeness_problems(files, sizes, ["a.safetensors", "uv.lock"]) == []
    found = completeness_problems(files, {"a.safetensors": 9}, ["b.incomplete"], ["x.incomplete"])
    assert [(p.path, p.problem) for p in found] == [
        ("a.safetensors", "size"),
        ("uv.lock", "missing"),
        (".cache/huggingface/download/x.incomplete", "unfinished"),
        ("b.incomplete", "unfinished"),
    ]
    assert unfinished_problems(["x.lock"], listed=["x.lock"]) == []


def test_a_file_larger_than_its_manifest_size_is_not_complete() -> None:
    """Issue 27.1: a shard that grew (appended to, or another file's bytes) is as wrong as a
    short one; only the exact size counts."""
    files = [ManifestFile("a.safetensors", 10), ManifestFile("b.safetensors", 0)]
    found = completeness_problems(files, {"a.safetensors": 11, "b.safetensors": 1})
    assert [(p.path, p.problem, p.detail) for p in found] == [
        ("a.safetensors", "size", "is 11 bytes, manifest says 10"),
        ("b.safetensors", "size", "is 1 bytes, manifest says 0"),
    ]


def test_each_problem_has_a_detail_that_reads_after_its_path() -> None:
    """`weights status` prints each problem as `PROBLEM: PATH DETAIL`: a missing file reads
    `x missing`, a leftover `y.incomplete is an unfinished download` (never `None`)."""
    found = completeness_problems(
        [ManifestFile("a.safetensors", 10)], {}, ["b.partial"], ["c.incomplete"]
    )
    assert [f"{p.problem}: {p.path} {p.detail}" for p in found] == [
        "missing: a.safetensors missing",
        "unfinished: .cache/huggingface/download/c.incomplete is an unfinished download",
        "unfinished: b.partial is an unfinished download",
    ]


DAMAGE = {
    "intact": lambda d: None,
    "truncated shard": lambda d: (d / "model-00001-of-00003.safetensors").write_bytes(b"x"),
    "grown shard": lambda d: (d / "model-00002-of-00003.safetensors").open("ab").write(b"x"),
    "missing config": lambda d: (d / "config.json").unlink(),
    "leftover .incomplete": lambda d: (d / "model-00002.safetensors.incomplete").write_bytes(b"h"),
    "hf leftover": lambda d: (
        (d / ".cache/huggingface/download").mkdir(parents=True),
        (d / ".cache/huggingface/download/abc.incomplete").write_bytes(b"h"),
    ),
    "shard replaced by a directory": lambda d: (
        (d / "model-00003-of-00003.safetensors").unlink(),
        (d / "model-00003-of-00003.safetensors").mkdir(),
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_check_and_status_agree(hub, cli: WeightsCli, tmp_path: Path, damage: str) -> None:
    publish(hub, make_model_files())
    target = tmp_path / "model"
    assert cli.run("ensure", REPO, "--to", str(target), "-q").returncode == 0
    DAMAGE[damage](target)
    status = cli.run("status", str(target), "--json")
    finding = check_verdict(target, cli.env())
    complete = json.loads(status.stdout)["state"] == "complete"
    assert complete == (damage == "intact"), status.stdout
    assert (finding["status"] == "PASS") == complete, finding
    assert status.returncode == (0 if complete else 3)


def test_model_present_remedy_names_the_mirror(hub, cli: WeightsCli, tmp_path: Path) -> None:
    """After a reboot empties the tmpfs, check says how to restore it: from the mirror."""
    publish(hub, make_model_files())
    target, mirror = tmp_path / "shm" / "model", tmp_path / "mirror"
    env = {"GPUDOCTOR_STATE_DIR": str(tmp_path / "state")}
    run = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "-q", env=env)
    assert run.returncode == 0, run.output
    shutil.rmtree(target)  # the reboot
    finding = check_verdict(target, cli.env(env))
    assert finding["status"] == "FAIL"
    assert finding["remediation"] == (
        f"gpudoctor weights ensure {REPO} --to {target} --mirror {mirror}"
    )
    restore = cli.run(*finding["remediation"].split()[2:], env={**env, "HF_HUB_OFFLINE": "1"})
    assert restore.returncode == 0 and "restored from mirror" in restore.stdout, restore.output


def test_to_proc_is_one_clean_line_before_any_work(cli: WeightsCli) -> None:
    """`ensure --to /proc/x`: one line, exit 1, no traceback, no request (issue 13.2)."""
    run = cli.run("ensure", REPO, "--to", "/proc/x")
    assert run.returncode == 1 and "Traceback" not in run.output
    assert run.stderr.strip().count("\n") == 0 and "/proc/x" in run.stderr
    assert cli.hub.requests == []
