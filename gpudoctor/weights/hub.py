"""The Hugging Face Hub side: which files a revision has, and fetching them.

huggingface_hub is imported inside the functions (it is slow to import, and the no-op
path of ``ensure`` must not pay for it). The token comes from huggingface_hub's usual
places (``HF_TOKEN``, ``hf auth login``'s token file) and is never printed: every
message leaving this module goes through :func:`scrub`.

Files are fetched with ``hf_hub_download(local_dir=...)`` in a thread pool, exactly
what ``snapshot_download`` does inside, but with the file list we already hold (no
second tree listing) and a progress bar per file. huggingface_hub uses hf_xet when
the server offers it, plain HTTP otherwise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.weights import localfs
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import ManifestFile, check_relative_path
from gpudoctor.weights.progress import Progress

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class RemoteSnapshot:
    """The files of one commit of a Hub repository.

    Attributes:
        repo_id: ``org/name``.
        revision: the 40-hex commit sha.
        files: every file with its size and, for LFS files, its sha256.
    """

    repo_id: str
    revision: str
    files: tuple[ManifestFile, ...]


def current_token() -> str | None:
    """Return the HF token huggingface_hub would use (never to be printed), or None.

    Looks where huggingface_hub looks, without importing it: ``HF_TOKEN``,
    ``HUGGING_FACE_HUB_TOKEN``, then the file ``HF_TOKEN_PATH`` (default
    ``$HF_HOME/token``, ``~/.cache/huggingface/token``).
    """
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    path = os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def scrub(text: str, token: str | None = None) -> str:
    """Return ``text`` with the HF token (and anything that looks like one) replaced by ``***``."""
    token = token if token is not None else current_token()
    if token:
        text = text.replace(token, "***")
    return re.sub(r"hf_[A-Za-z0-9]{8,}", "hf_***", text)


def endpoint() -> str:
    """Return the Hub endpoint in use (``HF_ENDPOINT``, default ``https://huggingface.co``)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def translate_error(exc: BaseException, repo_id: str, revision: str | None) -> WeightsError:
    """Return a one-line :class:`WeightsError` for a huggingface_hub / network / OS failure."""
    from huggingface_hub import errors as hf_errors

    rev = revision or "main"
    hub = endpoint()
    if isinstance(exc, WeightsError):
        return exc
    if isinstance(exc, hf_errors.GatedRepoError):
        msg = f"{repo_id} is gated on {hub}: accept its terms on the Hub and set HF_TOKEN"
    elif isinstance(exc, hf_errors.RepositoryNotFoundError):
        msg = f"repository {repo_id} not found on {hub} (private? set HF_TOKEN or `hf auth login`)"
    elif isinstance(exc, hf_errors.RevisionNotFoundError):
        msg = f"revision {rev!r} not found in {repo_id} on {hub}"
    elif isinstance(exc, hf_errors.RemoteEntryNotFoundError):
        msg = f"a file of {repo_id}@{rev} is missing on {hub}: {_first_line(exc)}"
    elif isinstance(exc, hf_errors.OfflineModeIsEnabled) or (
        isinstance(exc, hf_errors.LocalEntryNotFoundError) and _offline()
    ):
        msg = f"offline (HF_HUB_OFFLINE is set) and no complete local copy or mirror of {repo_id}"
    elif isinstance(exc, hf_errors.LocalEntryNotFoundError):
        # hf_hub_download's wrapper for a failed HEAD: the cause is the real story.
        cause = exc.__cause__
        why = f"{type(cause).__name__}: {_first_line(cause)}" if cause else _first_line(exc)
        msg = f"cannot reach the Hub at {hub} to fetch a file of {repo_id}@{rev} ({why})"
    elif isinstance(exc, hf_errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        msg = f"the Hub ({hub}) answered HTTP {status} for {repo_id}: {_first_line(exc)}"
    elif _is_network_error(exc):
        msg = f"cannot reach the Hub at {hub} ({type(exc).__name__}: {_first_line(exc)})"
    elif isinstance(exc, PermissionError):
        msg = f"permission denied: {exc.filename or _first_line(exc)}"
    elif isinstance(exc, OSError) and exc.errno == 28:
        msg = f"no space left on device while writing {exc.filename or ''}".rstrip()
    else:
        msg = f"{type(exc).__name__}: {_first_line(exc)}"
    return WeightsError(scrub(msg))


def _offline() -> bool:
    """Return True when huggingface_hub runs offline (``HF_HUB_OFFLINE=1``)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _is_network_error(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"ConnectError", "TimeoutException", "NetworkError", "ConnectionError"})


def fetch_snapshot(repo_id: str, revision: str | None) -> RemoteSnapshot:
    """Return the revision's commit sha and file list with sizes and LFS sha256.

    Requests: ``GET /api/models/ID/revision/REV`` (skipped for a full sha), then
    ``GET /api/models/ID/tree/SHA?recursive=true``. Equivalent: ``hf api`` calls
    ``repo_info`` + ``list_repo_tree``.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    try:
        sha = revision if revision and FULL_SHA.match(revision) else None
        if sha is None:
            # "main" as snapshot_download's default; never the revision-less route.
            sha = api.repo_info(repo_id, revision=revision or "main").sha
        entries = list(api.list_repo_tree(repo_id, revision=sha, recursive=True))
    except Exception as exc:
        raise translate_error(exc, repo_id, revision) from None
    files = []
    for entry in entries:
        if isinstance(entry, RepoFile):
            lfs = entry.lfs
            files.append(
                ManifestFile(
                    check_relative_path(entry.path), int(entry.size), lfs.sha256 if lfs else None
                )
            )
    return RemoteSnapshot(repo_id, sha, tuple(sorted(files, key=lambda f: f.path)))


class _FileBar:
    """A tqdm look-alike that forwards byte counts of one file to a :class:`Progress`."""

    progress: Progress
    path: str

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        initial = int(kwargs.get("initial") or 0)
        if initial:
            self.progress.advance(self.path, initial)

    def update(self, n: float | None = 1) -> None:
        self.progress.advance(self.path, int(n or 0))

    def update_transfer(self, n: float | None = 1) -> None:
        """Network bytes (hf_xet); counted through :meth:`update` instead."""

    def __enter__(self) -> _FileBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    @property
    def format_dict(self) -> dict[str, Any]:
        return {}

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _bar_for(progress: Progress, path: str) -> type:
    return type("FileBar", (_FileBar,), {"progress": progress, "path": path})


def download_files(
    snapshot: RemoteSnapshot,
    files: Iterable[ManifestFile],
    dest: Path,
    progress: Progress,
    workers: int = 16,
) -> None:
    """Download ``files`` of ``snapshot`` into ``dest`` (``hf download ID FILES --local-dir DEST``).

    Files of at least 16 MiB are fetched by ranges over ``workers`` parallel
    connections (:mod:`gpudoctor.weights.fetch`); smaller ones, and every file when a
    proxy is configured or the server ignores ``Range``, with huggingface_hub's
    ``hf_hub_download`` (up to 8 at a time, as ``hf download``). Returns None. Files finish one by one
    (each is renamed into place when complete), so an interruption keeps every
    finished file. Raises :class:`WeightsError` (one line) on the first failure.
    """
    from gpudoctor.weights import fetch
    from gpudoctor.weights import pool as pools

    files = sorted(files, key=lambda f: -f.size)
    url_of = lambda path: fetch.resolve_url(endpoint(), snapshot.repo_id, snapshot.revision, path)  # noqa: E731
    ranged = {f.path: f.size for f in files if f.size >= fetch.RANGED_MIN_BYTES}
    if ranged and fetch.proxies_in_use(url_of("x")):
        ranged = {}
    small = [f for f in files if f.path not in ranged]
    # small files: hf's own pace (hf download uses 8 workers); big ones: ``workers`` connections
    pool = pools.new_pool(max(1, min(workers, 8)), "download")
    interrupted: BaseException | None = None
    try:
        futures = [pool.submit(_hf_fetch, snapshot, f, dest, progress) for f in small]
        if ranged:
            incomplete = localfs.private_subdir(dest, fetch.INCOMPLETE_DIR)

            def finished(path: str, temp: Path) -> None:
                localfs.move_into(temp, dest, path)
                progress.file_done(path)

            downloader = fetch.RangedDownloader(url_of, current_token(), max(1, workers))
            try:
                fallback = downloader.download(ranged, incomplete, progress.advance, finished)
            except Exception as exc:
                raise translate_error(exc, snapshot.repo_id, snapshot.revision) from None
            futures += [
                pool.submit(_hf_fetch, snapshot, f, dest, progress)
                for f in files
                if f.path in fallback
            ]
        try:
            pools.wait_all(futures)
        except Exception as error:
            raise translate_error(error, snapshot.repo_id, snapshot.revision) from None
    except BaseException as exc:
        interrupted = exc
        raise
    finally:
        pools.shutdown(pool, interrupted)


def _hf_fetch(snapshot: RemoteSnapshot, f: ManifestFile, dest: Path, progress: Progress) -> str:
    """Download one file with ``hf_hub_download(local_dir=dest)``; return its path."""
    from huggingface_hub import hf_hub_download

    hf_hub_download(
        snapshot.repo_id,
        f.path,
        revision=snapshot.revision,
        local_dir=dest,
        tqdm_class=_bar_for(progress, f.path),  # type: ignore[arg-type]
    )
    progress.file_done(f.path)
    return f.path
