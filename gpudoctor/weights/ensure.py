"""``gpudoctor weights ensure``: make a directory hold a complete, verified model.

Order (see docs/weights.md): no-op when complete -> decide the file list (mirror
manifest, local manifest or the Hub) -> space precheck -> build in ``TARGET.partial``
(restore from the mirror, or download) -> verify -> manifest -> atomic rename ->
fill the mirror. The unit of resume is a finished file.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from gpudoctor.weights import localfs, trust
from gpudoctor.weights.complete import FileProblem, unfinished_problems
from gpudoctor.weights.errors import VerifyError, WeightsError
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, ManifestFile, utc_now_iso
from gpudoctor.weights.mirror import fill_mirror, mirror_state, revision_problem
from gpudoctor.weights.plan import WorkPlan, plan_work, revision_matches
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.space import bytes_on_disk, check_fits, measure_space, same_filesystem
from gpudoctor.weights.verify import directory_problems, full_verify

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


@dataclass(frozen=True)
class EnsureRequest:
    """What the user asked for.

    Attributes:
        repo_id: Hub repository (``org/name``).
        target: the model directory to fill (typically on tmpfs, ``/dev/shm/NAME``).
        revision: branch, tag or commit sha; None = whatever is complete locally, else ``main``.
        mirror: root of a local disk mirror (``MIRROR/org/name``), or None.
        verify: ``quick`` (sizes) or ``full`` (sha256 of LFS files too).
        max_workers: parallel downloads.
        mirror_only: never download: fail (saying why) when the mirror cannot serve.
    """

    repo_id: str
    target: Path
    revision: str | None = None
    mirror: Path | None = None
    verify: str = "quick"
    max_workers: int = 16
    mirror_only: bool = False


@dataclass(frozen=True)
class EnsureResult:
    """What ``ensure`` did.

    Attributes:
        repo_id: the repository.
        revision: the commit sha now in ``target``.
        target: the model directory.
        action: ``none`` (already complete), ``restored``, ``downloaded`` or ``repaired``.
        source: ``local``, ``mirror`` or ``hub``: where the fetched bytes came from.
        files_total: files in the model.
        bytes_total: bytes in the model.
        files_fetched: files copied or downloaded by this run.
        bytes_fetched: bytes copied or downloaded by this run.
        verify: the verification done (``quick`` or ``full``).
        mirror_updated: True when the mirror received this revision.
        seconds: wall time of the run.
        warnings: non-fatal problems (one line each).
        mirror_problem: why ``--mirror`` could not serve this run (None: it served, or
            there was no ``--mirror``, or the target was already complete).
    """

    repo_id: str
    revision: str
    target: str
    action: str
    source: str
    files_total: int
    bytes_total: int
    files_fetched: int = 0
    bytes_fetched: int = 0
    verify: str = "quick"
    mirror_updated: bool = False
    seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)
    mirror_problem: str | None = None

    def to_dict(self) -> dict[str, object]:
        """Return the result as a JSON-ready dict."""
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        return data


@dataclass(frozen=True)
class _Source:
    files: tuple[ManifestFile, ...]
    revision: str
    kind: str  # "mirror" or "hub"


def _check_request(req: EnsureRequest) -> None:
    if not _REPO_ID.match(req.repo_id) or ".." in req.repo_id:
        raise WeightsError(f"invalid repository id {req.repo_id!r} (expected ORG/NAME)")
    if req.verify not in ("quick", "full"):
        raise WeightsError(f"invalid verify mode {req.verify!r} (quick or full)")
    if os.path.ismount(req.target):
        raise WeightsError(
            f"{req.target} is a mount point: it cannot be replaced atomically;"
            f" use a directory inside it (--to {req.target}/MODEL)"
        )


def _problems(
    directory: Path, files: tuple[ManifestFile, ...], mode: str, progress: Progress
) -> list[FileProblem]:
    """Return why ``directory`` is not complete (the rule of :mod:`gpudoctor.weights.complete`)."""
    if mode == "full":
        return full_verify(directory, files, progress, whole_directory=True)
    return directory_problems(directory, files)


def _complete_result(req: EnsureRequest, m: Manifest, t0: float) -> EnsureResult:
    return EnsureResult(
        repo_id=m.repo_id,
        revision=m.revision,
        target=str(req.target),
        action="none",
        source="local",
        files_total=len(m.files),
        bytes_total=m.total_size,
        verify=req.verify,
        seconds=time.monotonic() - t0,
    )


def ensure(
    req: EnsureRequest, progress: Progress, notify: Callable[[str], None] | None = None
) -> EnsureResult:
    """Return an :class:`EnsureResult` once ``req.target`` holds the complete model.

    ``notify(line)`` is told, before any download starts, why ``--mirror`` cannot serve.
    Raises :class:`WeightsError` (one-line message) on any failure, file-system
    errors included; its ``mirror_problem`` attribute (and its message) say why the
    mirror could not serve, when it could not. A failed first download leaves
    ``TARGET.partial`` for the next run to resume from; a failed repair of an existing
    ``TARGET`` renames it back, so the user's directory never disappears.
    """
    t0 = time.monotonic()
    _check_request(req)
    req = replace(req, target=trust.safe_location(req.target))
    trust.check_dir(req.target, "--to")
    local = localfs.read_manifest(req.target)
    if (
        req.verify == "quick"
        and local is not None
        and local.repo_id == req.repo_id
        and revision_matches(req.revision, local.revision)
        and not directory_problems(req.target, local.files)
    ):
        return _complete_result(req, local, t0)
    notes: dict[str, str | None] = {"mirror_problem": None}
    try:
        with localfs.locked(req.target):
            return _ensure_locked(req, progress, t0, notes, notify or (lambda line: None))
    except (WeightsError, OSError) as exc:
        from gpudoctor.weights.hub import translate_error

        error = translate_error(exc, req.repo_id, req.revision)
        problem = notes["mirror_problem"]
        if problem and not error.args[0].startswith("--mirror-only"):
            error = type(error)(f"{error} (--mirror could not serve: {problem})")
        error.mirror_problem = problem  # type: ignore[attr-defined]
        raise error from None


def _ensure_locked(
    req: EnsureRequest,
    progress: Progress,
    t0: float,
    notes: dict[str, str | None],
    notify: Callable[[str], None],
) -> EnsureResult:
    from gpudoctor.weights import hub

    target, partial = req.target, localfs.partial_dir(req.target)
    local = localfs.read_manifest(target)
    if local is not None and local.repo_id != req.repo_id:
        raise WeightsError(
            f"{target} holds {local.repo_id}, not {req.repo_id}: choose another --to"
        )
    state = mirror_state(req.mirror, req.repo_id) if req.mirror else None
    mirror_path = state.path if state else None
    mirrored = state.manifest if state else None
    notes["mirror_problem"] = state.problem if state else None
    if req.mirror_only and state is not None and state.problem:
        raise WeightsError(f"--mirror-only: {state.problem}; nothing was downloaded")
    source = _choose_source(req, local, mirrored)
    if state is not None and source.kind != "mirror":
        if state.problem is None:
            notes["mirror_problem"] = revision_problem(state, req.revision or source.revision)
        if req.mirror_only:
            raise WeightsError(f"--mirror-only: {notes['mirror_problem']}; nothing was downloaded")
        notify(
            f"--mirror {req.mirror} cannot serve {req.repo_id}: {notes['mirror_problem']};"
            " fetching from the Hub"
        )
    reserved = [f.path for f in source.files if trust.reserved_name(f.path)]
    if reserved:
        raise WeightsError(
            f"{req.repo_id} has a file named {reserved[0]!r}, which collides with gpudoctor's"
            " own bookkeeping (.gpudoctor-*, .cache/huggingface/); refusing to fetch it"
        )
    known_bad: frozenset[str] = frozenset()
    target_exists = trust.check_dir(target, "--to")
    partial_exists = trust.check_dir(partial, "the partial directory of an earlier run")
    if local is not None and local.revision == source.revision:
        problems = _problems(target, source.files, req.verify, progress)
        if not problems and local.files == source.files:
            return _complete_result(req, local, t0)
        known_bad = frozenset(p.path for p in problems)
    if target_exists and partial_exists:
        raise WeightsError(f"both {target} and {partial} exist: remove the one you do not want")
    existing = partial if partial_exists else target if target_exists else None
    plan = _plan_for(existing, local, source, req.repo_id, known_bad)
    _precheck_space(req, source, plan.fetch, mirror_path, mirrored)

    renamed = existing == target
    if renamed:
        os.rename(target, partial)
    elif existing is None:
        try:
            os.mkdir(partial, 0o700)
        except PermissionError:
            raise WeightsError(f"permission denied: cannot create {partial}") from None
    try:
        manifest, fetch, warnings = _build(
            req, source, plan, partial, mirror_path, progress, renamed
        )
    except BaseException as exc:
        if renamed:  # the user's directory keeps its name, whatever failed (issue 34.7)
            same_revision = local is not None and local.revision == source.revision
            verified = not isinstance(exc, VerifyError)  # else it holds files proven wrong
            with contextlib.suppress(OSError):  # the first error is the one to tell
                _put_back(partial, target, keep_manifest=same_revision and verified)
        raise
    from gpudoctor.weights.record import TargetRecord, remember

    mirror_text = str(req.mirror.absolute()) if req.mirror else None
    problem = remember(target, TargetRecord(req.repo_id, req.revision, mirror_text))
    warnings += [problem] if problem else []
    mirror_updated = False
    if mirror_path is not None and (mirrored is None or mirrored.revision != source.revision):
        try:
            fill_mirror(target, mirror_path, manifest, progress)
            mirror_updated = True
        except OSError as exc:
            warnings.append(hub.scrub(f"mirror not updated: {exc}"))
    action = (
        "restored"
        if source.kind == "mirror"
        else "repaired"
        if existing == target
        else "downloaded"
    )
    return EnsureResult(
        repo_id=req.repo_id,
        revision=source.revision,
        target=str(target),
        action=action,
        source=source.kind,
        files_total=len(source.files),
        bytes_total=manifest.total_size,
        files_fetched=len(fetch),
        bytes_fetched=sum(f.size for f in fetch),
        verify=req.verify,
        mirror_updated=mirror_updated,
        seconds=time.monotonic() - t0,
        warnings=tuple(warnings),
        mirror_problem=notes["mirror_problem"],
    )


def _refetch_warnings(
    req: EnsureRequest, source: _Source, problems: list, copied_bad: list
) -> list[str]:
    """Return the warnings for the files fetched again: those the mirror gave with a wrong
    sha256 named as the mirror's damage, which stays, with the command that re-makes it
    from the restored copy (issue 47); the others as failing ``req.verify``."""
    damaged = copied_bad if source.kind == "mirror" and req.mirror is not None else []
    rest = [p for p in problems if p not in damaged]
    warnings = (
        [f"{len(rest)} file(s) failed {req.verify} verify and were re-fetched"] if rest else []
    )
    if damaged:
        names = ", ".join(p.path for p in damaged[:3]) + (", ..." if len(damaged) > 3 else "")
        warnings.append(
            f"{len(damaged)} file(s) of the mirror {req.mirror} failed sha256 ({names}) and were"
            f" fetched from the Hub instead; the mirror stays damaged: re-make it with"
            f" gpudoctor weights mirror {req.repo_id} --to {req.mirror} --from {req.target}"
        )
    return warnings


def _build(
    req: EnsureRequest,
    source: _Source,
    plan: WorkPlan,
    partial: Path,
    mirror_path: Path | None,
    progress: Progress,
    renamed: bool,
) -> tuple[Manifest, list[ManifestFile], list[str]]:
    """Fill ``partial`` per ``plan``, verify it, write its manifest and publish it as
    ``req.target``; return the manifest written, the files fetched and the warnings."""
    from gpudoctor.weights import hub

    kept_in = req.target if renamed else partial
    localfs.write_partial_marker(partial, req.repo_id, source.revision)
    localfs.clean_incomplete(partial)
    localfs.remove_files(partial, plan.delete)
    fetch = list(plan.fetch)
    if plan.hash_first:
        suspects = full_verify(partial, plan.hash_first, progress)
        localfs.remove_files(partial, [p.path for p in suspects])
        bad = {p.path for p in suspects}
        fetch += [f for f in plan.hash_first if f.path in bad]
    snapshot = hub.RemoteSnapshot(req.repo_id, source.revision, source.files)
    copied_bad = _fetch(req, source, snapshot, fetch, partial, mirror_path, progress)
    warnings: list[str] = []
    problems = _problems(partial, source.files, req.verify, progress)
    if copied_bad:  # proven wrong while restored: said as such, not as "missing"
        bad_paths = {p.path for p in copied_bad}
        problems = copied_bad + [p for p in problems if p.path not in bad_paths]
    if problems:
        warnings += _refetch_warnings(req, source, problems, copied_bad)
        if req.mirror_only:
            raise VerifyError(
                f"--mirror-only: {problems[0].path} from the mirror failed verify"
                f" ({problems[0].detail}); nothing was downloaded. Kept in {kept_in}"
            )
        bad_paths = {p.path for p in problems}
        localfs.remove_files(partial, bad_paths)
        refetch = [f for f in source.files if f.path in bad_paths]
        from_hub = _Source(source.files, source.revision, "hub")
        try:
            _fetch(req, from_hub, snapshot, refetch, partial, None, progress)
        except WeightsError as exc:
            raise WeightsError(
                f"{problems[0].path} from the {source.kind} failed verify"
                f" ({problems[0].detail}) and fetching it again failed: {exc}"
            ) from None
        again = _problems(partial, tuple(refetch), req.verify, progress)
        if again:
            raise VerifyError(
                f"{len(again)} file(s) still wrong after re-download, e.g. {again[0].path}"
                f" ({again[0].detail}); the source serves bad bytes. Kept in {kept_in}"
            )
    manifest = Manifest(req.repo_id, source.revision, source.files, utc_now_iso())
    localfs.drop_hf_cache(partial)
    localfs.remove_partial_marker(partial)
    leftovers = unfinished_problems(localfs.list_names(partial), (), manifest_paths(source))
    localfs.remove_leftovers(partial, [p.path for p in leftovers])
    localfs.write_manifest(partial, manifest)
    localfs.publish(partial, req.target)
    return manifest, fetch, warnings


def _put_back(partial: Path, target: Path, keep_manifest: bool) -> None:
    """Rename the user's directory, moved to ``partial`` for a repair that failed, back to
    ``target``. Its manifest stays only when the repair fetched the same revision (the
    files are then what it lists); otherwise it is removed, so nothing calls a mix of two
    revisions complete (``weights status`` then says so, and the next run resumes)."""
    if target.exists() or not partial.is_dir():
        return
    localfs.remove_partial_marker(partial)
    localfs.drop_hf_cache(partial)
    if not keep_manifest:
        localfs.remove_files(partial, [MANIFEST_NAME])
    os.rename(partial, target)


def manifest_paths(source: _Source) -> list[str]:
    """Return the paths of the files the model consists of."""
    return [f.path for f in source.files]


def _choose_source(
    req: EnsureRequest, local: Manifest | None, mirrored: Manifest | None
) -> _Source:
    """Return the file list to build, preferring what is known offline (mirror, local)."""
    from gpudoctor.weights import hub

    if mirrored is not None and revision_matches(req.revision, mirrored.revision):
        return _Source(mirrored.files, mirrored.revision, "mirror")
    local_ok = local is not None and revision_matches(req.revision, local.revision)
    if local_ok and req.verify == "quick":
        return _Source(local.files, local.revision, "hub")
    # --verify full hashes against the Hub's (or the mirror's) list, never the target's own.
    revision = local.revision if local_ok and local is not None else req.revision
    snapshot = hub.fetch_snapshot(req.repo_id, revision)
    if mirrored is not None and mirrored.revision == snapshot.revision:
        return _Source(mirrored.files, mirrored.revision, "mirror")
    return _Source(snapshot.files, snapshot.revision, "hub")


def _plan_for(
    existing: Path | None,
    local: Manifest | None,
    source: _Source,
    repo_id: str,
    known_bad: frozenset[str],
) -> WorkPlan:
    """Return the WorkPlan for the directory to build from (None: an empty one)."""
    paths = [f.path for f in source.files]
    if existing is None:
        return plan_work(source.files, {}, trusted=True)
    sizes = localfs.file_sizes(existing, paths)
    if existing.name.endswith(".partial"):
        marker = localfs.read_partial_marker(existing)
        return plan_work(source.files, sizes, trusted=marker == (repo_id, source.revision))
    if local is not None and local.revision == source.revision:
        return plan_work(source.files, sizes, trusted=True, known_bad=known_bad)
    return plan_work(source.files, sizes, trusted=False, previous=local.files if local else ())


def _precheck_space(
    req: EnsureRequest,
    source: _Source,
    fetch: tuple[ManifestFile, ...],
    mirror_path: Path | None,
    mirrored: Manifest | None,
) -> None:
    """Raise SpaceError before any write when the fetch (or the mirror copy) cannot fit."""
    check_fits(bytes_on_disk([f.size for f in fetch]), measure_space(req.target))
    fills_mirror = mirror_path is not None and (
        mirrored is None or mirrored.revision != source.revision
    )
    if fills_mirror and not same_filesystem(req.target, mirror_path):
        check_fits(
            bytes_on_disk([f.size for f in source.files]),
            measure_space(mirror_path),
            "the mirror copy",
        )


def _fetch(
    req: EnsureRequest,
    source: _Source,
    snapshot,
    files: list[ManifestFile],
    partial: Path,
    mirror_path: Path | None,
    progress: Progress,
) -> list[FileProblem]:
    """Copy ``files`` from the mirror or download them from the Hub into ``partial``;
    return the mirror's files whose copied bytes do not hash to the mirror's sealed
    manifest (left out of ``partial``; every restored file is hashed as it is written)."""
    from gpudoctor.weights import hub
    from gpudoctor.weights.copier import copy_files

    if not files:
        return []
    sizes = {f.path: f.size for f in files}
    if source.kind == "mirror" and mirror_path is not None:
        with progress.phase("restore from mirror", sizes):
            try:
                return copy_files(mirror_path, partial, sizes, progress,
                                  expected={f.path: f.sha256 for f in files})  # fmt: skip
            except OSError as exc:
                raise hub.translate_error(exc, req.repo_id, source.revision) from None
    with progress.phase("download", sizes):
        hub.download_files(snapshot, files, partial, progress, workers=req.max_workers)
    return []
