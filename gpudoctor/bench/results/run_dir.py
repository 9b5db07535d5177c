"""A run directory: the plan as run, the environment, and the append-only cell records.

Layout of ``--out DIR``::

    plan.toml        the plan exactly as run
    run.json         environment (host, GPUs, driver, engine version, gpudoctor version)
    results.jsonl    one JSON line per finished cell (ok | crashed | skipped), fsync'ed
    preflight.jsonl  every preflight verdict (and the diagnosis that stopped a campaign)
    logs/            one server log per configuration
    raw/             per-request records of each cell (``<cell key>.jsonl``)
    .lock            held while a launcher works on the directory

Trust (issue 22.1): root often runs ``bench --out`` into a place others can write
(``/tmp/run1``, ``/dev/shm/...``, the boot unit). A run directory is used only when it
belongs to the caller or root and nobody else can write it (a sticky ancestor such as
/tmp is fine above it, never as the run directory itself), and it is not a symlink; its
ancestors belong to the caller or root and are sticky where others can write them
(:func:`check_run_dir`). Every file in it is opened without following a link
(``O_NOFOLLOW`` relative to the checked directory): a planted ``results.jsonl`` ->
/victim is refused, never appended to, truncated or replaced.

Exactly once per cell: a cell counts as done only when its line is in
``results.jsonl``. A line is written with one ``write()`` and fsync'ed; a torn last line
(the launcher killed mid-write) is cut off on the next open, and the cell reruns. A
corrupt line in the middle is skipped (and reported), never a reason to drop the lines
after it.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor import fsio
from gpudoctor.bench.results.launcher_state import STATE, launcher_alive

RESULTS = "results.jsonl"
PLAN = "plan.toml"
# what --no-resume moves to previous-<time>/: every file a launch writes (issue 47: servers,
# state and trace stayed, so the fresh run appended to the old servers.jsonl)
ARCHIVED = (PLAN, RESULTS, "run.json", "preflight.jsonl", "logs", "raw", "servers.jsonl",
            "gpus.jsonl", "superseded.jsonl", "state.json", "trace")  # fmt: skip


def _launcher_pid(run: Path) -> int | None:
    """Return the pid of the launcher that holds ``run`` (its state.json, while that
    process runs), or None when it cannot be told."""
    try:
        state = json.loads((read_run_file(run / STATE) or b"{}").decode("utf-8", "replace"))
    except (OSError, ValueError, RunDirError):
        return None
    if not isinstance(state, dict) or not launcher_alive(state):
        return None
    return int(state["pid"])


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (one line for the CLI)."""


@dataclass(frozen=True)
class Opened:
    """What opening a run directory found.

    Attributes:
        resumed: True when earlier results were kept.
        done: finished records by cell key.
        dropped_bytes: bytes of a torn last line that were cut off.
        corrupt_lines: line numbers of results.jsonl that were not JSON (skipped).
        archived: where earlier files were moved (``--no-resume``), or None.
        same_plan: True when the directory's plan.toml was this very plan (its records
            then hold this plan's cells, whatever form their keys have).
    """

    resumed: bool
    done: dict[str, dict[str, Any]]
    dropped_bytes: int = 0
    archived: str | None = None
    corrupt_lines: tuple[int, ...] = ()
    same_plan: bool = False


def check_run_dir(path: Path, option: str = "--out", create: bool = False) -> bool:
    """Check that nobody but the caller (or root) controls the run directory ``path``;
    return True when it exists (``create``: it is made first, ``mkdir -p -m 0755``).

    Refused with one RunDirError line naming the path, its owner or mode and the fix: an
    ancestor another user owns or can write without the sticky bit; a run directory that
    is a symlink, not a directory, another user's, or writable by group or others."""
    path = Path(os.path.abspath(path))
    fix = f"choose another {option} (a directory of your own) or remove it (rm -rf --one-file-system {path})"
    try:
        fsio.check_ancestors(path.parent, option)
        if create:  # each level made on the one held before it, and judged (issue 46.4)
            parent = fsio.make_missing_dirs(path.parent, option=option)
            try:
                fsio.make_dirs(parent, path.name)  # another user's directory: refused below
            except fsio.FsioError as exc:
                if exc.errno != 20:  # ENOTDIR: a link or a file there, named below
                    raise
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode):
            raise RunDirError(
                f"{path} ({option}) is a symlink (to {os.readlink(path)}): gpudoctor never"
                f" follows one there; give the real directory ({os.path.realpath(path)})"
            )
        if not stat.S_ISDIR(st.st_mode):
            raise RunDirError(f"{path} ({option}) is not a directory; choose another {option}")
        fsio.judge_owner(path, st, f"the {option} run directory", fix)
    except fsio.FsioError as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        raise RunDirError(f"cannot use {option} {path}: {exc.strerror or exc}") from None
    return True


def read_run_file(path: Path, limit: int | None = None) -> bytes | None:
    """Return the bytes of a run file (``cat DIR/NAME``), None when it does not exist; never
    through a symlink (RunDirError, one line, for a link, FIFO or device there, or for a
    file over ``limit`` bytes: nothing more than ``limit`` + 1 bytes is read)."""
    try:
        data = fsio.read_regular(path, limit=None if limit is None else limit + 1)
    except FileNotFoundError:
        return None
    except fsio.FsioError as exc:
        raise RunDirError(str(exc)) from None
    if limit is not None and len(data) > limit:
        raise RunDirError(
            f"{path} is larger than {limit / (1 << 20):g} MiB: not a file gpudoctor wrote; remove it (rm {path})"
        )
    return data


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file, fsync, rename, fsync dir) with
    :func:`gpudoctor.fsio.atomic_replace`, in a trusted directory and never through or
    over a symlink; raise RunDirError (one line) on a refusal."""
    try:
        fsio.atomic_replace(path, text, keep_mode=False, require_trusted_dir=True)
    except fsio.FsioError as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:  # ENOSPC, EDQUOT, EIO: name the file (never blamed on stdout)
        raise RunDirError(_write_failed(path, exc)) from None


def _write_failed(path: Path, exc: OSError) -> str:
    """Return the one line for a failed write of a run file: which file, why, what to do."""
    return (f"cannot write {path}: {exc.strerror or exc}; free space there (df -h {path.parent})"
            " or choose another --out, then run the same command again")  # fmt: skip


@dataclass(frozen=True)
class RecordScan:
    """What reading results.jsonl found.

    Attributes:
        records: the complete JSON records, in file order.
        dropped_bytes: bytes of a torn last line (no final newline).
        corrupt_lines: 1-based numbers of complete lines that were not a JSON object
            (skipped; the records after them are kept).
    """

    records: list[dict[str, Any]]
    dropped_bytes: int = 0
    corrupt_lines: tuple[int, ...] = ()


def scan_records(path: Path, repair: bool = False, limit: int | None = None) -> RecordScan:
    """Read a results file line by line: keep JSON objects, skip corrupt lines, and note a
    torn tail. With ``repair`` the torn tail (bytes after the last newline) is cut off;
    corrupt lines in the middle are left in place (never truncated: the lines after them
    are finished cells). ``limit``: refuse (RunDirError) a file over that many bytes."""
    data = read_run_file(path, limit)
    if data is None:
        return RecordScan([])
    good_end = data.rfind(b"\n") + 1
    records: list[dict[str, Any]] = []
    corrupt: list[int] = []
    for number, line in enumerate(data[:good_end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            corrupt.append(number)
    dropped = len(data) - good_end
    if dropped and repair:
        try:
            fsio.truncate_file(path, good_end, require_trusted_dir=True)
        except fsio.FsioError as exc:
            raise RunDirError(str(exc)) from None
    return RecordScan(records, dropped, tuple(corrupt))


def read_records(
    path: Path, repair: bool = False, limit: int | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Return the JSON records of a results file and the byte count of a torn tail
    (:func:`scan_records`, corrupt lines skipped; ``limit``: its size bound in bytes)."""
    scan = scan_records(path, repair, limit)
    return scan.records, scan.dropped_bytes


class RunDir:
    """An opened run directory; hold it with ``with`` (an exclusive lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    @property
    def results_path(self) -> Path:
        """Return ``DIR/results.jsonl``."""
        return self.path / RESULTS

    def log_path(self, label: str) -> Path:
        """Return the server log path of one configuration (``logs/auto@tp1.log``); ``logs/``
        is created (``mkdir``, never through a symlink: RunDirError)."""
        return self._subdir("logs") / f"{label.replace('/', '_')}.log"

    def raw_path(self, cell_key: str) -> Path:
        """Return the raw per-request record path of one cell; ``raw/`` is created
        (``mkdir``, never through a symlink: RunDirError)."""
        return self._subdir("raw") / f"{cell_key}.jsonl"

    def _subdir(self, name: str) -> Path:
        path = self.path / name
        if os.path.islink(path):
            raise RunDirError(
                f"{path} is a symlink (to {os.readlink(path)}): gpudoctor never writes through"
                f" one in a run directory; remove it (rm {path}) and run again"
            )
        try:
            return fsio.make_dirs(self.path, name)
        except OSError as exc:
            raise RunDirError(f"{exc}; remove it (rm {path}) and run again") from None

    def __enter__(self) -> RunDir:
        check_run_dir(self.path, create=True)
        try:
            fd = fsio.open_lock(self.path / ".lock", require_trusted_dir=True)
        except fsio.FsioError as exc:
            raise RunDirError(str(exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            pid = _launcher_pid(self.path)
            who = f" (launcher pid {pid})" if pid else ""
            stop = f"kill -INT {pid}" if pid else "Ctrl-C in its terminal"
            raise RunDirError(  # issue 47: said only "run it again with --debug"
                f"{self.path}: another gpudoctor bench is running on this directory{who}; follow"
                f" it with: gpudoctor bench status {self.path}, or stop it first ({stop})"
            ) from exc
        self._lock_fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def open(self, plan_text: str, resume: bool | None) -> Opened:
        """Prepare the directory for ``plan_text`` and return the finished records.

        ``resume=None`` resumes when the directory holds the same plan and refuses a
        different one; ``True`` resumes whatever the plan (cells match by key);
        ``False`` moves earlier files to ``previous-<time>/`` and starts afresh."""
        plan_file = self.path / PLAN
        old_bytes = read_run_file(plan_file)
        old_plan = None if old_bytes is None else old_bytes.decode("utf-8", "replace")
        has_results = os.path.lexists(self.results_path)
        archived = None
        if old_plan is not None or has_results:
            if resume is False:
                archived = self._archive()
            elif resume is None and old_plan is not None and old_plan != plan_text:
                raise RunDirError(
                    f"{self.path} holds a different plan: pass --resume to reuse its finished "
                    "cells (matched by key), --no-resume to archive it, or another --out"
                )
        scan = scan_records(self.results_path, repair=True)
        done = {str(r["key"]): r for r in scan.records if "key" in r}
        if old_plan is not None and old_plan != plan_text and archived is None:
            write_atomic(self.path / time.strftime("plan-before-%Y%m%dT%H%M%S.toml"), old_plan)
        if old_plan != plan_text or archived is not None:  # archived: plan.toml moved too
            write_atomic(plan_file, plan_text)
        return Opened(resumed=bool(done), done=done, dropped_bytes=scan.dropped_bytes,
                      archived=archived, corrupt_lines=scan.corrupt_lines,
                      same_plan=old_plan == plan_text and archived is None)  # fmt: skip

    def _archive(self) -> str:
        """Move every file of the earlier launches (:data:`ARCHIVED`) into a new
        ``previous-<time>/``; return its path."""
        dest = self.path / time.strftime("previous-%Y%m%dT%H%M%S")
        dest.mkdir()
        for name in ARCHIVED:
            if os.path.lexists(self.path / name):  # a rename: moves a link, never follows it
                os.rename(self.path / name, dest / name)
        fsio.fsync_dir(self.path)
        return str(dest)

    def drop_records(self, keys: set[str]) -> int:
        """Remove the records of ``keys`` from results.jsonl (``--retry-crashed``), moving
        them to ``superseded.jsonl`` first so nothing is lost; return how many."""
        records, _ = read_records(self.results_path, repair=True)
        gone = [r for r in records if r.get("key") in keys]
        if not gone:
            return 0
        self._append_lines(self.path / "superseded.jsonl", gone)
        kept = "".join(
            json.dumps(r, sort_keys=True) + "\n" for r in records if r.get("key") not in keys
        )
        write_atomic(self.results_path, kept)
        return len(gone)

    def _append_lines(self, path: Path, records: list[dict[str, Any]]) -> None:
        blob = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records).encode()
        try:
            fsio.durable_append(path, blob, require_trusted_dir=True)
        except fsio.FsioError as exc:
            raise RunDirError(str(exc)) from None
        except OSError as exc:
            raise RunDirError(_write_failed(path, exc)) from None

    def append(self, record: dict[str, Any]) -> None:
        """Append one cell record to results.jsonl and fsync it (``echo JSON >> results.jsonl``)."""
        self._append_lines(self.results_path, [record])

    def append_preflight(self, record: dict[str, Any]) -> None:
        """Append one preflight verdict to preflight.jsonl."""
        self._append_lines(self.path / "preflight.jsonl", [record])

    def append_server(self, record: dict[str, Any]) -> None:
        """Append one stopped server's facts to servers.jsonl."""
        self._append_lines(self.path / "servers.jsonl", [record])

    def append_gpu_out(self, record: dict[str, Any]) -> None:
        """Append one GPU that failed its check (and left the pool) to gpus.jsonl."""
        self._append_lines(self.path / "gpus.jsonl", [record])

    def write_run_json(self, facts: dict[str, Any]) -> None:
        """Write run.json (the environment of this launch; earlier launches kept in ``launches``)."""
        path = self.path / "run.json"
        launches: list[Any] = []
        old_bytes = read_run_file(path)
        if old_bytes is not None:
            try:
                old = json.loads(old_bytes)
                launches = old.get("launches", [])
                if old.get("tag") != facts.get("tag"):  # an earlier launch: keep its facts
                    launches = [*launches, {k: v for k, v in old.items() if k != "launches"}]
            except ValueError:
                launches = []
        write_atomic(
            path,
            json.dumps(
                {**facts, "launches": launches[-20:]}, indent=2, sort_keys=True, default=str
            ),
        )


def environment_facts(engine: str, engine_version: str | None, arch: str) -> dict[str, Any]:
    """Return the environment for run.json: host, OS, Python, GPUs and driver (via NVML),
    engine + version, gpudoctor version (``nvidia-smi -q`` + ``uname -a`` in one dict)."""
    from gpudoctor import __version__

    facts: dict[str, Any] = {
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "gpudoctor_version": __version__,
        "engine": engine,
        "engine_version": engine_version,
        "gpu_arch": arch,
        "gpus": [],
        "driver": None,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 min: others' load
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            facts["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                facts["gpus"].append(
                    {
                        "index": i,
                        "name": _text(pynvml.nvmlDeviceGetName(h)),
                        "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
                        "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                        "compute_capability": f"{major}.{minor}",
                    }
                )
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no GPU: recorded, not fatal
        facts["gpu_error"] = str(exc) or type(exc).__name__
    return facts


def _cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str | None:
    """Return the CPU's model name (``grep -m1 'model name' /proc/cpuinfo``), else
    ``platform.processor()``, None if unknown."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
