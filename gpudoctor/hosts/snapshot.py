"""A per-run snapshot of a target: answers an agent gave in one pipelined round trip
(:meth:`gpudoctor.hosts.agent.client.AgentHost.prefetch`), served again to the checks."""

from __future__ import annotations

from typing import Any


def snapshot_key(op: str, args: dict[str, Any]) -> tuple[Any, ...]:
    """Return the key of one request in a snapshot (``nodes_only`` is a prefetch detail,
    not part of the question)."""
    return (op, *sorted((k, v) for k, v in args.items() if k != "nodes_only"))


class Kept:
    """One prefetched answer: a result (a fresh copy each time) or an OSError (raised anew)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def result(self) -> Any:
        """Return a copy of the result (dict, list or str), or raise a new OSError like
        the kept one."""
        answer = self.answer
        if isinstance(answer, OSError):
            raise OSError(answer.errno, answer.strerror, answer.filename)
        if isinstance(answer, dict):
            return dict(answer)
        if isinstance(answer, list):
            return list(answer)
        return answer
