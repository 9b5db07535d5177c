"""How long a fleet check takes for N containers: sequential vs the parallel runner.

In the lab (needs root, lxc, busybox-static, openssh-server): N real LXC containers on one
pure-cgroup2 host reached through a real sshd on 127.0.0.1 (half allow the stand-in GPU,
half deny it). For N = 1, 5, 10, 20 it times, interleaved and repeated (these machines
are noisy), the whole ``gpudoctor check --inventory`` work (connect, host checks, the
catalogue inside every CT and its config check on the host) with:

  sequential   --parallel 1
  parallel     --parallel 8 (default: at most 4 per node, MaxSessions-safe)
  parallel/8   --parallel 8 with 8 per node (one big node)

and prints medians plus the ratios: speed-up over sequential, and T(N)/T(1) of the
parallel runner (goal: T(20) <= 2 x T(1) on a 2-core machine).

Usage: sudo .venv/bin/python benchmarks/fleet_check.py [--runs N] [--sizes 1,5,10,20]
       [--only device,ct] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.fleet.execute import FleetSettings, check_fleet
from gpudoctor.fleet.inventory import CtSpec, Inventory, NodeSpec

SETTLE_S = 1.0
MODES = {
    "sequential": {"parallel": 1, "per_node": 1},
    "parallel": {"parallel": 8, "per_node": 4},
    "parallel/8": {"parallel": 8, "per_node": 8},
}
Key = tuple[str, int]


def cpu_seconds(pid: int) -> float:
    """Return the CPU seconds of process ``pid`` and its reaped descendants (utime + stime +
    cutime + cstime of ``/proc/PID/stat``): for the lab sshd, every session it served."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def run_once(
    node: NodeSpec, names: list[str], mode: str, options: CheckOptions, sshd_pid: int
) -> tuple[float, int, float, float]:
    """Return (wall s, CTs checked, client CPU s, node-side CPU s) of one fleet check. The
    node side is everything the sshd ran (sessions, lxc-attach, the agents in the CTs)."""
    inventory = Inventory((node,), tuple(CtSpec(node.name, n) for n in names), "bench")
    settings = FleetSettings(options=options, target_timeout_s=120, **MODES[mode])
    node_before, mine_before = cpu_seconds(sshd_pid), os.times()
    started = time.perf_counter()
    result = check_fleet(inventory, settings)
    elapsed = time.perf_counter() - started
    mine = os.times()
    time.sleep(SETTLE_S)  # the connection closes in the background: let sshd reap it
    node_cpu = cpu_seconds(sshd_pid) - node_before
    client_cpu = mine.user + mine.system - mine_before.user - mine_before.system
    return elapsed, sum(1 for c in result.cts if c.state == "checked"), client_cpu, node_cpu


def measure(sizes: list[int], runs: int, only: tuple[str, ...]) -> tuple[dict, dict]:
    """Build the lab, run every (mode, N) ``runs`` times interleaved; return
    ({(mode, N): [wall s]}, {(mode, N): [(client CPU s, node CPU s)]})."""
    from tests.lab.lxc import Lab
    from tests.lab.sshd import LabSSHD

    lab = Lab().setup()
    sshd = LabSSHD(lab.root / "sshd", lab.namespace).start()
    try:
        devices = {"/dev/fakegpu": str(lab.fake_gpu)}
        rule = [f"c {lab.fake_gpu_major}:* rwm"]
        made = [
            lab.container(devices=devices, allow=rule if i % 2 else []) for i in range(max(sizes))
        ]
        node = NodeSpec("lab", sshd.spec, flavor="lxc", known_hosts=str(sshd.known_hosts),
                        identity_file=str(sshd.client_key))  # fmt: skip
        options = CheckOptions(devices=(DeviceRequest("/dev/fakegpu", "misc"),), only=only)
        names = [c.name for c in made]
        assert sshd.proc is not None
        pid = sshd.proc.pid
        run_once(node, names[:1], "parallel", options, pid)  # warm the page cache
        walls: dict[Key, list[float]] = {}
        cpu: dict[Key, list[tuple[float, float]]] = {}
        for _ in range(runs):
            for size in sizes:
                for mode in MODES:
                    wall, checked, client, node_side = run_once(
                        node, names[:size], mode, options, pid
                    )
                    if checked != size:
                        sys.exit(f"{mode} N={size}: only {checked} CT(s) checked")
                    walls.setdefault((mode, size), []).append(wall)
                    cpu.setdefault((mode, size), []).append((client, node_side))
        return walls, cpu
    finally:
        sshd.stop()
        lab.teardown()


def report(sizes: list[int], walls: dict, cpu: dict, runs: int, only: str) -> float:
    """Print the tables; return T(biggest)/T(smallest) of the parallel runner."""
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"fleet check, {os.cpu_count()} CPU(s), {runs} run(s) each, median seconds; "
          f"checks: {only or 'whole catalogue'}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'N':>3} {'sequential':>11} {'parallel':>9} {'par/8':>7} {'speed-up':>9} "
          f"{'T(N)/T(1)':>10} {'par/8 T(N)/T(1)':>16}")  # fmt: skip
    for size in sizes:
        seq, par, par8 = (med[(m, size)] for m in MODES)
        print(f"{size:>3} {seq:>11.2f} {par:>9.2f} {par8:>7.2f} {seq / par:>8.1f}x "
              f"{par / med[('parallel', sizes[0])]:>9.2f}x "
              f"{par8 / med[('parallel/8', sizes[0])]:>15.2f}x")  # fmt: skip
    print("CPU seconds, parallel runner (median): N, client, node side, per CT, CPU-bound floor")
    for size in sizes:
        client = statistics.median(c for c, _ in cpu[("parallel", size)])
        node_side = statistics.median(n for _, n in cpu[("parallel", size)])
        floor = (client + node_side) / (os.cpu_count() or 1)
        print(f"{size:>3} {client:>7.2f} {node_side:>7.2f} {(client + node_side) / size:>7.3f} "
              f"{floor:>7.2f}")  # fmt: skip
    biggest = sizes[-1]
    ratio = med[("parallel", biggest)] / med[("parallel", sizes[0])]
    print(f"goal: T({biggest}) <= 2 x T({sizes[0]}) with the parallel runner: {ratio:.2f}x "
          f"-> {'met' if ratio <= 2 else 'NOT met'}")  # fmt: skip
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1,5,10,20")
    parser.add_argument("--only", default="", help="check ids/families (default: all)")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root (LXC containers, mount namespaces)")
    sizes = [int(s) for s in args.sizes.split(",")]
    walls, cpu = measure(sizes, args.runs, tuple(p for p in args.only.split(",") if p))
    ratio = report(sizes, walls, cpu, args.runs, args.only)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "machine": platform.platform(), "cpus": os.cpu_count(), "runs": args.runs,
            "only": args.only, "ratio": ratio, "loadavg_1m": os.getloadavg()[0],
            "wall_s": {f"{m}/{n}": v for (m, n), v in walls.items()},
            "cpu_client_node_s": {f"{m}/{n}": v for (m, n), v in cpu.items()},
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
