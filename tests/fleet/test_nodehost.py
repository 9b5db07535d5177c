"""NodeHost against the real lab sshd: commands go through one agent on the node, and the
few run-constant ones are asked once."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.fleet.nodehost import NodeHost, constant_for_a_run
from gpudoctor.hosts.local import LocalHost
from tests.lab.sshd import LabSSHD


@pytest.mark.lab
def test_commands_run_through_one_node_agent_and_constants_are_asked_once(
    lab_sshd: LabSSHD,
) -> None:
    node = NodeHost(lab_sshd.host())
    try:
        first = node.run(["lxc-config", "lxc.lxcpath"])
        assert first.ok and first.stdout.strip() == "/var/lib/lxc"
        assert node.run(["lxc-config", "lxc.lxcpath"]) is first  # remembered
        parents = {node.run(["sh", "-c", "cat /proc/$PPID/cmdline"]).stdout for _ in range(3)}
        assert len(parents) == 1  # the same parent every time: the node agent,
        assert "gpudoctor-agent" in parents.pop()  # not an sshd session + shell per command
        stamps = {node.run(["date", "+%s%N"]).stdout for _ in range(2)}
        assert len(stamps) == 2  # ordinary commands are never cached
        failed = node.run(["sh", "-c", "exit 3"])
        assert failed.returncode == 3
        assert node.read_text("/proc/devices") == LocalHost().read_text("/proc/devices")
    finally:
        node.close()


def test_which_commands_are_constant() -> None:
    assert constant_for_a_run(["lxc-config", "lxc.lxcpath"])
    assert constant_for_a_run(["readlink", "/etc/pve/local"])
    assert constant_for_a_run(["pveversion"])
    assert not constant_for_a_run(["readlink", "/etc/pve/lxc/200.conf"])
    assert not constant_for_a_run(["pct", "list"])
    assert not constant_for_a_run(["lxc-config", "lxc.rootfs.path"])


def test_a_local_node_runs_commands_itself() -> None:
    node = NodeHost(LocalHost())
    assert node.run(["echo", "hi"]).stdout == "hi\n"
    assert node.python == LocalHost().python


def test_node_file_facts_are_asked_once_per_run(tmp_path: Path) -> None:
    """The facts every CT's config check reads on the node (``stat``, ``ls``,
    ``/proc/devices``) are asked once per run, errors included; other reads are not kept,
    and a new run (a new NodeHost) asks again."""
    inner = LocalHost()
    devices = inner.read_text("/proc/devices")
    asked: list[tuple[str, str]] = []
    for op in ("stat", "list_dir", "read_text"):
        real = getattr(inner, op)
        setattr(
            inner, op, lambda path, *a, op=op, real=real: asked.append((op, path)) or real(path, *a)
        )
    f, missing = str(tmp_path / "f"), str(tmp_path / "missing")
    (tmp_path / "f").write_text("one")
    node = NodeHost(inner)
    for _ in range(3):
        assert node.stat(f).size == 3
        assert node.list_dir(str(tmp_path)) == ["f"]
        with pytest.raises(FileNotFoundError):
            node.stat(missing)
        assert node.read_text("/proc/devices") == devices
        assert node.read_text(f) == "one"
    for once in [("stat", f), ("list_dir", str(tmp_path)), ("stat", missing),
                 ("read_text", "/proc/devices")]:  # fmt: skip
        assert asked.count(once) == 1, once
    assert asked.count(("read_text", f)) == 3  # not a remembered file
    (tmp_path / "f").write_text("three")
    assert NodeHost(inner).stat(f).size == 5  # the next run asks again
