"""Where a packed campaign puts a tensor-parallel server, seen from the records a user
reads: a GPU that fails its check leaves the pool but the healthy GPUs taken with it come
back (the TP set is retried on them), and a TP set is chosen by its weakest link first
(a set with one SYS hop is never preferred to one whose every link is better).

The real campaign loop with stand-in GPUs (GPUDOCTOR_FAKE_GPUS: this machine has none),
their health and `nvidia-smi topo -m` text from files, servers = tests/bench/stream_server.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.launch.slots import link_score, parse_topo
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.run_dir import read_records
from tests.bench.campaign_support import wait_no_leftovers, write
from tests.bench.launch.test_packing import UUIDS, packed_plan, standin_gpus

__all__ = ["standin_gpus"]

# GPU0-GPU1 and GPU0-GPU2 bridged (NV18), GPU1-GPU2 across the sockets (SYS), GPU3 behind
# one PCIe switch with every other (PXB). Of the 3-GPU sets, {0,1,2} has the highest link
# sum (78 + 78 + 10) but a SYS hop; {0,1,3} and {0,2,3} have no link below PXB.
TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tNV18\tPXB\t0-31\t0
GPU1\tNV18\t X \tSYS\tPXB\t0-31\t0
GPU2\tNV18\tSYS\t X \tPXB\t32-63\t1
GPU3\tPXB\tPXB\tPXB\t X \t0-31\t0
"""

TP3 = '[[configs]]\nname = "wide"\ntp = [3]\n'


def _records(out: Path) -> list[dict]:
    return read_records(out / "results.jsonl")[0]


@pytest.mark.timeout(180)  # a guard: GPUs never given back must not hang the suite
def test_a_failed_gpus_healthy_partners_return_to_the_pool(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a topology the first 3 GPUs are taken (0, 1, 2); GPU1 fails its check, so
    the set is refused, and 0 and 2 must be free again: the config runs on 0, 2, 3."""
    faults = tmp_path / "faults"
    faults.write_text(f"{UUIDS[1]} 2 uncorrected ECC errors\n")
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPU_FAULTS", str(faults))
    plan = load_plan(write(tmp_path, packed_plan(tiny_model_dir, TP3)))
    out = tmp_path / "run"
    summary = run_campaign(plan, LaunchOptions(out=out))
    assert (summary.ok, summary.crashed, summary.skipped) == (2, 0, 0)
    for record in _records(out):
        assert sorted(record["gpus"]) == [UUIDS[0], UUIDS[2], UUIDS[3]], record
    gone = [json.loads(x) for x in (out / "gpus.jsonl").read_text().splitlines()]
    assert [g["uuid"] for g in gone] == [UUIDS[1]]
    assert wait_no_leftovers(out) == []


def test_a_tp_set_is_chosen_by_its_weakest_link(
    tmp_path: Path, tiny_model_dir: Path, standin_gpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = tmp_path / "topo.txt"
    topo.write_text(TOPO)
    monkeypatch.setenv("GPUDOCTOR_FAKE_GPU_TOPO", str(topo))
    plan = load_plan(write(tmp_path, packed_plan(tiny_model_dir, TP3)))
    out = tmp_path / "run"
    assert run_campaign(plan, LaunchOptions(out=out)).ok == 2
    links = parse_topo(TOPO)
    index = {u: i for i, u in enumerate(UUIDS)}
    for record in _records(out):
        chosen = sorted(index[u] for u in record["gpus"])
        kinds = {links[(a, b)] for a in chosen for b in chosen if a < b}
        assert "SYS" not in kinds, (chosen, kinds)
        assert min(link_score(k) for k in kinds) == link_score("PXB"), (chosen, kinds)
    assert wait_no_leftovers(out) == []
