"""A Hugging Face Hub stand-in on 127.0.0.1: it stands for https://huggingface.co.

It implements the subset of the Hub's HTTP API that huggingface_hub 2.4.0 uses to
download a repository (documented in docs/recipes/hf_hub_offline.md, section 3):

- ``GET /api/models/{id}[/revision/{rev}][?blobs=true]``: ``id``, ``sha``, ``siblings``.
- ``GET /api/models/{id}/tree/{rev}[/{path}]?recursive=``: files with ``size``, git
  ``oid`` and, for LFS files, ``lfs: {oid: sha256, size, pointerSize}`` (never xetHash,
  so clients use plain HTTP).
- ``GET /api/models/{id}/refs``: branches and tags.
- ``HEAD|GET /{id}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag`` (sha256 for LFS,
  git blob sha1 otherwise), ``X-Linked-Etag``/``X-Linked-Size`` for LFS,
  ``Content-Length``, ``Range: bytes=N-`` / ``N-M`` -> 206 with ``Content-Range``.
- Errors: unknown repo -> 401 + ``X-Error-Code: RepoNotFound``; a gated one (``gated``) ->
  403 + ``GatedRepo``; unknown revision -> 404 + ``RevisionNotFound``; unknown file ->
  404 + ``EntryNotFound``; ``api_status``: every ``/api/`` request answered with it.

File bodies are served from disk with ``sendfile`` (fast enough for benchmarks), or
slowly (``throttle_bytes_per_s``) so a test can kill a client mid-download. Every
request is logged in :attr:`HubServer.requests` (server-side request counting).
``Authorization`` headers are recorded (to prove a token was sent) but not checked.

Run standalone: ``python -m tests.weights.hub_server --port 8765 --repo org/name=DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
LFS_MIN_SIZE = 10 * 1000 * 1000


@dataclass
class HubFile:
    """One file of a commit: its bytes live at ``source`` on disk."""

    path: str
    source: Path
    size: int
    sha256: str
    is_lfs: bool
    _git_oid: str = ""

    @property
    def pointer(self) -> bytes:
        """The git-lfs pointer text that the git tree would hold."""
        spec = "https://git-lfs.github.com/spec/v1"
        return f"version {spec}\noid sha256:{self.sha256}\nsize {self.size}\n".encode()

    @property
    def git_oid(self) -> str:
        """git blob sha1 (of the pointer for LFS files), as ``git hash-object`` gives."""
        if not self._git_oid:
            data = self.pointer if self.is_lfs else self.source.read_bytes()
            self._git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return self._git_oid

    @property
    def etag(self) -> str:
        return self.sha256 if self.is_lfs else self.git_oid

    def tree_entry(self) -> dict:
        entry = {"type": "file", "path": self.path, "size": self.size, "oid": self.git_oid}
        if self.is_lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(self.pointer)}
        return entry


@dataclass
class HubRepo:
    """A repository: commits (sha -> files) and refs (branch/tag -> sha)."""

    repo_id: str
    storage: Path
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def commit(
        self, files: dict[str, bytes | Path], branch: str = "main", tag: str | None = None
    ) -> str:
        """Record a commit holding ``files`` ({path: bytes or a file on disk}); return its sha."""
        entries: dict[str, HubFile] = {}
        for path, content in sorted(files.items()):
            if isinstance(content, bytes):
                source = self.storage / hashlib.sha256(content).hexdigest()
                source.parent.mkdir(parents=True, exist_ok=True)
                source.write_bytes(content)
            else:
                source = Path(content)
            entries[path] = _describe(path, source)
        parent = self.branches.get(branch, "")
        seed = json.dumps([parent, [(p, f.sha256) for p, f in entries.items()], len(self.commits)])
        sha = hashlib.sha1(seed.encode()).hexdigest()
        self.commits[sha] = entries
        self.branches[branch] = sha
        if tag:
            self.tags[tag] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        """Return the commit sha for a branch, tag, full or short sha; None if unknown."""
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        matches = [sha for sha in self.commits if len(rev) >= 7 and sha.startswith(rev)]
        return matches[0] if len(matches) == 1 else None


def _describe(path: str, source: Path) -> HubFile:
    digest = hashlib.sha256()
    with open(source, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    size = source.stat().st_size
    is_lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
    return HubFile(path, source, size, digest.hexdigest(), is_lfs)


@dataclass(frozen=True)
class LoggedRequest:
    """One request seen by the server."""

    method: str
    path: str
    status: int
    range: str | None
    bytes_sent: int  # what the answer carries (a client that hangs up gets less)
    authorization: str | None
    port: int = 0  # the client's port: one per connection


class HubServer:
    """The server: ``start()`` returns the endpoint URL for ``HF_ENDPOINT``."""

    def __init__(self, storage: Path, port: int = 0) -> None:
        self.storage = storage
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[LoggedRequest] = []
        self.throttle_bytes_per_s: int | None = None
        self.ignore_range = False  # answer every Range request with 200 and the whole file
        self.redirect_lfs = False  # send LFS bodies from /cdn/... with a 302, as the Hub does
        self.gated: set[str] = set()  # repositories whose terms the caller has not accepted
        self.api_status: int | None = None  # answer every /api/ request with this error status
        self.tree_reversed = False  # list a tree's files in reverse path order
        self.hold_small: threading.Event | None = None  # non-LFS files wait for it (10 s at most)
        self._port = port
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add_repo(self, repo_id: str) -> HubRepo:
        """Create and return an empty repository."""
        repo = HubRepo(repo_id, self.storage / repo_id.replace("/", "--"))
        self.repos[repo_id] = repo
        return repo

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> str:
        """Start serving in a daemon thread; return ``http://127.0.0.1:PORT``."""
        handler = type("Handler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and close the listening socket (connections are then refused)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def log(self, entry: LoggedRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def clear_log(self) -> None:
        """Forget the requests seen so far."""
        with self._lock:
            self.requests.clear()

    def file_gets(self) -> list[LoggedRequest]:
        """Return the GETs of file bodies (``/resolve/``) seen so far."""
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path]


_RESOLVE = re.compile(r"^/(?:(datasets|spaces)/)?(.+?)/resolve/([^/]+)/(.+)$")
_API = re.compile(r"^/api/(models|datasets|spaces)/(.+?)(?:/(revision|tree|refs)(?:/(.*))?)?$")


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def _log(self, status: int, sent: int = 0) -> None:
        """Log this request BEFORE its answer goes out: a client that has its answer
        always finds the request in :attr:`HubServer.requests` (logged after the answer,
        a test reading the log at once could miss it)."""
        self.hub.log(
            LoggedRequest(
                self.command,
                self.path,
                status,
                self.headers.get("Range"),
                sent,
                self.headers.get("Authorization"),
                self.client_address[1],
            )
        )

    def _send_json(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self._log(status, len(data))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        headers = {"X-Error-Message": message} | ({"X-Error-Code": code} if code else {})
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send_json(status, {"error": message}, headers)

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        if match := _API.match(path):
            self._api(match, query)
        elif match := _RESOLVE.match(url.path.removeprefix("/cdn")):
            repo_id = unquote(match.group(2))
            rev, file = unquote(match.group(3)), unquote(match.group(4))
            self._resolve(repo_id, rev, file, from_cdn=url.path.startswith("/cdn/"))
        else:
            self._error(404, "EntryNotFound", f"no route for {path}")

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", f"Repository {repo_id} not found")
        elif repo_id in self.hub.gated:
            self._error(403, "GatedRepo", f"Access to model {repo_id} is restricted.")
            return None
        return repo

    def _api(self, match: re.Match[str], query: dict[str, list[str]]) -> None:
        _kind, repo_id, action, rest = match.groups()
        if self.hub.api_status is not None:
            self._error(self.hub.api_status, "", "Internal Error - We're working hard to fix this")
            return
        repo = self._repo(repo_id)
        if repo is None:
            return
        if action == "refs":
            refs = {
                "branches": [
                    {"name": n, "ref": f"refs/heads/{n}", "targetCommit": s}
                    for n, s in repo.branches.items()
                ],
                "tags": [
                    {"name": n, "ref": f"refs/tags/{n}", "targetCommit": s}
                    for n, s in repo.tags.items()
                ],
                "converts": [],
            }
            self._send_json(200, refs)
            return
        rev, sub = (rest or "main"), ""
        if action == "tree" and rest and "/" in rest:
            rev, sub = rest.split("/", 1)
        sha = repo.resolve(rev)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        files = repo.commits[sha]
        if action == "tree":
            self._send_json(200, self._tree(files, sub.strip("/"), query))
            return
        blobs = query.get("blobs") == ["true"]
        siblings = []
        for f in files.values():
            item: dict[str, object] = {"rfilename": f.path}
            if blobs:
                item.update(size=f.size, blobId=f.git_oid)
                if f.is_lfs:
                    item["lfs"] = f.tree_entry()["lfs"] | {"sha256": f.sha256}
            siblings.append(item)
        self._send_json(
            200, {"id": repo.repo_id, "sha": sha, "private": False, "siblings": siblings}
        )

    def _tree(self, files: dict[str, HubFile], sub: str, query: dict[str, list[str]]) -> list:
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = f"{sub}/" if sub else ""
        entries, dirs = [], set()
        for f in files.values():
            if not f.path.startswith(prefix):
                continue
            rest = f.path[len(prefix) :]
            parts = rest.split("/")
            for depth in range(1, len(parts)):
                if recursive or depth == 1:
                    dirs.add(prefix + "/".join(parts[:depth]))
            if recursive or len(parts) == 1:
                entries.append(f.tree_entry())
        folders = [{"type": "directory", "path": d, "oid": "0" * 40, "size": 0} for d in dirs]
        if self.hub.tree_reversed:
            entries.reverse()
        return sorted(folders, key=lambda e: e["path"]) + entries

    def _resolve(self, repo_id: str, rev: str, path: str, from_cdn: bool = False) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        sha = repo.resolve(rev)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        f = repo.commits[sha].get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist at {rev}", commit=sha)
            return
        if not f.is_lfs and self.hub.hold_small is not None:
            self.hub.hold_small.wait(10)
        if f.is_lfs and self.hub.redirect_lfs and not from_cdn:
            self._log(302)
            self.send_response(302)
            self.send_header("Location", f"/cdn/{repo_id}/resolve/{sha}/{path}")
            self.send_header("X-Repo-Commit", sha)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = 0, f.size - 1
        status = 200
        wanted = self.headers.get("Range")
        if wanted and self.command == "GET" and not self.hub.ignore_range:
            m = re.match(r"bytes=(\d+)-(\d*)$", wanted.strip())
            if m:
                start = int(m.group(1))
                end = min(int(m.group(2)), f.size - 1) if m.group(2) else f.size - 1
                status = 206
        length = max(0, end - start + 1)
        self._log(status, length if self.command == "GET" else 0)
        self.send_response(status)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{f.etag}"')
        self.send_header("Accept-Ranges", "bytes")
        if f.is_lfs:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length if self.command == "GET" else f.size))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if self.command == "GET":
            try:
                self._send_body(f.source, start, length)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    def _send_body(self, source: Path, start: int, length: int) -> int:
        throttle = self.hub.throttle_bytes_per_s
        with open(source, "rb") as handle:
            if not throttle:
                return self.connection.sendfile(handle, start, length)
            handle.seek(start)
            sent, step = 0, max(1, throttle // 20)
            while sent < length:
                chunk = handle.read(min(step, length - sent))
                self.wfile.write(chunk)
                sent += len(chunk)
                time.sleep(len(chunk) / throttle)
            return sent


def main() -> None:
    """Serve directories as repositories until killed (one commit per ``--repo``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--storage", type=Path, default=Path("/tmp/hub-server-storage"))
    parser.add_argument("--repo", action="append", default=[], help="ORG/NAME=DIR")
    parser.add_argument("--throttle", type=int, default=None, help="bytes/s per file body")
    args = parser.parse_args()
    hub = HubServer(args.storage, port=args.port)
    hub.throttle_bytes_per_s = args.throttle
    for spec in args.repo:
        repo_id, _, directory = spec.partition("=")
        root = Path(directory)
        files = {str(p.relative_to(root)): p for p in sorted(root.rglob("*")) if p.is_file()}
        hub.repos.get(repo_id) or hub.add_repo(repo_id)
        hub.repos[repo_id].commit(files)
    print(hub.start(), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
