"""``gpudoctor weights status``: is a model directory complete, by its manifest?"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpudoctor.weights import localfs, trust
from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.verify import directory_problems, full_verify


@dataclass(frozen=True)
class StatusResult:
    """The state of one model directory.

    Attributes:
        target: the directory asked about.
        state: ``complete`` (by :mod:`gpudoctor.weights.complete`, the rule that
            ``check``'s model.present applies too), ``incomplete``
            (manifest present, files missing or wrong), ``unmanaged`` (exists, no
            valid manifest), ``missing`` (does not exist) or ``untrusted`` (a symlink,
            another user's, or writable by others: see :mod:`gpudoctor.weights.trust`).
        repo_id: from the manifest ("" when none).
        revision: from the manifest ("" when none).
        created_at: when the manifest was written ("" when none).
        files_total: files listed in the manifest.
        bytes_total: bytes listed in the manifest.
        verify: ``quick`` (sizes) or ``full`` (sha256 too).
        problems: the files that are missing or wrong.
        partial: path of a ``*.partial`` directory left by an interrupted run, or "".
    """

    target: str
    state: str
    repo_id: str = ""
    revision: str = ""
    created_at: str = ""
    files_total: int = 0
    bytes_total: int = 0
    verify: str = "quick"
    problems: tuple[FileProblem, ...] = field(default_factory=tuple)
    partial: str = ""

    @property
    def complete(self) -> bool:
        """Return True when the directory is complete."""
        return self.state == "complete"

    def to_dict(self) -> dict[str, object]:
        """Return the result as a JSON-ready dict."""
        data = asdict(self)
        data["problems"] = [asdict(p) for p in self.problems]
        return data


def status(target: Path, progress: Progress, verify: str = "quick") -> StatusResult:
    """Return the :class:`StatusResult` of ``target`` (reads only metadata unless ``full``)."""
    target = target.absolute()
    partial = localfs.partial_dir(target)
    partial_text = str(partial) if partial.exists() else ""
    try:
        if not trust.check_dir(target, "the model directory"):
            return StatusResult(str(target), "missing", verify=verify, partial=partial_text)
        manifest = localfs.read_manifest(target)
    except trust.UntrustedError as exc:
        problem = FileProblem(".", "untrusted", str(exc))
        return StatusResult(str(target), "untrusted", verify=verify, problems=(problem,))
    if manifest is None:
        return StatusResult(str(target), "unmanaged", verify=verify, partial=partial_text)
    if verify == "full":
        problems = full_verify(target, manifest.files, progress, whole_directory=True)
    else:
        problems = directory_problems(target, manifest.files)
    return StatusResult(
        target=str(target),
        state="incomplete" if problems else "complete",
        repo_id=manifest.repo_id,
        revision=manifest.revision,
        created_at=manifest.created_at,
        files_total=len(manifest.files),
        bytes_total=manifest.total_size,
        verify=verify,
        problems=tuple(problems),
        partial=partial_text,
    )
