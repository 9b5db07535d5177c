"""One Proxmox API credential scheme for ``check`` and ``fix``, single host and fleet.

Real runs against the HTTPS stand-in for a Proxmox node's API (tests/fakes/pve_recorded_api.py:
TLS with its own certificate, pveproxy's token header and ticket login), as subprocesses.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudoctor.credentials import WITHHELD, ApiAuth, redact
from tests.cli.support import ERROR_LINE, gpudoctor, last_line
from tests.fakes.pve_recorded_api import PveApiServer
from tests.fleet.test_proxmox_inventory import ssh_home


@pytest.fixture
def api(tmp_path: Path):
    server = PveApiServer(tmp_path).start()
    yield server
    server.stop()


def api_options(command: str) -> set[str]:
    """Return the ``--api-*`` options that ``gpudoctor COMMAND --help`` shows."""
    return set(re.findall(r"(--api-[a-z-]+)", gpudoctor(command, "--help").stdout))


def test_check_and_fix_show_the_same_api_options():
    wanted = {"--api-token-id", "--api-token-secret-file", "--api-user", "--api-password-file",
              "--api-ca-file", "--api-insecure"}  # fmt: skip
    assert api_options("check") == wanted
    assert api_options("fix") == wanted  # (fix's --api URL is not a credential)


def form(api: PveApiServer, tmp_path: Path, how: str) -> tuple[list[str], dict[str, str]]:
    """Return (options, environment) giving the credentials in the way ``how`` names."""
    secret_file, password_file = tmp_path / "token", tmp_path / "password"
    secret_file.write_text(api.token_secret + "\n")
    password_file.write_text(api.password + "\n")
    secret_file.chmod(0o600)
    password_file.chmod(0o600)
    forms = {
        "token-env": ([], {"PVE_TOKEN_ID": api.token_id, "PVE_TOKEN_SECRET": api.token_secret}),
        "token-file": (
            ["--api-token-id", api.token_id, "--api-token-secret-file", str(secret_file)],
            {},
        ),
        "password-env": (["--api-user", api.user], {"PVE_PASSWORD": api.password}),
        "password-file": (["--api-user", api.user, "--api-password-file", str(password_file)], {}),
    }
    return forms[how]


@pytest.mark.parametrize("command", ["check", "fix"])
@pytest.mark.parametrize("how", ["token-env", "token-file", "password-env", "password-file"])
def test_every_credential_form_reaches_the_api_on_check_and_fix(api, tmp_path, command, how):
    """Each form logs in (the TLS certificate verified with --api-ca-file) and lists the
    cluster's CTs; the nodes themselves are then unreachable over SSH (a closed port)."""
    options, env = form(api, tmp_path, how)
    extra = ["--dry-run"] if command == "fix" else []
    done = gpudoctor(command, "--cluster", api.host, "--api-ca-file", str(api.cert),
                     "--ct", "200", *options, *extra,
                     env={"HOME": str(ssh_home(tmp_path)), **env})  # fmt: skip
    output = done.stdout + done.stderr
    assert "authentication failed" not in output and "no Proxmox API credentials" not in output
    assert any(s.path.endswith("/cluster/resources") for s in api.seen), output
    assert api.token_secret not in output and api.password not in output
    assert "--api-insecure" not in done.stderr and "command line" not in done.stderr
    assert "read by other users" not in done.stderr


def test_secret_file_readable_by_others_warns(api, tmp_path):
    secret = tmp_path / "token"
    secret.write_text(api.token_secret + "\n")
    secret.chmod(0o644)
    done = gpudoctor("check", "--cluster", api.host, "--api-ca-file", str(api.cert),
                     "--api-token-id", api.token_id, "--api-token-secret-file", str(secret),
                     "--ct", "200", env={"HOME": str(ssh_home(tmp_path))})  # fmt: skip
    assert f"{secret} can be read by other users; chmod 600" in done.stderr
    assert api.token_secret not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["check", "fix"])
def test_secret_in_argv_warns_and_is_never_echoed(api, tmp_path, command):
    """Attack: a secret on the command line is readable by every local user (ps, history);
    gpudoctor still accepts it but says so, and never prints it back."""
    wrong = "0123456789-not-the-secret"
    done = gpudoctor(command, "--cluster", api.host, "--api-ca-file", str(api.cert),
                     "--api-token-id", api.token_id, "--api-token-secret", wrong,
                     env={"HOME": str(ssh_home(tmp_path))})  # fmt: skip
    assert done.returncode == 1
    assert "--api-token-secret on the command line is visible" in done.stderr
    assert wrong not in done.stdout + done.stderr
    assert ERROR_LINE.match(last_line(done.stderr)) and "authentication failed" in done.stderr


@pytest.mark.parametrize("command", ["check", "fix"])
def test_api_insecure_warns_on_every_command(api, tmp_path, command):
    env = {"HOME": str(ssh_home(tmp_path)), "PVE_TOKEN_ID": api.token_id,
           "PVE_TOKEN_SECRET": api.token_secret}  # fmt: skip
    done = gpudoctor(command, "--cluster", api.host, "--api-insecure", "--ct", "200", env=env)
    warnings = [line for line in done.stderr.splitlines() if "--api-insecure" in line]
    assert len(warnings) == 1 and "not verified" in warnings[0], done.stderr


def test_fix_cluster_without_credentials_names_options_fix_has(tmp_path):
    """The advice used to name --api-token-secret, an option fix did not have."""
    done = gpudoctor("fix", "--cluster", "127.0.0.1:1", "--dry-run",
                     env={"HOME": str(tmp_path), "PVE_TOKEN_ID": "", "PVE_TOKEN_SECRET": "",
                          "PVE_USER": "", "PVE_PASSWORD": ""})  # fmt: skip
    assert done.returncode == 1 and "no Proxmox API credentials" in done.stderr
    named = set(re.findall(r"(--api-[a-z-]+)", last_line(done.stderr)))
    assert named and named <= api_options("fix") and named <= api_options("check")


def test_no_secret_in_any_repr():
    """No secret in a repr: a request object logged or shown in a traceback leaks nothing."""
    from gpudoctor.commands.fix_cluster import ClusterFixRequest
    from gpudoctor.fleet.proxmox import ApiCredentials
    from gpudoctor.fleet.request import FleetRequest
    from gpudoctor.pve.api import ApiSettings

    auth = ApiAuth("root@pam!gd", "token-secret-1234", "root@pam", "password-5678")
    shown = " ".join(
        repr(obj)
        for obj in (
            auth,
            FleetRequest(cluster="pve1", credentials=auth),
            ClusterFixRequest(cluster="pve1", credentials=auth),
            ApiCredentials("pve1", auth.token_id, auth.token_secret, auth.user, auth.password),
            ApiSettings("https://pve1:8006", auth.token, user="root@pam", password="password-5678"),
        )
    )
    assert "token-secret-1234" not in shown and "password-5678" not in shown
    assert "root@pam!gd" in shown  # the ids stay visible


def test_redaction_replaces_whole_values_only():
    """Attack: with substring redaction, a one-letter password "x" turned "Proxmox" into
    "Pro***mo***", so every message spelled out the password. Whole values only, and text
    holding a secret too short to redact safely is never echoed."""
    assert redact("Proxmox API at pve1 failed", ("x",)) == WITHHELD
    assert redact("Proxmox API at pve1 failed", ("zz",)) == "Proxmox API at pve1 failed"
    assert redact("login with long-secret-1 failed", ("long-secret-1",)) == "login with *** failed"
    assert redact("header PVEAPIToken=a!b=long-secret-1", ("long-secret-1",)).endswith("=***")
    assert redact("xlong-secret-1x", ("long-secret-1",)) == WITHHELD  # inside a word: withheld
