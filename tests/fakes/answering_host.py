"""AnsweringHost: a Host on which one probe command runs and gives a set answer.

It stands for a machine with NVIDIA GPUs (and, for the all-reduce probe, torch and NCCL)
on which gpudoctor's P2P or all-reduce probe runs as a child process: this CPU-only machine
cannot run them for real. It answers every ``run`` with ``answer`` and records the argv and
timeout it was given; its files and nodes are a RecordedHost's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpudoctor.hosts.base import CommandResult
from tests.fakes.recorded_host import RecordedHost


@dataclass
class AnsweringHost(RecordedHost):
    """A RecordedHost whose commands all give ``answer``; ``ran``: [(argv, timeout)]."""

    answer: CommandResult = field(default_factory=lambda: CommandResult((), 0))
    ran: list[tuple[list[str], float]] = field(default_factory=list)

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        self.ran.append((list(argv), timeout))
        return self.answer
