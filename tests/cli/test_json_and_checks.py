"""``--json`` everywhere, ``--version``/``-V``, and checks that say nothing (real
subprocesses on this machine, which has no NVIDIA driver)."""

from __future__ import annotations

import json

import pytest

from gpudoctor import __version__
from tests.cli.support import ERROR_LINE, gpudoctor, last_line


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    done = gpudoctor(flag)
    assert done.returncode == 0 and __version__ in done.stdout


def test_list_json_is_the_catalogue():
    done = gpudoctor("list", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "gpudoctor.list/1"
    ids = [c["id"] for c in doc["checks"]]
    plain = [line.split()[0] for line in gpudoctor("list").stdout.splitlines()]
    assert ids == plain and "device.open" in ids
    rules = next(c for c in doc["checks"] if c["id"] == "ct.device_rules")
    assert rules["scope"] == "ct_host" and rules["severity"] in ("critical", "high", "warning")


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--json", "--timeout", "-1"],
        ["check", "--json", "--host", "root@127.0.0.1:1", "--known-hosts", "/dev/null"],
        ["fix", "--json", "--cluster", "a", "--inventory", "b"],
        ["bench", "run", "/nonexistent.toml", "--json"],
        ["bench", "report", "/nonexistent", "--json"],
        ["weights", "ensure", "a/b", "--to", "/proc/x", "--json"],
    ],
    ids=" ".join,
)
def test_errors_with_json_print_a_json_object(args):
    """On an error, --json gives one JSON object on stdout, besides the line on stderr."""
    done = gpudoctor(*args)
    assert done.returncode in (1, 2)
    doc = json.loads(done.stdout)
    assert doc["ok"] is False
    assert doc["error"] == last_line(done.stderr).removeprefix("gpudoctor: error: ")


def test_check_that_checks_nothing_says_so():
    """--only device on a machine without the NVIDIA driver: every check SKIPs, which must
    not read as healthy (exit 0): exit 4 and a line saying nothing was checked."""
    done = gpudoctor("check", "--only", "device")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "nothing was checked" in done.stderr
    healthy = gpudoctor("check", "--only", "proc.usable")
    assert healthy.returncode == 0 and "nothing was checked" not in healthy.stderr


def test_ct_rules_without_ct_is_a_usage_error():
    done = gpudoctor("check", "--only", "ct.device_rules")
    assert done.returncode == 2
    assert "needs --ct" in done.stderr and ERROR_LINE.match(last_line(done.stderr))


def test_ct_that_is_no_number_is_a_usage_error_in_pve_flavor():
    done = gpudoctor("check", "--ct", "abc")
    assert done.returncode == 2 and "a Proxmox CT id is a number" in done.stderr
    lxc = gpudoctor("check", "--ct", "abc", "--flavor", "lxc", "--only", "proc.usable")
    assert "a Proxmox CT id is a number" not in lxc.stderr  # a plain LXC name is fine


def test_model_dir_that_is_a_file_says_so_and_names_a_directory(tmp_path):
    """Issue 26.11: `check --model-dir FILE` (the config.json instead of its folder) got
    the remedy "Check permissions"; it says the path is a file and names a directory."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = gpudoctor("check", "--only", "model.present", "--json", "--model-dir",
                     str(model / "config.json"))  # fmt: skip
    assert done.returncode == 3, done.stderr
    finding = next(f for f in json.loads(done.stdout)["findings"] if f["status"] == "FAIL")
    assert "is a file, not a directory" in finding["message"]
    assert "permissions" not in finding["remediation"].lower()
    assert f"--model-dir {model}" in finding["remediation"]
