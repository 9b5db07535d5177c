"""A real Slurm cluster of one node on 127.0.0.1 for lab tests: Debian's slurm-wlm.

Per run, under a temporary directory: a fresh munge key and ``munged`` on its own socket,
``slurm.conf`` (NodeName=localhost NodeAddr=127.0.0.1, CPUs=2, Gres=gpu:4, select/cons_tres,
proctrack/linuxproc, free ports, state and spool directories here) and ``gres.conf`` naming
four character devices made with mknod (the numbers of /dev/null: Slurm needs a device
file per GPU, and then hands tasks ``CUDA_VISIBLE_DEVICES`` as it does on a GPU node).
``slurmctld -D`` and ``slurmd -D`` run as child processes; the clients (sbatch, squeue,
scontrol, scancel) find the cluster through ``SLURM_CONF``. Nothing of Slurm is faked.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.signals import default_signals


class SlurmLabError(RuntimeError):
    """The cluster could not start (the reason, with the daemons' last log lines)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def missing_programs() -> list[str]:
    """Return the Slurm/munge programs this machine lacks (apt: slurm-wlm munge)."""
    names = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")
    return [n for n in names if shutil.which(n) is None and not Path(f"/usr/sbin/{n}").exists()]


class SlurmCluster:
    """munged + slurmctld + slurmd on 127.0.0.1; ``env`` points clients at it."""

    def __init__(self, root: Path, gpus: int = 4, cpus: int = 2) -> None:
        self.root = root
        self.gpus = gpus
        self.cpus = cpus
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        # munged wants every directory above its socket searchable by all; pytest's tmp is 0700
        self.sock_dir = Path(tempfile.mkdtemp(prefix="gd-munge-"))
        self.sock_dir.chmod(0o755)

    def _write_config(self) -> None:
        r = self.root
        for name in ("state", "spool", "log", "dev"):
            (r / name).mkdir(mode=0o700, parents=True, exist_ok=True)
        for i in range(self.gpus):
            dev = r / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o600 | 0o020000, os.makedev(1, 3))  # S_IFCHR, like /dev/null
        conf = f"""\
ClusterName=gdlab
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.sock_dir}/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=3600
KillWait=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName=lab Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        (r / "slurm.conf").write_text(conf)
        (r / "gres.conf").write_text(
            f"AutoDetect=off\nName=gpu File={r}/dev/gpu[0-{self.gpus - 1}]\n"
        )

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.root / "log" / log, "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True, preexec_fn=default_signals)  # fmt: skip
        out.close()
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 60.0) -> None:
        """Start munged, slurmctld and slurmd; return when the node is idle with its GPUs."""
        self._write_config()
        r = self.root
        (r / "munge").mkdir(mode=0o700, exist_ok=True)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(["munged", "-F", f"--key-file={key}", f"--socket={self.sock_dir}/socket",
                     f"--pid-file={r}/munge/pid", f"--log-file={r}/munge/log",
                     f"--seed-file={r}/munge/seed"], "munged.out")  # fmt: skip
        self._wait(lambda: (self.sock_dir / "socket").exists(), 15, "munged never made its socket")
        conf = str(r / "slurm.conf")
        self._spawn(["slurmctld", "-D", "-f", conf], "slurmctld.out")
        self._wait(
            lambda: self._ok(["scontrol", "ping"], "UP"), timeout_s, "slurmctld never answered"
        )
        self._spawn(["slurmd", "-D", "-N", "localhost", "-f", conf], "slurmd.out")
        self._wait(lambda: self._ok(["sinfo", "-h", "-N", "-o", "%t %G"], f"idle gpu:{self.gpus}"),
                   timeout_s, "the node never became idle with its GPUs")  # fmt: skip

    def _ok(self, argv: list[str], want: str) -> bool:
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=30)
        return proc.returncode == 0 and want in proc.stdout

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SlurmLabError(f"{what}; logs: {self.log_tail()}")
            time.sleep(0.3)

    def log_tail(self) -> str:
        """Return the daemons' last log lines (for a failure message)."""
        out = []
        for path in sorted((self.root / "log").glob("*.log")) + sorted(
            (self.root / "log").glob("*.out")
        ):
            lines = path.read_text(errors="replace").splitlines()[-4:]
            out.append(f"{path.name}: " + " | ".join(lines))
        return "; ".join(out)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=60)

    def stop(self) -> None:
        """Cancel every job and stop the daemons (slurmd, slurmctld, munged)."""
        if self.procs:
            self.run("scancel", "--user=root")
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self.procs.clear()
        shutil.rmtree(self.sock_dir, ignore_errors=True)
