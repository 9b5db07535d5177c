"""How long a fleet check takes for N containers: sequential vs the parallel runner.

In the lab (needs root, lxc, busybox-static, openssh-server): N real LXC containers on one
pure-cgroup2 host reached through a real sshd on 127.0.0.1 (half allow the stand-in GPU,
half deny it). For N = 1, 5, 10, 20 it times, interleaved and repeated (these machines
are noisy), the whole ``gpudoctor check --inventory`` work (connect, host checks, the
catalogue inside every CT and its config check on the host) with:

  sequential   --parallel 1
  parallel     --parallel 8 (default: at most 4 per node, MaxSessions-safe)
  parallel/8   --parallel 8 with 8 per node (one big node)

and prints medians, T(N)/T(1) and the CPU per CT (client, node side, per extra CT). With
``--agents python,sh`` the in-CT agent is switched between runs of the same lab, so both
are measured side by side in one run (``sh`` is the default agent; ``python`` the
``python3`` agent it replaced).

Usage: sudo .venv/bin/python benchmarks/fleet_check.py [--runs N] [--sizes 1,5,10,20]
       [--only device,ct] [--agents sh@old,sh] [--modes parallel] [--json OUT]
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


def use_path(path: str) -> None:
    """Select the code path to time: ``new`` (today's) or ``old`` (issue 14.5's before: no
    prefetch of the CT's facts, every read through ``head``, paramiko's cipher order)."""
    from gpudoctor.fleet import prefetch
    from gpudoctor.hosts.agent import shell as shell_agent
    from gpudoctor.hosts.ssh import connect as ssh_connect

    new = path == "new"
    prefetch.ENABLED = shell_agent.BUILTIN_READ = ssh_connect.PREFER_AEAD = new


def measure(sizes: list[int], runs: int, only: tuple[str, ...], agents: list[str],
            modes: list[str]) -> tuple[dict, dict]:  # fmt: skip
    """Build the lab, run every (agent, mode, N) ``runs`` times interleaved; return
    ({(agent, mode, N): [wall s]}, {(agent, mode, N): [(client CPU s, node CPU s)]}).
    An agent ``sh@old`` is the sh agent on the old code path (:func:`use_path`)."""
    from gpudoctor.hosts import container
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
                for agent in agents:
                    container.DEFAULT_AGENT, _, path = agent.partition("@")
                    use_path(path or "new")
                    for mode in modes:
                        wall, checked, client, node_side = run_once(
                            node, names[:size], mode, options, pid
                        )
                        if checked != size:
                            sys.exit(f"{agent} {mode} N={size}: only {checked} CT(s) checked")
                        walls.setdefault((agent, mode, size), []).append(wall)
                        cpu.setdefault((agent, mode, size), []).append((client, node_side))
        return walls, cpu
    finally:
        sshd.stop()
        lab.teardown()


def report(sizes: list[int], walls: dict, cpu: dict, runs: int, only: str) -> float:
    """Print one table per (in-CT agent, runner mode): wall time, T(N)/T(1), CPU (client,
    node side, per CT, per EXTRA CT); return T(biggest)/T(smallest) of the first pair."""
    print(f"fleet check, {os.cpu_count()} CPU(s), {runs} run(s) each, median seconds; "
          f"checks: {only or 'whole catalogue'}; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    pairs = list(dict.fromkeys(k[:2] for k in walls))
    first = sizes[0]
    ratios = []
    for agent, mode in pairs:
        print(f"agent {agent}, {mode}:")
        print(f"{'N':>4} {'wall s':>7} {'T(N)/T(1)':>10} {'client':>7} {'node':>7} "
              f"{'CPU/CT':>7} {'CPU/extra CT':>13}")  # fmt: skip
        med = {n: statistics.median(walls[(agent, mode, n)]) for n in sizes}
        tot = {n: (statistics.median(c for c, _ in cpu[(agent, mode, n)]),
                   statistics.median(x for _, x in cpu[(agent, mode, n)])) for n in sizes}  # fmt: skip
        for n in sizes:
            client, node_side = tot[n]
            extra = (
                (client + node_side - sum(tot[first])) / (n - first) if n > first else float("nan")
            )
            print(f"{n:>4} {med[n]:>7.2f} {med[n] / med[first]:>9.2f}x {client:>7.2f} "
                  f"{node_side:>7.2f} {(client + node_side) / n:>7.3f} {extra:>13.3f}")  # fmt: skip
        ratios.append(med[sizes[-1]] / med[first])
    return ratios[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1,5,10,20")
    parser.add_argument("--only", default="", help="check ids/families (default: all)")
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--agents", default="auto",
                        help="in-CT agents to compare side by side, e.g. python,sh "
                        "(auto: python where the CT has it)")  # fmt: skip
    parser.add_argument("--modes", default=",".join(MODES), help="runner modes to time")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("the lab needs root (LXC containers, mount namespaces)")
    sizes = [int(s) for s in args.sizes.split(",")]
    walls, cpu = measure(sizes, args.runs, tuple(p for p in args.only.split(",") if p),
                         args.agents.split(","), args.modes.split(","))  # fmt: skip
    ratio = report(sizes, walls, cpu, args.runs, args.only)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "machine": platform.platform(), "cpus": os.cpu_count(), "runs": args.runs,
            "only": args.only, "ratio": ratio, "loadavg_1m": os.getloadavg()[0],
            "wall_s": {"/".join(map(str, k)): v for k, v in walls.items()},
            "cpu_client_node_s": {"/".join(map(str, k)): v for k, v in cpu.items()},
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
