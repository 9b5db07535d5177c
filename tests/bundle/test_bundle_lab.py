"""``gpudoctor bundle --host HOST --ct NAME`` against the lab: a real OpenSSH server on
127.0.0.1 playing the container's host, a real LXC container whose config carries a
planted token. The archive holds the CT's config and the host's facts, with the token,
the SSH alias and the user replaced."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab.lxc import LabContainer
from tests.lab.sshd import LabSSHD

pytestmark = pytest.mark.lab

CONFIG_TOKEN = "hf_PlantedConfigToken0123456789abcdef"


def test_remote_bundle_redacts_the_ct_config(
    lab_sshd: LabSSHD, lab_container: Callable[..., LabContainer], tmp_path: Path
) -> None:
    ct = lab_container(extra_config=[f"lxc.environment = HF_TOKEN={CONFIG_TOKEN}"])
    home = lab_sshd.client_home(tmp_path / "home", alias="gpuhost-planted")
    out = tmp_path / "b.tar.gz"
    argv = [sys.executable, "-m", "gpudoctor", "bundle", "--host", "gpuhost-planted",
            "--ct", ct.name, "--flavor", "lxc", "-o", str(out), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "HOME": str(home)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-1500:]
    with tarfile.open(out) as tar:
        files = {m.name.removeprefix("gpudoctor-bundle/"): tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                 for m in tar.getmembers()}  # fmt: skip
    assert {"ct/config.txt", "host/uname.txt", "host/proc-devices.txt", "local/uname.txt",
            "check.json"} <= set(files)  # fmt: skip
    config = files["ct/config.txt"]
    assert "lxc.environment = HF_TOKEN=<secret-1>" in config
    # where it came from; the CT's name is its host name inside, so it is replaced too
    assert re.fullmatch(r"# /var/lib/lxc/<host-\d+>/config", config.splitlines()[0])
    report = json.loads(files["check.json"])
    assert report["target"].startswith("<host-1>/")  # the alias, replaced
    everything = "\n".join(files.values())
    assert CONFIG_TOKEN not in everything
    assert "gpuhost-planted" not in everything and ct.name not in everything
    assert "misc" in files["host/proc-devices.txt"]  # the host's own facts, read over SSH
