"""`gpudoctor weights ensure` against olah, a real third-party Hub mirror server (offline).

olah covers plain snapshot downloads and revision pinning; the rest (Range, request
counting, fault injection) is tested against tests/weights/hub_server.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import lab_unavailable
from tests.weights.conftest import WeightsCli, dir_files, make_model_files, model_part
from tests.weights.olah_hub import OlahServer, olah_cli

pytestmark = pytest.mark.lab


@pytest.fixture
def olah(tmp_path: Path):
    cli = olah_cli()
    if cli is None:
        lab_unavailable("olah is not installed (python3 -m venv /opt/olah-venv && "
                        "/opt/olah-venv/bin/pip install olah==0.5.4)")  # fmt: skip
    server = OlahServer(tmp_path / "olah", cli)
    (tmp_path / "olah").mkdir()
    try:
        yield server
    finally:
        server.stop()


def test_snapshot_and_revision_pinning_from_olah(
    olah: OlahServer, cli: WeightsCli, tmp_path
) -> None:
    v1 = make_model_files(seed=1)
    v2 = {**v1, "config.json": b'{"v": 2}\n'}
    shards = {p for p in v1 if p.endswith(".safetensors")}
    repo = olah.repo("acme/tiny")
    sha1 = repo.commit(v1, lfs=shards, tag="v1.0")
    sha2 = repo.commit(v2, lfs=shards)
    cli.endpoint = olah.start()

    latest = cli.run(
        "ensure", "acme/tiny", "--to", str(tmp_path / "latest"), "--verify", "full", "--json"
    )
    pinned = cli.run(
        "ensure", "acme/tiny", "--to", str(tmp_path / "v1"), "--revision", "v1.0", "--json"
    )
    by_sha = cli.run(
        "ensure", "acme/tiny", "--to", str(tmp_path / "sha"), "--revision", sha1, "--json"
    )

    for run in (latest, pinned, by_sha):
        assert run.returncode == 0, run.output
    assert json.loads(latest.stdout)["revision"] == sha2
    assert json.loads(pinned.stdout)["revision"] == sha1 == json.loads(by_sha.stdout)["revision"]
    assert model_part(dir_files(tmp_path / "latest")) == v2
    assert model_part(dir_files(tmp_path / "v1")) == v1 == model_part(dir_files(tmp_path / "sha"))
    again = cli.run(
        "ensure", "acme/tiny", "--to", str(tmp_path / "v1"), "--revision", sha1[:8], "--json"
    )
    assert json.loads(again.stdout)["action"] == "none"
