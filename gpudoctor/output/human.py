"""Human output: one line per finding, with evidence, remedy and fix command under problems.

Colour comes from rich and is off when NO_COLOR is set or stdout is not a terminal. A
finding's text may carry a CT's strings (file names, command output): every control
character in it is shown escaped (:func:`gpudoctor.terminal.printable`; rich drops BEL and
CR but passes ESC, so a CT could clear root's screen or write its clipboard).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from rich.console import Console
from rich.text import Text

from gpudoctor.model import Finding, Report, Status, worst
from gpudoctor.terminal import printable

STYLE = {
    Status.PASS: "green",
    Status.SKIP: "dim",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
}
INDENT = " " * 6


def finding_lines(f: Finding, verbose: bool) -> list[Text]:
    """Return the lines that show one finding."""
    head = Text()
    head.append(f"{f.status.value:<5} ", style=STYLE[f.status])
    head.append(f"{f.check_id}  ", style="bold")
    subject = (
        "" if f.subject in ("check", "") or f.message.startswith(f.subject) else f"{f.subject}: "
    )
    head.append(printable(subject + f.message))
    lines = [head]
    problem = f.status in (Status.WARN, Status.FAIL, Status.ERROR)
    if verbose or problem:
        lines += [Text(f"{INDENT}· {printable(e)}", style="dim") for e in f.evidence if e]
    if problem and f.remediation:
        lines.append(Text(f"{INDENT}remedy: {printable(f.remediation)}", style="cyan"))
    if problem and f.fix_hint and f.fix_hint not in (f.remediation or ""):  # never twice
        lines.append(Text(f"{INDENT}or run: {printable(f.fix_hint)}", style="cyan"))
    return lines


def summary(reports: Sequence[Report]) -> Text:
    """Return the closing line: counts per status and the wall time."""
    counts = Counter(f.status for r in reports for f in r.findings)
    status = worst(r.status for r in reports)
    text = Text()
    text.append(f"{status.value}", style=STYLE[status])
    parts = [f"{counts[s]} {s.value}" for s in Status if counts[s]]
    targets = printable(", ".join(r.target for r in reports))
    seconds = max((r.duration_s for r in reports), default=0.0)
    text.append(f"  {targets}: {', '.join(parts) or 'no findings'} in {seconds:.2f} s")
    return text


def write_human(reports: Sequence[Report], stream: TextIO, verbose: bool = False) -> None:
    """Write the reports for a person (problems first within each target)."""
    console = Console(file=stream, highlight=False, soft_wrap=True, emoji=False)
    for report in reports:
        if len(reports) > 1:
            console.print(Text(f"== {printable(report.target)}", style="bold"))
        for f in sorted(report.findings, key=lambda f: -f.status.rank if f.status.rank > 2 else 0):
            for line in finding_lines(f, verbose):
                console.print(line)
    console.print(summary(reports))
