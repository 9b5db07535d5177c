"""The pure steps of a launch: options and outcomes, what happens to each cell (run,
already done, skipped by a quirk), fitting a workload into the server's context, and
refusing a plan whose flags the engine does not know."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.engines import Engine, EngineError, EngineNotInstalled
from gpudoctor.bench.plan import Cell, Limits, Plan, ServerConfig
from gpudoctor.bench.plan import quirks as quirks_mod


class CampaignError(RuntimeError):
    """The campaign cannot start or must stop (one line for the CLI)."""


class EngineMissing(CampaignError):
    """The plan's engine (its program or package) is not installed: a dry run notes it."""


@dataclass(frozen=True)
class LaunchOptions:
    """How to run a plan.

    Attributes:
        out: the run directory.
        resume: None = resume a same-plan directory; True/False = ``--resume/--no-resume``.
        retry_crashed: rerun cells recorded as crashed or skipped by a crash quirk.
        preflight: run ``gpudoctor check`` (``--no-preflight`` turns it off).
        quirks_path: the local quirks table (default :func:`quirks.default_local_path`).
        help_cache: where engine ``--help`` outputs are cached (None = no cache).
        shard: ``(I, N)``: run only the cells of shard I of N (``--shard I/N``, 1-based).
        retry_failed: rerun cells recorded as failed (their requests failed).
    """

    out: Path
    resume: bool | None = None
    retry_crashed: bool = False
    preflight: bool = True
    quirks_path: Path | None = None
    help_cache: Path | None = None
    shard: tuple[int, int] | None = None
    retry_failed: bool = False


def retried(record: dict[str, Any], options: LaunchOptions) -> bool:
    """Return whether a recorded cell is measured again in this launch: crashed or skipped
    by a crash (``--retry-crashed``), failed (``--retry-failed``); every other recorded
    cell is kept exactly once."""
    status = record.get("status")
    if options.retry_crashed and (status == "crashed" or record.get("retryable")):
        return True
    return options.retry_failed and status == "failed"


@dataclass(frozen=True)
class Summary:
    """What a campaign run did (counts of cells by what happened to them this time)."""

    total: int
    already_done: int
    ok: int
    crashed: int
    skipped: int
    server_starts: int
    stopped: str | None = None
    failed: int = 0  # cells whose requests failed (issue 31): ``bench run`` exits 3
    client_bound: int = 0  # measured, not in ``ok``: the client did not hold the schedule (exit 3)


@dataclass(frozen=True)
class Decision:
    """What the launcher will do with one cell (the dry run's rows)."""

    cell: Cell
    action: str  # run | done | skip
    reason: str = ""


def clamp_workload(
    w: WorkloadSpec, max_context: int | None, limits: Limits
) -> tuple[WorkloadSpec | None, dict]:
    """Return the workload fitted below ``max_context`` (None = cannot fit) and the clamp facts.

    input + output + template overhead must stay at or below the server's real context;
    the input is shortened when needed, refused when it would drop below the minimum.
    For a JSONL dataset the facts carry ``max_total_tokens`` (prompt + output per
    request): each prompt is tokenized and cut to it when the cell is built."""
    facts: dict[str, Any] = {
        "max_context": max_context,
        "requested_input_len": w.input_len,
        "input_len": w.input_len,
        "output_len": w.output_len,
        "template_overhead": limits.template_overhead,
        "clamped": False,
    }
    if max_context is None:
        facts["note"] = "the server did not report its context length; not clamped"
        return w, facts
    budget = max_context - w.output_len - limits.template_overhead
    if w.kind != "random":  # each dataset / generated prompt is cut when the cell builds it
        facts.update(kind=w.kind, max_total_tokens=max_context - limits.template_overhead)
        own_output = w.kind in ("trace", "sharegpt")  # each request's output_len is its own
        if budget < limits.min_input_len and not own_output:
            facts["note"] = (
                f"output_len {w.output_len} + overhead {limits.template_overhead} leaves {budget} "
                f"input tokens of a {max_context}-token context (minimum {limits.min_input_len})"
            )
            return None, facts
        return w, facts
    if w.input_len <= budget:
        return w, facts
    if budget < limits.min_input_len:
        facts["note"] = (
            f"output_len {w.output_len} + overhead {limits.template_overhead} leaves {budget} input "
            f"tokens of a {max_context}-token context (minimum {limits.min_input_len})"
        )
        return None, facts
    facts.update(input_len=budget, clamped=True)
    return dataclasses.replace(w, input_len=budget), facts


def keeps_text(limits: Limits, config: ServerConfig) -> bool:
    """Return whether a cell keeps the streamed text: ``limits.keep_text`` when set, else
    True only for a speculative configuration (an arg named ``speculative-*``)."""
    if limits.keep_text is not None:
        return limits.keep_text
    return any(flag.startswith("speculative") and value not in (False, None)
               for flag, value in config.args)  # fmt: skip


def model_problems(plan: Plan) -> list[str]:
    """Return what is wrong with the plan's local paths before anything starts (``test -e
    PATH``), in a run and in both dry-run modes: a model ``path``, ``tokenizer`` or
    workload ``dataset_path`` that does not exist (a ``repo``'s ``dir`` is created by the
    weights step and is not checked)."""
    problems = []
    named = (("model.path", plan.model.path), ("model.tokenizer", plan.model.tokenizer),
             ("workload.dataset_path", plan.workload.dataset_path))  # fmt: skip
    for key, value in named:
        if value and not Path(value).exists():
            problems.append(
                f"{plan.source}: {key} {value} does not exist; fix the path "
                "(relative paths are relative to the plan file)"
            )
    path = plan.model.path
    if path and Path(path).exists() and not Path(path).is_dir():  # issue 47: a Hub error later
        parent = Path(path).parent
        here = f" ({parent})" if (parent / "config.json").is_file() else ""
        problems.append(
            f"{plan.source}: model.path {path} is a file, not a model directory; give the"
            f" directory that holds config.json and the weights{here}"
        )
    if not problems and plan.workload.api == "chat":
        problems += _chat_template_problems(plan)
    return problems


def _chat_template_problems(plan: Plan) -> list[str]:
    """Return why chat prompts cannot be built: the model's tokenizer has no chat template
    (a base model; the server would refuse them too). A tokenizer not on disk yet (a
    ``repo`` the weights step fetches) is not judged here."""
    tokenizer_dir = plan.model.tokenizer or plan.model.local_dir
    if not (Path(tokenizer_dir) / "tokenizer_config.json").is_file():
        return []
    from gpudoctor.bench.load.workload import load_tokenizer

    try:
        template = getattr(load_tokenizer(tokenizer_dir), "chat_template", None)
    except Exception:  # an unreadable tokenizer: the cell says why, with its own error
        return []
    if template:
        return []
    return [
        f'{plan.source}: workload.api = "chat" needs a chat template, and the tokenizer in'
        f' {tokenizer_dir} has none (a base model); use api = "completions"'
    ]


def load_generator_problems() -> list[str]:
    """Return why gpudoctor's load generator cannot run here (before anything starts, in a
    run and in a dry run): transformers, which reads the model's tokenizer, not installed."""
    if tokenizer_library():
        return []
    return [
        "the load generator needs transformers to read the model's tokenizer (prompt"
        " lengths, context clamping); install it: pip install 'gpudoctor[bench]'"
    ]


def tokenizer_library() -> bool:
    """Return True when transformers (the tokenizers' loader) can be imported here
    (``python -c 'import transformers'``); imported once, as the load generator would."""
    try:
        import transformers  # noqa: F401 - lazy: heavy, and only a campaign needs it
    except ImportError:
        return False
    return True


def run_id(out: Path) -> str:
    """Return the stable id of a run directory (tags its server processes)."""
    return "gdb-" + hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:12]


def validate_flags(plan: Plan, engine: Engine, help_cache: Path | None) -> str:
    """Check every flag of every config against the engine's ``--help``; return the help text.
    Raises CampaignError naming the offending flags. A ``command`` engine whose plan passes
    no args has nothing to check: only its program must exist (a ``sh -c`` launcher,
    whose ``--help`` lists no flag, is then fine)."""
    if engine.name == "command" and not any(config.args for config in plan.configs):
        program = engine.launcher()[0] if engine.launcher() else ""
        if not shutil.which(program):
            raise EngineMissing(f"command: {program} not found")
        return ""
    try:
        help_text = engine.help_text(help_cache)
        problems = engine.check_flags(plan.configs, help_text)
        if problems and help_cache is not None:  # the cached help may predate a reinstall
            help_text = engine.help_text(help_cache, refresh=True)
            problems = engine.check_flags(plan.configs, help_text)
    except EngineNotInstalled as exc:
        raise EngineMissing(str(exc)) from exc
    except EngineError as exc:
        raise CampaignError(str(exc)) from exc
    if problems:
        raise CampaignError(f"{plan.source}: " + "; ".join(p.message() for p in problems))
    return help_text


def with_legacy_keys(plan: Plan, done: dict[str, dict]) -> dict[str, dict]:
    """Return ``done`` (a run directory's records by key, written for this very plan) with
    each record written under a cell's key of before issue 45 (its configuration's key
    without the program) also found under the cell's key now: such a run resumes instead
    of running every cell again. Only for the same plan: the old key does not name the
    program, so another plan's record under it may be another program's."""
    found = dict(done)
    for cell in plan.cells():
        legacy = plan.legacy_cell_key(cell)
        if legacy is not None and legacy in done and cell.key not in done:
            found[cell.key] = done[legacy]
    return found


def skip_reason(quirk: quirks_mod.Quirk) -> str:
    """Return why a cell is skipped for ``quirk``: its id, the table it is in (gpudoctor's
    shipped one, or the local file a crash was written to) and how to run it anyway."""
    table = "the shipped quirks table" if quirk.source == "shipped" else quirk.source
    return f"quirk {quirk.id} (in {table}; --retry-crashed runs it anyway): {quirk.reason}"


def decide(
    plan: Plan, done: dict[str, dict], quirk_list: list, arch: str, version: str | None, retry: bool
) -> list[Decision]:
    """Return what happens to each cell: ``done`` (recorded), ``skip`` (quirk) or ``run``."""
    out = []
    for cell in plan.cells():
        if cell.key in done:
            out.append(Decision(cell, "done", done[cell.key].get("status", "")))
            continue
        quirk = (
            None
            if retry
            else quirks_mod.find_quirk(quirk_list, arch, plan.engine.name, version, cell.config)
        )
        if quirk:
            out.append(Decision(cell, "skip", skip_reason(quirk)))
        else:
            out.append(Decision(cell, "run"))
    return out
