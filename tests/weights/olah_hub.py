"""olah (a real third-party Hugging Face mirror server), run offline on 127.0.0.1.

olah 0.5.4 in offline mode serves local git repositories as Hub repositories: plain
snapshot downloads, revision pinning (branch, tag, sha), the tree with sizes and LFS
sha256. It lacks Range requests and ``?blobs=true`` (see the recipe), which is why
the other tests use tests/weights/hub_server.py.

olah is installed in its own virtualenv (its dependency fastapi-utils pins psutil<6,
which would downgrade the project's psutil): ``python3 -m venv /opt/olah-venv &&
/opt/olah-venv/bin/pip install olah==0.5.4``. ``GPUDOCTOR_OLAH_CLI`` may point at
another ``olah-cli``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.signals import default_signals

DEFAULT_CLI = "/opt/olah-venv/bin/olah-cli"
LFS_SPEC = "https://git-lfs.github.com/spec/v1"


def olah_cli() -> str | None:
    """Return the olah-cli to run, or None when olah is not installed."""
    for candidate in (os.environ.get("GPUDOCTOR_OLAH_CLI"), DEFAULT_CLI, shutil.which("olah-cli")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


class OlahRepo:
    """A git working copy under olah's mirrors path; LFS files as pointer + object."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        _git(path, "init", "-q", "-b", "main")

    def commit(self, files: dict[str, bytes], lfs: set[str], tag: str | None = None) -> str:
        """Commit ``files`` (``lfs``: the paths stored as git-lfs pointers); return the sha."""
        for rel, data in files.items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if rel in lfs:
                digest = hashlib.sha256(data).hexdigest()
                obj = self.path / ".git/lfs/objects" / digest[:2] / digest[2:4] / digest
                obj.parent.mkdir(parents=True, exist_ok=True)
                obj.write_bytes(data)
                data = f"version {LFS_SPEC}\noid sha256:{digest}\nsize {len(data)}\n".encode()
            target.write_bytes(data)
        _git(self.path, "add", "-A")
        _git(self.path, "commit", "-q", "-m", "update")
        if tag:
            _git(self.path, "tag", tag)
        return _git(self.path, "rev-parse", "HEAD")


class OlahServer:
    """``olah-cli`` with an offline TOML config, started and stopped by the test."""

    def __init__(self, root: Path, cli: str) -> None:
        self.root = root
        self.cli = cli
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def repo(self, repo_id: str) -> OlahRepo:
        """Create an empty model repository ``repo_id``."""
        return OlahRepo(self.root / "mirrors" / "models" / repo_id)

    def start(self, timeout_s: float = 60) -> str:
        """Start olah; return its URL once it accepts connections."""
        netloc = f"127.0.0.1:{self.port}"
        (self.root / "olah.toml").write_text(
            f'[basic]\nhost = "127.0.0.1"\nport = {self.port}\nrepos-path = "olah_repos"\n'
            f'mirror-netloc = "{netloc}"\nmirror-lfs-netloc = "{netloc}"\n'
            'mirrors-path = ["mirrors"]\n[accessibility]\noffline = true\n'
        )
        self.proc = subprocess.Popen(
            [self.cli, "-c", "olah.toml", "--log-path", "logs"],
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=default_signals,  # stop() sends SIGTERM
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"olah exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self.url
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("olah did not start listening")

    def stop(self) -> None:
        """Stop olah (its whole process group) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
