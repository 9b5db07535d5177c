"""A fleet run leaves the SSH connect timeout to the node's ssh config (its
``ConnectTimeout``, else 10 s) unless the run sets one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.fleet.execute import FleetSettings, open_node
from gpudoctor.fleet.inventory import NodeSpec


def test_the_ssh_config_connect_timeout_applies_in_fleet_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.write_text(
        "Host slowsite\n  HostName 127.0.0.1\n  ConnectTimeout 3\n"
        "Host plainsite\n  HostName 127.0.0.1\n"
    )
    monkeypatch.setenv("GPUDOCTOR_SSH_CONFIG", str(config))
    assert FleetSettings().connect_timeout_s is None
    slow = open_node(NodeSpec("pve1", "slowsite"), FleetSettings())
    plain = open_node(NodeSpec("pve2", "plainsite"), FleetSettings())
    forced = open_node(NodeSpec("pve1", "slowsite"), FleetSettings(connect_timeout_s=5))
    assert (slow.connect_timeout, plain.connect_timeout, forced.connect_timeout) == (3, 10, 5)
