"""What the launcher leaves for the user and for `bench status`, in-process and fast: the
one writer of results.jsonl / servers.jsonl / gpus.jsonl (a real run directory in
tmp_path), state.json (written, then read back by another reader), a measured cell's
status from its verdict, and a Ctrl-C that Python dropped raised again (real signals
sent to this process)."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpudoctor.bench.launch import interrupts
from gpudoctor.bench.launch.live_state import LiveState, now_utc
from gpudoctor.bench.launch.outcome import cell_outcome
from gpudoctor.bench.launch.progress import PlainReporter
from gpudoctor.bench.launch.run_writer import RunWriter
from gpudoctor.bench.launch.slots import Gpu
from gpudoctor.bench.plan_model import Limits
from gpudoctor.bench.results.launcher_state import STATE, launcher_alive
from gpudoctor.bench.results.run_dir import RunDir, read_records

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# --- the one writer ---------------------------------------------------------------------


def test_the_writer_appends_each_record_once_and_counts_this_launchs_cells(
    tmp_path: Path,
) -> None:
    with RunDir(tmp_path / "run") as rd:
        reporter = PlainReporter(io.StringIO())
        writer = RunWriter(rd, reporter)
        for key, status in (("k1", "ok"), ("k2", "failed"), ("k3", "crashed"), ("k4", "skipped"),
                            ("k5", "ok"), ("k6", "not-run")):  # fmt: skip
            assert writer.append_cell({"key": key, "status": status}) is True
        writer.append_result_line({"key": "search-1", "record": "search"})
        assert writer.counts == {
            "ok": 2,
            "failed": 1,
            "crashed": 1,
            "skipped": 2,
            "client_bound": 0,
        }
        # a client-bound ok cell is counted apart (issue 45.9); a flag on another status not
        assert writer.append_cell({"key": "k8", "status": "ok", "client_bound": "late"})
        assert writer.append_cell({"key": "k9", "status": "failed", "client_bound": "late"})
        assert writer.append_cell({"key": "k10", "status": "ok", "client_bound": ""})
        assert writer.counts == {
            "ok": 4,
            "failed": 2,
            "crashed": 1,
            "skipped": 2,
            "client_bound": 1,
        }
        assert set(writer.done) == {
            "k1",
            "k2",
            "k3",
            "k4",
            "k5",
            "k6",
            "k8",
            "k9",
            "k10",
            "search-1",
        }
        assert writer.done["k2"] == {"key": "k2", "status": "failed"}
        writer.stopping.set()  # interrupted: the cell that was cut short is not finished
        assert writer.append_cell({"key": "k7", "status": "ok"}) is False
        assert "k7" not in writer.done and writer.counts["ok"] == 4
    keys = [r["key"] for r in read_records(tmp_path / "run" / "results.jsonl")[0]]
    assert keys == ["k1", "k2", "k3", "k4", "k5", "k6", "search-1", "k8", "k9", "k10"]


def test_servers_and_gpus_out_go_to_their_own_files_and_a_gpu_out_is_told(
    tmp_path: Path,
) -> None:
    with RunDir(tmp_path / "run") as rd:
        reporter = PlainReporter(io.StringIO())
        writer = RunWriter(rd, reporter)
        writer.server_line({"label": "a@tp1", "startup_s": 9.5})
        writer.gpu_out(Gpu(2, "GPU-c", "NVIDIA H200"), "2 uncorrected ECC errors", "w@tp2")
    run = tmp_path / "run"
    assert lines(run / "servers.jsonl") == [{"label": "a@tp1", "startup_s": 9.5}]
    (gone,) = lines(run / "gpus.jsonl")
    assert gone.pop("at") is not None
    assert gone == {"uuid": "GPU-c", "index": 2, "name": "NVIDIA H200",
                    "reason": "2 uncorrected ECC errors", "before": "w@tp2"}  # fmt: skip
    assert not (run / "results.jsonl").exists() or lines(run / "results.jsonl") == []
    assert reporter.stream.getvalue() == (
        "bench: GPU 2 (GPU-c) failed its check and left the pool: 2 uncorrected ECC errors\n"
    )


def test_slot_threads_writing_at_once_leave_whole_lines(tmp_path: Path) -> None:
    with RunDir(tmp_path / "run") as rd:
        writer = RunWriter(rd, PlainReporter(io.StringIO()))
        barrier = threading.Barrier(4)

        def slot(n: int) -> None:
            barrier.wait()
            for i in range(25):
                writer.append_cell({"key": f"{n}-{i}", "status": "ok", "pad": "x" * 4000})

        threads = [threading.Thread(target=slot, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert writer.counts["ok"] == 100 and len(writer.done) == 100
    records, torn = read_records(tmp_path / "run" / "results.jsonl")
    assert torn == 0 and len(records) == 100


# --- state.json -------------------------------------------------------------------------


def test_state_json_says_what_runs_where_since_when(tmp_path: Path) -> None:
    import re

    path = tmp_path / STATE
    state = LiveState(path, "tag-1")
    state.set_pool({"gpus": [{"index": 0, "uuid": "GPU-a"}], "out": {}})
    doc = json.loads(path.read_text())
    assert doc["tag"] == "tag-1" and doc["pid"] == os.getpid() and doc["finished"] is False
    assert doc["pool"] == {"gpus": [{"index": 0, "uuid": "GPU-a"}], "out": {}}
    assert doc["running"] == [] and re.fullmatch(STAMP, doc["updated_at"])
    assert launcher_alive(doc)  # this process wrote it and runs
    state.start("s2", {"label": "w@tp2", "slot": 2, "gpus": ["GPU-b", "GPU-c"]})
    state.start("s1", {"label": "a@tp1", "slot": 1, "gpus": ["GPU-a"]})
    state.cell("s1", 8)
    state.cell("gone", 4)  # a server already stopped: nothing to say
    doc = json.loads(path.read_text())
    assert [r["slot"] for r in doc["running"]] == [1, 2]  # by slot, not by start
    first = doc["running"][0]
    assert first["concurrency"] == 8 and re.fullmatch(STAMP, first["cell_since"])
    assert re.fullmatch(STAMP, first["since"]) and "concurrency" not in doc["running"][1]
    state.stop("s1")
    state.stop("s1")  # twice: no error
    assert [r["label"] for r in json.loads(path.read_text())["running"]] == ["w@tp2"]
    state.close()
    doc = json.loads(path.read_text())
    assert doc["finished"] is True and doc["running"] == [] and not launcher_alive(doc)
    # for a person who cats it in another terminal: indented by 2, keys sorted
    assert path.read_text() == json.dumps(doc, indent=2, sort_keys=True)
    assert list(doc) == sorted(doc) and '\n  "finished": true,' in path.read_text()
    assert re.fullmatch(STAMP, now_utc())


def test_state_json_names_its_writers_start_so_a_reused_pid_is_not_taken_for_it(
    tmp_path: Path,
) -> None:
    """`bench status` in another terminal asks whether the launcher still runs: state.json
    carries the launcher's process start, so another process that got its pid later (here:
    PID 1, started long before this test: a parent such as `timeout` can start within the
    same clock tick as its child) never reads as the launcher; and a state written
    before any pool is known has an empty pool, not null."""
    path = tmp_path / STATE
    LiveState(path, "tag").start("s1", {"label": "a@tp1", "slot": 1, "gpus": []})
    doc = json.loads(path.read_text())
    assert doc["pid_started"] == psutil.Process().create_time() and doc["pool"] == {}
    assert launcher_alive(doc)
    assert psutil.Process(1).create_time() != doc["pid_started"]
    assert not launcher_alive({**doc, "pid": 1})  # alive, but not the launcher


def test_state_times_are_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")  # UTC+05:30 all year
    time.tzset()
    try:
        stamp = datetime.datetime.strptime(now_utc(), "%Y-%m-%dT%H:%M:%SZ")
        now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
        assert abs((now - stamp).total_seconds()) < 3600  # the zone's 5.5 h would show
    finally:
        monkeypatch.undo()
        time.tzset()


def test_a_launcher_counts_as_alive_only_while_its_very_process_runs() -> None:
    mine = {"pid": os.getpid()}
    assert launcher_alive(mine)
    started = psutil.Process().create_time()
    assert launcher_alive({"pid": os.getpid(), "pid_started": started})
    assert not launcher_alive({"pid": os.getpid(), "pid_started": started + 1})  # pid reused
    assert not launcher_alive({"pid": str(os.getpid())}) and not launcher_alive({})
    assert not launcher_alive({"pid": os.getpid(), "finished": True})
    assert not launcher_alive({"pid": 2**22 + 12345})  # no such process


# --- a measured cell's status -----------------------------------------------------------


def _measurement(completed: int, errors: dict[str, int], **extra: Any) -> dict[str, Any]:
    return {"num_prompts": completed + sum(errors.values()), "completed": completed,
            "errors": errors, "metrics": {"total_output_tokens": 100 * completed}, **extra}  # fmt: skip


def test_a_clean_cell_is_ok_with_no_reason() -> None:
    out = cell_outcome(_measurement(10, {}), Limits())
    assert out == {"status": "ok", "reason": "", "verdict": {
        "status": "ok", "reason": "", "requests": 10, "failed": 0, "errors": {},
        "first_error": None}}  # fmt: skip


def test_a_cell_whose_requests_failed_is_failed_with_why() -> None:
    out = cell_outcome(_measurement(0, {"http_500": 4}), Limits())
    assert out["status"] == "failed" and out["reason"] == "all 4 requests failed (http_500 4)"
    assert set(out) == {"status", "reason", "verdict"}
    tolerated = cell_outcome(_measurement(99, {"timeout": 1}), Limits(max_failed_fraction=0.05))
    assert (
        tolerated["status"] == "ok"
        and tolerated["reason"] == "1 of 100 requests failed (timeout 1)"
    )


def test_the_client_bound_and_suspect_flags_are_noted_beside_the_status() -> None:
    m = _measurement(10, {}, client={"audit": {"rate_ratio": 0.5, "achieved_rate": 5.0, "target_rate": 10.0}},
                     telemetry={"xids": [{"xid": 79, "gpu": 0, "t": 1.5}]})  # fmt: skip
    out = cell_outcome(m, Limits())
    assert out["status"] == "ok"
    assert out["client_bound"] == "sent 5 req/s, 0.50 of the schedule's rate"
    assert out["suspect"] == "Xid 79 on GPU 0 at 1.5 s during the cell"
    assert out["reason"] == ("client-bound: sent 5 req/s, 0.50 of the schedule's rate; "
                             "suspect: Xid 79 on GPU 0 at 1.5 s during the cell")  # fmt: skip
    failed = cell_outcome(_measurement(0, {"reset": 2}, telemetry={"xids": [13]}), Limits())
    assert failed["reason"] == "all 2 requests failed (reset 2); suspect: Xid 13 during the cell"
    assert "client_bound" not in failed


def test_a_servers_usage_overclaim_is_named_after_the_tolerated_failures() -> None:
    """Issue 45.1: a server claiming more tokens than it streamed is named in the reason."""
    m = _measurement(99, {"timeout": 1})
    m["metrics"].update(usage_overclaims=2, usage_overclaimed_tokens=14)
    out = cell_outcome(m, Limits(max_failed_fraction=0.05))
    assert out["status"] == "ok" and out["reason"] == (
        "1 of 100 requests failed (timeout 1); the server's usage claims 14 output tokens more"
        " than it streamed in 2 replies (the numbers count the tokens that arrived)"
    )
    alone = _measurement(10, {})
    alone["metrics"]["usage_overclaims"] = 1
    assert cell_outcome(alone, Limits())["reason"].startswith("the server's usage claims")


# --- Ctrl-C never lost ------------------------------------------------------------------


def _asked() -> BaseException | None:
    """Return the KeyboardInterrupt raise_if_interrupted() raised, or None: a stray one is
    then a test failure, not pytest's own "interrupted by the user" stop."""
    try:
        interrupts.raise_if_interrupted()
    except KeyboardInterrupt as exc:
        return exc
    return None


def test_nothing_is_raised_in_the_main_thread_when_no_signal_came() -> None:
    interrupts.reset()
    assert threading.current_thread() is threading.main_thread()
    assert _asked() is None  # a campaign never stops for a Ctrl-C nobody pressed
    with interrupts.catching():
        assert _asked() is None


def test_a_signal_is_recorded_and_raised_again_where_the_launcher_asks() -> None:
    with interrupts.catching():
        assert _asked() is None  # nothing happened: returns
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)
            while True:  # the handler runs between two bytecodes of this loop
                pass
        # its KeyboardInterrupt was "dropped": asked again, it is raised again
        with pytest.raises(KeyboardInterrupt, match=r"^signal 15$"):
            interrupts.raise_if_interrupted()
        with pytest.raises(KeyboardInterrupt, match=r"^signal 15$"):
            interrupts.raise_if_interrupted()  # until a new campaign resets it
        seen: list[BaseException] = []
        worker = threading.Thread(target=lambda: seen.append(_ask()))
        worker.start()
        worker.join()
        assert seen == [None]  # a slot thread is never interrupted: signals are the main's
    interrupts.reset()
    assert _asked() is None


def _ask() -> None:
    interrupts.raise_if_interrupted()


def test_a_recorded_interrupt_without_its_number_is_a_sigint() -> None:
    interrupts.reset()
    interrupts._INTERRUPTED.set()
    try:
        with pytest.raises(KeyboardInterrupt, match=f"^signal {signal.SIGINT}$"):
            interrupts.raise_if_interrupted()
    finally:
        interrupts.reset()


def test_catching_takes_int_term_hup_and_puts_everything_back() -> None:
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.getsignal(s) for s in signals}
    hook = sys.unraisablehook
    interrupts._LAST[:] = [1]
    interrupts._INTERRUPTED.set()
    with interrupts.catching():
        assert not interrupts._INTERRUPTED.is_set() and interrupts._LAST == []  # a new campaign
        assert all(signal.getsignal(s) is interrupts.handler for s in signals)
        assert sys.unraisablehook is not hook
    assert {s: signal.getsignal(s) for s in signals} == before and sys.unraisablehook is hook
    with pytest.raises(KeyboardInterrupt, match=r"^signal 1$"):
        interrupts.handler(1, None)
    assert interrupts._LAST == [1]
    interrupts.reset()


def test_only_a_dropped_keyboard_interrupt_is_kept_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", shown.append)

    def report(exc: BaseException) -> Any:
        args = type("Args", (), {})()
        args.exc_type, args.exc_value, args.exc_traceback = type(exc), exc, None
        args.err_msg, args.object = "Exception ignored in", None
        return args

    with interrupts.catching():
        sys.unraisablehook(report(KeyboardInterrupt("signal 2")))
        sys.unraisablehook(report(ValueError("a real bug")))
        empty = report(ValueError("x"))
        empty.exc_type = None
        sys.unraisablehook(empty)
    assert [type(a.exc_value).__name__ for a in shown] == ["ValueError", "ValueError"]


def test_a_signal_while_deferred_is_recorded_not_raised_until_asked() -> None:
    """47.3: while the launcher forks a server, a Ctrl-C is recorded only (raised inside
    Popen it lost the started server); asked after, it is raised."""
    interrupts.reset()
    try:
        assert not interrupts.pending()
        with interrupts.deferred():
            with interrupts.deferred():  # nested: still deferred after the inner one
                pass
            assert interrupts.handler(signal.SIGINT, None) is None
            assert interrupts.pending()
        with pytest.raises(KeyboardInterrupt, match=f"^signal {signal.SIGINT}$"):
            interrupts.raise_if_interrupted()
        with pytest.raises(KeyboardInterrupt, match=f"^signal {signal.SIGTERM}$"):
            interrupts.handler(signal.SIGTERM, None)  # outside: raised at once
        assert interrupts._DEFER == []
    finally:
        interrupts.reset()
    assert not interrupts.pending()


def test_deferring_in_a_slot_thread_leaves_the_main_thread_raising() -> None:
    """A slot thread's deferral changes nothing: it records no deferral, so the main
    thread's handler still raises."""
    seen: list[list[bool]] = []

    def slot() -> None:
        with interrupts.deferred():
            seen.append(list(interrupts._DEFER))

    worker = threading.Thread(target=slot)
    worker.start()
    worker.join()
    try:
        assert seen == [[]]
        with pytest.raises(KeyboardInterrupt):
            interrupts.handler(signal.SIGINT, None)
    finally:
        interrupts.reset()
