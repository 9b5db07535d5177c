"""Download big files over several HTTP connections at once (``Range`` requests).

``hf download`` fetches each file over one connection, so a model of a few big
shards gets a few connections, and each is limited by one Python thread moving
64 KiB pieces. Here every file of at least ``RANGED_MIN_BYTES`` is cut into ranges,
and ``connections`` threads fetch the ranges of all files, round-robin across files,
each with its own keep-alive connection. Bytes are read straight into a 4 MiB
buffer (``recv_into``) and written at their offset (``pwrite``): the GIL is released
for both, so the threads really run in parallel.

A file is written to ``PARTIAL/.gpudoctor-incomplete/`` and renamed into place only
when every range is in: the unit of resume stays the finished file. Redirects
(the Hub sends LFS and Xet files to a CDN) are followed, and the token is sent only
to the Hub's own host. Equivalent shell: ``curl -r A-B URL`` per range, N at a time.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urljoin, urlsplit

from gpudoctor.weights import pool as pools
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.localfs import INCOMPLETE_DIR as INCOMPLETE_DIR

RANGED_MIN_BYTES = 16 << 20
RANGE_BYTES = 64 << 20
BUFFER_BYTES = 4 << 20
TIMEOUT_S = 60.0
MAX_REDIRECTS = 5


@dataclass(frozen=True)
class RangeJob:
    """One byte range of one file.

    Attributes:
        path: the file's path in the repository.
        offset: first byte.
        length: bytes in the range.
    """

    path: str
    offset: int
    length: int


class RangeUnsupported(Exception):
    """The server answered a range request with the whole file (no ``206``)."""


def plan_ranges(sizes: dict[str, int], range_bytes: int | None = None) -> list[RangeJob]:
    """Return the ranges of ``sizes`` ({path: bytes}), round-robin across files (biggest first)."""
    range_bytes = range_bytes or RANGE_BYTES
    per_file = [
        [RangeJob(p, o, min(range_bytes, s - o)) for o in range(0, s, range_bytes)]
        for p, s in sorted(sizes.items(), key=lambda item: -item[1])
    ]
    jobs: list[RangeJob] = []
    for i in range(max((len(f) for f in per_file), default=0)):
        jobs.extend(f[i] for f in per_file if i < len(f))
    return jobs


def proxies_in_use(url: str) -> bool:
    """Return True when the environment routes ``url`` through a proxy (``*_PROXY``)."""
    from urllib.request import getproxies, proxy_bypass

    host = urlsplit(url).hostname or ""
    proxies = getproxies()
    return bool(proxies.get(urlsplit(url).scheme) or proxies.get("all")) and not proxy_bypass(host)


def resolve_url(endpoint: str, repo_id: str, revision: str, path: str) -> str:
    """Return the Hub URL of one file: ``ENDPOINT/ORG/NAME/resolve/SHA/PATH``."""
    return f"{endpoint.rstrip('/')}/{repo_id}/resolve/{revision}/{quote(path)}"


def _ssl_context() -> ssl.SSLContext:
    cafile = os.environ.get("SSL_CERT_FILE") or os.environ.get("REQUESTS_CA_BUNDLE")
    if not cafile:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:
            cafile = None
    return ssl.create_default_context(cafile=cafile)


class _Connections:
    """One keep-alive connection per (thread, scheme, host)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._ssl: ssl.SSLContext | None = None

    def get(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "pool", {}
        )
        conn = pool.get((scheme, netloc))
        if conn is None:
            if scheme == "https":
                self._ssl = self._ssl or _ssl_context()
                conn = http.client.HTTPSConnection(netloc, timeout=TIMEOUT_S, context=self._ssl)
            else:
                conn = http.client.HTTPConnection(netloc, timeout=TIMEOUT_S)
            pool[(scheme, netloc)] = conn
        return conn

    def drop(self, scheme: str, netloc: str) -> None:
        pool = self._local.__dict__.get("pool", {})
        conn = pool.pop((scheme, netloc), None)
        if conn is not None:
            conn.close()


class RangedDownloader:
    """Fetch files by ranges over ``connections`` parallel keep-alive connections."""

    def __init__(self, url_of: Callable[[str], str], token: str | None, connections: int) -> None:
        self._url_of = url_of
        self._token = token
        self._hub_host = urlsplit(url_of("x")).netloc
        self._connections = connections
        self._conns = _Connections()
        self._redirects: dict[str, str] = {}
        self._lock = threading.Lock()

    def _open(self, path: str, start: int, end: int) -> http.client.HTTPResponse:
        """Return the open response for bytes start..end (inclusive) of ``path``."""
        url = self._redirects.get(path) or self._url_of(path)
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            headers = {"Range": f"bytes={start}-{end}", "User-Agent": "gpudoctor"}
            if self._token and parts.netloc == self._hub_host:
                headers["Authorization"] = f"Bearer {self._token}"
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            for attempt in (0, 1):  # a kept-alive connection may have been closed
                conn = self._conns.get(parts.scheme, parts.netloc)
                try:
                    conn.request("GET", target, headers=headers)
                    response = conn.getresponse()
                    break
                except (ConnectionError, http.client.HTTPException, TimeoutError):
                    self._conns.drop(parts.scheme, parts.netloc)
                    if attempt:
                        raise
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                response.read()
                if not location:
                    raise WeightsError(
                        f"the Hub answered HTTP {response.status} without a Location for {path}"
                    )
                url = urljoin(url, location)
                continue
            if response.status == 206:
                with self._lock:
                    self._redirects[path] = url
                return response
            body = response.read(512).decode("utf-8", "replace").strip().splitlines()
            self._conns.drop(parts.scheme, parts.netloc)
            if response.status == 200:
                raise RangeUnsupported(path)
            detail = body[0] if body else response.reason
            raise WeightsError(
                f"the Hub answered HTTP {response.status} for {path}: {detail[:200]}"
            )
        raise WeightsError(f"too many redirects for {path}")

    def _fetch_range(self, fd: int, job: RangeJob, on_bytes: Callable[[int], None]) -> None:
        buffer = bytearray(min(BUFFER_BYTES, job.length))
        view = memoryview(buffer)
        done = 0
        retries = 2
        while done < job.length:
            start = job.offset + done
            try:
                response = self._open(job.path, start, job.offset + job.length - 1)
                while done < job.length:
                    got = response.readinto(view[: min(len(buffer), job.length - done)])
                    if not got:
                        raise ConnectionError(f"connection closed at byte {job.offset + done}")
                    os.pwrite(fd, view[:got], job.offset + done)
                    done += got
                    on_bytes(got)
            except (ConnectionError, TimeoutError, http.client.HTTPException):
                retries -= 1
                if retries < 0:
                    raise
                parts = urlsplit(self._redirects.get(job.path) or self._url_of(job.path))
                self._conns.drop(parts.scheme, parts.netloc)

    def download(
        self,
        sizes: dict[str, int],
        incomplete_dir: Path,
        on_bytes: Callable[[str, int], None],
        on_file: Callable[[str, Path], None],
    ) -> list[str]:
        """Fetch ``sizes``' files into ``incomplete_dir``; call ``on_file(path, temp)`` per file.

        Returns the paths whose server ignored ``Range`` (fetch them another way).
        Raises the first error after cancelling the ranges not started.
        """
        fds: dict[str, int] = {}
        remaining = dict(sizes)
        unsupported: set[str] = set()
        temps = {p: incomplete_dir / (quote(p, safe="") + ".incomplete") for p in sizes}
        for path, size in sizes.items():
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fds[path] = os.open(temps[path], flags, 0o600)
            os.ftruncate(fds[path], size)

        def run(job: RangeJob) -> None:
            if job.path in unsupported:
                return
            try:
                self._fetch_range(fds[job.path], job, lambda n: on_bytes(job.path, n))
            except RangeUnsupported:
                unsupported.add(job.path)
                return
            with self._lock:
                remaining[job.path] -= job.length
                finished = remaining[job.path] == 0
            if finished:
                os.close(fds.pop(job.path))
                on_file(job.path, temps[job.path])

        pool = pools.new_pool(self._connections, "range")
        error: BaseException | None = None
        try:
            pools.wait_all([pool.submit(run, job) for job in plan_ranges(sizes)])
        except BaseException as exc:
            error = exc
            raise
        finally:
            pools.shutdown(pool, error)  # Ctrl-C: the threads are not waited for
            if error is None or isinstance(error, Exception):
                for fd in fds.values():
                    os.close(fd)
        for path in unsupported:
            temps[path].unlink(missing_ok=True)
        return sorted(unsupported)
