"""nccl.p2p and nccl.allreduce: the paths between the GPUs, and NCCL itself over them.

TP4/TP8 runs fail in containers and VMs for reasons one GPU never shows: peer-to-peer copies
blocked or silently corrupted by PCIe ACS / an IOMMU. nccl.p2p finds that before a benchmark
does; nccl.allreduce (``--deep``: one process per GPU, a real NCCL all-reduce through torch)
then runs NCCL itself. It hangs on its first all-reduce when peer-to-peer is broken, or dies
when /dev/shm is too small: the check runs the all-reduce probe
(:mod:`gpudoctor.probes.allreduce_probe`) and, when it fails, once more with
NCCL_P2P_DISABLE=1 to tell a broken P2P path from everything else.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.checks.gpu import inventory

from gpudoctor.context import CheckContext
from gpudoctor.facts.allreduce import AllreduceRun, run_allreduce_probe
from gpudoctor.facts.multigpu import (
    P2PProbe,
    PairResult,
    bandwidth_matrix,
    nccl_shm_bytes,
    run_p2p_probe,
    slow_pairs,
)
from gpudoctor.model import Finding, Severity, Status
from gpudoctor.registry import check

MIB = 1 << 20
NVLINK_FLOOR_GBPS = 15.0
"""Below this a copy cannot be using NVLink: one NVLink 2.0 link moves ~24 GB/s each way
(V100 SXM2 single-link pairs in p2pBandwidthLatencyTest), NVLink 4 pairs ~370 GB/s (H100)."""
P2P_REMEDY = (
    "GPU peer-to-peer is being blocked or redirected between the GPUs, usually by PCIe ACS "
    "or the IOMMU. On the host (or hypervisor): boot with `iommu=pt` (intel_iommu=on iommu=pt "
    "/ amd_iommu=on iommu=pt), disable ACS on the PCIe bridges above the GPUs (BIOS, "
    "`pci=noacs`, or at runtime `setpci -s <bridge BDF> ECAP_ACS+6.w=0000` for each bridge "
    "`lspci -vvv | grep ACSCtl` shows with SrcValid+), then re-run. Until then NCCL works "
    "without P2P, slower: `export NCCL_P2P_DISABLE=1`."
)
NO_PEER_REMEDY = (
    "`nvidia-smi topo -m` and `nvidia-smi topo -p2p rw` show the links and the driver's reason "
    "(CNS/GNS/TNS = chipset/GPU/topology not supported). GPUs on one NVLink or PCIe switch "
    "should have P2P: in a VM pass the whole switch through and keep ACS and the IOMMU out of "
    "the path (`iommu=pt`, ACS off on the bridges). Consumer GPUs and GPUs behind different "
    "root complexes may legitimately lack it."
)


@check(
    id="nccl.p2p",
    title="Every GPU pair copies peer-to-peer correctly and at a similar speed",
    severity=Severity.HIGH,
    proves="for every ordered GPU pair: peer access can be enabled when the driver offers it, a "
    "32 MiB device-to-device copy returns exactly the bytes sent, and its bandwidth is not far "
    "below the other pairs'",
    remediation=P2P_REMEDY,
    requires=("driver.loaded", "cuda.init"),
    after=("gpu.count",),
    uses_gpu_probe=True,
)
def nccl_p2p(ctx: CheckContext) -> Iterator[Finding]:
    """Yield the peer-to-peer verdicts (``nvidia-smi topo -p2p rw`` + ``p2pBandwidthLatencyTest``)."""
    inv = inventory(ctx)
    if (inv.visible or 0) < 2:
        yield ctx.skip(
            "GPU pairs",
            f"Only {inv.visible or 0} GPU visible to CUDA here: peer-to-peer needs two or more.",
            evidence=inv.evidence(),
        )
        return
    # the GPU probe is done by now: the rest of this check's time is the P2P probe's
    budget = max(
        ctx.options.probe_timeout_s, ctx.options.timeout_s + ctx.options.probe_timeout_s - 3
    )
    probe = run_p2p_probe(ctx.host, budget)
    broken = probe_broken(ctx, probe)
    if broken is not None:
        yield broken
        return
    yield from judge_pairs(ctx, probe)


def probe_broken(ctx: CheckContext, probe: P2PProbe) -> Finding | None:
    """Return a FAIL when the probe could not test pairs at all (no init, setup error), else None."""
    init = probe.init
    tail = probe.stderr.strip()[-300:]
    if not init:
        what = (
            f"cuInit did not return within {probe.timeout_s:g} s"
            if probe.timed_out
            else f"the probe did not run (exit {probe.returncode})"
        )
        return ctx.fail(
            "P2P probe",
            f"The P2P probe could not start: {what}.",
            evidence=[tail] if tail else [],
            remediation="On the host: `dmesg | grep -i -e xid -e nvrm`; check cuda.init.",
        )
    if "load_error" in init or init.get("init") != 0 or "error" in init:
        detail = (
            init.get("load_error")
            or init.get("error")
            or f"cuInit = {init.get('init')} {init.get('init_name')}"
        )
        return ctx.fail(
            "P2P probe",
            f"CUDA failed in the P2P probe: {detail}.",
            evidence=[tail] if tail else [],
            remediation="See cuda.init.",
        )
    if not probe.finished and probe.hung_pair is None and not probe.setup_error:
        stage = probe.unfinished_stage or "the end"
        how = (
            f"was killed at its {probe.timeout_s:g} s timeout in {stage}"
            if probe.timed_out
            else f"exited {probe.returncode} in {stage}"
        )
        return ctx.fail(
            "P2P probe",
            f"The P2P probe {how} before testing every pair.",
            evidence=[tail] if tail else [],
            remediation="On the host: `dmesg | grep -i -e xid -e nvrm`; re-run with a longer "
            "--timeout if the GPUs are busy.",
        )
    if probe.setup_error:
        full = "CUDA_ERROR_OUT_OF_MEMORY" in probe.setup_error
        verdict = ctx.warn if full else ctx.fail
        return verdict(
            "P2P probe",
            f"Setting up a context and 2 x {init.get('size_bytes', 0) // MIB} MiB on every GPU "
            f"failed: {probe.setup_error}"
            + (
                ": the GPUs' memory is taken (a workload running?), pairs not tested."
                if full
                else "."
            ),
            remediation="Free GPU memory (`nvidia-smi --query-compute-apps=pid,used_memory "
            "--format=csv`) and re-run.",
        )
    return None


def judge_pairs(ctx: CheckContext, probe: P2PProbe) -> Iterator[Finding]:
    """Yield FAILs for hung/corrupt/failing pairs, WARNs for no-peer and slow pairs, else a PASS."""
    count = probe.device_count
    matrix = [
        *bandwidth_matrix(probe.pairs, count),
        "(* = no peer access: copy staged through host)",
        *probe.topology_lines(),
    ]
    size_mib = int(probe.init.get("size_bytes", 0)) // MIB
    bad = False
    hung = probe.hung_pair
    if hung is not None:
        bad = True
        untested = count * (count - 1) - len(probe.pairs)
        took = [p.seconds for p in probe.pairs if p.finished and p.seconds is not None]
        pace = f", while each earlier pair took {max(took):.2f} s at most" if took else ""
        yield ctx.fail(
            hung.label,
            f"A {size_mib} MiB peer copy {hung.label} did not complete within "
            f"{probe.timeout_s:g} s{pace}: "
            f"P2P traffic between them is being dropped; NCCL will hang the same way"
            + (f" ({untested} later pair(s) not tested)." if untested else "."),
            evidence=matrix,
            remediation=P2P_REMEDY,
        )
    errors: dict[str, list[PairResult]] = {}
    for pair in probe.pairs:
        if pair.error and pair.finished:
            errors.setdefault(pair.error, []).append(pair)
            continue
        finding = judge_pair(ctx, pair, size_mib, matrix)
        if finding is not None:
            bad = True
            yield finding
    for error, pairs in errors.items():  # a sticky CUDA error repeats on every later pair
        bad = True
        yield ctx.fail(
            pairs[0].label,
            f"The peer copy {pairs[0].label} failed: {error}"
            + (
                f" (and {len(pairs) - 1} more pair(s): {pair_list(pairs[1:])})."
                if pairs[1:]
                else "."
            ),
            evidence=matrix,
            remediation=P2P_REMEDY,
        )
    tested = [p for p in probe.pairs if p.finished]
    no_peer = [p for p in tested if p.can_access_peer == 0]
    if no_peer:
        bad = True
        everyone = len(no_peer) == len(tested)
        scope = "No GPU pair can" if everyone else f"{len(no_peer)} of {len(tested)} pairs cannot"
        yield ctx.warn(
            "GPU pairs",
            f"{scope} use peer access (cuDeviceCanAccessPeer = 0"
            + ("" if everyone else ": " + pair_list(no_peer))
            + ")"
            + driver_reasons(probe, no_peer)
            + ": NCCL routes them through host memory (SHM), slower, and needs /dev/shm room "
            f"(about {nccl_shm_bytes(count) // MIB} MiB for {count} GPUs).",
            evidence=matrix,
            remediation=NO_PEER_REMEDY,
        )
    slow = slow_pairs(tested)
    if slow:
        bad = True
        yield ctx.warn(
            "GPU pairs",
            f"{len(slow)} pair(s) copy far below the others: "
            + "; ".join(
                f"{p.label} {p.gbps:.1f} GB/s vs median {m:.1f}"
                + (f" ({probe.link(p.src, p.dst)})" if probe.link(p.src, p.dst) else "")
                for p, m in slow[:8]
            )
            + ". A degraded NVLink, a narrower PCIe link or traffic through the CPU slows every "
            "collective to that pace.",
            evidence=matrix,
            remediation="Compare `nvidia-smi topo -m` and `nvidia-smi nvlink -s` for those GPUs; "
            "reseat or check the PCIe link width (gpu.health); " + P2P_REMEDY.split(" Until")[0],
        )
    slow_ids = {(p.src, p.dst) for p, _ in slow}
    crawling = [
        p
        for p in tested
        if p.gbps is not None
        and p.gbps < NVLINK_FLOOR_GBPS
        and probe.link(p.src, p.dst).startswith("NVLink")
        and (p.src, p.dst) not in slow_ids
    ]
    if crawling:
        bad = True
        yield ctx.warn(
            "GPU pairs",
            f"{len(crawling)} pair(s) joined by NVLink (per NVML) copy at "
            f"{rate_span([p.gbps for p in crawling if p.gbps is not None])}, below even one "
            f"NVLink's {NVLINK_FLOOR_GBPS:g} GB/s: "
            + pair_list(crawling)
            + ". The copies do not take the NVLink path (P2P off, or traffic staged through host).",
            evidence=matrix,
            remediation="`nvidia-smi nvlink -s` (links up?), `nvidia-smi topo -p2p n`; in a VM "
            "the NVLink/NVSwitch fabric must be passed through too (fabric manager running).",
        )
    if not bad:
        span = rate_span([p.gbps for p in tested if p.gbps is not None], digits=0)
        yield ctx.passed(
            "GPU pairs",
            f"All {len(tested)} ordered pairs of {count} GPUs: peer access on, {size_mib} MiB "
            f"copies byte-exact, {span}.",
            evidence=matrix,
        )


def judge_pair(
    ctx: CheckContext, pair: PairResult, size_mib: int, matrix: list[str]
) -> Finding | None:
    """Return a FAIL for a pair whose peer access failed or whose copy was wrong, else None."""
    if not pair.finished:
        return None
    if pair.can_access_peer and not pair.peer_enabled:
        return ctx.fail(
            pair.label,
            f"The driver offers peer access {pair.label} but cuCtxEnablePeerAccess returned "
            f"{pair.enable_rc} {pair.enable_name}.",
            evidence=matrix,
            remediation=P2P_REMEDY,
        )
    if pair.copy_ok is False:
        m = pair.mismatch
        looks = {
            "zeros": "zeros",
            "unchanged": "its old contents (the write never landed)",
        }.get(str(m.get("dst_looks")), "wrong bytes")
        return ctx.fail(
            pair.label,
            f"Silent corruption: a {size_mib} MiB peer copy {pair.label} returned without error "
            f"but the destination holds {looks} in {m.get('bad_chunks')} of {m.get('chunks')} "
            f"4 KiB blocks (first at byte {m.get('first_bad_offset')}). This is what an IOMMU "
            "dropping P2P writes looks like: tensors arrive zeroed, models produce garbage.",
            evidence=[*matrix, f"mismatch: {m}"],
            remediation=P2P_REMEDY,
        )
    return None


def driver_reasons(probe: P2PProbe, pairs: list[PairResult]) -> str:
    """Return ``; NVML says PCIe SYS, P2P TNS (topology not supported) for 0-2, 1-3`` (or "")."""
    groups: dict[str, list[str]] = {}
    for p in pairs:
        if p.src < p.dst and probe.link(p.src, p.dst):
            groups.setdefault(probe.link(p.src, p.dst), []).append(f"{p.src}-{p.dst}")
    if not groups:
        return ""
    return "; NVML says " + "; ".join(f"{k} for {', '.join(v)}" for k, v in groups.items())


def rate_span(rates: list[float], digits: int = 1) -> str:
    """Return ``370 GB/s`` or ``9.6-10.2 GB/s`` (``not measured`` when empty)."""
    if not rates:
        return "not measured"
    low, high = f"{min(rates):.{digits}f}", f"{max(rates):.{digits}f}"
    return f"{low} GB/s" if low == high else f"{low}-{high} GB/s"


def pair_list(pairs: list[PairResult]) -> str:
    """Return ``0->2, 2->0, ...`` (at most 12)."""
    text = ", ".join(f"{p.src}->{p.dst}" for p in pairs[:12])
    return text + (", ..." if len(pairs) > 12 else "")


@check(
    id="nccl.allreduce",
    title="An NCCL all-reduce across all GPUs completes with the right sum",
    severity=Severity.HIGH,
    proves="one process per GPU initialises NCCL through torch.distributed and an int32 "
    "all-reduce returns the exact sum on every rank within the timeout (NVLink multicast off)",
    remediation="If it hangs: re-run with NCCL_P2P_DISABLE=1; if that works, P2P is broken "
    "(ACS/IOMMU, see nccl.p2p). If NCCL WARNs about /dev/shm: grow /dev/shm.",
    requires=("driver.loaded", "cuda.init"),
    after=("gpu.count", "nccl.p2p", "shm.capacity"),
    uses_gpu_probe=True,
)
def nccl_allreduce(ctx: CheckContext) -> Iterator[Finding]:
    """Yield the all-reduce verdict (``torchrun --nproc-per-node N`` + ``dist.all_reduce``;
    nccl-tests' ``all_reduce_perf -g N``). Opt-in: only with ``--deep``."""
    if not ctx.options.deep:
        yield ctx.skip(
            "all-reduce",
            "Opt-in: run with --deep (starts one torch process per GPU "
            "and an NCCL all-reduce; 10-30 s).",
        )
        return
    count = inventory(ctx).visible or 0
    if count < 2:
        yield ctx.skip(
            "all-reduce",
            f"Only {count} GPU visible to CUDA here: an all-reduce across GPUs needs two or more.",
        )
        return
    budget = ctx.options.timeout_s + ctx.options.probe_timeout_s - 5
    first = run_allreduce_probe(ctx.host, count, max(budget * 0.6, 5.0))
    if first.error == "no_torch":
        yield ctx.skip(
            "all-reduce",
            f"{first.error_detail}: install torch there, or run "
            "gpudoctor with a Python that has it (the check needs torch.distributed).",
        )
        return
    if first.ok:
        yield allreduce_passed(ctx, first)
        return
    retry = None
    left = budget - first.elapsed_s - 1
    if not first.error and left >= 5:
        retry = run_allreduce_probe(ctx.host, count, left, extra_env=("NCCL_P2P_DISABLE=1",))
    yield allreduce_failed(ctx, first, retry, count)


def allreduce_passed(ctx: CheckContext, run: AllreduceRun) -> Finding:
    """Return the finding of a correct all-reduce: PASS, or WARN when NCCL was kept off P2P
    (``NCCL_P2P_DISABLE=1`` left in the environment, or P2P unused although nccl.p2p passed)."""
    r0 = run.ranks[0].result
    busbw = min((r.result.get("busbw_gbps") or 0.0) for r in run.ranks)
    via = ", ".join(run.transports) or "not logged"
    message = (
        f"NCCL {r0.get('nccl_version', '?')} all-reduce over {run.world_size} GPUs gave the exact "
        f"sum on every rank (init {r0.get('init_s', 0):.1f} s); bus bandwidth {busbw:.0f} GB/s "
        f"at {int(r0.get('bw_bytes', 0)) // MIB} MiB; transports: {via}."
    )
    p2p = ctx.result("nccl.p2p")
    no_p2p_used = bool(run.transports) and not any(t.startswith("P2P") for t in run.transports)
    if run.env.get("NCCL_P2P_DISABLE") == "1":
        return ctx.warn(
            "all-reduce",
            message + " NCCL_P2P_DISABLE=1 is set in this environment: NCCL avoids the GPUs' "
            "direct path, which is slower.",
            evidence=run.evidence(),
            remediation="Unset NCCL_P2P_DISABLE once nccl.p2p passes.",
        )
    if no_p2p_used and p2p is not None and p2p.status == Status.PASS:
        return ctx.warn(
            "all-reduce",
            message + " NCCL did not use P2P although every GPU pair has it (nccl.p2p).",
            evidence=run.evidence(),
            remediation="Look for NCCL_P2P_LEVEL / NCCL_P2P_DISABLE / NCCL_TOPO_FILE in the "
            "environment and /etc/nccl.conf.",
        )
    return ctx.passed("all-reduce", message, evidence=run.evidence())


def allreduce_failed(
    ctx: CheckContext, first: AllreduceRun, retry: AllreduceRun | None, count: int
) -> Finding:
    """Return the FAIL finding of a failed all-reduce, with the NCCL_P2P_DISABLE=1 retry's
    outcome deciding whether the P2P path is to blame."""
    what = first.describe_failure()
    evidence = first.evidence()
    causes = tuple(c for c in ("nccl.p2p", "shm.capacity") if ctx.failed(c))
    if retry is not None:
        evidence += ["retry with NCCL_P2P_DISABLE=1:", *retry.evidence()]
    if retry is not None and retry.ok:
        return ctx.fail(
            "all-reduce",
            f"{what} With NCCL_P2P_DISABLE=1 the same all-reduce gives the right sum: the GPUs' "
            "peer-to-peer path is broken.",
            evidence=evidence,
            remediation=P2P_REMEDY,
            caused_by=causes,
        )
    shm = any("shm" in w.lower() for w in first.warnings)
    if shm:
        need = nccl_shm_bytes(count)
        remedy = (
            f"NCCL could not allocate in /dev/shm: give it at least {need // MIB} MiB free for "
            f"{count} GPUs (`mount -o remount,size=16G /dev/shm`; Docker: --shm-size=16g)."
        )
    else:
        remedy = (
            "Re-run by hand with NCCL_DEBUG=INFO to see where it stops; if it hangs, try "
            "NCCL_P2P_DISABLE=1 then NCCL_SHM_DISABLE=1. " + P2P_REMEDY
        )
    tried = " A retry with NCCL_P2P_DISABLE=1 failed too." if retry is not None else ""
    return ctx.fail(
        "all-reduce", what + tried, evidence=evidence, remediation=remedy, caused_by=causes
    )
