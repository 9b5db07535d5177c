"""The disk mirror (``MIRROR/ORG/NAME`` with its own manifest): can it serve a model, and
is it intact? Used by ``weights ensure --mirror`` (to say why it cannot serve, issue 26.3)
and by ``weights mirror`` (:mod:`gpudoctor.weights.mirror_make`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.weights import localfs, trust
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.space import same_filesystem
from gpudoctor.weights.verify import quick_verify


@dataclass(frozen=True)
class MirrorState:
    """What the mirror holds for one repository.

    Attributes:
        path: ``MIRROR/ORG/NAME``.
        manifest: its manifest when the copy is usable (complete by sizes), else None.
        problem: why it cannot serve (one phrase, ``/m/acme/x has no manifest``), or None.
    """

    path: Path
    manifest: Manifest | None
    problem: str | None


def mirror_state(root: Path, repo_id: str) -> MirrorState:
    """Return the :class:`MirrorState` of ``repo_id`` in the mirror ``root`` (stat only).

    Raises UntrustedError for a mirror another user could have written (trust rules of
    :mod:`gpudoctor.weights.trust`); every other reason is returned as ``problem``.
    """
    path = localfs.mirror_dir(root, repo_id)
    trust.check_ancestors(path.parent, "--mirror")
    if not root.exists():
        return MirrorState(path, None, f"{root} does not exist")
    if not trust.check_dir(path, "the mirror"):
        return MirrorState(path, None, f"{root} holds no {repo_id} ({path} does not exist)")
    manifest = localfs.read_manifest(path)
    if manifest is None:
        return MirrorState(path, None, f"{path} has no valid {MANIFEST_NAME}")
    if manifest.repo_id != repo_id:
        return MirrorState(path, None, f"{path}'s manifest is for {manifest.repo_id}")
    problems = quick_verify(path, manifest.files, follow_symlinks=True)
    if problems:
        first = problems[0]
        return MirrorState(
            path,
            None,
            f"{path} is incomplete: {len(problems)} file(s) missing or of the wrong size,"
            f" e.g. {first.path} {first.detail}",
        )
    return MirrorState(path, manifest, None)


def revision_problem(state: MirrorState, wanted: str) -> str:
    """Return why ``state``'s complete copy is not the revision ``wanted`` (asked or resolved)."""
    held = state.manifest.revision[:12] if state.manifest else "?"
    return f"{state.path} holds revision {held}, not {wanted}"


def fill_mirror(target: Path, mirror_path: Path, manifest: Manifest, progress: Progress) -> None:
    """Put the complete model ``target`` into the mirror at ``mirror_path``: hard links on
    the same filesystem, else a copy flushed to disk; built in ``NAME.partial`` and swapped
    in (``NAME.old`` removed after). Returns None; raises OSError."""
    from gpudoctor.weights.copier import copy_files

    paths = [f.path for f in manifest.files]
    staging = localfs.partial_dir(mirror_path)
    shutil.rmtree(staging, ignore_errors=True)
    fsio.make_missing_dirs(staging, 0o755)  # every level 0755 whatever the umask
    if same_filesystem(target, staging):
        localfs.link_or_copy_tree(target, staging, paths, use_links=True)
    else:
        with progress.phase("copy to mirror", {f.path: f.size for f in manifest.files}):
            copy_files(
                target, staging, {f.path: f.size for f in manifest.files}, progress, sync=True
            )
    localfs.write_manifest(staging, manifest)
    old = mirror_path.with_name(mirror_path.name + ".old")
    if mirror_path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(mirror_path, old)
    os.rename(staging, mirror_path)
    shutil.rmtree(old, ignore_errors=True)
