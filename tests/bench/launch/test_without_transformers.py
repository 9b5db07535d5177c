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


def test_a_chat_workload_on_a_model_without_a_chat_template_is_refused_before_a_server_starts(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Found with the real vLLM (issue 44): ``api = "chat"`` on a base model ended in a
    transformers ValueError and "run it again with --debug", after the server had started."""
    import shutil

    base = tmp_path / "base-model"
    shutil.copytree(tiny_model_dir, base)
    (base / "chat_template.jinja").unlink()
    plan = write(
        tmp_path,
        stub_plan(
            base,
            workload='api = "chat"\ninput_len = 16\noutput_len = 2\nnum_prompts = 2\nwarmup = 0',
        ),
    )
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "run", str(plan), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        'workload.api = "chat" needs a chat template' in last and 'use api = "completions"' in last
    )
    assert "--debug" not in last and not (out / "servers.jsonl").exists()
    with_template = write(
        tmp_path,
        stub_plan(
            tiny_model_dir,
            workload='api = "chat"\ninput_len = 16\noutput_len = 2\nnum_prompts = 2\nwarmup = 0',
        ),
        "ok.toml",
    )
    dry = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "run", str(with_template), "--dry-run"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "chat template" not in dry.stdout + dry.stderr
