"""Where each target's model comes from, kept on disk so that ``check`` can say how to
restore a directory that a reboot emptied (``model.present``'s remedy names ``--mirror``).

``weights ensure`` run as root records ``{target: {repo_id, revision, mirror}}`` in
``/var/lib/gpudoctor/weights-targets.json`` (``GPUDOCTOR_STATE_DIR`` moves it); the
revision is the one asked for (None: the default). Writing it never fails ``ensure``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio

RECORD_NAME = "weights-targets.json"


@dataclass(frozen=True)
class TargetRecord:
    """How a target was last ensured.

    Attributes:
        repo_id: the Hub repository.
        revision: the revision asked for (``--revision``), or None.
        mirror: the ``--mirror`` root, or None.
    """

    repo_id: str
    revision: str | None = None
    mirror: str | None = None


def record_path() -> Path:
    """Return the record's path (``/var/lib/gpudoctor/weights-targets.json``)."""
    return Path(os.environ.get("GPUDOCTOR_STATE_DIR") or "/var/lib/gpudoctor") / RECORD_NAME


def parse_records(text: str | None) -> dict[str, TargetRecord]:
    """Return {target: TargetRecord} from the record's JSON text ({} when absent or invalid)."""
    try:
        doc = json.loads(text or "{}")
    except ValueError:
        return {}
    records: dict[str, TargetRecord] = {}
    for target, raw in (doc.get("targets") or {}).items() if isinstance(doc, dict) else ():
        if isinstance(raw, dict) and isinstance(raw.get("repo_id"), str):
            rev, mirror = raw.get("revision"), raw.get("mirror")
            records[target] = TargetRecord(
                raw["repo_id"],
                rev if isinstance(rev, str) else None,
                mirror if isinstance(mirror, str) else None,
            )
    return records


def remember(target: Path, record: TargetRecord) -> str | None:
    """Record ``record`` for ``target`` (root only); return a warning line on failure, else None."""
    if os.geteuid() != 0:
        return None
    from gpudoctor.weights.localfs import read_trusted_text, write_private
    from gpudoctor.weights.trust import check_dir

    path = record_path()
    try:
        fsio.make_missing_dirs(path.parent)
        check_dir(path.parent, "gpudoctor's state directory")
        records = parse_records(read_trusted_text(path, "the weights record"))
        records[str(target)] = record
        doc = {"targets": {t: r.__dict__ for t, r in sorted(records.items())}}
        write_private(path, json.dumps(doc, indent=1) + "\n")
    except Exception as exc:  # a hint for later, never a reason to fail now
        return f"could not record the target in {path}: {exc}"
    return None
