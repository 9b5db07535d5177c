"""``[engine] port_range``: every server of a campaign listens inside the range a firewall
allows (issue 34 item 8); a range that cannot be used is a one-line plan error, and a range
whose ports are all taken records its cells as not run, with the reason, and quirks nothing.

Real ``gpudoctor bench`` processes against the loopback stream server
(tests/bench/stream_server.py) and real sockets holding ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import stub_plan, write
from tests.bench.launch.test_packing import holds, packed_plan, standin_gpus

__all__ = ["standin_gpus"]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", *args],
                          capture_output=True, text=True, timeout=180, env=env)  # fmt: skip


def _plan_with(model: Path, port_range: str) -> str:
    text = stub_plan(model, concurrency="[1]")
    return text.replace(
        "stop_timeout_s = 5\n", f'stop_timeout_s = 5\nport_range = "{port_range}"\n'
    )


def _free_block(size: int) -> int:
    """Return the first port of ``size`` consecutive ports free on 127.0.0.1 right now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            low = s.getsockname()[1]
        if low + size > 65535:
            continue
        socks = []
        try:
            for port in range(low, low + size):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return low
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no block of free loopback ports")


def test_every_server_listens_inside_the_range(tmp_path: Path, tiny_model_dir: Path) -> None:
    low = _free_block(3)
    plan = write(tmp_path, _plan_with(tiny_model_dir, f"{low}-{low + 2}"))
    out = tmp_path / "run"

    proc = _bench(str(plan), "--out", str(out))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    servers = read_records(out / "servers.jsonl")[0]
    assert len(servers) == 2 and all(low <= s["port"] <= low + 2 for s in servers), servers
    assert {r["status"] for r in read_records(out / "results.jsonl")[0]} == {"ok"}


def test_a_range_whose_ports_are_all_taken_stops_with_one_line_and_runs_nothing(
    tmp_path: Path, tiny_model_dir: Path, local_quirks: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        plan = write(tmp_path, _plan_with(tiny_model_dir, f"{port}-{port}"))
        out = tmp_path / "run"

        proc = _bench(str(plan), "--out", str(out))

    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpudoctor: error: ") and (
        f"no free port in engine.port_range {port}-{port}" in last
    ), proc.stderr
    assert read_records(out / "results.jsonl")[0] == []  # every cell pending for a resume
    assert read_records(out / "servers.jsonl")[0] == []  # no server was started
    assert not local_quirks.exists()  # a port problem is not the configuration's crash


@pytest.mark.parametrize("value", ["30100-30000", "80-90", "30000", "30000-70000", "a-b"])
def test_a_range_that_cannot_be_used_is_a_one_line_plan_error(
    tmp_path: Path, tiny_model_dir: Path, value: str
) -> None:
    plan = write(tmp_path, _plan_with(tiny_model_dir, value))
    proc = _bench(str(plan), "--dry-run", "--no-validate", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "engine.port_range" in last and '"LOW-HIGH"' in last, last


def test_dry_run_json_still_lists_the_cells(tmp_path: Path, tiny_model_dir: Path) -> None:
    plan = write(tmp_path, _plan_with(tiny_model_dir, "30000-30100"))
    proc = _bench(str(plan), "--dry-run", "--json", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert len(result["cells"]) == 2
    assert (
        "each server listens on a free port of 30000-30100 (engine.port_range)" in result["notes"]
    )


def test_servers_starting_at_once_never_share_a_port_of_the_range(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path
) -> None:
    """Four servers start at once on four stand-in GPUs with a range of exactly four ports:
    a port handed to a server that does not listen yet is not handed out again (else two
    would pick it, and one fail with EADDRINUSE and retry)."""
    low = _free_block(4)
    configs = "".join(  # each binds its port 1 s after it starts: all four pick meanwhile
        f'[[configs]]\nname = "c{i}"\nargs = {{ max-model-len = {2048 + i}, start-delay-s = 1 }}\n'
        for i in range(4)
    )
    text = packed_plan(tiny_model_dir, configs).replace(
        "stop_timeout_s = 5\n", f'stop_timeout_s = 5\nport_range = "{low}-{low + 3}"\n'
    )
    plan = write(tmp_path, text)
    out = tmp_path / "run"

    proc = _bench(str(plan), "--out", str(out))

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "port was taken meanwhile" not in proc.stderr
    servers = read_records(out / "servers.jsonl")[0]
    assert len(servers) == 4 and {s["attempt"] for s in servers} == {1}, servers
    assert all(low <= s["port"] <= low + 3 for s in servers)
    assert len({h[0] for h in holds(standin_gpus)}) == 4  # one server on each GPU, at once


def test_free_port_keeps_to_the_range_and_skips_the_ports_handed_out() -> None:
    """server.free_port over real sockets: a port another socket listens on and a port in
    ``avoid`` (handed to a server not listening yet) are never returned, whatever the
    random first pick; none left is NoFreePort naming the range."""
    from gpudoctor.bench.launch.server import NoFreePort, free_port

    low = _free_block(3)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", low))
        busy.listen()
        picks = {
            free_port(port_range=(low, low + 2), avoid=frozenset({low + 1})) for _ in range(30)
        }
        assert picks == {low + 2}
        with pytest.raises(NoFreePort, match=f"no free port in engine.port_range {low}-{low + 1}"):
            free_port(port_range=(low, low + 1), avoid=frozenset({low + 1}))
