"""Messages that were false or sent users the wrong way (issue 47, the table), each through
the real CLI in a subprocess: the case the issue names, and what the message says now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GD = [sys.executable, "-m", "gpudoctor"]


def run(*args: str, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    """Run ``gpudoctor ARGS``; return the finished process (text)."""
    return subprocess.run([*GD, *args], capture_output=True, text=True, timeout=300, **kw)


def model_finding(directory: str) -> dict:
    """Return the model.present finding of ``check --only model --model-dir DIRECTORY``."""
    done = run("check", "--only", "model", "--model-dir", directory, "--json")
    assert done.returncode == 3, (done.returncode, done.stderr)
    return json.loads(done.stdout)["findings"][0]


def test_a_tmpfs_mount_point_as_model_dir_is_not_told_to_ensure_into_it() -> None:
    """`check --model-dir /dev/shm` said `weights ensure ... --to /dev/shm`, which ensure
    refuses (a mount point). It names the mount point and a directory inside it."""
    with open("/proc/self/mounts") as fh:
        assert any(line.split()[1] == "/dev/shm" for line in fh)  # what the test stands on
    found = model_finding("/dev/shm")
    assert "/dev/shm is a mount point, not a model's directory" in found["message"]
    assert "--to /dev/shm/MODEL" in found["remediation"]
    assert "--to /dev/shm " not in found["remediation"] + " "


def test_a_file_as_model_dir_is_not_told_to_use_a_directory_without_a_model() -> None:
    """`check --model-dir /etc/passwd` said `e.g. --model-dir /etc`: /etc holds no model."""
    found = model_finding("/etc/passwd")
    assert "--model-dir /etc" not in found["remediation"]
    assert "a model's own directory" in found["remediation"]


def test_a_file_inside_a_model_dir_names_that_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    found = model_finding(str(tmp_path / "model.safetensors"))
    assert found["remediation"].endswith(f": --model-dir {tmp_path}.")


def test_a_failed_restore_is_not_blamed_on_a_reboot(tmp_path: Path) -> None:
    """After a failed `weights ensure`, `check --model-dir` said "a tmpfs is emptied by every
    reboot"; NAME.partial says otherwise: an unfinished restore, to run again."""
    partial = tmp_path / "qwen.partial"
    partial.mkdir()
    (partial / ".gpudoctor-partial.json").write_text('{"repo_id": "org/qwen", "revision": "abc"}')
    found = model_finding(str(tmp_path / "qwen"))
    assert "reboot" not in found["message"]
    assert f"but {partial} does: a restore (gpudoctor weights ensure) failed" in found["message"]
    assert found["remediation"].endswith(f"gpudoctor weights ensure org/qwen --to {tmp_path}/qwen")
    gone = model_finding(str(tmp_path / "other"))
    assert "a tmpfs is emptied by every reboot" in gone["message"]  # no .partial: as before
