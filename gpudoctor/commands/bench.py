"""``gpudoctor bench``: run or resume a benchmark matrix, report it, compare two runs.

``gpudoctor bench PLAN ...`` is short for ``gpudoctor bench run PLAN ...``: the group
falls back to ``run`` when the first word is not one of its subcommands.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from gpudoctor.commands.options import require_writable_dir
from gpudoctor.exit_codes import ExitCode


class DefaultRunGroup(click.Group):
    """A group that treats anything but a subcommand (or --help) as the ``run`` command's
    arguments: ``gpudoctor bench PLAN --out DIR`` = ``gpudoctor bench run PLAN --out DIR``."""

    def _with_run(self, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            return ["run", *args]
        return args

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._with_run(list(args)))


@click.group(cls=DefaultRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Run, resume, report and compare LLM serving benchmark matrices.

    \b
    gpudoctor bench PLAN.toml --out runs/NAME      run (or resume) the matrix
    gpudoctor bench PLAN.toml --dry-run            cells, skips and exact server commands
    gpudoctor bench report runs/NAME               tables + plots
    gpudoctor bench compare runs/A runs/B          per-cell ratios B / A
    gpudoctor bench status runs/NAME               a campaign at a glance (read-only)
    gpudoctor bench run PLAN --shard 2/4 --out D   one host's share of the cells
    gpudoctor bench merge D1 D2 ... --out runs/M   shards into one run, by cell key
    gpudoctor bench submit --slurm PLAN --out D    a Slurm job array + a merge job

    A plan (TOML) names a model, an engine (sglang, vllm, transformers, or command: any
    OpenAI-compatible server from an argv you give) with shared server arguments, axes
    (tp, concurrency), configurations (each may sweep arguments), a workload and SLOs;
    see docs/bench.md and docs/examples/. One server runs per
    configuration; results.jsonl gets one fsync'ed line per cell, so a killed or
    rebooted campaign resumes where it stopped and never runs a finished cell twice.

    A plan is code: a plan runs the programs it names: run only plans you trust.
    It runs the engine, its --help, engine.python and any command template, even
    with --dry-run; --dry-run --no-validate expands a plan without running anything.
    """


@bench.command("run")
@click.argument(
    "plan_path", metavar="PLAN", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Run directory (default: runs/<plan name>). Resumed when it holds the same plan.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show the matrix, skips with reasons and the exact server commands; start no "
    "server. Still runs the engine's --help and engine.python to check flags.",
)
@click.option(
    "--no-validate",
    is_flag=True,
    help="With --dry-run: a pure expansion that runs no program of the plan "
    "(flags are not checked).",
)
@click.option(
    "--resume/--no-resume",
    default=None,
    help="--resume: reuse finished cells even if the plan changed (matched by key). "
    "--no-resume: move earlier results to DIR/previous-<time>/ and start afresh. "
    "Default: resume a directory that holds the same plan.",
)
@click.option(
    "--retry-crashed", is_flag=True, help="Rerun cells that crashed or were skipped by a quirk."
)
@click.option(
    "--retry-failed",
    is_flag=True,
    help="Rerun cells recorded as failed (their requests failed); kept once otherwise.",
)
@click.option("--no-preflight", is_flag=True, help="Do not run `gpudoctor check` before the cells.")
@click.option(
    "--quirks",
    "quirks_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Local quirks table, an existing file (touch it to start one; default "
    "$GPUDOCTOR_BENCH_QUIRKS or ~/.config/gpudoctor/bench-quirks.toml).",
)
@click.option(
    "--shard",
    metavar="I/N",
    help="Run only shard I of N (1-based): the cells whose key falls in it. Every host of a "
    "cluster runs its own shard into its own --out; `bench merge` joins them.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the summary (or the dry run) as JSON on stdout."
)
def run(plan_path: Path, out: Path | None, dry_run: bool, no_validate: bool, resume: bool | None,
        retry_crashed: bool, retry_failed: bool, no_preflight: bool, quirks_path: Path | None,
        shard: str | None, as_json: bool) -> None:  # fmt: skip
    """Run (or resume) the benchmark matrix of PLAN.

    A plan runs the programs it names: run only plans you trust.

    \b
    Before any server starts, every flag is checked against the engine's --help.
    Cells known to crash (shipped or local quirks) are skipped with the reason.
    A server that crashes is recorded (last 50 log lines) and the matrix goes on.
    A cell is ok only when its requests succeeded: none succeeded, zero output
    tokens, or more failed than [limits] max_failed_fraction (0.01) records it
    FAILED with the server's first error; a warmup answered HTTP 4xx fails it at
    once. Exit 3 when a cell of the run failed (--retry-failed reruns them),
    crashed its server (named by the engine's own error line), was client-bound
    (the load generator did not hold the schedule), or every cell was skipped.
    Ctrl-C / SIGTERM stop every server; run the same command again to resume.
    At the end, a table per cell: output tok/s, TTFT and TPOT p50/p99, errors.

    \b
    GPUs: with several GPUs (NVML) servers run side by side, each on its own
    GPUs (tp of them, CUDA_VISIBLE_DEVICES by UUID, best-linked first): TP1
    configurations fill every GPU, a TP4 one waits for 4 free. [hardware]
    gpus = [0, 1] or gpus = 2 in the plan caps them; --dry-run shows the
    schedule (configuration -> GPUs, wave) and its expected length.

    \b
    Examples:
      gpudoctor bench docs/examples/cpu-tiny.toml --out runs/cpu
      gpudoctor bench qwen.toml --dry-run
    """
    from gpudoctor.bench.launch import campaign as launcher
    from gpudoctor.bench.launch import dry_run as preview
    from gpudoctor.bench.launch.progress import make_reporter
    from gpudoctor.bench.launch.schedule import parse_shard
    from gpudoctor.bench.plan import PlanError, load_plan

    if no_validate and not dry_run:
        raise click.UsageError("--no-validate only goes with --dry-run")
    try:
        shard_pair = parse_shard(shard) if shard else None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        plan = load_plan(plan_path)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from exc
    from gpudoctor.bench.plan.advice import plan_warnings

    advice = plan_warnings(plan)
    for line in advice:
        click.echo(f"warning: {line}", err=True)
    out = out or Path("runs") / plan.name
    if not dry_run:
        require_writable_dir(out, "--out")
        from gpudoctor.bench.results.run_dir import RunDirError, check_run_dir

        try:  # before any program runs: another user's --out is refused (issue 22.1)
            check_run_dir(out)
        except RunDirError as exc:
            raise click.ClickException(str(exc)) from exc
    options = launcher.LaunchOptions(
        out=out,
        resume=resume,
        retry_crashed=retry_crashed,
        retry_failed=retry_failed,
        preflight=not no_preflight,
        quirks_path=quirks_path,
        shard=shard_pair,
        help_cache=Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "gpudoctor"
        / "engine-help",
    )
    if dry_run:
        try:
            result = preview.dry_run(plan, options, validate=not no_validate)
        except launcher.CampaignError as exc:
            raise click.ClickException(str(exc)) from exc
        if as_json:  # one JSON document, with ok/error when the plan has a problem
            if result["problems"]:
                result = {"ok": False, "error": result["problems"][0], **result}
            click.echo(preview.dumps(result))
            if result["problems"]:
                click.get_current_context().exit(ExitCode.ERROR)
            return
        click.echo(_dry_run_text(result))
        if result["problems"]:
            raise click.ClickException(result["problems"][0])
        return
    try:
        summary = launcher.run_campaign(plan, options, make_reporter())
    except launcher.CampaignError as exc:
        err = click.ClickException(str(exc))
        err.exit_code = ExitCode.FAILED if str(exc).startswith("preflight") else ExitCode.ERROR
        raise err from exc
    except KeyboardInterrupt as exc:
        err = click.ClickException(
            f"interrupted; every server is stopped. Resume: gpudoctor bench {plan_path} --out {options.out}"
        )
        err.exit_code = ExitCode.INTERRUPTED
        raise err from exc
    failed, failed_count = failed_cells(options.out)
    if as_json:
        import dataclasses

        click.echo(preview.dumps({**dataclasses.asdict(summary), "out": str(options.out),
                                  "failed_cells": failed_count, "failures": failed}))  # fmt: skip
    else:
        from gpudoctor.bench.results.summary_table import results_table

        click.echo(results_table(options.out, plan))
        bound = f", {summary.client_bound} client-bound" if summary.client_bound else ""
        click.echo(
            f"{options.out}: {summary.total} cells: {summary.already_done} done before, "
            f"{summary.ok} ok{bound}, {summary.failed} failed, "
            f"{summary.crashed} crashed, {summary.skipped} skipped now; "
            f"{summary.server_starts} server start(s). Next: gpudoctor bench report {options.out}"
        )
    for line in advice:  # said again under the table its cells are in (issue 47)
        click.echo(f"warning: {line}", err=True)
    from gpudoctor.bench.launch.run_verdict import RunFacts, verdict_lines
    from gpudoctor.bench.plan.quirks import default_local_path

    facts = RunFacts(f"gpudoctor bench {plan_path} --out {options.out}",
                     str(options.quirks_path or default_local_path()), tuple(failed),
                     failed_count, tuple(crashed_cells(options.out)))  # fmt: skip
    lines = verdict_lines(summary, facts)
    for line in lines:
        click.echo(line, err=True)
    if lines:
        click.get_current_context().exit(ExitCode.FAILED)


def crashed_cells(out: Path) -> list[str]:
    """Return one line per crashed cell of the run directory ``out`` (``label c=N: why``)."""
    from gpudoctor.bench.results.reader import ResultsError, read_run

    try:
        cells = list(read_run(out).cells)
    except ResultsError:
        return []
    return [
        f"{c.config} (TP{c.tp}) {c.load_label}: {c.reason}" for c in cells if c.status == "crashed"
    ]


def failed_cells(out: Path) -> tuple[list[str], int]:
    """Return the failed cells of the run directory ``out``: one line per cell (``label
    c=N: why``), a configuration whose every cell failed the same way in one line (a plan
    problem, with the field to change when the server named one); and their count."""
    from gpudoctor.bench.results.reader import ResultsError, read_run
    from gpudoctor.bench.results.verdict import common_failure

    try:
        cells = list(read_run(out).cells)
    except ResultsError:
        return [], 0
    by_config: dict[str, list] = {}
    for cell in cells:
        by_config.setdefault(f"{cell.config} (TP{cell.tp})", []).append(cell)
    lines = []
    for label, group in by_config.items():
        failed = [c for c in group if c.status == "failed"]
        records = [{"status": c.status, "verdict": {"first_error": c.first_error},
                    "measurement": c.measurement} for c in group]  # fmt: skip
        same = common_failure(records) if len(group) > 1 else None
        if same:
            lines.append(f"{label}, all {len(group)} cells: {same}")
        else:
            lines += [f"{label} {c.load_label}: {c.reason}" for c in failed]
    return lines, sum(1 for c in cells if c.status == "failed")


def _dry_run_text(result: dict) -> str:
    unknown = (
        "(not installed)"
        if result.get("validated", True)
        else "version not checked (--no-validate)"
    )
    lines = [f"plan {result['plan']}: engine {result['engine']} {result['engine_version'] or unknown}, "
             f"GPU arch {result['gpu_arch']}, {len(result['cells'])} cells"]  # fmt: skip
    lines += [f"note: {n}" for n in result["notes"]]
    lines += [f"PROBLEM: {p}" for p in result["problems"]]
    for config in result["configs"]:
        lines.append("")
        lines.append(
            f"{config['label']}  (key {config['key']}, concurrency {config['concurrencies']})"
        )
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in config["env"].items())
        if config["command"]:  # none for a plan's running server (engine.server_url)
            lines.append(
                f"  $ {env} {shlex.join(config['command'])}".replace("--port 0", "--port <free>")
            )
        for cell in (c for c in result["cells"] if c["label"] == config["label"]):
            why = f"  {cell['reason']}" if cell["reason"] else ""
            lines.append(f"    c={cell['concurrency']:<4} {cell['action']:<5} {cell['key']}{why}")
    lines += _schedule_text(result.get("schedule"))
    return "\n".join(lines)


def _schedule_text(schedule: dict | None) -> list[str]:
    """Return the dry run's schedule lines (wave, configuration -> GPUs, expected times)."""
    if not schedule or not schedule["placements"]:
        return []
    lines = [""]
    if schedule["packed"]:
        gpus = ", ".join(f"{g['index']}={g['uuid']}" for g in schedule["gpus"])
        lines.append(f"schedule on {len(schedule['gpus'])} GPU(s) ({schedule['source']}): {gpus}")
    else:
        lines.append("schedule: no GPU found, one server at a time")
    for p in schedule["placements"]:
        where = "GPU " + ",".join(map(str, p.get("gpu_indices", []))) if p["gpus"] else "-"
        lines.append(f"  wave {p['wave']:<3} {p['label']:<28} {where:<14} "
                     f"{p['start_s'] / 60:7.1f} -> {p['end_s'] / 60:7.1f} min  ({p['cells']} cells)")  # fmt: skip
    for label in schedule.get("not_runnable", []):
        lines.append(f"  not runnable: {label} needs more GPUs than the pool has")
    lines.append(f"expected {schedule['expected_s'] / 60:.1f} min (ideal {schedule['ideal_s'] / 60:.1f}, "
                 f"one at a time {schedule['serial_s'] / 60:.1f}; estimates from earlier cells, else 1 min a cell)")  # fmt: skip
    return lines


def _add_report_commands() -> None:
    try:
        from gpudoctor.commands.bench_report import compare, report
    except ImportError:  # pragma: no cover - the report half ships with gpudoctor
        return
    bench.add_command(report)
    bench.add_command(compare)
    from gpudoctor.commands.bench_cluster import merge, status, submit

    for command in (merge, submit, status):
        bench.add_command(command)


_add_report_commands()
