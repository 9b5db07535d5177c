"""Test support: the gpudoctor.gpu collection built with the real ``ansible-galaxy`` and
installed in a test's directory, and real ``ansible-playbook`` / ``ansible`` runs against
the lab's sshd (an inventory written per test, trusting only the lab's host key)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.lab.lxc import REPO_ROOT

COLLECTION_SRC = REPO_ROOT / "gpudoctor" / "ansible_collection"
BIN = Path(sys.executable).parent  # ansible-core is in the [test] extra, beside gpudoctor
GPUDOCTOR = str(BIN / "gpudoctor")
PLAYBOOK = "gpudoctor.gpu.gpu_cts"  # the collection's own documented playbook
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+).*$",
    re.MULTILINE,
)


def ansible_tool(name: str) -> Path | None:
    """Return the path of an ansible-core program beside this Python, or None."""
    path = BIN / name
    return path if path.exists() else None


def build_and_install(dest: Path) -> Path:
    """Build the collection from the repo (``ansible-galaxy collection build``) and install
    the tarball offline under ``dest``; return the collections path to give Ansible."""
    built = dest / "built"
    built.mkdir(parents=True)
    run([str(BIN / "ansible-galaxy"), "collection", "build", str(COLLECTION_SRC),
         "--output-path", str(built)])  # fmt: skip
    (tarball,) = built.glob("gpudoctor-gpu-*.tar.gz")
    installed = dest / "collections"
    run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", str(tarball),
         "-p", str(installed)])  # fmt: skip
    return installed


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300.0):  # type: ignore[no-untyped-def]
    """Run ``argv``; return the CompletedProcess (raise with its output when it fails)."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({done.returncode}): {done.stdout}{done.stderr}")
    return done


@dataclass(frozen=True)
class Recap:
    """One host's line of the PLAY RECAP."""

    COUNTS: ClassVar[tuple[str, ...]] = ("ok", "changed", "unreachable", "failed")

    line: str
    ok: int
    changed: int
    unreachable: int
    failed: int


@dataclass(frozen=True)
class PlayRun:
    """An ``ansible-playbook`` run: its exit status, output and the recap per host."""

    returncode: int
    output: str
    recap: dict[str, Recap]


def play_run(returncode: int, stdout: str, stderr: str) -> PlayRun:
    """Return the PlayRun of an ``ansible-playbook`` that exited with this output."""
    recap = {
        m["host"]: Recap(m.group(0), *(int(m[k]) for k in Recap.COUNTS))
        for m in RECAP.finditer(stdout)
    }
    return PlayRun(returncode, stdout + stderr, recap)


def finish(proc: subprocess.Popen[str], timeout: float = 600.0) -> PlayRun:
    """Wait for a playbook :meth:`Controller.start` started; return its PlayRun."""
    stdout, stderr = proc.communicate(timeout=timeout)
    return play_run(proc.returncode, stdout, stderr)


class Controller:
    """The Ansible controller of one test: its directory, inventory and environment."""

    def __init__(self, root: Path, collections: Path, sshd: Any, host_vars: dict[str, Any]):
        self.root = root
        (root / "home").mkdir(parents=True, exist_ok=True)
        (root / "ansible.cfg").write_text("[defaults]\n")
        self.inventory = root / "inventory.yml"
        ssh_args = (f"-F /dev/null -o UserKnownHostsFile={sshd.known_hosts} "
                    "-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes "
                    "-o IdentitiesOnly=yes -o IdentityAgent=none")  # fmt: skip
        node = {
            "ansible_host": "127.0.0.1",
            "ansible_port": sshd.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(sshd.client_key),
            "ansible_ssh_common_args": ssh_args,
            "ansible_python_interpreter": "/usr/bin/python3",
            "gpudoctor_executable": GPUDOCTOR,
            **host_vars,
        }
        doc = {"all": {"hosts": {"labnode": node}}}
        self.inventory.write_text(json.dumps(doc, indent=2))  # JSON is YAML
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root / "home"),
            "LANG": "C.UTF-8",
            "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
            "ANSIBLE_HOME": str(root / "ansible-home"),
            "ANSIBLE_LOCAL_TEMP": str(root / "ansible-tmp"),
            "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=no",  # no master process left behind
            "ANSIBLE_PIPELINING": "true",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_HOST_KEY_CHECKING": "true",
        }

    def playbook(
        self, *args: str, extra: dict[str, Any] | None = None, playbook: str = PLAYBOOK
    ) -> PlayRun:
        """Run ``playbook`` (the collection's own by default) with ``args`` (``--check``,
        ``--diff``) and extra variables; return the run (never raises on a failed task)."""
        argv = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), playbook, *args]
        if extra:
            argv += ["-e", json.dumps(extra)]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=600, cwd=self.root)  # fmt: skip
        return play_run(done.returncode, done.stdout, done.stderr)

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start the collection's playbook with ``args`` in the background; return it (read
        it with :func:`finish`)."""
        argv = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), PLAYBOOK, *args]
        return subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.root)  # fmt: skip

    def module(self, name: str, args: dict[str, Any], *flags: str) -> dict[str, Any]:
        """Run one module of the collection ad hoc (``ansible labnode -m NAME``) and
        return its result (the ``minimal`` callback's ``labnode | STATUS => {...}``)."""
        env = {**self.env, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
               "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.minimal"}  # fmt: skip
        argv = [str(BIN / "ansible"), "labnode", "-i", str(self.inventory), "-m",
                f"gpudoctor.gpu.{name}", "-a", json.dumps(args), *flags]  # fmt: skip
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600,
                              cwd=self.root)  # fmt: skip
        head, _, body = done.stdout.partition(" => ")
        try:
            result = json.loads(body)
        except ValueError as exc:
            raise AssertionError(f"no result from ansible: {done.stdout}{done.stderr}") from exc
        return {**result, "outcome_line": head.strip()}
