"""Worker pools that Ctrl-C stops at once (copy, ranged download, small downloads).

A signal sent to the process may be taken by any thread that does not block it; a
worker in ``sendfile`` or ``recv`` would take SIGINT and the main thread, blocked in
``wait``, would not see it until every job was done. So the workers block SIGINT and
SIGTERM (:func:`block_signals`, the pool's initializer), the main thread waits in short
slices (:func:`wait_all`), and on Ctrl-C the pool is left without joining its threads
(:func:`shutdown`): ``weights ensure`` then exits 130 while they are still running,
and every file they had not finished is a temp file the next run deletes.
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

POLL_S = 0.2
_BLOCKED = {signal.SIGINT, signal.SIGTERM}


def block_signals() -> None:
    """Block SIGINT and SIGTERM in the calling (worker) thread; return None."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED)


def new_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """Return a pool of ``workers`` threads named ``name-N`` that leave signals to the
    main thread."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=block_signals)


def wait_all(futures: list[Future], stop: threading.Event | None = None) -> None:
    """Return once every future is done; raise the first one's error at once.

    Waits in slices of ``POLL_S`` so a signal handler runs between two. On any exception
    (Ctrl-C's KeyboardInterrupt included) sets ``stop`` (the jobs check it between two
    steps) and cancels the futures not started before re-raising.
    """
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_EXCEPTION)
            for future in done:
                error = future.exception()
                if error is not None:
                    raise error
    except BaseException:
        if stop is not None:
            stop.set()
        for other in futures:
            other.cancel()
        raise


def shutdown(pool: ThreadPoolExecutor, error: BaseException | None) -> None:
    """End ``pool``: join its threads after success or an ordinary error (they stop at
    their next step), but not after Ctrl-C (``error`` not an Exception); return None."""
    pool.shutdown(wait=error is None or isinstance(error, Exception), cancel_futures=True)
