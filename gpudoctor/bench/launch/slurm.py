"""A campaign as a Slurm job array: one task per shard, each into its own run directory on
shared storage, and a dependent job that merges them.

``bench submit --slurm PLAN --out DIR --shards N`` writes ``DIR/slurm/array.sh`` and
``DIR/slurm/merge.sh`` and runs::

    sbatch --parsable --array=1-N --gres=gpu:G DIR/slurm/array.sh
    sbatch --parsable --dependency=afterany:ARRAY DIR/slurm/merge.sh

Task I runs ``gpudoctor bench run PLAN --shard I/N --out DIR/shards/I``; the merge job
runs ``gpudoctor bench merge DIR/shards/* --out DIR/merged``. Each submission is appended
to ``DIR/slurm/submissions.jsonl``. A later ``bench submit`` on the same DIR resubmits
only the shards whose cells are not all recorded and whose task is not queued or running
(a resumed shard runs only its missing cells).

DIR is checked like every run directory (``check_run_dir``: no link, the caller's or
root's, writable by nobody else, nor its parents), and so are ``slurm/`` and
``slurm/logs/`` (made with ``mkdir``, never through a link): Slurm opens the task logs as
the job's user, root, following links. The scripts are written for the record and handed
to ``sbatch`` on its standard input, so what runs is what gpudoctor wrote, whatever
happens to ``array.sh`` afterwards. Job ids read back from ``submissions.jsonl`` are
digits or are not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.launch.schedule import in_shard
from gpudoctor.bench.plan import Plan
from gpudoctor.bench.results.run_dir import RESULTS, check_run_dir, read_records
from gpudoctor.terminal import printable

SUBMISSIONS = "submissions.jsonl"
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


class SlurmError(RuntimeError):
    """sbatch/squeue failed or is missing (one line for the CLI)."""


@dataclass(frozen=True)
class Submission:
    """What one ``bench submit`` did: the array job, its tasks, the merge job."""

    array_job: str
    tasks: tuple[int, ...]
    merge_job: str
    gres: int
    skipped: dict[int, str]

    def to_json(self) -> dict[str, Any]:
        """Return the submission as a JSON-ready dict."""
        return vars(self) | {"tasks": list(self.tasks)}


def _run(argv: list[str], timeout_s: float = 60.0, stdin: str | None = None) -> str:
    """Run a Slurm client command (``stdin``: its standard input); return its stdout
    (SlurmError with its stderr)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, input=stdin)
    except FileNotFoundError as exc:
        raise SlurmError(
            f"{argv[0]} not found: is this a Slurm login node? (apt install slurm-client)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{argv[0]} did not answer within {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:]
        why = last[0] if last else f"exit code {proc.returncode}"
        raise SlurmError(f"{shlex.join(argv[:2])} failed: {why}")
    return proc.stdout


def require_clients(names: tuple[str, ...] = ("sbatch", "squeue")) -> None:
    """Raise SlurmError (the one line :func:`_run` gives) when a Slurm client command is not
    on PATH (``command -v sbatch``), so a submit that cannot reach Slurm makes nothing."""
    for name in names:
        if shutil.which(name) is None:
            raise SlurmError(
                f"{name} not found: is this a Slurm login node? (apt install slurm-client)"
            )


def shard_cells(plan: Plan, n: int) -> dict[int, set[str]]:
    """Return the cell keys of each shard 1..n."""
    return {i: {c.key for c in plan.cells() if in_shard(c.key, (i, n))} for i in range(1, n + 1)}


def shard_dir(out: Path, i: int) -> Path:
    """Return the run directory of shard ``i`` (``DIR/shards/I``)."""
    return out / "shards" / str(i)


def missing_cells(plan: Plan, out: Path, n: int) -> dict[int, int]:
    """Return, per shard, how many of its cells are not recorded yet in its run directory."""
    missing = {}
    for i, keys in shard_cells(plan, n).items():
        done = {str(r.get("key")) for r in read_records(shard_dir(out, i) / RESULTS)[0]}
        missing[i] = len(keys - done)
    return missing


def read_submissions(out: Path) -> list[dict[str, Any]]:
    """Return the submissions recorded in ``DIR/slurm/submissions.jsonl`` (oldest first);
    a line whose ``array_job`` is not a Slurm job id (digits) is left out, so nothing but a
    job id reaches ``squeue``, ``scontrol`` or ``sacct``."""
    records = read_records(out / "slurm" / SUBMISSIONS, limit=64 << 20)[0]
    return [
        r for r in records if _job_id(r.get("array_job")) and isinstance(r.get("shards", 1), int)
    ]


def _job_id(value: object) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool) and str(value).isascii() \
        and str(value).isdigit() and len(str(value)) <= 20  # fmt: skip


def campaign_dir(out: Path) -> Path:
    """Check (and make) the campaign directory ``out`` and its ``slurm/logs/``; return the
    ``slurm/`` directory. Raise RunDirError (one line) when another user owns or can write
    one of them or a parent, or one is a link."""
    from gpudoctor.bench.results.run_dir import RunDirError

    check_run_dir(out, "--out", create=True)
    for rel in ("slurm", "slurm/logs"):
        path = out / rel
        try:
            fsio.make_dirs(out, rel)
            fsio.judge_owner(path, os.lstat(path), f"the campaign's {rel}/",
                             f"remove it (rm -rf --one-file-system {path}) and submit again")  # fmt: skip
        except OSError as exc:
            raise RunDirError(str(exc)) from None
    return out / "slurm"


def job_name(plan: Plan) -> str:
    """Return the plan's name as one printable line (a newline in it cannot add a line to
    ``array.sh``, nor a control character reach ``squeue``'s output)."""
    return printable(plan.name)


def task_states(array_jobs: list[str]) -> dict[str, dict[int, str]]:
    """Return ``{array job: {task: state}}`` from ``squeue`` (queued, running) and
    ``scontrol show job`` / ``sacct`` (finished tasks Slurm still remembers)."""
    states: dict[str, dict[int, str]] = {j: {} for j in array_jobs}
    if not array_jobs:
        return states
    text = _run(["squeue", "-h", "-r", "-j", ",".join(array_jobs), "-o", "%F %K %T"])
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit() and parts[0] in states:
            states[parts[0]][int(parts[1])] = parts[2]
    for job in array_jobs:
        try:
            shown = _run(["scontrol", "-o", "show", "job", job])
        except SlurmError:
            shown = ""
        for line in shown.splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            task = fields.get("ArrayTaskId", "")
            if task.isdigit() and int(task) not in states[job]:
                states[job][int(task)] = fields.get("JobState", "UNKNOWN")
        if not shown:
            try:
                acct = _run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State"])
            except SlurmError:
                acct = ""
            for line in acct.splitlines():
                jid, _, state = line.partition("|")
                task = jid.rpartition("_")[2]
                if task.isdigit():
                    states[job].setdefault(int(task), state.split()[0] if state else "UNKNOWN")
    return states


def _remove_made(slurm_dir: Path, made: tuple[Path, ...]) -> None:
    """Remove the scripts of a submission sbatch refused, then the directories of ``made``
    (those this submit created) that are empty now, deepest first; returns None."""
    for name in ("array.sh", "merge.sh"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slurm_dir / name)
    for path in reversed(made):
        with contextlib.suppress(OSError):  # not empty: something else is in there; kept
            os.rmdir(path)


def _script(lines: list[str]) -> str:
    return "#!/bin/bash\nset -euo pipefail\n" + "\n".join(lines) + "\n"


def missing_dirs(out: Path) -> tuple[Path, ...]:
    """Return those of ``out``, ``out/slurm`` and ``out/slurm/logs`` that do not exist yet
    (what a first submit makes, and removes again when sbatch refuses it)."""
    return tuple(p for p in (out, out / "slurm", out / "slurm" / "logs") if not os.path.lexists(p))


def submit(plan: Plan, plan_path: Path, out: Path, shards: int, gres: int | None = None,
           sbatch_args: tuple[str, ...] = (), gpudoctor: str | None = None,
           made: tuple[Path, ...] | None = None) -> Submission:  # fmt: skip
    """Write the scripts and submit the array (only shards with missing cells and no live
    task) and the merge job; return what was submitted. ``gres``: GPUs per task (default:
    the plan's largest tp; ``made``: the directories the caller found missing before it made
    them, :func:`missing_dirs`). Raises SlurmError (sbatch failed: what this first submit
    made is removed) or ValueError (bad input)."""
    if shards < 1:
        raise ValueError("--shards must be >= 1")
    made = missing_dirs(out) if made is None else made
    slurm_dir = campaign_dir(out)
    earlier = read_submissions(out)
    if earlier and int(earlier[-1].get("shards", shards)) != shards:
        raise ValueError(
            f"{out} was submitted with --shards {earlier[-1]['shards']}; keep it (the shards are by cell key)"
        )
    gres = gres or plan.max_tp
    live: dict[int, str] = {}
    states = task_states([str(s["array_job"]) for s in earlier])
    for sub in earlier:
        for task, state in states.get(str(sub["array_job"]), {}).items():
            if state in ACTIVE:
                live[task] = f"task {sub['array_job']}_{task} is {state}"
    missing = missing_cells(plan, out, shards)
    todo = [i for i in range(1, shards + 1) if missing[i] and i not in live]
    skipped = {i: live.get(i, "all cells recorded") for i in range(1, shards + 1) if i not in todo}
    exe = gpudoctor or shlex.join([sys.executable, "-m", "gpudoctor"])
    plan_abs, out_abs = plan_path.resolve(), out.resolve()
    array = _script([
        f"# gpudoctor bench submit: one task per shard of {job_name(plan)}",
        'shard="$SLURM_ARRAY_TASK_ID"',
        f"exec {exe} bench run {shlex.quote(str(plan_abs))} --shard \"$shard/{shards}\" "
        f"--out {shlex.quote(str(out_abs / 'shards'))}/\"$shard\" --resume",
    ])  # fmt: skip
    dirs = " ".join(shlex.quote(str(shard_dir(out_abs, i))) for i in range(1, shards + 1))
    merge = _script([
        "# gpudoctor bench submit: merge every shard that has results",
        "inputs=()",
        f"for d in {dirs}; do [ -f \"$d/results.jsonl\" ] && inputs+=(\"$d\"); done",
        'if [ ${#inputs[@]} -eq 0 ]; then echo "no shard has results yet; nothing to merge"; exit 0; fi',
        f"exec {exe} bench merge \"${{inputs[@]}}\" --out {shlex.quote(str(out_abs / 'merged'))}",
    ])  # fmt: skip
    for name, text in (("array.sh", array), ("merge.sh", merge)):
        fsio.atomic_replace(slurm_dir / name, text, mode=0o755, keep_mode=False,
                            refuse_non_regular=True, require_trusted_dir=True)  # fmt: skip
    if not todo:
        return Submission("", (), "", gres, skipped)
    logs = out_abs / "slurm" / "logs"
    # the scripts go to sbatch on stdin: a file swapped after it was written never runs
    try:
        array_job = _run(["sbatch", "--parsable", f"--array={','.join(map(str, todo))}",
                          f"--gres=gpu:{gres}", f"--job-name=gdb-{job_name(plan)}",
                          f"--output={logs}/shard-%a-%A.log", *sbatch_args],
                         stdin=array).strip().split(";")[0]  # fmt: skip
    except SlurmError:
        if not earlier:  # nothing was ever submitted: leave no slurm/ behind (issue 47)
            _remove_made(slurm_dir, made)
        raise
    merge_job = _run(["sbatch", "--parsable", f"--dependency=afterany:{array_job}",
                      f"--job-name=gdb-{job_name(plan)}-merge", f"--output={logs}/merge-%j.log",
                      *sbatch_args], stdin=merge).strip().split(";")[0]  # fmt: skip
    line = {"array_job": array_job, "tasks": todo, "merge_job": merge_job, "shards": shards,
            "gres": gres, "plan": str(plan_abs), "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": os.uname().nodename}  # fmt: skip
    fsio.durable_append(slurm_dir / SUBMISSIONS, (json.dumps(line, sort_keys=True) + "\n").encode(),
                        require_trusted_dir=True)  # fmt: skip
    return Submission(array_job, tuple(todo), merge_job, gres, skipped)
