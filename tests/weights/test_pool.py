"""Worker pools that Ctrl-C stops at once: the workers leave SIGINT/SIGTERM to the main
thread, the first error is raised without waiting for the other jobs, the jobs not started
are cancelled and told to stop, and after Ctrl-C the pool is not joined.

Real threads; every wait is on an event (a job started, a job released), never a sleep.
"""

from __future__ import annotations

import signal
import threading

import pytest

from gpudoctor.weights import pool as pools

TIMEOUT_S = 30  # a safety net only: every wait ends on an event long before


def test_workers_block_sigint_and_sigterm_and_carry_the_pool_name() -> None:
    pool = pools.new_pool(2, "copy")
    try:
        seen = pool.submit(
            lambda: (threading.current_thread().name, signal.pthread_sigmask(signal.SIG_BLOCK, []))
        ).result(TIMEOUT_S)
    finally:
        pool.shutdown()
    name, mask = seen
    assert name.startswith("copy_")
    assert {signal.SIGINT, signal.SIGTERM} <= set(mask)
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # main: untouched


def test_the_pool_runs_as_many_jobs_at_once_as_it_has_workers() -> None:
    both_in = threading.Barrier(3)  # two workers and this thread
    pool = pools.new_pool(2, "x")
    try:
        futures = [pool.submit(both_in.wait, TIMEOUT_S) for _ in range(2)]
        both_in.wait(TIMEOUT_S)  # raises BrokenBarrierError if only one worker ran
        pools.wait_all(futures)
    finally:
        pool.shutdown()
    assert all(f.done() and f.exception() is None for f in futures)


def test_wait_all_returns_once_every_job_is_done() -> None:
    results: list[int] = []
    pool = pools.new_pool(3, "x")
    try:
        futures = [pool.submit(results.append, n) for n in range(5)]
        pools.wait_all(futures)
        assert all(f.done() for f in futures)
    finally:
        pool.shutdown()
    assert sorted(results) == [0, 1, 2, 3, 4]
    pools.wait_all([])  # nothing to wait for: returns


def test_the_first_error_is_raised_at_once_and_the_rest_told_to_stop() -> None:
    release = threading.Event()
    started = threading.Event()
    stop = threading.Event()

    def slow() -> None:
        started.set()
        release.wait(TIMEOUT_S)

    def broken() -> None:
        started.wait(TIMEOUT_S)
        raise OSError("disk on fire")

    pool = pools.new_pool(2, "x")
    try:
        futures = [pool.submit(slow), pool.submit(broken), pool.submit(slow)]
        with pytest.raises(OSError, match="disk on fire"):
            pools.wait_all(futures, stop)
        assert not futures[0].done()  # raised while a job was still running
        assert stop.is_set()
        assert futures[2].cancelled()  # never started: cancelled
    finally:
        release.set()
        pool.shutdown()


def test_an_error_without_a_stop_event_is_still_raised() -> None:
    pool = pools.new_pool(1, "x")
    try:
        future = pool.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            pools.wait_all([future], None)
    finally:
        pool.shutdown()


def test_shutdown_after_success_or_an_error_joins_the_workers() -> None:
    for error in (None, OSError("x")):
        release = threading.Event()
        pool = pools.new_pool(1, "joined")
        running = pool.submit(release.wait, TIMEOUT_S)
        queued = pool.submit(lambda: None)
        queued.add_done_callback(lambda _, r=release: r.set())  # once shutdown drops it
        pools.shutdown(pool, error)
        assert queued.cancelled()  # the jobs not started are dropped
        assert running.done()  # and the running one was waited for


def test_shutdown_after_ctrl_c_returns_without_joining() -> None:
    release = threading.Event()
    started = threading.Event()
    pool = pools.new_pool(1, "left")

    def job() -> None:
        started.set()
        release.wait(TIMEOUT_S)

    running = pool.submit(job)
    started.wait(TIMEOUT_S)
    try:
        pools.shutdown(pool, KeyboardInterrupt())  # must return while the job still runs
        assert not running.done()
    finally:
        release.set()
        running.result(TIMEOUT_S)
