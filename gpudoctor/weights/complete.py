"""What "complete" means: the one definition that ``weights status``, ``weights ensure``
and ``gpudoctor check``'s ``model.present`` share. Pure: the callers gather the facts
(sizes by ``stat``, directory listings) locally or through a Host.

A directory with a manifest is complete when every file the manifest lists is a
regular file of exactly the listed size, and no unfinished download is left in it:
no top-level entry ending in ``.incomplete``, ``.partial`` or ``.lock`` that the
manifest does not list, and nothing in huggingface_hub's ``.cache/huggingface/download``
ending in ``.incomplete``. (``--verify full`` adds the sha256 of every hashed file.)

A directory without a manifest is judged differently, and on purpose: ``status``
calls it ``unmanaged`` (exit 3: gpudoctor cannot vouch for it), while ``model.present``
falls back to ``config.json``, the safetensors index and each shard's header, so a
model made by ``hf download`` can still pass ``check``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpudoctor.weights.manifest import ManifestFile

UNFINISHED_SUFFIXES = (".incomplete", ".partial", ".lock")
HF_DOWNLOAD_DIR = ".cache/huggingface/download"


@dataclass(frozen=True)
class FileProblem:
    """One file that is not right.

    Attributes:
        path: relative path.
        problem: ``missing``, ``size``, ``sha256``, ``unfinished`` or ``untrusted``.
        detail: a short explanation that reads after the path (``is 10 bytes, manifest says 12``).
    """

    path: str
    problem: str
    detail: str


def size_problems(
    files: Iterable[ManifestFile], sizes: Mapping[str, int | None]
) -> list[FileProblem]:
    """Return the files missing (size None: absent or not a regular file) or of the wrong size."""
    problems: list[FileProblem] = []
    for f in files:
        actual = sizes.get(f.path)
        if actual is None:
            problems.append(FileProblem(f.path, "missing", "missing"))
        elif actual != f.size:
            problems.append(
                FileProblem(f.path, "size", f"is {actual} bytes, manifest says {f.size}")
            )
    return problems


def unfinished_problems(
    entries: Iterable[str], hf_entries: Iterable[str] = (), listed: Iterable[str] = ()
) -> list[FileProblem]:
    """Return the unfinished downloads among a directory's top-level ``entries`` and the
    names in its ``.cache/huggingface/download`` (``hf_entries``); ``listed`` paths are
    model files, never leftovers."""
    known = set(listed)
    names = [e for e in entries if e.endswith(UNFINISHED_SUFFIXES) and e not in known]
    names += [f"{HF_DOWNLOAD_DIR}/{e}" for e in hf_entries if e.endswith(".incomplete")]
    return [FileProblem(n, "unfinished", "is an unfinished download") for n in sorted(names)]


def completeness_problems(
    files: Iterable[ManifestFile],
    sizes: Mapping[str, int | None],
    entries: Iterable[str] = (),
    hf_entries: Iterable[str] = (),
) -> list[FileProblem]:
    """Return why a directory is not complete (empty list: it is complete), by the rule above."""
    files = list(files)
    return size_problems(files, sizes) + unfinished_problems(
        entries, hf_entries, (f.path for f in files)
    )
