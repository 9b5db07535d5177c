"""The gpudoctor agent: a self-contained, stdlib-only probe served over stdin/stdout.

This file is SENT to a remote host or a container and run there with ``python3 -I``
(nothing of gpudoctor needs to be installed on the far side); see :data:`BOOTSTRAP`.
It must therefore import nothing but the standard library and stay compatible with
Python 3.6+ (old containers).

Protocol: line-delimited JSON on stdin/stdout.

* On start the agent writes ``{"hello": "gpudoctor-agent", "version": 1, ...}``.
* Requests: ``{"id": N, "op": OP, "args": {...}}``; each is served in its own thread,
  so a slow ``run`` does not block a ``stat``.
* Replies: ``{"id": N, "ok": true, "result": ...}``; an OSError travels as
  ``{"id": N, "ok": false, "errno": E, "strerror": S, "filename": P}``; any other
  failure as ``{"id": N, "ok": false, "error": TEXT}``.
* Ops (each mirrors :class:`gpudoctor.hosts.local.LocalHost`): ``read_text(path,
  limit)``, ``read_bytes(path, length, offset)`` (base64), ``stat(path)`` (symlinks
  followed), ``try_open(path, write)``, ``list_dir(path)``, ``disk_usage(path)``,
  ``run(argv, timeout, input)``, ``ping()``.

EOF on stdin ends the agent.
"""

import base64
import contextlib
import json
import os
import signal
import stat as stat_mod
import subprocess
import sys
import threading
import time

PROTOCOL_VERSION = 1

# What the client runs on the far side: read the agent's length-prefixed source from
# stdin, then execute it; the rest of stdin is the request stream.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    "exec(compile(b.read(n),'gpudoctor-agent','exec'))"
)

_KINDS = (
    (stat_mod.S_ISCHR, "char"),
    (stat_mod.S_ISBLK, "block"),
    (stat_mod.S_ISDIR, "dir"),
    (stat_mod.S_ISREG, "file"),
    (stat_mod.S_ISLNK, "link"),
    (stat_mod.S_ISFIFO, "fifo"),
    (stat_mod.S_ISSOCK, "socket"),
)


def op_read_text(path, limit=1 << 20):
    """Return at most ``limit`` bytes of the file, decoded as UTF-8 (``cat PATH``). A FIFO or
    socket is refused (OSError), never waited on: its open is non-blocking and checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat_mod.S_ISFIFO(mode) or stat_mod.S_ISSOCK(mode):
            raise OSError(22, f"{file_kind(mode)}, not a file: refusing to read it", path)
        os.set_blocking(fd, True)
        return fh.read(limit).decode("utf-8", "replace")


def op_read_bytes(path, length, offset=0):
    """Return up to ``length`` bytes from ``offset``, base64-encoded (``dd skip= count=``)."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return base64.b64encode(fh.read(length)).decode("ascii")


def file_kind(mode):
    """Return the FileStat kind of an ``st_mode``: char, block, dir, file, link,
    fifo, socket or other."""
    return next((name for test, name in _KINDS if test(mode)), "other")


def op_stat(path):
    """Return ``stat PATH`` (symlinks followed) as a dict of FileStat fields."""
    return stat_fields(path, os.stat(path))


def stat_fields(path, st):
    """Return the FileStat fields of ``path``'s ``os.stat_result`` ``st``, as a dict."""
    kind = file_kind(st.st_mode)
    rdev = st.st_rdev if kind in ("char", "block") else 0
    return {
        "path": path,
        "kind": kind,
        "mode": st.st_mode & 0o7777,
        "major": os.major(rdev),
        "minor": os.minor(rdev),
        "uid": st.st_uid,
        "gid": st.st_gid,
        "size": st.st_size,
        "mtime": st.st_mtime,
    }


def op_try_open(path, write=True):
    """Open and close ``path`` (O_RDWR or O_RDONLY, non-blocking); return the errno."""
    flags = os.O_RDWR if write else os.O_RDONLY
    name = "O_RDWR" if write else "O_RDONLY"
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        return {"path": path, "flags": name, "errno": exc.errno or -1}
    os.close(fd)
    return {"path": path, "flags": name, "errno": 0}


def op_list_dir(path):
    """Return the sorted entry names of a directory (``ls -A PATH``)."""
    return sorted(os.listdir(path))


def op_disk_usage(path):
    """Return total/used/free bytes of the filesystem holding ``path`` (``df -B1``)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return {"total": total, "used": used, "free": free}


MAX_OUTPUT = 16 << 20  # bytes of a command's stdout (and of its stderr) kept; the rest dropped


def _drain(pipe, keep):
    """Read ``pipe`` to EOF, keeping at most MAX_OUTPUT bytes in the list ``keep``."""
    size = 0
    for chunk in iter(
        lambda: pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536), b""
    ):
        if size < MAX_OUTPUT:
            keep.append(chunk[: MAX_OUTPUT - size])
            size += len(keep[-1])
    pipe.close()


def _feed(pipe, data):
    """Write ``data`` to ``pipe`` and close it (in a thread: a child that does not read
    must not block the deadline)."""
    with contextlib.suppress(OSError):
        pipe.write(data)
    with contextlib.suppress(OSError):
        pipe.close()


def op_run(argv, timeout=30.0, input=None):
    """Run ``argv`` in its own session; SIGKILL its process group at ``timeout`` s. At most
    MAX_OUTPUT bytes of stdout and of stderr are kept (a flood cannot exhaust memory)."""
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return {
            "argv": list(argv),
            "returncode": 127,
            "stdout": "",
            "stderr": "{}: {}".format(argv[0] if argv else "", exc.strerror),
            "timed_out": False,
            "duration_s": 0.0,
        }
    out, err = [], []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    if input is not None:
        threading.Thread(target=_feed, args=(proc.stdin, input.encode()), daemon=True).start()
    timed_out = False
    _RUNNING.add(proc)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out = True
    finally:
        _RUNNING.discard(proc)
    for reader in readers:
        # A grandchild that escaped the group may hold the pipes open: do not wait forever.
        reader.join(5.0 if not timed_out else 1.0)
    return {
        "argv": list(argv),
        "returncode": proc.returncode,
        "stdout": b"".join(out).decode("utf-8", "replace"),
        "stderr": b"".join(err).decode("utf-8", "replace"),
        "timed_out": timed_out,
        "duration_s": time.monotonic() - started,
    }


_RUNNING = set()  # Popen objects of commands in flight, killed when the client leaves


def kill_running():
    """SIGKILL the process group of every command still running (client went away)."""
    for proc in list(_RUNNING):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)


def op_ping():
    """Return the agent's pid and Python version (a liveness probe)."""
    return {"pid": os.getpid(), "python": sys.version.split()[0]}


OPS = {
    "read_text": op_read_text,
    "read_bytes": op_read_bytes,
    "stat": op_stat,
    "try_open": op_try_open,
    "list_dir": op_list_dir,
    "disk_usage": op_disk_usage,
    "run": op_run,
    "ping": op_ping,
}


def handle(request):
    """Return the reply dict for one decoded request dict (never raises)."""
    req_id = request.get("id")
    try:
        func = OPS[request["op"]]
        return {"id": req_id, "ok": True, "result": func(**request.get("args", {}))}
    except OSError as exc:
        return {
            "id": req_id,
            "ok": False,
            "errno": exc.errno,
            "strerror": exc.strerror,
            "filename": exc.filename,
        }
    except Exception as exc:  # an agent bug or a bad request: report, keep serving
        return {"id": req_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}


def serve(infile, outfile):
    """Serve requests from ``infile`` (binary lines) to ``outfile`` until EOF."""
    lock = threading.Lock()

    def send(message):
        data = (json.dumps(message) + "\n").encode()
        with lock:
            outfile.write(data)
            outfile.flush()

    def work(line):
        try:
            request = json.loads(line.decode("utf-8"))
        except ValueError as exc:
            send({"id": None, "ok": False, "error": f"bad request: {exc}"})
            return
        send(handle(request))

    send({"hello": "gpudoctor-agent", "version": PROTOCOL_VERSION, **op_ping()})
    for line in iter(infile.readline, b""):
        if line.strip():
            threading.Thread(target=work, args=(line,), daemon=True).start()


def main():
    """Serve on this process's stdin/stdout (the agent's entry point)."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must never corrupt the protocol stream
    serve(sys.stdin.buffer, out)
    # The client is gone: end its commands and exit now, without waiting for worker
    # threads (a daemon thread holding stdout's lock would stall interpreter shutdown).
    kill_running()
    os._exit(0)


if __name__ == "__main__":
    main()
