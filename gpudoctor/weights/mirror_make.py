"""``gpudoctor weights mirror``: make a disk mirror of a model, and check one.

``make_mirror`` fills ``MIRROR/ORG/NAME`` from the Hub (``weights ensure`` into the mirror
with ``--verify full``: the same trust rules, resume and space checks) or from a complete
local copy (``--from DIR``, a directory with a gpudoctor manifest, checked by sha256 first;
hard links on the same filesystem, else a copy flushed to disk). Then it *seals* the
mirror: every file gets a sha256 in the manifest (the Hub gives none for small git files,
so those are hashed here), every file is ``fsync``'ed, and the manifest is written
atomically and durably (:func:`gpudoctor.fsio.atomic_replace`). ``verify_mirror``
re-hashes every file against that manifest (``sha256sum -c``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.weights import localfs, trust
from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, ManifestFile, utc_now_iso
from gpudoctor.weights.mirror import fill_mirror
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.verify import full_verify, sha256_of


@dataclass(frozen=True)
class MirrorCopy:
    """One model in a mirror, as made or as checked.

    Attributes:
        repo_id: the repository (``""`` when the directory has no valid manifest).
        path: ``MIRROR/ORG/NAME``.
        revision: the commit sha it holds (``""`` when unknown).
        files_total: files in its manifest.
        bytes_total: bytes in its manifest.
        problems: files missing, of the wrong size or the wrong sha256 (empty: intact).
    """

    repo_id: str
    path: str
    revision: str
    files_total: int
    bytes_total: int
    problems: tuple[FileProblem, ...] = field(default_factory=tuple)

    @property
    def intact(self) -> bool:
        """Return True when every file is present with its size and sha256."""
        return not self.problems

    def to_dict(self) -> dict[str, object]:
        """Return the copy as a JSON-ready dict (``intact`` included)."""
        data = asdict(self)
        data["problems"] = [asdict(p) for p in self.problems]
        data["intact"] = self.intact
        return data


def _copy_of(manifest: Manifest, path: Path, problems: list[FileProblem]) -> MirrorCopy:
    return MirrorCopy(
        manifest.repo_id,
        str(path),
        manifest.revision,
        len(manifest.files),
        manifest.total_size,
        tuple(problems),
    )


def seal(path: Path, manifest: Manifest, progress: Progress) -> Manifest:
    """Hash the files of ``manifest`` that have no sha256, fsync every file, and write the
    manifest with every hash (atomically, fsync'ed); return the sealed manifest."""
    files = []
    with progress.phase("hash", {f.path: f.size for f in manifest.files if f.sha256 is None}):
        for f in manifest.files:
            digest = f.sha256 or sha256_of(path / f.path, progress, f.path)
            files.append(ManifestFile(f.path, f.size, digest))
    for f in files:
        fd = os.open(path / f.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    sealed = Manifest(manifest.repo_id, manifest.revision, tuple(files), utc_now_iso())
    localfs.write_manifest(path, sealed)
    return sealed


def make_mirror(
    repo_id: str,
    root: Path,
    progress: Progress,
    source: Path | None = None,
    revision: str | None = None,
    max_workers: int = 16,
) -> MirrorCopy:
    """Fill ``root/ORG/NAME`` with ``repo_id`` (from the Hub, or from the complete local
    copy ``source``) and seal it; return the :class:`MirrorCopy` made.

    Raises WeightsError (one line): an incomplete or foreign ``source``, an untrusted
    mirror directory, or any failure of the download.
    """
    from gpudoctor.weights.ensure import EnsureRequest, ensure

    path = localfs.mirror_dir(root, repo_id)
    if source is None:
        request = EnsureRequest(repo_id, path, revision, None, "full", max_workers)
        ensure(request, progress)
        manifest = localfs.read_manifest(path)
        if manifest is None:  # pragma: no cover - ensure just wrote it
            raise WeightsError(f"{path} has no manifest after the download")
        return _copy_of(seal(path, manifest, progress), path, [])
    trust.check_dir(source, "--from")
    manifest = localfs.read_manifest(source)
    if manifest is None:
        raise WeightsError(
            f"--from {source} has no gpudoctor {MANIFEST_NAME}: make it complete first"
            f" (gpudoctor weights ensure {repo_id} --to {source}, which adopts an hf download)"
        )
    if manifest.repo_id != repo_id:
        raise WeightsError(f"--from {source} holds {manifest.repo_id}, not {repo_id}")
    if revision is not None and not manifest.revision.startswith(revision):
        raise WeightsError(
            f"--from {source} holds revision {manifest.revision[:12]}, not {revision}"
        )
    problems = full_verify(source, manifest.files, progress, whole_directory=True)
    if problems:
        first = problems[0]
        raise WeightsError(
            f"--from {source} is not complete: {len(problems)} file(s) wrong, e.g."
            f" {first.path} {first.detail}; nothing was written to the mirror"
        )
    trust.check_ancestors(path.parent, "--to")
    trust.check_dir(path, "the mirror")
    fsio.make_missing_dirs(path.parent)
    try:
        fill_mirror(source, path, manifest, progress)
    except OSError as exc:
        raise WeightsError(f"cannot write the mirror {path}: {exc}") from None
    return _copy_of(seal(path, manifest, progress), path, [])


def mirror_models(root: Path) -> list[Path]:
    """Return the model directories of the mirror ``root``: every ``ORG/NAME`` (or
    ``NAME``) that holds a manifest, sorted; a refresh's ``NAME.partial``/``NAME.old``
    left by an interrupted ``weights mirror`` is not a model."""
    found: list[Path] = []
    for first in sorted(localfs.list_names(root)):
        top = root / first
        if not _model_candidate(top):
            continue
        if (top / MANIFEST_NAME).exists():
            found.append(top)
            continue
        for second in sorted(localfs.list_names(top)):
            model = top / second
            if _model_candidate(model) and (model / MANIFEST_NAME).exists():
                found.append(model)
    return found


def _model_candidate(path: Path) -> bool:
    """Return True for a real directory that is not a refresh's leftover (``NAME.partial``
    being built, ``NAME.old`` being replaced: :func:`gpudoctor.weights.mirror.fill_mirror`)."""
    return path.is_dir() and not path.is_symlink() and not path.name.endswith((".partial", ".old"))


def verify_mirror(root: Path, progress: Progress, repo_id: str | None = None) -> list[MirrorCopy]:
    """Re-hash every model in the mirror ``root`` (only ``repo_id`` when given) against its
    manifest; return one :class:`MirrorCopy` per model, with its bad and missing files.

    Raises WeightsError when ``root`` (or ``repo_id`` in it) holds no model, and
    UntrustedError for a directory or manifest another user could have written.
    """
    if not root.is_dir():
        raise WeightsError(f"mirror {root} does not exist or is not a directory")
    trust.check_ancestors(root, "--verify")
    paths = [localfs.mirror_dir(root, repo_id)] if repo_id else mirror_models(root)
    if not paths and ((root / MANIFEST_NAME).is_file() or (root / "config.json").is_file()):
        raise WeightsError(  # issue 47: a model directory is checked by `weights status`
            f"{root} is a model directory, not a mirror root (M with ORG/NAME under it); check"
            f" it with: gpudoctor weights status {root} --verify full"
        )
    if not paths:
        raise WeightsError(f"mirror {root} holds no model with a gpudoctor manifest")
    copies = []
    for path in paths:
        if not trust.check_dir(path, "the mirror"):
            raise WeightsError(f"mirror {root} holds no {repo_id} ({path} does not exist)")
        manifest = localfs.read_manifest(path)
        if manifest is None:
            problem = FileProblem(MANIFEST_NAME, "missing", "missing or invalid")
            copies.append(MirrorCopy(repo_id or "", str(path), "", 0, 0, (problem,)))
            continue
        copies.append(_copy_of(manifest, path, full_verify(path, manifest.files, progress)))
    return copies
