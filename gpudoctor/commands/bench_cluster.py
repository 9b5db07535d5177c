"""``gpudoctor bench merge``, ``bench submit --slurm`` and ``bench status``: a campaign
across shards, hosts and a Slurm cluster, and its state at a glance."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click

from gpudoctor.exit_codes import ExitCode

_RUN_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


@click.command("merge")
@click.argument("inputs", nargs=-1, required=True, type=_RUN_DIR, metavar="RUN...")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The merged run directory: new or empty, or an earlier merge (merged into, "
                   "keeping every cell it holds). Any other non-empty directory is refused.")  # fmt: skip
@click.option(
    "--any-plan", is_flag=True, help="Merge runs of different plans (cells still match by key)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def merge(inputs: tuple[Path, ...], out: Path, any_plan: bool, as_json: bool) -> None:
    """Merge run directories (shards, hosts, Slurm tasks) into one, by cell key.

    A cell recorded in several inputs is kept once (ok over crashed or skipped,
    then the newest) and every duplicate is listed, and kept in
    OUT/duplicates.jsonl: never silently twice. The inputs are only read.
    A merge never replaces a run: OUT is new, or an earlier merge, whose cells
    are all kept (say, shards merged as they finish).
    `bench report OUT` and `bench compare OUT OTHER` work on the result.

    \b
    Example:
      gpudoctor bench merge runs/x-1 runs/x-2 runs/x-3 --out runs/x
    """
    from gpudoctor.bench.results.merge import MergeError, merge_runs

    try:
        result = merge_runs(list(inputs), out, allow_other_plan=any_plan)
    except MergeError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    for d in result.duplicates:
        click.echo(f"duplicate: {d.config} c={d.concurrency} ({d.key}) recorded in {d.kept} and "
                   f"{', '.join(d.dropped)} ({'/'.join(d.statuses)}); kept {d.kept}'s")  # fmt: skip
    if result.earlier is not None:
        click.echo(f"{out} held an earlier merge ({result.earlier} cells): merged into it, "
                   "every cell it held kept")  # fmt: skip
    per = ", ".join(f"{n}: {c}" for n, c in result.by_input.items())
    click.echo(f"{out}: {result.cells} cells ({per}); {len(result.duplicates)} duplicate(s). "
               f"Next: gpudoctor bench report {out}")  # fmt: skip


@click.command("submit")
@click.argument(
    "plan_path", metavar="PLAN", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--slurm", is_flag=True, required=True, help="Submit to Slurm (the one scheduler supported)."
)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Campaign directory on storage every node sees: shards/I, merged, slurm/.")  # fmt: skip
@click.option("--shards", type=click.IntRange(min=1), default=None,
              help="Tasks in the array (default: one per configuration, or what DIR was submitted with).")  # fmt: skip
@click.option(
    "--gpus-per-task",
    type=click.IntRange(min=1),
    default=None,
    help="--gres=gpu:N of each task (default: the plan's largest tp).",
)
@click.option(
    "--sbatch-arg",
    "sbatch_args",
    multiple=True,
    metavar="ARG",
    help="Passed to sbatch as is (repeatable): --sbatch-arg=--partition=gpu.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the submission as JSON on stdout.")
def submit(plan_path: Path, slurm: bool, out: Path, shards: int | None, gpus_per_task: int | None,
           sbatch_args: tuple[str, ...], as_json: bool) -> None:  # fmt: skip
    """Submit PLAN as a Slurm job array: one task per shard, then a merge job.

    \b
    Task I runs `gpudoctor bench run PLAN --shard I/N --out DIR/shards/I` on its
    --gres=gpu:N (packed onto them); a job with --dependency=afterany:ARRAY merges
    every shard into DIR/merged. Run it again after a task failed or was cancelled:
    only shards with missing cells and no queued or running task are resubmitted,
    and each resumes where it stopped. `gpudoctor bench status DIR` follows it.

    \b
    Example:
      gpudoctor bench submit --slurm plan.toml --out /shared/runs/x --shards 8
    """
    from gpudoctor.bench.launch.slurm import (
        SlurmError,
        campaign_dir,
        missing_dirs,
        read_submissions,
        require_clients,
    )
    from gpudoctor.bench.launch.slurm import submit as do_submit
    from gpudoctor.bench.plan import PlanError, load_plan
    from gpudoctor.bench.results.run_dir import RunDirError

    try:
        plan = load_plan(plan_path)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        require_clients()  # no sbatch: nothing is made under --out
        made = missing_dirs(out)  # removed again when sbatch refuses a first submit
        campaign_dir(out)  # DIR and slurm/ judged before anything in them is read
        earlier = read_submissions(out)
        n = shards or (int(earlier[-1]["shards"]) if earlier else len(plan.configs))
        sub = do_submit(plan, plan_path, out, n, gpus_per_task, sbatch_args, made=made)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except (SlurmError, RunDirError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({**sub.to_json(), "shards": n, "out": str(out)}, indent=2))
        return
    for shard, why in sub.skipped.items():
        click.echo(f"shard {shard}/{n}: not submitted ({why})")
    if sub.array_job:
        click.echo(f"submitted array {sub.array_job} (shards {','.join(map(str, sub.tasks))} of {n}, "
                   f"--gres=gpu:{sub.gres}) and merge job {sub.merge_job}. "
                   f"Follow: gpudoctor bench status {out}")  # fmt: skip
    else:
        click.echo(f"{out}: nothing to submit")


@click.command("status")
@click.argument("run", type=_RUN_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON on stdout.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", is_flag=False, flag_value=5.0,
              help="Refresh every SECONDS (default 5) until the campaign ends or Ctrl-C.")  # fmt: skip
def status(run: Path, as_json: bool, watch: float | None) -> None:
    """Show a campaign at a glance: preflight, weights, each TP group's cells
    (done / running on which GPUs since when / pending / skipped with the quirk /
    crashed with the log line), progress and an ETA from the cells measured so far.

    \b
    Works on a live or finished run, a directory of shards or Slurm tasks
    (`bench submit --slurm --out DIR`) and a merged run. Read-only: it never
    takes the run's lock and writes nothing, so it cannot disturb the campaign.

    \b
    Examples:
      gpudoctor bench status runs/x
      gpudoctor bench status runs/x --watch 10
    """
    from gpudoctor.bench.launch.status import campaign_status, render

    marks = ("plan.toml", "results.jsonl", "run.json", "shards", "merge.json")
    if not any(os.path.lexists(run / name) for name in marks):
        raise click.ClickException(
            f"{run} is not a bench run directory (no plan.toml, results.jsonl or shards/);"
            " give the --out of a `gpudoctor bench` run"
        )
    while True:
        result = campaign_status(run)
        if as_json:
            click.echo(json.dumps(result, indent=2, default=str))
        else:
            if watch:
                click.echo(
                    "\x1b[2J\x1b[H" if click.get_text_stream("stdout").isatty() else "", nl=False
                )
            click.echo(render(result))
        live = result.get("live") or any(s.get("live") for s in result.get("shards", []))
        if not watch or not live:
            return
        try:
            time.sleep(watch)
        except KeyboardInterrupt:
            click.get_current_context().exit(ExitCode.OK)
