"""gpudoctor/facts/allreduce.py: how the all-reduce probe's launcher output becomes each rank's
outcome, and the sentences and evidence ``nccl.allreduce`` shows from it. The launcher's
output is what the real launcher prints (gpudoctor/probes/allreduce_probe.py); the machine
that would run it (several GPUs, torch, NCCL) cannot exist here, so
tests/fakes/answering_host.py answers its one command (the real launcher on gloo: test_multigpu_allreduce.py)."""

from __future__ import annotations

import json

from gpudoctor.facts.allreduce import (
    AllreduceRun,
    RankOutcome,
    parse_allreduce_output,
    run_allreduce_probe,
)
from gpudoctor.facts.multigpu import probe_source
from gpudoctor.hosts.base import CommandResult
from tests.fakes.answering_host import AnsweringHost


def lines(*objs: object) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def done(rank: int, sum_ok: bool = True, busbw: float = 100.0) -> dict:
    return {"stage": f"rank{rank}", "result": {"sum_ok": sum_ok, "busbw_gbps": busbw}}


def launcher(**fields: object) -> dict:
    return {"stage": "launcher", **fields}


def rank(k: int, step: str = "done", code: int | None = 0, **kw: object) -> RankOutcome:
    return RankOutcome(k, step, code, **kw)


OK = {"sum_ok": True, "busbw_gbps": 50.0}

# ---------------------------------------------------------------------------- parsing


def test_every_rank_done_with_the_right_sum_is_ok():
    stdout = lines(
        launcher(started=True),
        {"stage": "rank0", "step": "init"},
        done(0),
        done(1, busbw=80.5),
        launcher(
            ranks=[{"rank": 0, "returncode": 0}, {"rank": 1, "returncode": 0}],
            transports=["P2P/CUMEM", "SHM"],
            warnings=["NCCL WARN x"],
            stderr_tail={"rank1": "tail"},
            env={"NCCL_NVLS_ENABLE": "0"},
            elapsed_s=3,
        ),
    )
    run = parse_allreduce_output(stdout, 2, timeout_s=30.0, extra_env=("A=1",))
    assert run == AllreduceRun(
        world_size=2,
        ranks=(
            RankOutcome(0, "done", 0, {"sum_ok": True, "busbw_gbps": 100.0}),
            RankOutcome(1, "done", 0, {"sum_ok": True, "busbw_gbps": 80.5}),
        ),
        transports=("P2P/CUMEM", "SHM"),
        warnings=("NCCL WARN x",),
        stderr_tail={"rank1": "tail"},
        env={"NCCL_NVLS_ENABLE": "0"},
        extra_env=("A=1",),
        elapsed_s=3.0,
        timeout_s=30.0,
    )
    assert isinstance(run.elapsed_s, float)
    assert run.ok


def test_a_rank_that_printed_nothing_is_at_start_and_its_exit_status_comes_from_the_launcher():
    stdout = lines(
        {"stage": "rank1", "step": "allreduce", "checked": {"sum_ok": True}},
        {"stage": "rank2", "step": "init", "checked": "not a dict"},
        launcher(ranks=[{"rank": 1, "returncode": -9}, {"rank": 0}], timed_out=True),
    )
    run = parse_allreduce_output(stdout, 3)
    assert run.ranks == (
        RankOutcome(0, "start", None),
        RankOutcome(1, "allreduce", -9, {}, {"sum_ok": True}),
        RankOutcome(2, "init", None),
    )
    assert run.timed_out and not run.ok and run.error == ""


def test_lines_that_are_not_rank_or_launcher_objects_are_skipped():
    stdout = "NCCL INFO Bootstrap\n[1]\n{broken\n" + lines(
        {"stage": "rankX", "step": "init"},
        {"stage": "rank", "step": "init"},
        {"stage": "other", "result": {"sum_ok": False}},
        {"stage": "rank0", "note": "neither a step nor a result"},
        {"stage": "rank0", "step": "import"},
        launcher(),
    )
    run = parse_allreduce_output(stdout, 1)
    assert run.ranks == (RankOutcome(0, "import", None),)
    assert run.error == ""


def test_without_a_launcher_line_the_run_has_no_result_unless_it_was_killed():
    stdout = lines(done(0), launcher(started=True))
    assert parse_allreduce_output(stdout, 1).error == "no_result"
    killed = parse_allreduce_output(stdout, 1, killed=True)
    assert killed.error == "" and killed.timed_out
    assert killed.elapsed_s == 0.0  # the launcher never said how long it ran


def test_the_launchers_error_and_its_detail_are_kept():
    stdout = lines(launcher(error="no_torch", detail="No module named 'torch'"))
    run = parse_allreduce_output(stdout, 2)
    assert (run.error, run.error_detail) == ("no_torch", "No module named 'torch'")
    assert not run.ok
    assert run.describe_failure() == "The all-reduce launcher failed: No module named 'torch'."


# ---------------------------------------------------------------------------- verdicts


def test_ok_needs_every_rank_and_each_sum_right():
    assert AllreduceRun(2, (rank(0, result=OK), rank(1, result=OK))).ok
    assert not AllreduceRun(2, (rank(0, result=OK),)).ok  # a rank missing
    assert not AllreduceRun(1, (rank(0, result={"sum_ok": "True"}),)).ok
    assert not AllreduceRun(1, (rank(0, result=OK),), timed_out=True).ok
    assert not AllreduceRun(1, (rank(0, result=OK),), error="no_result").ok


def test_a_wrong_sum_is_read_from_the_result_else_from_the_checked_all_reduce():
    wrong = {"sum_ok": False, "wrong_elements": 7, "elements": 1024, "first_value": 0.0,
             "expected_first": 3.0}  # fmt: skip
    run = AllreduceRun(
        3,
        (
            rank(0, result=OK, checked={"sum_ok": False}),  # the final result decides
            rank(1, "allreduce", None, checked=wrong),
            rank(2, result={**wrong, "wrong_elements": 9, "first_value": 1.0}),
        ),
    )
    assert [r.rank for r in run.wrong_sum] == [1, 2]
    assert run.describe_failure() == (
        "The all-reduce returned WRONG values on rank(s) 1, 2 (7 of 1024 elements; first "
        "0.0, expected 3.0): data is corrupted between GPUs."
    )


def test_crashed_ranks_exited_on_their_own_and_stuck_ones_never_finished():
    run = AllreduceRun(
        6,
        (
            rank(0, "init", 1),
            rank(1, "allreduce", -9),  # killed by the launcher at the deadline
            rank(2, "init", None),
            rank(3, "done", 0, result=OK),
            rank(4, "bandwidth", 0),  # exited 0 without its result
            rank(5, "done", 2, result=OK),  # a result, then a bad exit: not a crash
        ),
    )
    assert [r.rank for r in run.crashed] == [0]
    assert [r.rank for r in run.stuck] == [1, 2, 4]


def test_a_crash_names_the_rank_its_status_its_step_and_ncclss_warning():
    run = AllreduceRun(
        2,
        (rank(0, "allreduce", -9), rank(1, "init", 134)),
        warnings=(
            "host:12:12 [1] misc/shmutils.cc:72 NCCL error",
            "a [1] NCCL WARN Cuda failure 2 ",
        ),
    )
    assert run.describe_failure() == "Rank 1 exited 134 during init (Cuda failure 2)."
    plain = AllreduceRun(1, (rank(0, "import", 1),), warnings=("NCCL error only",))
    assert plain.describe_failure() == "Rank 0 exited 1 during import."
    twice = AllreduceRun(1, (rank(0, "init", 1),), warnings=("x NCCL WARN a: NCCL WARN b ",))
    assert twice.describe_failure() == "Rank 0 exited 1 during init (a: NCCL WARN b)."
    other = AllreduceRun(1, (rank(0, "init", 1),), warnings=("torch WARN low memory",))
    assert other.describe_failure() == "Rank 0 exited 1 during init (torch WARN low memory)."


def test_a_hang_names_each_step_and_its_ranks():
    run = AllreduceRun(
        4,
        (rank(0, "allreduce", -9), rank(1, "init", -9), rank(2, "allreduce", None),
         rank(3, result=OK)),
        timed_out=True,
        timeout_s=30.0,
    )  # fmt: skip
    assert run.describe_failure() == (
        "The all-reduce across 4 GPUs did not finish within 30 s "
        "(ranks 0, 2 in allreduce; rank 1 in init)."
    )


def test_a_hang_after_a_right_small_all_reduce_says_large_transfers_fail():
    checked = {"sum_ok": True}
    run = AllreduceRun(
        2,
        (rank(0, "bandwidth", -9, checked=checked), rank(1, "bandwidth", -9, checked=checked)),
        timed_out=True,
        timeout_s=2.5,
    )
    assert run.describe_failure() == (
        "The all-reduce across 2 GPUs did not finish within 2.5 s (ranks 0, 1 in bandwidth). "
        "The first, 4 MiB all-reduce gave the right sum; the timed 64 MiB ones hung "
        "(large transfers fail where small ones pass)."
    )
    one_unchecked = AllreduceRun(
        2, (rank(0, "bandwidth", -9, checked=checked), rank(1, "init", -9)), timeout_s=2.5
    )
    assert "4 MiB" not in one_unchecked.describe_failure()


def test_the_evidence_lists_the_run_its_env_transports_ranks_and_first_warnings():
    run = AllreduceRun(
        2,
        (rank(0, result={"sum_ok": True, "busbw_gbps": 91.2}), rank(1, "init", -9)),
        transports=("P2P/CUMEM", "SHM"),
        warnings=tuple(f"NCCL WARN w{k}" for k in range(7)),
        env={"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG_SUBSYS": "INIT", "A_NCCL": "x"},
        extra_env=("NCCL_P2P_DISABLE=1", "X=2"),
        elapsed_s=12.345,
        timeout_s=60.0,
    )
    assert run.evidence() == [
        "ranks: 2, deadline 60 s, took 12.3 s, extra env NCCL_P2P_DISABLE=1 X=2",
        "env: A_NCCL=x NCCL_P2P_DISABLE=1",
        "NCCL transports: P2P/CUMEM, SHM",
        "rank 0: step done, exit 0, sum_ok True, busbw 91.2 GB/s",
        "rank 1: step init, exit -9",
        *(f"NCCL WARN w{k}" for k in range(5)),
    ]


def test_the_evidence_of_a_plain_run_says_no_transport_was_logged():
    run = AllreduceRun(1, (rank(0, result=OK),), timeout_s=30.0, elapsed_s=1.0)
    assert run.evidence()[:3] == [
        "ranks: 1, deadline 30 s, took 1.0 s",
        "env: ",
        "NCCL transports: none logged",
    ]


# ---------------------------------------------------------------------------- running it


def test_the_launcher_runs_with_the_world_size_deadline_backend_and_each_extra_variable():
    host = AnsweringHost(answer=CommandResult((), 0, lines(done(0), done(1), launcher())))
    host.python = "/opt/venv/bin/python"
    run = run_allreduce_probe(host, 2, 30.0, extra_env=("NCCL_P2P_DISABLE=1", "X=2"))
    argv, timeout = host.ran[0]
    assert argv == [
        "/opt/venv/bin/python", "-c", probe_source("allreduce_probe"), "launch",
        "--world-size", "2", "--timeout", "30", "--backend", "nccl",
        "--env", "NCCL_P2P_DISABLE=1", "--env", "X=2",
    ]  # fmt: skip
    assert timeout == 38.0  # the launcher's own deadline, plus time to report
    assert run.ok and run.extra_env == ("NCCL_P2P_DISABLE=1", "X=2") and run.timeout_s == 30.0


def test_another_backend_and_a_fractional_deadline_are_passed_as_given():
    host = AnsweringHost(answer=CommandResult((), 0, lines(done(0), launcher())))
    run_allreduce_probe(host, 1, 2.5, backend="gloo")
    argv, timeout = host.ran[0]
    assert argv[3:] == ["launch", "--world-size", "1", "--timeout", "2.5", "--backend", "gloo"]
    assert timeout == 10.5


def test_a_launcher_that_died_without_a_result_says_how_with_its_stderr():
    stderr = "x" * 2000 + "Traceback ...\nSyntaxError: bad\n"
    host = AnsweringHost(answer=CommandResult((), 1, "", stderr))
    run = run_allreduce_probe(host, 2, 30.0)
    assert run.error == "no_result"
    assert run.error_detail == ("the launcher exited 1 without a result: " + stderr.strip()[-500:])
    assert run.stderr_tail == {"launcher": stderr[-1500:]}
    assert run.describe_failure().startswith(
        "The all-reduce launcher failed: the launcher exited 1"
    )


def test_a_launcher_that_died_silently_says_there_was_no_stderr():
    run = run_allreduce_probe(AnsweringHost(answer=CommandResult((), 139, "", "  \n")), 2, 30.0)
    assert run.error_detail == "the launcher exited 139 without a result: (no stderr)"


def test_a_launcher_killed_at_the_outer_deadline_is_a_hang_not_a_missing_result():
    answer = CommandResult((), -9, lines({"stage": "rank0", "step": "init"}), "", True)
    run = run_allreduce_probe(AnsweringHost(answer=answer), 2, 30.0)
    assert run.timed_out and run.error == "" and run.error_detail == ""
    assert run.stderr_tail == {}
    assert run.describe_failure() == (
        "The all-reduce across 2 GPUs did not finish within 30 s (rank 0 in init; rank 1 in start)."
    )
