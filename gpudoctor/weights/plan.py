"""Pure decisions of the weights workflow: which revision matches, what to keep and fetch.

No I/O here: inputs are manifests, file lists and observed sizes; outputs are lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudoctor.weights.manifest import ManifestFile

_HEX_PREFIX = re.compile(r"^[0-9a-f]{7,40}$")


def revision_matches(requested: str | None, actual_sha: str) -> bool | None:
    """Return True/False when ``requested`` can be compared with ``actual_sha`` offline.

    None (no revision asked) matches any; a hex prefix of at least 7 digits matches
    the sha it starts; a branch or tag name returns None: only the Hub can tell.
    """
    if requested is None:
        return True
    if _HEX_PREFIX.match(requested):
        if actual_sha.startswith(requested):
            return True
        return False if len(requested) == 40 else None
    return None


@dataclass(frozen=True)
class WorkPlan:
    """What to do with a (partial) directory to make it match a file list.

    Attributes:
        keep: files already there with the right size (relative paths).
        fetch: files to copy or download.
        delete: paths to remove first (wrong size, stale revision, unknown origin).
        hash_first: kept files of unknown origin to check by sha256 before trusting them.
    """

    keep: tuple[str, ...]
    fetch: tuple[ManifestFile, ...]
    delete: tuple[str, ...]
    hash_first: tuple[ManifestFile, ...]

    @property
    def fetch_bytes(self) -> int:
        """Return the bytes to fetch."""
        return sum(f.size for f in self.fetch)


def plan_work(
    wanted: tuple[ManifestFile, ...],
    sizes: dict[str, int | None],
    trusted: bool,
    previous: tuple[ManifestFile, ...] = (),
    known_bad: frozenset[str] = frozenset(),
) -> WorkPlan:
    """Return the :class:`WorkPlan` to turn a directory with ``sizes`` into ``wanted``.

    ``trusted``: the directory was written by gpudoctor for this very revision (its
    manifest or partial marker says so), so a file of the right size is complete
    (huggingface_hub renames a file into place only when fully downloaded).
    ``previous``: the files of the directory's old manifest (another revision): a
    file is kept only if its size and sha256 are the same in both; old files that
    the new revision does not have are deleted. ``known_bad``: paths a verify just
    found wrong (deleted and fetched again whatever their size).
    """
    old = {f.path: f for f in previous}
    keep: list[str] = []
    fetch: list[ManifestFile] = []
    delete: list[str] = []
    hash_first: list[ManifestFile] = []
    for f in wanted:
        size = sizes.get(f.path)
        if f.path in known_bad and size is not None:
            delete.append(f.path)
            fetch.append(f)
        elif size is None:
            fetch.append(f)
        elif size != f.size:
            delete.append(f.path)
            fetch.append(f)
        elif trusted:
            keep.append(f.path)
        elif f.path in old:
            same = old[f.path].sha256 is not None and old[f.path] == f
            (keep if same else delete).append(f.path)
            if not same:
                fetch.append(f)
        elif f.sha256 is not None:
            keep.append(f.path)
            hash_first.append(f)
        else:
            delete.append(f.path)
            fetch.append(f)
    wanted_paths = {f.path for f in wanted}
    delete.extend(path for path in old if path not in wanted_paths)
    return WorkPlan(tuple(keep), tuple(fetch), tuple(delete), tuple(hash_first))
