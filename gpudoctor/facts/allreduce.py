"""The all-reduce probe's facts: run the launcher on a host, parse how every rank ended.

See :mod:`gpudoctor.probes.allreduce_probe` for what runs (one torch process per GPU, an NCCL
all-reduce with NVLink multicast off); this module is pure except :func:`run_allreduce_probe`,
which goes through ``host.run``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpudoctor.facts.multigpu import probe_source
from gpudoctor.hosts.base import Host


@dataclass(frozen=True)
class RankOutcome:
    """How one rank of the all-reduce probe ended.

    Attributes:
        rank: its rank (= its GPU index).
        step: the last step it announced (``import``, ``init``, ``allreduce``, ``bandwidth``,
            ``done``; ``start`` when it printed nothing).
        returncode: its exit status (-9 when the launcher killed it), None if unknown.
        result: its final result (sum_ok, busbw_gbps, nccl_version, ...), empty if none.
        checked: the verified small all-reduce (sum_ok, ...) announced before the timed
            64 MiB ones; set even when those never finished.
    """

    rank: int
    step: str
    returncode: int | None
    result: dict[str, Any] = field(default_factory=dict)
    checked: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AllreduceRun:
    """One all-reduce probe run.

    Attributes:
        world_size: ranks started.
        ranks: each rank's outcome.
        timed_out: True when the launcher's deadline passed (or the launcher was killed).
        error: ``no_torch`` when torch is not importable there, else "".
        error_detail: the launcher's explanation of ``error``.
        transports: NCCL's ``via ...`` transports seen in the logs (``P2P/CUMEM``, ``SHM``).
        warnings: ``NCCL WARN`` / error lines of the ranks' logs.
        stderr_tail: {rankK: last lines of its stderr}.
        env: the NCCL_/TORCH_/NVSHMEM_ variables the ranks ran with.
        extra_env: variables this run added (``NCCL_P2P_DISABLE=1`` for the retry).
        elapsed_s: the launcher's wall time in seconds.
        timeout_s: the deadline the launcher ran under.
    """

    world_size: int
    ranks: tuple[RankOutcome, ...]
    timed_out: bool = False
    error: str = ""
    error_detail: str = ""
    transports: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    stderr_tail: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    extra_env: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    timeout_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Return True when every rank finished with the right sum."""
        return (
            not self.timed_out
            and not self.error
            and len(self.ranks) == self.world_size
            and all(r.result.get("sum_ok") is True for r in self.ranks)
        )

    @property
    def wrong_sum(self) -> list[RankOutcome]:
        """Return the ranks whose all-reduce result was wrong."""
        return [r for r in self.ranks if (r.result or r.checked).get("sum_ok") is False]

    @property
    def crashed(self) -> list[RankOutcome]:
        """Return the ranks that exited on their own with a non-zero status."""
        return [r for r in self.ranks if r.returncode not in (0, None, -9) and not r.result]

    @property
    def stuck(self) -> list[RankOutcome]:
        """Return the ranks that never finished (killed, or still running at the deadline)."""
        return [r for r in self.ranks if not r.result and r not in self.crashed]

    def describe_failure(self) -> str:
        """Return one or two sentences saying how an all-reduce run failed."""
        if self.error:
            return f"The all-reduce launcher failed: {self.error_detail or self.error}."
        if self.wrong_sum:
            got = self.wrong_sum[0].result or self.wrong_sum[0].checked
            ranks = ", ".join(str(x.rank) for x in self.wrong_sum)
            return (
                f"The all-reduce returned WRONG values on rank(s) {ranks} "
                f"({got.get('wrong_elements')} of {got.get('elements')} elements; first "
                f"{got.get('first_value')}, expected {got.get('expected_first')}): data is "
                "corrupted between GPUs."
            )
        if self.crashed:
            r = self.crashed[0]
            warn = next((w for w in self.warnings if "WARN" in w), "")
            return (
                f"Rank {r.rank} exited {r.returncode} during {r.step}"
                + (f" ({warn.split('NCCL WARN', 1)[-1].strip()})" if warn else "")
                + "."
            )
        by_step: dict[str, list[str]] = {}
        for r in self.stuck:
            by_step.setdefault(r.step, []).append(str(r.rank))
        steps = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)} in {step}"
            for step, ranks in by_step.items()
        )
        text = (
            f"The all-reduce across {self.world_size} GPUs did not finish within "
            f"{self.timeout_s:g} s ({steps})."
        )
        if self.stuck and all(r.checked.get("sum_ok") for r in self.stuck):
            text += (
                " The first, 4 MiB all-reduce gave the right sum; the timed 64 MiB ones hung "
                "(large transfers fail where small ones pass)."
            )
        return text

    def evidence(self) -> list[str]:
        """Return the evidence lines of one all-reduce self."""
        lines = [
            f"ranks: {self.world_size}, deadline {self.timeout_s:g} s, took {self.elapsed_s:.1f} s"
            + (f", extra env {' '.join(self.extra_env)}" if self.extra_env else ""),
            "env: "
            + " ".join(f"{k}={v}" for k, v in sorted(self.env.items()) if k != "NCCL_DEBUG_SUBSYS"),
            "NCCL transports: " + (", ".join(self.transports) or "none logged"),
        ]
        for r in self.ranks:
            res = r.result
            lines.append(
                f"rank {r.rank}: step {r.step}, exit {r.returncode}"
                + (
                    f", sum_ok {res.get('sum_ok')}, busbw {res.get('busbw_gbps')} GB/s"
                    if res
                    else ""
                )
            )
        lines += self.warnings[:5]
        return lines


def parse_allreduce_output(stdout: str, world_size: int, **run: Any) -> AllreduceRun:
    """Return the AllreduceRun for the launcher's JSON-lines ``stdout``."""
    steps: dict[int, str] = {}
    results: dict[int, dict[str, Any]] = {}
    checked: dict[int, dict[str, Any]] = {}
    launcher: dict[str, Any] = {}
    for line in stdout.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        stage = str(obj.get("stage", ""))
        if stage == "launcher" and not obj.get("started"):
            launcher = obj
        elif stage.startswith("rank") and stage[4:].isdigit():
            rank = int(stage[4:])
            if "result" in obj:
                results[rank], steps[rank] = dict(obj["result"]), "done"
            elif "step" in obj:
                steps[rank] = str(obj["step"])
                if isinstance(obj.get("checked"), dict):
                    checked[rank] = dict(obj["checked"])
    codes = {int(r["rank"]): r.get("returncode") for r in launcher.get("ranks", [])}
    ranks = tuple(
        RankOutcome(k, steps.get(k, "start"), codes.get(k), results.get(k, {}), checked.get(k, {}))
        for k in range(world_size)
    )
    killed = bool(run.pop("killed", False))
    error = str(launcher.get("error", "")) if launcher else ("" if killed else "no_result")
    return AllreduceRun(
        world_size=world_size,
        ranks=ranks,
        timed_out=bool(launcher.get("timed_out")) or killed,
        error=error,
        error_detail=str(launcher.get("detail", "")),
        transports=tuple(launcher.get("transports", ())),
        warnings=tuple(launcher.get("warnings", ())),
        stderr_tail=dict(launcher.get("stderr_tail", {})),
        env=dict(launcher.get("env", {})),
        elapsed_s=float(launcher.get("elapsed_s", 0.0)),
        **run,
    )


def run_allreduce_probe(
    host: Host,
    world_size: int,
    timeout_s: float,
    extra_env: Sequence[str] = (),
    backend: str = "nccl",
) -> AllreduceRun:
    """Run the all-reduce launcher on ``host`` with ``host.python`` (which must import torch)
    and return how every rank ended. ``extra_env``: ``KEY=VALUE`` for the ranks.

    Equivalent: ``torchrun --nproc-per-node N allreduce.py`` with NCCL_NVLS_ENABLE=0.
    """
    argv = [
        host.python,
        "-c",
        probe_source("allreduce_probe"),
        "launch",
        "--world-size",
        str(world_size),
        "--timeout",
        f"{timeout_s:g}",
        "--backend",
        backend,
    ]
    for item in extra_env:
        argv += ["--env", item]
    result = host.run(argv, timeout=timeout_s + 8)
    run = parse_allreduce_output(
        result.stdout,
        world_size,
        killed=result.timed_out,
        extra_env=tuple(extra_env),
        timeout_s=timeout_s,
    )
    if run.error == "no_result":
        detail = f"the launcher exited {result.returncode} without a result: "
        detail += result.stderr.strip()[-500:] or "(no stderr)"
        return replace(run, error_detail=detail, stderr_tail={"launcher": result.stderr[-1500:]})
    return run
