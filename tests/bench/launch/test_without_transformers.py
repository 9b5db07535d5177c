"""``pip install 'gpudoctor[plots]'`` (or no extra) and a bench run: the load generator
reads the model's tokenizer with transformers, which only the ``bench`` extra brings.
Issue 44: the run started the server, then died with ``ModuleNotFoundError ...; this is a
gpudoctor bug``. Now ``bench run`` and ``--dry-run`` say what to install before anything
starts.

Not installing transformers in a venv of its own (a minute of pip per run): the child
blocks the import the way Python reports a missing package (``sys.modules`` entry None
makes ``import transformers`` raise ImportError), which is all gpudoctor can see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.bench.campaign_support import stub_plan, write

RUN_WITHOUT_TRANSFORMERS = (
    "import sys, runpy; sys.modules['transformers'] = None; "
    "sys.argv = ['gpudoctor', *sys.argv[1:]]; runpy.run_module('gpudoctor', run_name='__main__')"
)


def gd_without_transformers(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``gpudoctor ARGS`` in a Python where transformers cannot be imported."""
    return subprocess.run([sys.executable, "-c", RUN_WITHOUT_TRANSFORMERS, *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_run_without_transformers_says_what_to_install_before_any_server_starts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir))
    out = tmp_path / "run"
    done = gd_without_transformers("bench", "run", str(plan), "--out", str(out))
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gpudoctor: error: the load generator needs transformers")
    assert "pip install 'gpudoctor[bench]'" in last and "gpudoctor bug" not in done.stderr
    assert not (out / "servers.jsonl").exists()  # no server was started


def test_the_dry_run_names_the_missing_package_too(tmp_path: Path, tiny_model_dir: Path) -> None:
    plan = write(tmp_path, stub_plan(tiny_model_dir))
    done = gd_without_transformers("bench", "run", str(plan), "--dry-run")
    assert "pip install 'gpudoctor[bench]'" in done.stdout + done.stderr
    assert done.returncode != 0
