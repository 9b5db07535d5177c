"""Merge run directories (shards of one plan, hosts of a cluster, Slurm tasks) into one,
by cell key.

``bench merge A B ... --out M``: M gets ``plan.toml`` (the inputs must hold the same
plan), one record per cell key in ``results.jsonl``, the raw per-request files of the kept
records, each input's logs under ``logs/<input name>/`` and ``merge.json`` (where each
cell came from). A key recorded in more than one input is never kept twice: the ok record
wins over a crashed or skipped one (then the newest), every other copy goes to
``duplicates.jsonl`` and is listed in the result. The inputs are only read.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.results.run_dir import (
    PLAN,
    RESULTS,
    RunDir,
    RunDirError,
    scan_records,
    write_atomic,
)

_RANK = {"ok": 2, "crashed": 1}


class MergeError(RuntimeError):
    """The inputs cannot be merged (one line for the CLI)."""


@dataclass(frozen=True)
class Duplicate:
    """One cell key recorded in several inputs: which copy was kept, which were not."""

    key: str
    config: str
    concurrency: int
    kept: str
    dropped: tuple[str, ...]
    statuses: tuple[str, ...]


@dataclass(frozen=True)
class MergeResult:
    """What a merge did: the output, cells per input, duplicates, warnings."""

    out: Path
    cells: int
    by_input: dict[str, int]
    duplicates: tuple[Duplicate, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        """Return the result as a JSON-ready dict."""
        return {"out": str(self.out), "cells": self.cells, "by_input": self.by_input,
                "duplicates": [vars(d) for d in self.duplicates],
                "warnings": list(self.warnings)}  # fmt: skip


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Return whether ``new`` should be kept over ``old`` (ok > crashed > skipped, then newest)."""
    rank = (_RANK.get(new.get("status", ""), 0), str(new.get("recorded_at", "")))
    return rank > (_RANK.get(old.get("status", ""), 0), str(old.get("recorded_at", "")))


def _names(inputs: list[Path]) -> list[str]:
    """Return a unique short name per input (its directory name, numbered on a clash)."""
    names: list[str] = []
    for path in inputs:
        name = path.resolve().name or "run"
        base, n = name, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def merge_runs(inputs: list[Path], out: Path, allow_other_plan: bool = False) -> MergeResult:
    """Merge ``inputs`` into ``out`` (see the module docstring); return what was done.

    Raises MergeError: an input that is no run directory, inputs of different plans (unless
    ``allow_other_plan``), ``out`` among the inputs, or ``out`` busy with a launcher."""
    if not inputs:
        raise MergeError("nothing to merge: name the run directories")
    resolved = [p.resolve() for p in inputs]
    if out.resolve() in resolved:
        raise MergeError(f"{out} is one of the inputs; merge into a new directory")
    plans: dict[str, str] = {}
    for path in inputs:
        if not (path / RESULTS).is_file() and not (path / PLAN).is_file():
            raise MergeError(f"{path}: neither {RESULTS} nor {PLAN}; is it a run directory?")
        plan = path / PLAN
        if plan.is_file():
            plans[str(path)] = plan.read_text(encoding="utf-8")
    if len(set(plans.values())) > 1 and not allow_other_plan:
        raise MergeError("the inputs hold different plans (plan.toml differs); merge shards of "
                         "one plan, or pass --any-plan to match cells by key anyway")  # fmt: skip
    names = _names(inputs)
    kept: dict[str, tuple[str, Path, dict[str, Any]]] = {}
    copies: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    warnings: list[str] = []
    for name, path in zip(names, inputs, strict=True):
        scan = scan_records(path / RESULTS)
        if scan.corrupt_lines:
            warnings.append(f"{path}: skipped {len(scan.corrupt_lines)} corrupt line(s)")
        if scan.dropped_bytes:
            warnings.append(f"{path}: a torn last line ({scan.dropped_bytes} bytes) left out")
        for record in scan.records:
            key = str(record.get("key", ""))
            if not key:
                continue
            copies.setdefault(key, []).append((name, record))
            if key not in kept or _better(record, kept[key][2]):
                kept[key] = (name, path, record)
    duplicates = []
    for key, found in copies.items():
        if len(found) > 1:
            winner = kept[key][0]
            record = kept[key][2]
            dropped = [n for n, r in found if r is not record]
            duplicates.append(Duplicate(key, str(record.get("config")), int(record.get("concurrency") or 0),
                                        winner, tuple(dropped),
                                        tuple(str(r.get("status")) for _, r in found)))  # fmt: skip
    try:
        with RunDir(out) as rundir:
            _write(rundir, inputs, names, kept, copies, duplicates, plans)
    except (RunDirError, fsio.FsioError, OSError) as exc:
        raise MergeError(str(exc)) from exc
    by_input = {n: sum(1 for v in kept.values() if v[0] == n) for n in names}
    return MergeResult(out, len(kept), by_input, tuple(duplicates), tuple(warnings))


def _write(rundir: RunDir, inputs: list[Path], names: list[str],
           kept: dict[str, tuple[str, Path, dict[str, Any]]],
           copies: dict[str, list[tuple[str, dict[str, Any]]]],
           duplicates: list[Duplicate], plans: dict[str, str]) -> None:  # fmt: skip
    out = rundir.path
    if plans:
        write_atomic(out / PLAN, next(iter(plans.values())))
    lines = []
    for name, path, record in kept.values():
        record = {**record, "merged_from": name}
        raw = record.get("raw")
        if (
            isinstance(raw, str)
            and (path / raw).is_file()
            and not Path(raw).is_absolute()
            and ".." not in Path(raw).parts
        ):
            dest = out / "raw" / f"{record['key']}.jsonl"
            dest.parent.mkdir(parents=True, exist_ok=True)
            fsio.atomic_replace(dest, (path / raw).read_bytes(), keep_mode=False,
                                refuse_non_regular=True, follow_dir_link=True)  # fmt: skip
            record["raw"] = str(dest.relative_to(out))
        lines.append(json.dumps(record, sort_keys=True, default=str) + "\n")
    write_atomic(out / RESULTS, "".join(lines))
    dropped = [
        {**r, "merged_from": n, "duplicate_of": kept[key][0]}
        for key, found in copies.items() if len(found) > 1
        for n, r in found if r is not kept[key][2]
    ]  # fmt: skip
    write_atomic(
        out / "duplicates.jsonl",
        "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in dropped),
    )
    for name, path in zip(names, inputs, strict=True):
        logs = path / "logs"
        if logs.is_dir() and not logs.is_symlink():
            dest = out / "logs" / name
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(logs, dest, symlinks=True)
    meta = {"inputs": [{"name": n, "path": str(p.resolve())} for n, p in zip(names, inputs, strict=True)],
            "cells": len(kept), "duplicates": [vars(d) for d in duplicates]}  # fmt: skip
    write_atomic(out / "merge.json", json.dumps(meta, indent=2, sort_keys=True))
