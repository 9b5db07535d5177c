"""The GPU pool of a packed campaign, in-process and fast: which GPUs a launch may use
(stand-ins, NVML, ``CUDA_VISIBLE_DEVICES``), which of them fail their check and why, the
``nvidia-smi topo -m`` links, which TP set a server gets, and who holds what.

Stand-ins for what this machine lacks: ``GPUDOCTOR_FAKE_GPUS`` (the product's own stand-in
GPUs), a fake probe script (:func:`fake_nvml`) standing for gpudoctor's NVML probe on a
host with GPUs, and a fake ``nvidia-smi`` script (:func:`fake_nvidia_smi`) standing for
the driver's ``nvidia-smi topo -m``.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from pathlib import Path

import pytest

from gpudoctor.bench.launch import slots
from gpudoctor.bench.launch.slots import (
    Gpu,
    GpuPool,
    Slot,
    best_set,
    cap_gpus,
    check_gpus,
    declared_uuids,
    discover_gpus,
    gpu_fault,
    link_score,
    narrow_to_visible,
    parse_topo,
    read_topology,
    visible_devices,
)

FOUR = [Gpu(i, f"GPU-{i}aaa") for i in range(4)]

# Two sockets; GPU0-GPU1 bridged by 18 NVLinks, GPU2-GPU3 by 4; GPU0-GPU2 one PCIe switch.
TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tNV18\tPXB\tSYS\t0-31
GPU1\tNV18\t X \tSYS\tSYS\t0-31
GPU2\tPXB\tSYS\t X \tNV4\t32-63
GPU3\tSYS\tSYS\tNV4\t X \t32-63
"""


@pytest.fixture
def no_gpu_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (slots.FAKE_GPUS, slots.FAKE_FAULTS, slots.FAKE_TOPO, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def fake_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, devices: list[dict]) -> Path:
    """Stand in for gpudoctor's NVML probe (gpudoctor/probes/gpu_probe.py run on a host
    with GPUs): a script run the same way (``python -I -S -c SOURCE nvml``) that prints
    the ``nvml`` stage's JSON line with ``devices``; it writes the stages it was asked for
    to ``asked`` (returned)."""
    asked = tmp_path / "asked"
    source = (
        "import json, sys\n"
        f"open({str(asked)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "print(json.dumps({'stage': 'nvml', 'started': True}))\n"
        f"print(json.dumps({{'stage': 'nvml', 'devices': {devices!r}}}))\n"
    )
    monkeypatch.setattr("gpudoctor.facts.gpu.probe_source", lambda: source)
    return asked


def fake_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, rc: int) -> Path:
    """Stand in for the driver's ``nvidia-smi``: a script first on PATH that prints
    ``text`` and exits ``rc``; it writes its arguments to ``argv`` (returned)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "topo.txt").write_text(text)
    argv = tmp_path / "argv"
    script = bindir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\necho "$@" > {argv}\ncat {tmp_path / "topo.txt"}\nexit {rc}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return argv


# --- which GPUs a launch may use --------------------------------------------------------


def test_declared_stand_ins_are_read_with_blanks_and_spaces_ignored(
    no_gpu_env: pytest.MonkeyPatch,
) -> None:
    assert declared_uuids() is None
    no_gpu_env.setenv(slots.FAKE_GPUS, "  ")
    assert declared_uuids() is None
    no_gpu_env.setenv(slots.FAKE_GPUS, " GPU-a , ,GPU-b,")
    assert declared_uuids() == ["GPU-a", "GPU-b"]


def test_stand_ins_are_numbered_in_order_and_narrowed_to_the_visible_ones(
    no_gpu_env: pytest.MonkeyPatch,
) -> None:
    no_gpu_env.setenv(slots.FAKE_GPUS, "GPU-a,GPU-b,GPU-c")
    gpus, source = discover_gpus()
    assert source == "GPUDOCTOR_FAKE_GPUS"
    assert gpus == [Gpu(0, "GPU-a"), Gpu(1, "GPU-b"), Gpu(2, "GPU-c")]
    assert gpus[0].name == "stand-in" and gpus[0].memory_bytes is None
    no_gpu_env.setenv("CUDA_VISIBLE_DEVICES", "GPU-c,GPU-a")
    assert discover_gpus() == ([Gpu(2, "GPU-c"), Gpu(0, "GPU-a")], "GPUDOCTOR_FAKE_GPUS")


def test_nvml_gpus_come_from_the_probe_and_an_erroring_device_is_left_out(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = fake_nvml(no_gpu_env, tmp_path, [
        {"index": 0, "uuid": "GPU-x", "name": "NVIDIA H200", "memory_total": 150 << 30},
        {"index": 1, "uuid": "GPU-y", "error": "NVML_ERROR_GPU_IS_LOST"},
        {"index": 2, "uuid": "", "name": "no uuid"},
        {"index": 3, "uuid": "GPU-z"},
    ])  # fmt: skip
    gpus, source = discover_gpus()
    assert asked.read_text() == "nvml"
    assert source == "nvml"
    assert gpus == [Gpu(0, "GPU-x", "NVIDIA H200", 150 << 30), Gpu(3, "GPU-z", "GPU", None)]
    no_gpu_env.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert discover_gpus() == ([Gpu(3, "GPU-z", "GPU", None)], "nvml")


def test_a_probe_that_cannot_run_or_prints_no_nvml_stage_means_no_gpu(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_gpu_env.setattr("gpudoctor.facts.gpu.probe_source", lambda: "print('no json here')")
    assert discover_gpus() == ([], "nvml")
    no_gpu_env.setattr("gpudoctor.facts.gpu.probe_source", lambda: "raise SystemExit(3)")
    assert check_gpus([Gpu(0, "GPU-x")]) == {
        "GPU-x": "not listed by NVML any more (fallen off the bus?)"
    }
    no_gpu_env.setattr("gpudoctor.facts.gpu.probe_source", lambda: "import time; time.sleep(60)")
    assert slots._probe_devices(timeout_s=0.2) == []  # a hung probe: killed, no GPU
    no_gpu_env.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    assert discover_gpus() == ([], "nvml")


def test_cuda_visible_devices_by_index_uuid_or_prefix() -> None:
    assert narrow_to_visible(FOUR, None) == FOUR
    assert narrow_to_visible(FOUR, "") == [] and narrow_to_visible(FOUR, " , ") == []
    assert [g.index for g in narrow_to_visible(FOUR, "3, 1")] == [3, 1]
    assert [g.index for g in narrow_to_visible(FOUR, "2,9")] == [2]
    # as many indices as GPUs: already renumbered (a device cgroup shows only these)
    assert narrow_to_visible(FOUR[2:], "0,1") == FOUR[2:]
    assert [g.index for g in narrow_to_visible(FOUR, "GPU-2aaa,GPU-0")] == [2, 0]
    assert narrow_to_visible(FOUR, "GPU-9") == []


# --- health ---------------------------------------------------------------------------


def test_each_fault_is_named_and_warnings_are_not_faults() -> None:
    assert gpu_fault({"error": 15, "error_name": "NVML_ERROR_GPU_IS_LOST"}) == (
        "NVML error NVML_ERROR_GPU_IS_LOST"
    )
    assert gpu_fault({"error": 15}) == "NVML error 15"
    assert gpu_fault({"ecc_uncorrected_volatile": 2}) == (
        "2 uncorrected ECC error(s) since the driver loaded"
    )
    assert gpu_fault({"retired_pages_pending": 1}) == "pages pending retirement (reset the GPU)"
    assert gpu_fault({"retired_pages_pending": 0}) is None
    assert gpu_fault({"remapped_rows": {"failure": 1, "pending": 1}}) == (
        "row remapping failed (the GPU needs service)"
    )
    assert gpu_fault({"remapped_rows": {"pending": 1}}) == "a row remap is pending (reset the GPU)"
    assert gpu_fault({"remapped_rows": None, "throttle_reasons": 8, "pcie_width": 4}) is None


def test_stand_in_faults_come_from_the_declared_file(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_gpu_env.setenv(slots.FAKE_GPUS, "GPU-a,GPU-b,GPU-c")
    gpus, _ = discover_gpus()
    assert check_gpus(gpus) == {}  # no faults file named
    faults = tmp_path / "faults"
    no_gpu_env.setenv(slots.FAKE_FAULTS, str(faults))
    assert check_gpus(gpus) == {}  # named but not written yet
    faults.write_text("  GPU-a   2 uncorrected ECC errors \n\nGPU-c\nGPU-z gone\n")
    assert check_gpus(gpus) == {"GPU-a": "2 uncorrected ECC errors", "GPU-c": "declared faulty"}
    assert check_gpus(gpus[1:]) == {"GPU-c": "declared faulty"}


def test_nvml_faults_and_a_gpu_fallen_off_the_bus(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_nvml(no_gpu_env, tmp_path, [
        {"index": 0, "uuid": "GPU-x", "ecc_uncorrected_volatile": 0},
        {"index": 1, "uuid": "GPU-y", "remapped_rows": {"pending": 1}},
    ])  # fmt: skip
    gpus = [Gpu(0, "GPU-x"), Gpu(1, "GPU-y"), Gpu(2, "GPU-gone")]
    assert check_gpus(gpus) == {
        "GPU-y": "a row remap is pending (reset the GPU)",
        "GPU-gone": "not listed by NVML any more (fallen off the bus?)",
    }


# --- topology -------------------------------------------------------------------------


def test_topology_is_read_in_both_orders_and_colours_and_legend_are_skipped() -> None:
    coloured = "\x1b[4m" + TOPO.replace("NV18", "\x1b[1mNV18\x1b[0m", 1) + "\nLegend:\n  X = Self\n"
    links = parse_topo(coloured)
    assert links[(0, 1)] == links[(1, 0)] == "NV18"
    assert links[(2, 3)] == "NV4" and links[(0, 0)] == "X" and links[(3, 0)] == "SYS"
    assert len(links) == 16  # CPU affinity and the legend are no links
    assert parse_topo("") == {} and parse_topo("\n  \n") == {}
    assert parse_topo("nvidia-smi: command failed\n") == {}
    assert parse_topo("\tGPU0\tGPU1\nGPU1\tSYS\n") == {(1, 0): "SYS"}  # a short row


def test_links_rank_nvlink_by_count_above_pcie_and_unknown_last() -> None:
    ranked = ["X", "NVS", "NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS", "", "N/A", "NV"]
    scores = [link_score(k) for k in ranked]
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores[:-3])) == len(scores) - 3  # each known kind its own rank
    assert link_score("NV18") - link_score("NV4") == 14
    assert link_score("NV1") > link_score("PIX") and link_score("NV18") < link_score("NVS")
    assert scores[-3:] == [0, 0, 0]


def test_stand_in_topology_is_read_from_the_declared_file(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    no_gpu_env.setenv(slots.FAKE_GPUS, "GPU-a,GPU-b")
    assert read_topology() == {}
    topo = tmp_path / "topo"
    topo.write_text(TOPO)
    no_gpu_env.setenv(slots.FAKE_TOPO, str(topo))
    assert read_topology() == parse_topo(TOPO)


def test_nvidia_smi_topology_and_a_failing_or_missing_nvidia_smi(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ok").mkdir()
    argv = fake_nvidia_smi(no_gpu_env, tmp_path / "ok", TOPO, 0)
    assert read_topology() == parse_topo(TOPO)
    assert argv.read_text().split() == ["topo", "-m"]
    (tmp_path / "bad").mkdir()
    fake_nvidia_smi(no_gpu_env, tmp_path / "bad", TOPO, 9)
    assert read_topology() == {}  # printed a table but failed: not trusted
    no_gpu_env.setenv("PATH", str(tmp_path / "empty"))
    assert read_topology() == {}


# --- [hardware] and the TP set --------------------------------------------------------


def test_hardware_picks_named_gpus_in_its_order_then_caps_the_count() -> None:
    assert cap_gpus(FOUR, None, None) == FOUR and cap_gpus(FOUR, None, None) is not FOUR
    assert [g.index for g in cap_gpus(FOUR, (3, 0, 2), 2)] == [3, 0]
    assert cap_gpus(FOUR, None, 0) == []
    with pytest.raises(ValueError) as err:
        cap_gpus(FOUR, (1, 6, 7), None)
    assert str(err.value) == "[hardware] gpus names GPU 6, but this host has 0, 1, 2, 3"
    with pytest.raises(ValueError) as err:
        cap_gpus([], (0,), None)
    assert str(err.value) == "[hardware] gpus names GPU 0, but this host has none"


def test_a_tp_set_is_ranked_by_its_weakest_link_then_by_all_its_links() -> None:
    links = parse_topo(TOPO)
    # {0,1,2}: NV18 + PXB + SYS; {0,2,3}: PXB + SYS + NV4; both have a SYS hop, so the sum
    # decides: 78 + 40 + 10 > 40 + 10 + 64
    assert [g.index for g in best_set(FOUR, 3, links)] == [0, 1, 2]
    # pairs: NV18 beats NV4 beats PXB
    assert [g.index for g in best_set(FOUR, 2, links)] == [0, 1]
    assert [g.index for g in best_set(FOUR[1:], 2, links)] == [2, 3]
    # without GPU1 and GPU3: {0,2} is the only pair
    assert best_set([FOUR[0], FOUR[2]], 2, links) == [FOUR[0], FOUR[2]]
    # weakest first (issue 37): GPU0 bridged to GPU1 and GPU2, GPU1-GPU2 across the sockets,
    # GPU3 behind a PCIe switch with each. {0,1,2} has the largest sum (78 + 78 + 10) but a
    # SYS hop; {0,1,3} and {0,2,3} (78 + 40 + 40, none below PXB) tie: the lowest indices win
    bridged = parse_topo(
        "\tGPU0\tGPU1\tGPU2\tGPU3\nGPU0\t X \tNV18\tNV18\tPXB\nGPU1\tNV18\t X \tSYS\tPXB\n"
        "GPU2\tNV18\tSYS\t X \tPXB\nGPU3\tPXB\tPXB\tPXB\t X \n"
    )
    assert [g.index for g in best_set(FOUR, 3, bridged)] == [0, 1, 3]


def test_ties_and_small_requests_take_the_lowest_indices() -> None:
    flat = {(a, b): "PIX" for a in range(4) for b in range(4) if a != b}
    assert [g.index for g in best_set(FOUR, 2, flat)] == [0, 1]
    assert [g.index for g in best_set(FOUR[1:], 2, flat)] == [1, 2]
    assert best_set(FOUR, 1, parse_topo(TOPO)) == [FOUR[0]]
    assert best_set(FOUR, 3, {}) == FOUR[:3]
    assert best_set(FOUR, 4, parse_topo(TOPO)) == FOUR
    assert best_set(FOUR[:2], 3, parse_topo(TOPO)) is None
    assert best_set([], 1, {}) is None
    # a pair the topology does not name counts as the worst link
    partial = {(0, 1): "NV18", (1, 0): "NV18", (2, 3): "PIX", (3, 2): "PIX"}
    assert [g.index for g in best_set(FOUR, 2, partial)] == [0, 1]
    assert [g.index for g in best_set(FOUR[1:], 2, partial)] == [2, 3]


# --- the pool -------------------------------------------------------------------------


def test_the_pool_holds_each_gpu_for_one_slot_and_frees_it_when_given_back() -> None:
    pool = GpuPool(FOUR, parse_topo(TOPO))
    assert pool.usable == 4 and pool.free() == FOUR
    first = pool.take(2, slot=1)
    assert [g.index for g in first] == [0, 1]
    assert pool.held == {"GPU-0aaa": 1, "GPU-1aaa": 1}
    assert pool.take(3, slot=2) is None and len(pool.held) == 2  # a refusal holds nothing
    second = pool.take(2, slot=2)
    assert [g.index for g in second] == [2, 3] and pool.held["GPU-3aaa"] == 2
    assert pool.free() == [] and pool.usable == 4
    pool.give_back(first)
    assert pool.free() == FOUR[:2] and set(pool.held) == {"GPU-2aaa", "GPU-3aaa"}
    pool.give_back(first)  # twice: no error, nothing else freed
    assert pool.free() == FOUR[:2]


def test_a_failed_gpu_leaves_the_pool_and_its_healthy_partners_come_back() -> None:
    """Issue 37: a TP set with one failing GPU is refused; the failing GPU is out for the
    rest of the campaign, the others are free again and are offered to the next set."""
    pool = GpuPool(FOUR)
    taken = pool.take(3, slot=1)
    assert [g.index for g in taken] == [0, 1, 2]
    pool.remove(taken[1], "2 uncorrected ECC errors")
    pool.give_back(taken)
    assert pool.out == {"GPU-1aaa": "2 uncorrected ECC errors"} and pool.usable == 3
    assert [g.index for g in pool.free()] == [0, 2, 3]
    assert [g.index for g in pool.take(3, slot=2)] == [0, 2, 3]
    assert pool.take(1, slot=3) is None
    pool.remove(FOUR[3], "fell off the bus")  # a held GPU removed: no longer held either
    assert "GPU-3aaa" not in pool.held and pool.usable == 2


def test_the_pool_is_safe_to_share_between_slot_threads() -> None:
    pool = GpuPool([Gpu(i, f"GPU-{i}") for i in range(8)])
    barrier = threading.Barrier(8)
    got: list[list[Gpu] | None] = [None] * 8

    def worker(n: int) -> None:
        barrier.wait()
        got[n] = pool.take(1, slot=n + 1)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(g[0].index for g in got if g) == list(range(8))
    assert sorted(pool.held.values()) == list(range(1, 9))


def test_a_slot_is_given_its_gpus_by_uuid() -> None:
    slot = Slot(2, (FOUR[3], FOUR[1]))
    assert slot.uuids == ["GPU-3aaa", "GPU-1aaa"]
    assert visible_devices(list(slot.gpus)) == "GPU-3aaa,GPU-1aaa"
    assert visible_devices([]) == ""


def test_a_hung_nvidia_smi_is_given_up_on(no_gpu_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 600\n")
    (bindir / "nvidia-smi").chmod(0o755)
    no_gpu_env.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    no_gpu_env.setattr(slots, "NVIDIA_SMI_TIMEOUT_S", 0.2)
    assert read_topology() == {}  # no topology: GPUs are taken lowest index first


def test_on_a_large_host_the_search_stops_at_its_bound() -> None:
    """A TP2 set on 256 GPUs has 32640 candidates; only the first MAX_CANDIDATE_SETS are
    scored (the time a take may cost stays bounded): a better pair just past them is not
    found, the lowest indices are taken."""
    gpus = [Gpu(i, f"GPU-{i}") for i in range(256)]
    past = list(itertools.islice(itertools.combinations(range(256), 2),
                                 slots.MAX_CANDIDATE_SETS, None))  # fmt: skip
    a, b = past[0]
    links = {(a, b): "NV18", (b, a): "NV18"}
    assert [g.index for g in best_set(gpus, 2, links)] == [0, 1]
    last_in = list(itertools.combinations(range(256), 2))[slots.MAX_CANDIDATE_SETS - 1]
    links = {last_in: "NV18", last_in[::-1]: "NV18"}
    assert tuple(g.index for g in best_set(gpus, 2, links)) == last_in


def test_taking_a_free_gpu_out_of_the_pool() -> None:
    pool = GpuPool(FOUR)
    pool.remove(FOUR[2], "ECC")  # not held by any slot: out all the same
    assert pool.out == {"GPU-2aaa": "ECC"} and [g.index for g in pool.free()] == [0, 1, 3]


def test_a_driver_nvml_cannot_load_means_no_gpu(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = (
        "import json; print(json.dumps({'stage': 'nvml', 'error': 'NVML_ERROR_LIBRARY_NOT_FOUND'}))"
    )
    no_gpu_env.setattr("gpudoctor.facts.gpu.probe_source", lambda: source)
    assert discover_gpus() == ([], "nvml")


def test_the_probe_ignores_a_planted_pythonpath(
    no_gpu_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The probe runs isolated (``python -I``): a ``json.py`` on ``$PYTHONPATH`` (another
    user's directory, say) cannot change what NVML is said to report."""
    fake_nvml(no_gpu_env, tmp_path, [{"index": 0, "uuid": "GPU-x"}])
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "json.py").write_text("raise SystemExit('planted')\n")
    no_gpu_env.setenv("PYTHONPATH", str(planted))
    assert discover_gpus() == ([Gpu(0, "GPU-x", "GPU", None)], "nvml")
