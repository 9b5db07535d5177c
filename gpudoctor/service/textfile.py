"""The Prometheus textfile unit pair: ``gpudoctor-textfile.service`` (oneshot) runs
``gpudoctor check --format prometheus -o DIR/gpudoctor*.prom`` for the node and for each
CT named, and ``gpudoctor-textfile.timer`` starts it every N minutes.

node_exporter's textfile collector (``--collector.textfile.directory=DIR``) serves every
``*.prom`` file of DIR; ``check -o`` replaces each file atomically, so a scrape never sees
half a file. A check with findings exits 3 (4: nothing was checked), which is a successful run
here (``SuccessExitStatus=3 4``); each ``ExecStart=`` is prefixed with ``-`` so one target that
errors does not keep the others from being written.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gpudoctor.service.unitfile import (
    UNIT_DIR,
    ServiceError,
    check_name,
    check_path,
    check_words,
    exec_line,
)

DEFAULT_DIR = "/var/lib/prometheus/node-exporter"


@dataclass(frozen=True)
class TextfileTimer:
    """What the timer checks and where it writes.

    Attributes:
        directory: node_exporter's textfile directory (absolute).
        gpudoctor: the command that runs gpudoctor (absolute first word).
        every_min: minutes between runs.
        cts: CTs of this node to check from outside (``--ct ID``, one file each).
        check_args: extra ``gpudoctor check`` arguments for every run (``--device`` ...).
        name: the units are ``gpudoctor-NAME.service`` / ``.timer``.
    """

    directory: str
    gpudoctor: tuple[str, ...]
    every_min: int = 5
    cts: tuple[str, ...] = ()
    check_args: tuple[str, ...] = ()
    name: str = "textfile"

    def __post_init__(self) -> None:
        check_name(self.name)
        check_path(self.directory, "the textfile directory")
        check_words(self.gpudoctor, "--gpudoctor")
        check_words(self.check_args, "--check-arg")
        if not self.gpudoctor or not self.gpudoctor[0].startswith("/"):
            raise ServiceError("the gpudoctor command must start with an absolute path")
        if not 1 <= self.every_min <= 1440:
            raise ServiceError("--every must be 1..1440 minutes")
        args = self.check_args
        plain_lxc = "--flavor=lxc" in args or ("--flavor", "lxc") in itertools.pairwise(args)
        for ct in self.cts:
            check_name(ct)
            if not plain_lxc and not ct.isdigit():
                raise ServiceError(
                    f"--ct {ct!r}: a Proxmox CT id is a number "
                    "(plain LXC names: --check-arg=--flavor=lxc)"
                )

    @property
    def service_path(self) -> str:
        """Return ``/etc/systemd/system/gpudoctor-NAME.service``."""
        return f"{UNIT_DIR}/gpudoctor-{self.name}.service"

    @property
    def timer_path(self) -> str:
        """Return ``/etc/systemd/system/gpudoctor-NAME.timer``."""
        return f"{UNIT_DIR}/gpudoctor-{self.name}.timer"

    def runs(self) -> list[tuple[str, list[str]]]:
        """Return ``(textfile path, gpudoctor check argv)`` per run: the node itself, then
        each CT (``--ct ID``: inside the CT and its config on this node)."""
        base = ["check", "--format", "prometheus", *self.check_args]
        runs = [(f"{self.directory}/gpudoctor.prom", base)]
        for ct in self.cts:
            path = f"{self.directory}/gpudoctor-ct-{ct}.prom"
            runs.append((path, [*base, "--ct", ct]))
        return [(path, [*argv, "-o", path]) for path, argv in runs]


def render_service(timer: TextfileTimer) -> str:
    """Return the text of ``gpudoctor-NAME.service`` (Type=oneshot, one ExecStart per run)."""
    execs = "\n".join(
        "ExecStart=-" + exec_line([*timer.gpudoctor, *argv]) for _, argv in timer.runs()
    )
    return f"""\
# Written by `gpudoctor service install-timer`: run it again to change this unit.
[Unit]
Description=gpudoctor: write the Prometheus textfile ({timer.directory})
After=local-fs.target

[Service]
Type=oneshot
ExecStartPre=/bin/mkdir -p {exec_line([timer.directory])}
{execs}
SuccessExitStatus=3 4
TimeoutStartSec={max(60, timer.every_min * 60 - 10)}
SyslogIdentifier=gpudoctor-{timer.name}
"""


def render_timer(timer: TextfileTimer) -> str:
    """Return the text of ``gpudoctor-NAME.timer`` (every ``every_min`` minutes, first run
    one minute after boot)."""
    return f"""\
# Written by `gpudoctor service install-timer`: run it again to change this unit.
[Unit]
Description=gpudoctor: Prometheus textfile every {timer.every_min} min

[Timer]
OnBootSec=1min
OnUnitActiveSec={timer.every_min}min
AccuracySec=10s
Unit=gpudoctor-{timer.name}.service

[Install]
WantedBy=timers.target
"""
