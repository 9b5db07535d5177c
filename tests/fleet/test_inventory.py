"""The inventory file, ``--ct`` narrowing, and the selection of GPU CTs on real configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.fleet.inventory import (
    CtSpec,
    Inventory,
    InventoryError,
    NodeSpec,
    gpu_passthrough_evidence,
    load_inventory_file,
    parse_inventory,
    split_patterns,
)
from gpudoctor.pve.config import parse
from tests.recorded import RECORDED

COMMUNITY = RECORDED / "community"
NVIDIA_CONFIGS = [
    "bslc-ct100-cgroupv1.conf", "chrnnk-equals-syntax.conf", "frigate-8652-ct2051.conf",
    "gma1n-jellyfin-lxc.conf", "homestudiosdiy-105.conf", "jammsen-101.conf",
    "jammsen-231.conf", "loeeeee-lxc-gpu-passthrough.conf", "rpufky-xplex-ct850.conf",
    "schmidt-silas-inline-comments.conf", "telmate-1138.conf",
    "wolf-quickstart-nvidia-devN.conf",
]  # fmt: skip
OTHER_CONFIGS = [
    "charlzyx-102-snapshot-cgroupv1.conf", "frigate-4857-ct101-intel-legacy.conf",
    "hewittmd97-100-description-devN.conf", "wolf-quickstart-base.conf",
]  # fmt: skip

EXAMPLE = """
[defaults]
user = "admin"
known_hosts = "~/.ssh/known_hosts_pve"

[[nodes]]
name = "pve1"
ssh = "root@10.0.0.11"
cts = [200, 201, "202"]

[[nodes]]
name = "pve2"
cts = [300]
identity_file = "/keys/pve2"

[[nodes]]
name = "box"
ssh = "root@10.0.0.20:2222"
flavor = "lxc"
lxcpath = "/srv/lxc"
cts = ["llm-a", "llm-b", "web"]
"""


def test_example_inventory_parses_every_field() -> None:
    inv = parse_inventory(EXAMPLE, "file hosts.toml")
    assert [n.name for n in inv.nodes] == ["pve1", "pve2", "box"]
    pve1, pve2, box = inv.nodes
    assert (pve1.ssh, pve1.flavor, pve1.lxcpath) == ("root@10.0.0.11", "pve", None)
    assert pve2.ssh == "admin@pve2"  # <user>@<name> from [defaults]
    assert pve2.identity_file == "/keys/pve2"
    assert pve1.known_hosts == str(Path("~/.ssh/known_hosts_pve").expanduser())
    assert (box.flavor, box.lxcpath, box.ssh) == ("lxc", "/srv/lxc", "root@10.0.0.20:2222")
    assert [c.ct for c in inv.cts_of("pve1")] == ["200", "201", "202"]
    assert [c.label for c in inv.cts_of("box")] == ["box/llm-a", "box/llm-b", "box/web"]
    assert inv.cts_of("pve2")[0].label == "pve2/ct300"
    assert inv.source == "file hosts.toml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[nodes]]\nname = 'a'\ncts = ['x']\n", "Proxmox CT ids are numbers"),
        ("[[nodes]]\nname = 'a'\nflavor = 'docker'\n", "flavor 'docker'"),
        ("[[nodes]]\nssh = 'root@h'\n", "`name` is required"),
        ("[[nodes]]\nname = 'a'\nctz = [1]\n", "unknown key(s) ctz"),
        ("[[nodes]]\nname = 'a'\n[[nodes]]\nname = 'a'\n", "listed twice"),
        ("[defaults]\nflavor = 'pve'\n", "no [[nodes]]"),
        ("[[nodes]\nname = 'a'\n", "not valid TOML"),
        ("[[nodes]]\nname = 'a'\ncts = 200\n", "`cts` must be a list"),
    ],
)
def test_bad_inventories_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(InventoryError, match=r"^inv") as exc:
        parse_inventory(text, "inv")
    assert message in str(exc.value)
    assert "\n" not in str(exc.value).strip() or "TOML" in str(exc.value)


def test_load_inventory_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(EXAMPLE)
    assert len(load_inventory_file(str(path)).cts) == 7
    with pytest.raises(InventoryError, match="cannot read inventory"):
        load_inventory_file(str(tmp_path / "missing.toml"))


def test_narrowing_by_ids_names_globs_and_node() -> None:
    inv = parse_inventory(EXAMPLE)
    named = inv.narrowed(["llm-*"])
    assert [c.ct for c in named.cts] == ["llm-a", "llm-b"]
    assert [n.name for n in named.nodes] == ["box"]  # nodes without a kept CT are dropped
    assert [c.ct for c in inv.narrowed(["20?"]).cts] == ["200", "201", "202"]
    assert [c.ct for c in inv.narrowed(["pve1/201", "300"]).cts] == ["201", "300"]
    assert inv.narrowed([]) is inv
    assert inv.narrowed(["nothing*"]).cts == ()
    named_ct = CtSpec("pve1", "200", name="ollama")
    assert named_ct.label == "pve1/ct200"
    by_name = Inventory((NodeSpec("pve1", "root@pve1"),), (named_ct,)).narrowed(["oll*"])
    assert by_name.cts == (named_ct,)


def test_split_patterns() -> None:
    assert split_patterns(("200,201", " llm-* ", "")) == ("200", "201", "llm-*")


@pytest.mark.parametrize("name", NVIDIA_CONFIGS)
def test_real_nvidia_configs_are_selected(name: str) -> None:
    config = parse((COMMUNITY / name).read_text())
    evidence = gpu_passthrough_evidence(config.pairs())
    assert evidence, name
    assert all("nvidia" in line or " 195:" in line for line in evidence)


@pytest.mark.parametrize("name", OTHER_CONFIGS)
def test_configs_without_nvidia_are_not_selected(name: str) -> None:
    config = parse((COMMUNITY / name).read_text())
    assert gpu_passthrough_evidence(config.pairs()) == ()


def test_selection_kinds_and_custom_pattern() -> None:
    pairs = [
        ("lxc.mount.entry", "/dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file"),
        ("dev3", "/dev/nvidia0,gid=44"),
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 226:* rwm"),
        ("lxc.mount.entry", "/dev/dri dev/dri none bind,optional,create=dir"),
        ("hostname", "nvidia-box"),  # a name is not a device
    ]
    assert gpu_passthrough_evidence(pairs) == (
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "dev3: /dev/nvidia0,gid=44",
        "lxc.cgroup2.devices.allow: c 195:* rwm",
    )
    assert gpu_passthrough_evidence(pairs, "dri") == (
        "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir",
    )


def test_cli_unknown_only_is_a_usage_error(tmp_path: Path) -> None:
    from gpudoctor.cli import cli

    inventory = tmp_path / "hosts.toml"
    inventory.write_text('[[nodes]]\nname = "pve1"\ncts = [200]\n')
    result = CliRunner().invoke(cli, ["check", "--inventory", str(inventory), "--only", "nope"])
    assert result.exit_code == 2
    assert "unknown check id or family: nope" in result.output
