"""``weights ensure`` repairing a model with no Hub reachable (issue 34 item 7): the error
names the real cause, never "HF_HUB_OFFLINE is set" when it is not, and the user's model
directory keeps its name (it used to be left renamed to ``TARGET.partial``).

A real process against the loopback Hub stand-in, stopped after the first download: its
port then refuses connections as a Hub that is down does."""

from __future__ import annotations

import os
from pathlib import Path

from tests.weights.conftest import WeightsCli, dir_files, make_model_files
from tests.weights.hub_server import HubServer
from tests.weights.test_ensure_cli import REPO, assert_one_line_error, publish

SHARD = "model-00002-of-00003.safetensors"


def test_repair_with_hub_down_names_the_cause_and_keeps_the_target(
    hub: HubServer, cli: WeightsCli, tmp_path: Path
) -> None:
    files = make_model_files()
    publish(hub, files)
    target = tmp_path / "model"
    first = cli.run("ensure", REPO, "--to", str(target))
    assert first.returncode == 0, first.output
    os.truncate(target / SHARD, 1000)  # damaged: the next ensure repairs it from the Hub
    before = dir_files(target)
    url = hub.url
    hub.stop()

    run = cli.run("ensure", REPO, "--to", str(target))

    assert_one_line_error(run, f"cannot reach the Hub at {url}")
    assert "HF_HUB_OFFLINE" not in run.stderr and "ConnectError" in run.stderr
    assert sorted(os.listdir(tmp_path)) == ["hf-home", "hub-storage", "model"]  # no .partial
    after = dir_files(target)
    intact = {k: v for k, v in before.items() if k != SHARD}
    assert after == intact  # every good file and the manifest kept; the cut shard gone
    status = cli.run("status", str(target))
    assert status.returncode == 3 and f"missing: {SHARD}" in status.stdout, status.output
