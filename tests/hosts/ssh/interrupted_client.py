"""A gpudoctor client interrupted while a remote command runs: run by
tests/hosts/ssh/test_host_deadlines.py as a process of its own, as ``python
interrupted_client.py SPEC KEY KNOWN_HOSTS MARK``.

Its main thread runs ``sleep 600`` over SSH (``SSHHost.run``); once the remote command has
touched MARK and run() has started its threads, a watcher sends SIGINT to the main thread
(Ctrl-C). The client prints ``interrupted`` and returns from main WITHOUT closing the
host: the interpreter must then exit at once, no thread of run() keeping it waiting for
the remote command.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from gpudoctor.hosts.ssh.host import SSHHost


def interrupt_when_running(mark: Path, threads_before: int) -> None:
    """Send SIGINT to the main thread once ``mark`` exists and run()'s two threads (the
    stdout reader and the stderr drain) are up; give up after 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if mark.exists() and threading.active_count() >= threads_before + 2:
            break
        time.sleep(0.01)
    main = threading.main_thread().ident
    assert main is not None  # the main thread has started: it started this one
    signal.pthread_kill(main, signal.SIGINT)


def main() -> None:
    spec, key, known, mark = sys.argv[1:5]
    host = SSHHost(spec, key_filename=key, known_hosts=known, ssh_config=None,
                   system_known_hosts=False, connect_timeout=30)  # fmt: skip
    host.connect()
    watcher = threading.Thread(
        target=interrupt_when_running,
        args=(Path(mark), threading.active_count() + 1),  # + the watcher itself
        daemon=True,
    )
    watcher.start()
    try:
        host.run(["sh", "-c", f"touch {shlex.quote(mark)}; exec sleep 600"], timeout=600)
    except KeyboardInterrupt:
        print("interrupted", flush=True)


if __name__ == "__main__":
    main()
