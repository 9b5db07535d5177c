"""model.present: every ``--model-dir`` holds a complete model (the weights in tmpfs)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gpudoctor.context import CheckContext
from gpudoctor.facts.models import (
    HEADER_PREFIX,
    INDEX_NAME,
    SINGLE_NAME,
    expected_file_size,
    header_length,
    parse_index,
)
from gpudoctor.model import Finding, Severity
from gpudoctor.registry import check
from gpudoctor.weights.complete import HF_DOWNLOAD_DIR, completeness_problems, unfinished_problems
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, parse_manifest

GIB = 1 << 30


def gib(n: float) -> str:
    """Return a byte count as ``12.3 GiB``."""
    return f"{n / GIB:.1f} GiB"


def read_manifest(ctx: CheckContext, directory: str) -> Manifest | None:
    """Return the directory's gpudoctor manifest, or None when absent/unreadable."""
    text = ctx.facts.read_optional(f"{directory}/{MANIFEST_NAME}")
    if text is None:
        return None
    try:
        return parse_manifest(text)
    except ValueError:
        return None


def missing_bytes(ctx: CheckContext, directory: str) -> int:
    """Return how many bytes the manifest says are still missing from ``directory`` (0 if unknown)."""
    manifest = read_manifest(ctx, directory)
    if manifest is None:
        return 0
    have = 0
    for f in manifest.files:
        with contextlib.suppress(OSError):
            have += min(ctx.host.stat(f"{directory}/{f.path}").size, f.size)
    return max(manifest.total_size - have, 0)


def ensure_hint(ctx: CheckContext, directory: str, manifest: Manifest | None) -> str:
    """Return the ``gpudoctor weights ensure`` command that restores a directory.

    The repo, revision and ``--mirror`` come from the manifest and from the record
    that ``weights ensure`` keeps (:mod:`gpudoctor.weights.record`), read through the host.
    """
    from gpudoctor.weights.record import parse_records, record_path

    record = parse_records(ctx.facts.read_optional(str(record_path()))).get(directory)
    repo = manifest.repo_id if manifest else record.repo_id if record else "<org/model>"
    revision = manifest.revision if manifest else record.revision if record else None
    rev = f" --revision {revision}" if revision else ""
    mirror = f" --mirror {record.mirror}" if record and record.mirror else ""
    return f"gpudoctor weights ensure {repo} --to {directory}{rev}{mirror}"


@check(
    id="model.present",
    title="Every --model-dir holds a complete model",
    severity=Severity.HIGH,
    proves="config.json and every weight file exist with the right size (per the gpudoctor "
    "manifest, else the safetensors index and headers); no download is half done",
    remediation="Restore the weights: gpudoctor weights ensure REPO --to DIR [--mirror DISK_DIR].",
)
def model_present(ctx: CheckContext) -> Iterator[Finding]:
    """Yield one finding per ``--model-dir`` (``ls -l DIR``, sizes vs manifest/headers)."""
    if not ctx.options.model_dirs:
        yield ctx.skip("model dirs", "No --model-dir given.")
    for directory in ctx.options.model_dirs:
        yield judge_model_dir(ctx, directory.rstrip("/") or "/")


def judge_model_dir(ctx: CheckContext, directory: str) -> Finding:
    """Return the verdict for one model directory."""
    try:
        entries = ctx.host.list_dir(directory)
    except FileNotFoundError:
        return missing_model_dir(ctx, directory)
    except NotADirectoryError:
        parent = directory.rsplit("/", 1)[0] or "/" if "/" in directory else "."
        example = (f": --model-dir {parent}" if _holds_config(ctx, parent)
                   else " (a model's own directory, such as /dev/shm/MODEL)")  # fmt: skip
        return ctx.fail(
            directory,
            f"{directory} is a file, not a directory: --model-dir names the model's directory.",
            evidence=[f"ls {directory}: Not a directory"],
            remediation=f"Give the directory that holds config.json and the weights{example}.",
        )
    except OSError as exc:
        return ctx.fail(
            directory,
            f"{directory} cannot be listed: {exc.strerror}.",
            remediation=f"Check permissions of {directory}.",
        )
    manifest = read_manifest(ctx, directory)
    if manifest:  # the rule `weights status` applies (gpudoctor.weights.complete)
        problems, evidence = check_against_manifest(ctx, directory, manifest, entries)
    else:
        problems, evidence = check_against_index(ctx, directory, entries)
        leftovers = unfinished_problems(entries, hf_partials(ctx, directory))
        if leftovers:
            names = ", ".join(p.path for p in leftovers[:5])
            problems.append(f"unfinished download files: {names}")
    if problems and not manifest and "config.json" not in entries and _is_mount(ctx, directory):
        return ctx.fail(
            directory,
            f"{directory} is a mount point, not a model's directory: --model-dir names the"
            " directory that holds config.json and the weights.",
            evidence=[*evidence, f"{directory} is a mount point (/proc/self/mounts)"],
            remediation=f"Restore the model into a directory inside it and check that one:"
            f" gpudoctor weights ensure <org/model> --to {directory.rstrip('/')}/MODEL, then"
            f" --model-dir {directory.rstrip('/')}/MODEL",
        )
    if problems:
        return ctx.fail(
            directory,
            f"{directory} is incomplete: " + "; ".join(problems[:6]) + ".",
            evidence=evidence,
            remediation=ensure_hint(ctx, directory, manifest),
        )
    return ctx.passed(
        directory, f"{directory} is complete: " + evidence[0] + ".", evidence=evidence
    )


def missing_model_dir(ctx: CheckContext, directory: str) -> Finding:
    """Return the FAIL of a ``--model-dir`` that does not exist: an unfinished restore when
    ``DIR.partial`` is there (ensure failed or was stopped), else an emptied tmpfs."""
    partial = f"{directory}.partial"
    try:
        ctx.host.list_dir(partial)
    except OSError:
        return ctx.fail(
            directory,
            f"{directory} does not exist (a tmpfs is emptied by every reboot).",
            evidence=[f"ls {directory}: No such file or directory"],
            remediation=ensure_hint(ctx, directory, None),
        )
    repo = _partial_repo(ctx, partial)
    hint = ensure_hint(ctx, directory, None)
    if repo and "<org/model>" in hint:
        hint = hint.replace("<org/model>", repo)
    return ctx.fail(
        directory,
        f"{directory} does not exist, but {partial} does: a restore (gpudoctor weights"
        " ensure) failed or was stopped before it finished.",
        evidence=[f"ls {directory}: No such file or directory", f"ls {partial}: present"],
        remediation=f"Run the restore again; it resumes from {partial}: {hint}",
    )


def _partial_repo(ctx: CheckContext, partial: str) -> str | None:
    """Return the repo id an unfinished restore records in ``partial``, or None."""
    import json

    from gpudoctor.weights.localfs import PARTIAL_MARKER

    try:
        repo = json.loads(ctx.facts.read_optional(f"{partial}/{PARTIAL_MARKER}") or "{}")
    except ValueError:
        return None
    value = repo.get("repo_id") if isinstance(repo, dict) else None
    return value if isinstance(value, str) and value else None


def _holds_config(ctx: CheckContext, directory: str) -> bool:
    """Return True when ``directory`` holds a config.json (a model's directory)."""
    try:
        return "config.json" in ctx.host.list_dir(directory)
    except OSError:
        return False


def _is_mount(ctx: CheckContext, directory: str) -> bool:
    """Return True when ``directory`` is a mount point on the checked host."""
    from gpudoctor.facts.procfs import parse_mounts

    mounts = parse_mounts(ctx.facts.read_optional("/proc/self/mounts") or "")
    return any((m.target.rstrip("/") or "/") == directory for m in mounts)


def hf_partials(ctx: CheckContext, directory: str, every: bool = False) -> list[str]:
    """Return huggingface_hub's unfinished download files under ``DIR/.cache/huggingface``
    (``every``: all names there, for :func:`completeness_problems` to judge)."""
    try:
        names = ctx.host.list_dir(f"{directory}/{HF_DOWNLOAD_DIR}")
    except OSError:
        return []
    return names if every else [n for n in names if n.endswith(".incomplete")]


def check_against_manifest(
    ctx: CheckContext, directory: str, manifest: Manifest, entries: list[str]
) -> tuple[list[str], list[str]]:
    """Return (problems, evidence) by :func:`completeness_problems`, the definition of
    "complete" that ``gpudoctor weights status`` uses too (sizes, then leftovers)."""
    sizes: dict[str, int | None] = {}
    for f in manifest.files:
        try:
            st = ctx.host.stat(f"{directory}/{f.path}")
            sizes[f.path] = st.size if st.kind == "file" else None
        except OSError:
            sizes[f.path] = None
    found = completeness_problems(
        manifest.files, sizes, entries, hf_partials(ctx, directory, every=True)
    )
    sized = [f"{p.path} {p.detail}" for p in found if p.problem != "unfinished"]
    leftovers = [p.path for p in found if p.problem == "unfinished"]
    if leftovers:
        sized.append(f"unfinished download files: {', '.join(leftovers[:5])}")
    evidence = [
        f"{len(manifest.files)} files, {gib(manifest.total_size)} per manifest "
        f"({manifest.repo_id}@{manifest.revision[:12]})",
    ]
    return sized, evidence


def check_against_index(
    ctx: CheckContext, directory: str, entries: list[str]
) -> tuple[list[str], list[str]]:
    """Return (problems, evidence) from config.json, the safetensors index and shard headers."""
    problems: list[str] = []
    if "config.json" not in entries:
        problems.append("config.json missing")
    if INDEX_NAME in entries:
        try:
            shards = parse_index(ctx.host.read_text(f"{directory}/{INDEX_NAME}")).shards
        except (OSError, ValueError) as exc:
            return [*problems, f"{INDEX_NAME} unreadable ({exc})"], [f"{len(entries)} entries"]
    elif SINGLE_NAME in entries:
        shards = (SINGLE_NAME,)
    else:
        shards = tuple(e for e in entries if e.endswith(".safetensors"))
        if not shards:
            problems.append("no safetensors weights and no index")
    total = 0
    for shard in shards:
        if shard not in entries:
            problems.append(f"{shard} missing")
            continue
        size, problem = shard_size_problem(ctx, f"{directory}/{shard}")
        total += size
        if problem:
            problems.append(f"{shard} {problem}")
    return problems, [f"{len(shards)} weight file(s), {gib(total)} (no manifest: checked headers)"]


def shard_size_problem(ctx: CheckContext, path: str) -> tuple[int, str]:
    """Return (size, problem or "") for one safetensors file: its size must equal what its
    own header says (a truncated download fails this)."""
    try:
        size = ctx.host.stat(path).size
        prefix = ctx.host.read_bytes(path, HEADER_PREFIX)
        length = header_length(prefix)
        header = ctx.host.read_bytes(path, length, HEADER_PREFIX)
        expected = expected_file_size(prefix, header)
    except (OSError, ValueError) as exc:
        return 0, f"unreadable ({exc})"
    if size != expected:
        return size, f"is {size} bytes but its header says {expected} (truncated)"
    return size, ""
