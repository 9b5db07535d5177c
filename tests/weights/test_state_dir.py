"""The suite never writes gpudoctor's system state (``/var/lib/gpudoctor``) on the machine
that runs it (issue 26.12): ``tests/conftest.py`` moves it with ``GPUDOCTOR_STATE_DIR``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpudoctor.weights.record import RECORD_NAME, record_path
from tests.conftest import REAL_WEIGHTS_RECORD
from tests.weights.conftest import WeightsCli, make_model_files
from tests.weights.test_ensure_cli import REPO, publish


def test_state_dir_is_a_temporary_one_under_pytest(private_state_dir: Path) -> None:
    assert os.environ["GPUDOCTOR_STATE_DIR"] == str(private_state_dir)
    assert record_path() == private_state_dir / RECORD_NAME
    assert record_path() != REAL_WEIGHTS_RECORD


def test_default_state_dir_is_var_lib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUDOCTOR_STATE_DIR")
    assert record_path() == REAL_WEIGHTS_RECORD


def test_ensure_as_root_records_in_the_temporary_state_dir(
    hub, cli: WeightsCli, tmp_path: Path, private_state_dir: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the record is written only by root")
    publish(hub, make_model_files())
    target = tmp_path / "model"
    run = cli.run("ensure", REPO, "--to", str(target), "-q")
    assert run.returncode == 0, run.output
    doc = json.loads((private_state_dir / RECORD_NAME).read_text())
    assert doc["targets"][str(target)]["repo_id"] == REPO
    if REAL_WEIGHTS_RECORD.exists():
        assert str(target) not in REAL_WEIGHTS_RECORD.read_text()
