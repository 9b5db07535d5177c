"""The Proxmox API inventory, against a real HTTPS server on 127.0.0.1 that stands for a
Proxmox node's API and serves RECORDED API responses (tests/data/pve_api/README.md
says where each comes from; proxmoxer's own tests mock the API the same way). proxmoxer
really talks HTTP/TLS to it (self-signed certificate: ``verify=False``, or the cert file)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudoctor.fleet.inventory import InventoryError
from gpudoctor.fleet.proxmox import ApiCredentials, cluster_inventory
from tests.fakes.pve_recorded_api import PveApiServer


@pytest.fixture
def api(tmp_path: Path) -> Iterator[PveApiServer]:
    server = PveApiServer(tmp_path).start()
    yield server
    server.stop()


def token_creds(api: PveApiServer, **kw: object) -> ApiCredentials:
    settings: dict[str, object] = {
        "host": api.host, "token_id": api.token_id, "token_secret": api.token_secret,
        "verify": False,
    }  # fmt: skip
    settings.update(kw)
    return ApiCredentials(**settings)  # type: ignore[arg-type]


def test_token_inventory_selects_the_gpu_cts(api: PveApiServer) -> None:
    inventory, warnings = cluster_inventory(token_creds(api))
    got = [(c.node, c.ct, c.name, c.status) for c in inventory.cts]
    assert got == [
        ("pve1", "200", "ollama-docker-nvidia", "running"),  # raw lxc.mount.entry /dev/nvidia*
        ("pve1", "205", "frigatelxc", "running"),  # mounts from /lxc/.../nvidia0
        ("pve2", "202", "wolf", "stopped"),  # devN: /dev/nvidia0 ...
        ("pve2", "210", "jellyfin", "running"),  # only c 195:N rw rules
    ]
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in (
        inventory.cts[0].evidence
    )
    assert "dev2: /dev/nvidia0" in inventory.cts[2].evidence
    assert [(n.name, n.ssh, n.flavor, n.online) for n in inventory.nodes] == [
        ("pve1", "root@pve1", "pve", True),
        ("pve2", "root@pve2", "pve", True),
        ("pve3", "root@pve3", "pve", False),
    ]
    assert inventory.source == f"cluster {api.host}"
    assert any("permission denied (read CT 220 config)" in w for w in warnings)
    assert any("node pve3 is offline: its 1 CT(s)" in w for w in warnings)
    paths = [s.path for s in api.seen]
    # Only CT configs were fetched: no VM, no template, nothing on the offline node.
    configs = sorted(p for p in paths if p.endswith("/config"))
    assert configs == [
        f"/api2/json/nodes/{n}/lxc/{i}/config"
        for n, i in [("pve1", 200), ("pve1", 201), ("pve1", 205), ("pve2", 202), ("pve2", 210),
                     ("pve2", 220)]
    ]  # fmt: skip
    listing = [s.query for s in api.seen if s.path.endswith("/cluster/resources")]
    assert sorted(q["type"][0] for q in listing) == ["node", "vm"]
    token_header = f"PVEAPIToken={api.token_id}={api.token_secret}"
    assert all(s.headers.get("Authorization") == token_header for s in api.seen)


def test_password_login_gets_a_ticket_first(api: PveApiServer) -> None:
    creds = ApiCredentials(api.host, user=api.user, password=api.password, verify=False)
    inventory, _ = cluster_inventory(creds)
    assert [c.ct for c in inventory.cts] == ["200", "205", "202", "210"]
    assert api.seen[0].method == "POST" and api.seen[0].path == "/api2/json/access/ticket"
    assert all("PVEAuthCookie=" in s.headers.get("Cookie", "") for s in api.seen[1:])


def test_ct_pattern_narrows_api_inventory(api: PveApiServer) -> None:
    inventory, _ = cluster_inventory(token_creds(api))
    assert [c.ct for c in inventory.narrowed(["frig*", "210"]).cts] == ["205", "210"]
    assert [n.name for n in inventory.narrowed(["frig*"]).nodes] == ["pve1"]


def test_wrong_secret_is_a_clear_error_without_the_secret(
    api: PveApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "0f1e2d3c-wrong-secret-4b5a69788796"
    caplog.set_level(logging.DEBUG)
    with pytest.raises(InventoryError, match="authentication failed") as exc:
        cluster_inventory(token_creds(api, token_secret=wrong))
    assert wrong not in str(exc.value)
    assert wrong not in caplog.text
    assert caplog.records  # urllib3/proxmoxer did log the exchange, without the secret
    assert wrong not in repr(token_creds(api, token_secret=wrong))


def test_bad_password_is_refused(api: PveApiServer) -> None:
    creds = ApiCredentials(api.host, user=api.user, password="hunter2", verify=False)
    with pytest.raises(InventoryError, match="authentication failed") as exc:
        cluster_inventory(creds)
    assert "hunter2" not in str(exc.value)


def test_untrusted_certificate_is_refused_then_accepted_with_its_ca(
    api: PveApiServer, tmp_path: Path
) -> None:
    with pytest.raises(InventoryError, match="TLS certificate is not trusted"):
        cluster_inventory(token_creds(api, verify=True))
    ca = str(tmp_path / "pve-ssl.pem")  # the server's self-signed cert = its own CA
    inventory, _ = cluster_inventory(token_creds(api, verify=ca))
    assert len(inventory.cts) == 4


def test_closed_port_and_malformed_token(api: PveApiServer) -> None:
    from tests.lab.sshd import free_port

    with pytest.raises(InventoryError, match="cannot connect"):
        cluster_inventory(token_creds(api, host=f"127.0.0.1:{free_port()}"))
    with pytest.raises(InventoryError, match="USER@REALM!TOKENID"):
        cluster_inventory(token_creds(api, token_id="gpudoctor"))
    with pytest.raises(InventoryError, match="no Proxmox API credentials"):
        cluster_inventory(ApiCredentials(api.host))


def ssh_home(tmp_path: Path) -> Path:
    """A HOME whose ~/.ssh/config sends every node to a closed port on 127.0.0.1."""
    from tests.lab.sshd import free_port

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host pve*\n  HostName 127.0.0.1\n  Port {free_port()}\n"
    )
    (home / ".ssh" / "known_hosts").write_text("")
    return home


def test_cli_check_cluster_json(api: PveApiServer, tmp_path: Path) -> None:
    """``check --cluster`` end to end: the API inventory, then every node unreachable over
    SSH (a closed port): each node and CT is ERROR with the reason, pve3 is offline."""
    from gpudoctor.cli import cli

    env = {"PVE_TOKEN_ID": api.token_id, "PVE_TOKEN_SECRET": api.token_secret,
           "HOME": str(ssh_home(tmp_path))}  # fmt: skip
    result = CliRunner().invoke(
        cli, ["check", "--cluster", api.host, "--api-insecure", "--json"], env=env
    )
    assert result.exit_code == 3, result.output
    assert api.token_secret not in result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "ERROR"
    nodes = {n["node"]: n for n in doc["fleet"]["nodes"]}
    assert nodes["pve3"]["state"] == "unreachable"
    assert nodes["pve1"]["state"] == "unreachable"
    assert [c["ct"] for c in nodes["pve1"]["cts"]] == ["200", "205"]
    assert all(c["status"] == "ERROR" for n in nodes.values() for c in n["cts"])
    labels = [r["labels"] for r in doc["reports"]]
    assert {"node": "pve2", "ct": "210"} in labels
    ct210 = next(r for r in doc["reports"] if r["labels"] == {"node": "pve2", "ct": "210"})
    assert "not reached" in ct210["findings"][0]["message"]
    assert "cannot connect" in ct210["findings"][0]["message"]
    assert any("CT 220" in w for w in doc["fleet"]["warnings"])
    assert "gpudoctor: [" in result.stderr  # progress lines on stderr (not a tty)


def test_cli_check_cluster_bad_secret_is_one_line(api: PveApiServer, tmp_path: Path) -> None:
    from gpudoctor.cli import cli

    secret = "deadbeef-0000-4000-8000-feedfacecafe"
    result = CliRunner().invoke(
        cli,
        ["check", "--cluster", api.host, "--api-insecure", "--api-token-id", api.token_id,
         "--api-token-secret", secret, "--ct", "200"],
        env={"HOME": str(ssh_home(tmp_path))},
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "authentication failed" in result.output
    assert secret not in result.output
    assert "Traceback" not in result.output


def test_cli_check_cluster_ct_matching_nothing(api: PveApiServer, tmp_path: Path) -> None:
    from gpudoctor.cli import cli

    env = {"PVE_TOKEN_ID": api.token_id, "PVE_TOKEN_SECRET": api.token_secret,
           "HOME": str(ssh_home(tmp_path))}  # fmt: skip
    result = CliRunner().invoke(
        cli, ["check", "--cluster", api.host, "--api-insecure", "--ct", "999"], env=env
    )
    assert result.exit_code == 1
    assert "--ct 999 matches no CT" in result.output


def test_cli_check_cluster_prometheus_file(api: PveApiServer, tmp_path: Path) -> None:
    """``--format prometheus -o FILE``: node_exporter gauges with node/ct labels, written
    atomically (nothing on stdout)."""
    from gpudoctor.cli import cli

    env = {"PVE_TOKEN_ID": api.token_id, "PVE_TOKEN_SECRET": api.token_secret,
           "HOME": str(ssh_home(tmp_path))}  # fmt: skip
    out = tmp_path / "gpudoctor.prom"
    args = ["check", "--cluster", api.host, "--api-insecure", "--ct", "200,210",
            "--format", "prometheus", "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    text = out.read_text()
    assert 'target="pve1/ct200",node="pve1",ct="200"' in text
    assert 'node="pve2",ct="210"' in text
    assert 'check="fleet.reach"' in text
    assert api.token_secret not in text
