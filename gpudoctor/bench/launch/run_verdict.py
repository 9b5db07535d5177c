"""Whether a finished `bench run` measured what it set out to, in lines for stderr.

A run exits 0 only when every cell it ran is a result: none FAILED (its requests failed),
none crashed its server in this run (issue 45.8), none was client-bound (the load generator
did not hold the schedule, issue 45.9), and it measured anything at all (a run whose every
cell was skipped by a quirk measured nothing, issue 45.2). :func:`verdict_lines` says
which, each with what to do; ``gpudoctor bench run`` prints them and exits 3.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.bench.launch.steps import Summary


@dataclass(frozen=True)
class RunFacts:
    """What the verdict names besides the summary.

    Attributes:
        rerun: the command that runs the plan into its directory again
            (``gpudoctor bench PLAN --out DIR``).
        quirks: the local quirks table a crash was written to.
        failed: one line per failed cell (or configuration), and how many cells failed.
        crashed: one line per crashed cell.
    """

    rerun: str
    quirks: str
    failed: tuple[str, ...] = ()
    failed_count: int = 0
    crashed: tuple[str, ...] = ()


def verdict_lines(summary: Summary, facts: RunFacts, shown: int = 5) -> list[str]:
    """Return the stderr lines that make a finished run exit 3 (empty: exit 0): the first
    ``shown`` FAILED / CRASHED cells, then one line per reason with what to do next."""
    lines: list[str] = []
    if facts.failed_count:
        lines += [f"gpudoctor: FAILED: {line}" for line in facts.failed[:shown]]
        lines.append(
            f"gpudoctor: {facts.failed_count} cell(s) failed: their requests failed, their"
            f" numbers are not results; fix the cause above, then: {facts.rerun} --retry-failed"
        )
    if summary.crashed:
        lines += [f"gpudoctor: CRASHED: {line}" for line in facts.crashed[:shown]]
        lines.append(
            f"gpudoctor: {summary.crashed} cell(s) crashed their server in this run (a crash is"
            f" noted in the local quirks table {facts.quirks}, and later runs skip it): fix the"
            f" cause above, then: {facts.rerun} --retry-crashed"
        )
    if summary.client_bound:
        lines.append(
            f"gpudoctor: {summary.client_bound} cell(s) client-bound: the load generator did"
            " not send at the schedule's rate (the table's rate column says what it sent), so"
            " their numbers measure the client, not the server: lower the rate, or run the"
            " load from a less busy machine"
        )
    if summary.skipped and not (summary.already_done or summary.ok or summary.failed
                                or summary.crashed or summary.client_bound):  # fmt: skip
        lines.append(
            f"gpudoctor: nothing was measured: all {summary.skipped} cell(s) were skipped (the"
            " reasons above name each quirk and its table); to run them anyway:"
            f" {facts.rerun} --retry-crashed"
        )
    return lines
