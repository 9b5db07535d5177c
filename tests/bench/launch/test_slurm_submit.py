"""``bench submit --slurm`` without a Slurm controller, fast: the scripts it writes and hands
to ``sbatch``, the arguments of each Slurm command, what it records in submissions.jsonl,
which shards a second submit sends again, how it reads ``squeue`` / ``scontrol`` /
``sacct`` output (real Slurm output, tests/bench/data/slurm/), and its one-line errors.

The Slurm clients are tests/bench/launch/fake_slurm.sh (no controller runs here; the
real one-node cluster is tests/bench/launch/test_slurm_lab.py, a lab test)."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.launch import slurm
from gpudoctor.bench.launch.slurm import (
    SlurmError,
    Submission,
    campaign_dir,
    job_name,
    missing_cells,
    read_submissions,
    require_clients,
    shard_cells,
    shard_dir,
    submit,
    task_states,
)
from gpudoctor.bench.plan import Plan
from gpudoctor.bench.results.run_dir import RunDirError
from tests.bench.launch.inproc_launch import load, plan_text

DATA = Path(__file__).parent.parent / "data" / "slurm"
FAKE = Path(__file__).parent / "fake_slurm.sh"
CLIENTS = ("sbatch", "squeue", "scontrol", "sacct")
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
MODEL = Path("/models/tiny")  # a fixed path: the cell keys, so the shards, are the same each run


class Slurm:
    """The fake clients' directory: what they answer, what they were asked."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def answer(self, name: str, out: str = "", err: str = "", rc: int = 0, call: int = 0) -> None:
        (self.path / (f"{name}.{call}.out" if call else f"{name}.out")).write_text(out)
        if err:
            (self.path / f"{name}.err").write_text(err)
        if rc:
            (self.path / f"{name}.rc").write_text(str(rc))

    def calls(self) -> list[dict[str, Any]]:
        """Return each call's ``argv`` (the client's name first) and ``stdin``, in order."""
        calls = self.path / "calls"
        found = []
        for n in range(1, len(list(calls.glob("*.argv"))) + 1 if calls.exists() else 1):
            argv = (calls / f"{n}.argv").read_bytes().split(b"\0")[:-1]
            stdin = calls / f"{n}.stdin"
            found.append({"argv": [a.decode() for a in argv],
                          "stdin": stdin.read_text() if stdin.exists() else ""})  # fmt: skip
        return found

    def argvs(self) -> list[list[str]]:
        return [c["argv"] for c in self.calls()]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slurm:
    """Slurm's clients on PATH, answering nothing until told."""
    here = tmp_path / "slurm-fake"
    bin_dir = here / "bin"
    bin_dir.mkdir(parents=True)
    for name in CLIENTS:
        (bin_dir / name).symlink_to(FAKE)
    monkeypatch.setenv("FAKE_SLURM_DIR", str(here))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return Slurm(here)


CONFIGS = "".join(f'[[configs]]\nname = "{n}"\nenv = {{ JOB = "{n}" }}\n' for n in "abc") + (
    '[[configs]]\nname = "d"\ntp = [2]\n'
)


def _plan(
    tmp_path: Path, name: str = "inproc", concurrency: str = "[1, 2, 4]"
) -> tuple[Plan, Path]:
    text = plan_text(MODEL, 'command = ["srv", "{port}"]\n', configs=CONFIGS,
                     concurrency=concurrency).replace('name = "inproc"', f"name = {json.dumps(name)}")  # fmt: skip
    plan = load(tmp_path, text)
    return plan, tmp_path / "plan.toml"


def _record(out: Path, shard: int, keys: set[str]) -> None:
    path = shard_dir(out, shard)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "results.jsonl", "a", encoding="utf-8") as fh:
        for key in sorted(keys):
            fh.write(json.dumps({"key": key, "status": "ok"}) + "\n")


def test_a_first_submit_writes_both_scripts_and_queues_the_array_then_the_merge(
    tmp_path: Path, fake: Slurm
) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    fake.answer("sbatch", "4242;cluster-a\n", call=1)
    fake.answer("sbatch", "4243;cluster-a\n", call=2)

    before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sub = submit(plan, plan_path, out, 3)
    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    assert sub == Submission("4242", (1, 2, 3), "4243", 2, {})
    assert sub.to_json() == {"array_job": "4242", "tasks": [1, 2, 3], "merge_job": "4243",
                             "gres": 2, "skipped": {}}  # fmt: skip
    exe = shlex.join([sys.executable, "-m", "gpudoctor"])
    o = out.resolve()
    array = (out / "slurm" / "array.sh").read_text()
    assert array == (
        "#!/bin/bash\nset -euo pipefail\n"
        "# gpudoctor bench submit: one task per shard of inproc\n"
        'shard="$SLURM_ARRAY_TASK_ID"\n'
        f'exec {exe} bench run {plan_path.resolve()} --shard "$shard/3" '
        f'--out {o}/shards/"$shard" --resume\n'
    )
    merge = (out / "slurm" / "merge.sh").read_text()
    assert merge == (
        "#!/bin/bash\nset -euo pipefail\n"
        "# gpudoctor bench submit: merge every shard that has results\n"
        "inputs=()\n"
        f'for d in {o}/shards/1 {o}/shards/2 {o}/shards/3; do [ -f "$d/results.jsonl" ] &&'
        ' inputs+=("$d"); done\n'
        'if [ ${#inputs[@]} -eq 0 ]; then echo "no shard has results yet; nothing to merge";'
        " exit 0; fi\n"
        f'exec {exe} bench merge "${{inputs[@]}}" --out {o}/merged\n'
    )
    for name in ("array.sh", "merge.sh"):
        assert stat.S_IMODE((out / "slurm" / name).stat().st_mode) == 0o755
    logs = o / "slurm" / "logs"
    assert fake.calls() == [
        {"argv": ["sbatch", "--parsable", "--array=1,2,3", "--gres=gpu:2", "--job-name=gdb-inproc",
                  f"--output={logs}/shard-%a-%A.log"], "stdin": array},
        {"argv": ["sbatch", "--parsable", "--dependency=afterany:4242",
                  "--job-name=gdb-inproc-merge", f"--output={logs}/merge-%j.log"],
         "stdin": merge},
    ]  # fmt: skip
    (line,) = [
        json.loads(x) for x in (out / "slurm" / "submissions.jsonl").read_text().splitlines()
    ]
    assert list(line) == sorted(line)  # one stable layout: lines compare and grep alike
    stamp = line.pop("submitted_at")
    assert STAMP.fullmatch(stamp) and before <= stamp <= after
    assert line.pop("host") == os.uname().nodename
    assert line == {"array_job": "4242", "tasks": [1, 2, 3], "merge_job": "4243", "shards": 3,
                    "gres": 2, "plan": str(plan_path.resolve())}  # fmt: skip
    assert (out / "slurm" / "logs").is_dir()


def test_gres_extra_sbatch_arguments_and_the_gpudoctor_command_are_the_users(
    tmp_path: Path, fake: Slurm
) -> None:
    plan, plan_path = _plan(tmp_path)
    fake.answer("sbatch", "7\n")
    out = tmp_path / "campaign"
    sub = submit(plan, plan_path, out, 1, gres=8, sbatch_args=("--partition=h200", "--time=2:00:00"),
                 gpudoctor="/opt/gd/bin/gpudoctor")  # fmt: skip
    assert (sub.array_job, sub.merge_job, sub.gres) == ("7", "7", 8)
    first, second = fake.argvs()
    assert first[3] == "--gres=gpu:8" and first[-2:] == ["--partition=h200", "--time=2:00:00"]
    assert second[-2:] == ["--partition=h200", "--time=2:00:00"]
    assert "exec /opt/gd/bin/gpudoctor bench run " in (out / "slurm" / "array.sh").read_text()
    assert "exec /opt/gd/bin/gpudoctor bench merge " in (out / "slurm" / "merge.sh").read_text()


def test_a_second_submit_sends_only_shards_with_missing_cells_and_no_live_task(
    tmp_path: Path, fake: Slurm
) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    fake.answer("sbatch", "1\n", call=1)
    fake.answer("sbatch", "2\n", call=2)
    submit(plan, plan_path, out, 4)
    cells = shard_cells(plan, 4)
    _record(out, 1, cells[1])  # shard 1 finished every cell
    _record(out, 3, set(list(cells[3])[:1]))  # shard 3 ran one cell, then its task failed
    fake.answer("squeue", "1 2 RUNNING\n1 4 PENDING\n")
    fake.answer("scontrol", "")
    fake.answer("sacct", "1_1|COMPLETED\n1_3|FAILED\n")
    fake.answer("sbatch", "9\n", call=3)
    fake.answer("sbatch", "10\n", call=4)

    sub = submit(plan, plan_path, out, 4)

    assert sub.tasks == (3,) and (sub.array_job, sub.merge_job) == ("9", "10")
    assert sub.skipped == {1: "all cells recorded", 2: "task 1_2 is RUNNING",
                           4: "task 1_4 is PENDING"}  # fmt: skip
    assert fake.argvs()[-2][:3] == ["sbatch", "--parsable", "--array=3"]
    lines = (out / "slurm" / "submissions.jsonl").read_text().splitlines()
    assert [json.loads(x)["array_job"] for x in lines] == ["1", "9"]


def test_nothing_left_to_do_queues_nothing(tmp_path: Path, fake: Slurm) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    for i, keys in shard_cells(plan, 2).items():
        _record(out, i, keys)
    sub = submit(plan, plan_path, out, 2)
    assert sub == Submission("", (), "", 2, {1: "all cells recorded", 2: "all cells recorded"})
    assert fake.calls() == [] and (out / "slurm" / "array.sh").exists()
    assert not (out / "slurm" / "submissions.jsonl").exists()


def test_the_shard_count_of_a_campaign_is_kept(tmp_path: Path, fake: Slurm) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    fake.answer("sbatch", "5\n")
    submit(plan, plan_path, out, 2)
    with pytest.raises(ValueError) as refused:
        submit(plan, plan_path, out, 3)
    assert str(refused.value) == (
        f"{out} was submitted with --shards 2; keep it (the shards are by cell key)"
    )
    with pytest.raises(ValueError, match=r"^--shards must be >= 1$"):
        submit(plan, plan_path, out, 0)
    fake.answer("squeue", "")
    fake.answer("scontrol", "")
    fake.answer("sacct", "")
    assert submit(plan, plan_path, out, 2).tasks == (1, 2)  # the same count: fine


def test_an_sbatch_refusal_is_one_line_and_records_nothing(tmp_path: Path, fake: Slurm) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    fake.answer("sbatch", err="sbatch: warning: can't honor --ntasks-per-node\n"
                "sbatch: error: Batch job submission failed: Invalid generic"
                " resource (gres) specification\n", rc=1)  # fmt: skip
    with pytest.raises(SlurmError) as failed:
        submit(plan, plan_path, out, 1)
    assert str(failed.value) == (
        "sbatch --parsable failed: sbatch: error: Batch job submission failed: Invalid generic"
        " resource (gres) specification"
    )
    assert not (out / "slurm" / "submissions.jsonl").exists()
    assert not out.exists()  # issue 47: --out/slurm/ was left behind


def test_a_refused_first_submit_keeps_what_was_there_before(tmp_path: Path, fake: Slurm) -> None:
    """Only what this submit made goes: an --out that existed stays, and a slurm/ holding
    something else (not empty) too."""
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    out.mkdir()
    fake.answer("sbatch", err="sbatch: error: Invalid account\n", rc=1)
    with pytest.raises(SlurmError):
        submit(plan, plan_path, out, 1)
    assert out.is_dir() and list(out.iterdir()) == []
    (out / "slurm" / "logs").mkdir(parents=True)
    (out / "slurm" / "logs" / "mine.log").write_text("x")
    with pytest.raises(SlurmError):
        submit(plan, plan_path, out, 1)
    assert sorted(p.name for p in (out / "slurm").iterdir()) == ["logs"]


def test_a_silent_failure_says_its_exit_code(tmp_path: Path, fake: Slurm) -> None:
    fake.answer("squeue", rc=2)
    with pytest.raises(SlurmError, match=r"^squeue -h failed: exit code 2$"):
        task_states(["12"])


def test_a_missing_or_hanging_client_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SlurmError) as missing:
        require_clients()
    assert str(missing.value) == (
        "sbatch not found: is this a Slurm login node? (apt install slurm-client)"
    )
    (empty / "sbatch").symlink_to("/bin/true")
    with pytest.raises(SlurmError, match=r"^squeue not found: is this a Slurm login node"):
        require_clients()
    with pytest.raises(SlurmError, match=r"^squeue not found: is this a Slurm login node"):
        task_states(["1"])
    (empty / "squeue").symlink_to("/bin/true")
    require_clients()  # both there
    (empty / "hang").write_text("#!/bin/sh\nexec /bin/sleep 30\n")
    (empty / "hang").chmod(0o755)
    with pytest.raises(SlurmError, match=r"^hang did not answer within 0 s$"):
        slurm._run([str(empty / "hang").rsplit("/", 1)[1]], timeout_s=0.2)


def test_task_states_read_real_squeue_and_scontrol_output(fake: Slurm) -> None:
    fake.answer("squeue", (DATA / "squeue-array.txt").read_text()
                + "99 1 RUNNING\nnot a line\n1 N/A PENDING\n1 5\n")  # fmt: skip
    fake.answer("scontrol", (DATA / "scontrol-array-cancelled.txt").read_text())
    states = task_states(["1"])
    assert states == {"1": {3: "PENDING", 2: "RUNNING", 1: "RUNNING"}}  # squeue's word wins
    assert fake.argvs() == [
        ["squeue", "-h", "-r", "-j", "1", "-o", "%F %K %T"],
        ["scontrol", "-o", "show", "job", "1"],
    ]


def test_finished_tasks_come_from_scontrol_then_sacct(fake: Slurm) -> None:
    fake.answer("squeue", "")
    fake.answer("scontrol", (DATA / "scontrol-array-cancelled.txt").read_text()
                + "JobId=9 ArrayJobId=1 ArrayTaskId=4\n", call=1)  # fmt: skip
    fake.answer("scontrol", "", call=2)  # job 2: Slurm forgot it (MinJobAge)
    fake.answer("sacct", "2_1|COMPLETED\n2_2|CANCELLED by 0\n2_3|\n2_[4-5]|PENDING\n")
    states = task_states(["1", "2"])
    assert states == {
        "1": {1: "CANCELLED", 2: "CANCELLED", 3: "CANCELLED", 4: "UNKNOWN"},
        "2": {1: "COMPLETED", 2: "CANCELLED", 3: "UNKNOWN"},
    }
    assert fake.argvs() == [
        ["squeue", "-h", "-r", "-j", "1,2", "-o", "%F %K %T"],
        ["scontrol", "-o", "show", "job", "1"],
        ["scontrol", "-o", "show", "job", "2"],
        ["sacct", "-n", "-P", "-X", "-j", "2", "-o", "JobID,State"],
    ]
    assert task_states([]) == {} and len(fake.calls()) == 4  # nothing asked


def test_a_line_of_scontrol_without_an_array_task_is_left_out(fake: Slurm) -> None:
    fake.answer("squeue", "")
    fake.answer("scontrol", "JobId=7 JobName=gdb-x-merge JobState=PENDING Reason=Dependency\n"
                + (DATA / "scontrol-array-running.txt").read_text())  # fmt: skip
    assert task_states(["1"]) == {"1": {3: "PENDING", 2: "RUNNING", 1: "RUNNING"}}


def test_scontrol_failing_asks_sacct(fake: Slurm) -> None:
    fake.answer("squeue", "")
    (fake.path / "scontrol.rc").write_text("1")
    fake.answer("sacct", "3_2|COMPLETED\n")
    assert task_states(["3"]) == {"3": {2: "COMPLETED"}}


def test_an_earlier_submission_without_its_shard_count_is_taken_as_this_one(
    tmp_path: Path, fake: Slurm
) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    (campaign_dir(out) / "submissions.jsonl").write_text('{"array_job": "12"}\n')
    fake.answer("squeue", "")
    fake.answer("scontrol", "")
    fake.answer("sacct", "")
    fake.answer("sbatch", "13\n")
    assert submit(plan, plan_path, out, 2).tasks == (1, 2)


def test_the_submission_is_stamped_in_utc(
    tmp_path: Path, fake: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    fake.answer("sbatch", "21\n")
    monkeypatch.setenv("TZ", "America/Los_Angeles")  # a login node eight hours behind UTC
    time.tzset()
    try:
        before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        submit(plan, plan_path, out, 1)
        after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    finally:
        monkeypatch.undo()
        time.tzset()
    line = json.loads((out / "slurm" / "submissions.jsonl").read_text())
    assert before <= line["submitted_at"] <= after


def test_scontrol_or_sacct_failing_leaves_the_queue_view(fake: Slurm) -> None:
    fake.answer("squeue", "3 1 RUNNING\n")
    (fake.path / "scontrol.rc").write_text("1")
    (fake.path / "sacct.rc").write_text("1")
    (fake.path / "sacct.err").write_text("Slurm accounting storage is disabled\n")
    assert task_states(["3"]) == {"3": {1: "RUNNING"}}


def test_submissions_other_than_job_ids_are_left_out(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    (out / "slurm").mkdir(parents=True)
    lines = [{"array_job": bad, "shards": 1} for bad in ("--help", "1,2", "１２", True, None,
                                                          "1" * 21, 3.0)]  # fmt: skip
    lines += [{"array_job": "12", "shards": "2"}, {"array_job": "4242", "shards": 2},
              {"array_job": 77}, {"array_job": "1" * 20, "shards": 1}]  # fmt: skip
    (out / "slurm" / "submissions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [s["array_job"] for s in read_submissions(out)] == ["4242", 77, "1" * 20]
    assert read_submissions(tmp_path / "none") == []


def test_missing_cells_count_per_shard(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path)
    cells = shard_cells(plan, 3)
    every = {c.key for c in plan.cells()}
    assert set(cells) == {1, 2, 3} and set().union(*cells.values()) == every
    assert sum(len(k) for k in cells.values()) == len(every)  # each cell in one shard
    out = tmp_path / "campaign"
    _record(out, 2, set(list(cells[2])[:2]) | {"not-a-cell"})
    assert missing_cells(plan, out, 3) == {1: len(cells[1]), 2: len(cells[2]) - 2,
                                           3: len(cells[3])}  # fmt: skip
    assert shard_dir(out, 2) == out / "shards" / "2"


def test_the_campaign_directory_is_made_and_a_link_in_it_refused(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    assert campaign_dir(out) == out / "slurm"
    assert (out / "slurm" / "logs").is_dir()
    other = tmp_path / "elsewhere"
    other.mkdir()
    link = tmp_path / "linked"
    (link / "slurm").mkdir(parents=True)
    (link / "slurm" / "logs").symlink_to(other)
    with pytest.raises(RunDirError):
        campaign_dir(link)
    os.chmod(out / "slurm", 0o777)  # writable by every user
    with pytest.raises(RunDirError) as refused:
        campaign_dir(out)
    assert str(refused.value) == (
        f"{out / 'slurm'} (the campaign's slurm/) is writable by others (mode 0777): another"
        f" user may have changed it; remove it (rm -rf --one-file-system {out / 'slurm'}) and"
        " submit again"
    )


def test_the_job_name_is_one_printable_line(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, "x\ntouch /tmp/pwned")
    assert "\n" not in job_name(plan) and job_name(plan).startswith("x")
    assert "touch /tmp/pwned" in job_name(plan)


LIVE = ["PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"]
ENDED = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"]


def test_a_task_slurm_still_holds_is_never_submitted_twice(tmp_path: Path, fake: Slurm) -> None:
    """Every state of a task Slurm may still run (queued, running, requeued, suspended...)
    keeps its shard out of a new submit; a task that ended is submitted again."""
    plan, plan_path = _plan(tmp_path, concurrency="[1, 2, 4, 8, 16, 32]")
    shards = 16
    busy = [i for i, keys in shard_cells(plan, shards).items() if keys]
    assert len(busy) >= len(LIVE) + 3
    out = tmp_path / "campaign"
    fake.answer("sbatch", "1\n", call=1)
    fake.answer("sbatch", "2\n", call=2)
    submit(plan, plan_path, out, shards)
    states = dict(zip(busy, LIVE + ENDED, strict=False))
    fake.answer("squeue", "".join(f"1 {i} {state}\n" for i, state in states.items()))
    fake.answer("scontrol", "")
    fake.answer("sbatch", "3\n", call=3)
    fake.answer("sbatch", "4\n", call=4)

    sub = submit(plan, plan_path, out, shards)

    ended = [i for i, state in states.items() if state not in LIVE] + busy[len(states) :]
    assert sub.tasks == tuple(sorted(ended))
    assert {i: why for i, why in sub.skipped.items() if i in busy} == {
        i: f"task 1_{i} is {state}" for i, state in states.items() if state in LIVE
    }
    assert all(why == "all cells recorded" for i, why in sub.skipped.items() if i not in busy)


def test_a_second_submit_rewrites_the_scripts_executable(tmp_path: Path, fake: Slurm) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    slurm_dir = campaign_dir(out)
    for name in ("array.sh", "merge.sh"):
        (slurm_dir / name).write_text("#!/bin/sh\necho an older script\n")
        (slurm_dir / name).chmod(0o600)
    fake.answer("sbatch", "5\n")
    submit(plan, plan_path, out, 1)
    for name in ("array.sh", "merge.sh"):
        assert stat.S_IMODE((slurm_dir / name).stat().st_mode) == 0o755
        assert "older" not in (slurm_dir / name).read_text()


def test_a_script_path_that_is_not_a_file_is_refused(tmp_path: Path, fake: Slurm) -> None:
    plan, plan_path = _plan(tmp_path)
    out = tmp_path / "campaign"
    os.mkfifo(campaign_dir(out) / "array.sh")  # a reader would block, or read another writer
    with pytest.raises(OSError):
        submit(plan, plan_path, out, 1)
    assert fake.calls() == []


def test_a_campaign_directory_that_is_a_link_names_the_option(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    out = tmp_path / "campaign"
    out.symlink_to(real)
    with pytest.raises(RunDirError) as refused:
        campaign_dir(out)
    assert str(refused.value) == (
        f"{out} (--out) is a symlink (to {real}): gpudoctor never follows one there; give the"
        f" real directory ({real})"
    )
    assert not (real / "slurm").exists()
