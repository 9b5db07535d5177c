"""Report formats: human (rich), JSON (versioned schema), Prometheus textfile."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TextIO

from gpudoctor.model import Report


class Format(str, enum.Enum):
    """The output formats of ``gpudoctor check``."""

    HUMAN = "human"
    JSON = "json"
    PROMETHEUS = "prometheus"


def render(reports: Sequence[Report], fmt: Format, stream: TextIO, verbose: bool = False) -> None:
    """Write ``reports`` to ``stream`` in ``fmt`` (formatters are imported on demand)."""
    if fmt is Format.JSON:
        from gpudoctor.output.json_out import write_json

        write_json(reports, stream)
    elif fmt is Format.PROMETHEUS:
        from gpudoctor.output.prometheus import write_prometheus

        write_prometheus(reports, stream)
    else:
        from gpudoctor.output.human import write_human

        write_human(reports, stream, verbose=verbose)
