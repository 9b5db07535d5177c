"""The ``gpudoctor`` console script and ``python -m gpudoctor``: start the probe, then the CLI.

The imports run one way only: this module starts :mod:`gpudoctor.early_probe` (stdlib
``os``/``sys``, before click is imported, so ``check``'s GPU probe overlaps the CLI's own
start-up: docs/performance.md), then hands over to :mod:`gpudoctor.cli`. ``early_probe``
imports nothing of the CLI; the CLI reads ``early_probe.wanted`` (cli -> early_probe).
"""

from __future__ import annotations

import sys


def main() -> None:
    """Start ``check``'s GPU probe when it is wanted, then run the CLI
    (:func:`gpudoctor.cli.run`), which exits with the command's code: never returns."""
    from gpudoctor.early_probe import start

    start(sys.argv)
    from gpudoctor.cli import run

    run()
