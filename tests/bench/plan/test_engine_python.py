"""``[engine] python``: a relative interpreter path is the plan's, as ``[model] path`` is
(issue 44: a relative venv python was looked up from the current directory and the plan
read as "vllm (not installed)")."""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath

import pytest

from gpudoctor.bench.plan import load_plan, parse_plan

PLAN = """\
name = "p"
[model]
path = "model"
[engine]
name = "vllm"
{python}
[axes]
concurrency = [1]
[[configs]]
name = "a"
"""


def _plan(tmp_path: Path, python_line: str) -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.format(python=python_line))
    return path


def test_a_relative_python_is_joined_to_the_plans_directory_without_following_the_venv_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    link = tmp_path / "venv" / "bin" / "python"
    link.symlink_to(sys.executable)  # a venv's python: a link to the base interpreter
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not the plan's directory
    plan = load_plan(_plan(tmp_path, 'python = "./venv/../venv/bin/python"'))
    assert plan.engine.python == str(link)
    assert os.path.realpath(plan.engine.python) != plan.engine.python  # the link was kept


@pytest.mark.parametrize("python", ["python3", "/usr/bin/python3"])
def test_a_bare_name_or_an_absolute_path_is_kept_as_written(tmp_path: Path, python: str) -> None:
    plan = load_plan(_plan(tmp_path, f'python = "{python}"'))
    assert plan.engine.python == python


def test_no_python_stays_none(tmp_path: Path) -> None:
    assert load_plan(_plan(tmp_path, "")).engine.python is None


def test_a_plan_read_for_another_root_joins_lexically() -> None:
    text = PLAN.format(python='python = "../envs/v/bin/python"')
    plan = parse_plan(text, "plan.toml", base_dir=PurePosixPath("/srv/plans"))  # type: ignore[arg-type]
    assert plan.engine.python == "/srv/envs/v/bin/python"
