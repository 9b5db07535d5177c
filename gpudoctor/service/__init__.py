"""systemd units that keep a GPU container healthy without a human.

* :mod:`gpudoctor.service.campaign`: the boot unit of a CT (wait for the GPU, restore the
  weights, resume the benchmark campaign, stop once it is done) and its wrapper script.
* :mod:`gpudoctor.service.textfile`: the service + timer that writes the Prometheus
  textfile (``gpudoctor check --format prometheus -o FILE``) every N minutes.
* :mod:`gpudoctor.service.install`: writes those files under a root directory and enables
  them the way ``systemctl --root=ROOT enable`` does (a symlink in ``*.wants/``).
* ``alerts.yml``: the Prometheus alerting rules over gpudoctor's metrics.

Rendering is pure (dataclass in, text out); only :mod:`~gpudoctor.service.install` writes.
"""

from __future__ import annotations

from importlib import resources


def alert_rules_text() -> str:
    """Return the shipped Prometheus alerting rules (YAML text of ``alerts.yml``)."""
    return resources.files(__package__).joinpath("alerts.yml").read_text(encoding="utf-8")
