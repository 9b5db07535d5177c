"""Merge run directories (shards of one plan, hosts of a cluster, Slurm tasks) into one,
by cell key.

``bench merge A B ... --out M``: M gets ``plan.toml`` (the inputs must hold the same
plan), one record per cell key in ``results.jsonl``, the raw per-request files of the kept
records, each input's logs under ``logs/<input name>/`` and ``merge.json`` (where each
cell came from). A key recorded in more than one input is never kept twice: the ok record
wins over a crashed or skipped one (then the newest; on a full tie, the copy of the input
named first), every other copy goes to
``duplicates.jsonl`` and is listed in the result. The inputs are only read, as untrusted
input (:mod:`merge_inputs`).

A merge never replaces a run (issue 34.1): M is new (or empty), or an earlier merge,
which is merged into keeping every record it holds (its cells count as one more input;
its ``duplicates.jsonl`` lines stay). Any other non-empty M (a run directory, a
directory of other files) is refused before anything is written.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.results.merge_inputs import (
    InputError,
    check_input,
    log_files,
    read_file,
    read_raw,
    safe_key,
)
from gpudoctor.bench.results.run_dir import (
    PLAN,
    RESULTS,
    RunDir,
    RunDirError,
    check_run_dir,
    scan_records,
    write_atomic,
)

_RANK = {"ok": 2, "crashed": 1}
MERGE_JSON = "merge.json"
EARLIER = "earlier merge"
_OWN = ("merged_from", "raw", "duplicate_of")  # what a merge adds to a record


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
    """What a merge did: the output, cells per input, duplicates, warnings, and the cells
    an earlier merge in ``out`` held (``earlier``: None when ``out`` was new)."""

    out: Path
    cells: int
    by_input: dict[str, int]
    duplicates: tuple[Duplicate, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)
    earlier: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the result as a JSON-ready dict."""
        return {"out": str(self.out), "cells": self.cells, "by_input": self.by_input,
                "duplicates": [vars(d) for d in self.duplicates],
                "warnings": list(self.warnings), "earlier": self.earlier}  # fmt: skip


@dataclass
class _Source:
    """One place records come from: an input run directory, or the earlier merge in out."""

    name: str
    path: Path
    records: list[dict[str, Any]]


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Return whether ``new`` should be kept over ``old`` (ok > crashed > skipped, then
    newest; False on a full tie: the copy met first, of the input named first, stays)."""
    rank = (_RANK.get(new.get("status", ""), 0), str(new.get("recorded_at", "")))
    return rank > (_RANK.get(old.get("status", ""), 0), str(old.get("recorded_at", "")))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Return whether two records are one measurement (a merge's own fields aside)."""
    return {k: v for k, v in a.items() if k not in _OWN} == {
        k: v for k, v in b.items() if k not in _OWN
    }


def _names(inputs: list[Path], earlier: dict[str, str]) -> list[str]:
    """Return a unique short name per input: the name an earlier merge gave the same
    path, else its directory name (numbered on a clash)."""
    taken = {n for p, n in earlier.items()}
    names: list[str] = []
    for path in inputs:
        if str(path) in earlier:
            names.append(earlier[str(path)])
            continue
        name = path.name or "run"
        base, n = name, 2
        while name in names or name in taken:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names


def _read_plans(inputs: list[Path]) -> dict[str, str]:
    plans: dict[str, str] = {}
    for path in inputs:
        if not os.path.lexists(path / RESULTS) and not os.path.lexists(path / PLAN):
            raise MergeError(f"{path}: neither {RESULTS} nor {PLAN}; is it a run directory?")
        plan = read_file(path / PLAN)
        if plan is not None:
            plans[str(path)] = plan.decode("utf-8", "replace")
    return plans


def _earlier_merge(out: Path) -> dict[str, Any] | None:
    """Return the earlier merge's ``merge.json`` in ``out``; None when ``out`` is empty
    (a ``.lock`` aside). Raise MergeError for any other non-empty directory."""
    entries = sorted(set(os.listdir(out)) - {".lock"})
    if not entries:
        return None
    try:
        meta = json.loads(read_file(out / MERGE_JSON) or b"null")
    except ValueError:
        meta = None
    if isinstance(meta, dict) and isinstance(meta.get("inputs"), list):
        return meta
    what = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    raise MergeError(
        f"{out} is not empty ({what}) and holds no earlier merge: merging there would replace"
        f" what it holds; choose a new --out, or merge it too: gpudoctor bench merge {out}"
        " RUN... --out NEW"
    )


def merge_runs(inputs: list[Path], out: Path, allow_other_plan: bool = False) -> MergeResult:
    """Merge ``inputs`` into ``out`` (see the module docstring); return what was done.

    Raises MergeError: an input that is no run directory or that another user controls,
    inputs of different plans (unless ``allow_other_plan``), ``out`` among the inputs,
    ``out`` a non-empty directory that is no earlier merge, or ``out`` busy."""
    if not inputs:
        raise MergeError("nothing to merge: name the run directories")
    try:
        real = [check_input(p) for p in inputs]
        if Path(os.path.realpath(out)) in real:
            raise MergeError(f"{out} is one of the inputs; merge into a new directory")
        plans = _read_plans(real)
        if check_run_dir(out):
            _earlier_merge(out)  # refused before anything (a lock file) is made there
        with RunDir(out) as rundir:
            return _merge_into(rundir, real, plans, allow_other_plan)
    except (InputError, RunDirError, fsio.FsioError) as exc:
        raise MergeError(str(exc)) from exc
    except OSError as exc:
        raise MergeError(f"cannot merge into {out}: {exc.strerror or exc}") from exc


def _merge_into(rundir: RunDir, inputs: list[Path], plans: dict[str, str],
                allow_other_plan: bool) -> MergeResult:  # fmt: skip
    out = rundir.path
    warnings: list[str] = []
    earlier = _earlier_merge(out)
    before = {str(i.get("path")): str(i.get("name")) for i in (earlier or {}).get("inputs", [])
              if isinstance(i, dict)}  # fmt: skip
    if earlier is not None:
        old_plan = read_file(out / PLAN)
        if old_plan is not None:
            plans = {**plans, f"{out} (earlier merge)": old_plan.decode("utf-8", "replace")}
    if len(set(plans.values())) > 1 and not allow_other_plan:
        raise MergeError("the inputs hold different plans (plan.toml differs); merge shards of "
                         "one plan, or pass --any-plan to match cells by key anyway")  # fmt: skip
    names = _names(inputs, before)
    sources = []
    if earlier is not None:
        sources.append(_Source(EARLIER, out, scan_records(out / RESULTS).records))
    for name, path in zip(names, inputs, strict=True):
        scan = scan_records(path / RESULTS)
        if scan.corrupt_lines:
            warnings.append(f"{path}: skipped {len(scan.corrupt_lines)} corrupt line(s)")
        if scan.dropped_bytes:
            warnings.append(f"{path}: a torn last line ({scan.dropped_bytes} bytes) left out")
        sources.append(_Source(name, path, scan.records))
    kept, copies = _pick(sources, warnings)
    duplicates = []
    for key, found in copies.items():
        if len(found) > 1:
            winner, _, record = kept[key]
            dropped = [n for n, r in found if r is not record]
            duplicates.append(Duplicate(key, str(record.get("config")), int(record.get("concurrency") or 0),
                                        winner, tuple(dropped),
                                        tuple(str(r.get("status")) for _, r in found)))  # fmt: skip
    plan_dir = _plan_dir(inputs, earlier)
    meta_inputs = {**before, **{str(p): n for n, p in zip(names, inputs, strict=True)}}
    meta = {"inputs": [{"name": n, "path": p} for p, n in meta_inputs.items()],
            "cells": len(kept), "duplicates": [vars(d) for d in duplicates],
            "plan_dir": plan_dir}  # fmt: skip
    if plans:
        write_atomic(out / PLAN, next(iter(plans.values())))
    _write_records(rundir, kept)
    _write_duplicates(out, kept, copies)
    for name, path in zip(names, inputs, strict=True):
        warnings.extend(_copy_logs(rundir, name, path))
    write_atomic(out / MERGE_JSON, json.dumps(meta, indent=2, sort_keys=True))
    if earlier is not None and os.path.lexists(out / "report.md"):
        warnings.append(f"{out}/report.md and its plots describe the merge before this one: "
                        f"gpudoctor bench report {out} writes them anew")  # fmt: skip
    by_input = dict.fromkeys(names, 0)
    for name, _, _ in kept.values():
        by_input[name] = by_input.get(name, 0) + 1
    n_earlier = None if earlier is None else len(sources[0].records)
    return MergeResult(out, len(kept), by_input, tuple(duplicates), tuple(warnings), n_earlier)


def _pick(sources: list[_Source], warnings: list[str]) -> tuple[
        dict[str, tuple[str, Path, dict[str, Any]]], dict[str, list[tuple[str, dict[str, Any]]]]]:  # fmt: skip
    """Return the record kept per key (source name, its directory, the record) and every
    copy of each key; a record with an unsafe key is left out (a warning)."""
    kept: dict[str, tuple[str, Path, dict[str, Any]]] = {}
    copies: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for source in sources:
        unsafe = 0
        for record in source.records:
            if "key" not in record:
                continue
            key = safe_key(record.get("key"))
            if key is None:
                unsafe += 1
                continue
            name = (
                str(record.get("merged_from") or EARLIER) if source.name == EARLIER else source.name
            )
            found = copies.setdefault(key, [])
            if key in kept and _same(record, kept[key][2]):
                if source.name != EARLIER:  # the same measurement again: the input's copy
                    at = next(i for i, (_, r) in enumerate(found) if r is kept[key][2])
                    kept[key], found[at] = (name, source.path, record), (name, record)
                continue
            found.append((name, record))
            if key not in kept or _better(record, kept[key][2]):
                kept[key] = (name, source.path, record)
        if unsafe:
            warnings.append(f"{source.path}: left out {unsafe} record(s) whose key is not a plain"
                            " name (a path such as ../x is never written)")  # fmt: skip
    return kept, copies


def _plan_dir(inputs: list[Path], earlier: dict[str, Any] | None) -> str | None:
    """Return the plan's directory the inputs were launched with (run.json ``plan_dir``),
    which ``bench status`` resolves relative model paths against."""
    for path in inputs:
        try:
            facts = json.loads(read_file(path / "run.json") or b"{}")
        except (ValueError, InputError):
            continue
        if isinstance(facts, dict) and isinstance(facts.get("plan_dir"), str):
            return str(facts["plan_dir"])
    return (earlier or {}).get("plan_dir")


def _write_records(rundir: RunDir, kept: dict[str, tuple[str, Path, dict[str, Any]]]) -> None:
    lines = []
    for key, (name, path, record) in kept.items():
        record = {**record, "merged_from": name}
        blob = read_raw(path, record.get("raw"))
        if blob is not None:
            dest = rundir.raw_path(key)
            fsio.atomic_replace(dest, blob, mode=0o644, require_trusted_dir=True)
            record["raw"] = f"raw/{dest.name}"
        lines.append(json.dumps(record, sort_keys=True, default=str) + "\n")
    write_atomic(rundir.path / RESULTS, "".join(lines))


def _write_duplicates(out: Path, kept: dict[str, tuple[str, Path, dict[str, Any]]],
                      copies: dict[str, list[tuple[str, dict[str, Any]]]]) -> None:  # fmt: skip
    """Write duplicates.jsonl: the earlier merge's lines, then every copy not kept now."""
    lines = [line + "\n" for line in (read_file(out / "duplicates.jsonl") or b"").decode(
        "utf-8", "replace").splitlines() if line.strip()]  # fmt: skip
    for key, found in copies.items():
        for n, r in found:
            if len(found) > 1 and r is not kept[key][2]:
                line = json.dumps({**r, "merged_from": n, "duplicate_of": kept[key][0]},
                                  sort_keys=True, default=str) + "\n"  # fmt: skip
                if line not in lines:
                    lines.append(line)
    write_atomic(out / "duplicates.jsonl", "".join(lines))


def _copy_logs(rundir: RunDir, name: str, path: Path) -> list[str]:
    """Copy an input's regular log files to ``logs/<name>/``; return what was left out."""
    files, skipped = log_files(path)
    for rel, blob in files:
        dest_dir = fsio.make_dirs(rundir.path, Path("logs") / name / rel.parent)
        fsio.atomic_replace(dest_dir / rel.name, blob, mode=0o644, require_trusted_dir=True)
    return skipped
