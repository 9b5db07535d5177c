"""nccl.allreduce (``--deep``): one process per GPU, a real NCCL all-reduce through torch.

NCCL hangs on its first all-reduce when peer-to-peer is broken (PCIe ACS, an IOMMU), or dies
when /dev/shm is too small. This check runs the all-reduce probe
(:mod:`gpudoctor.probes.allreduce_probe`) and, when it fails, once more with
NCCL_P2P_DISABLE=1 to tell a broken P2P path from everything else.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpudoctor.checks.multigpu import MIB, P2P_REMEDY, inventory

from gpudoctor.context import CheckContext
from gpudoctor.facts.allreduce import AllreduceRun, run_allreduce_probe
from gpudoctor.facts.multigpu import nccl_shm_bytes
from gpudoctor.model import Finding, Severity, Status
from gpudoctor.registry import check


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
