"""The campaign unit of a CT: at boot, wait for the GPU, restore the weights, resume the
benchmark, and stop once the campaign is done.

Two files (pure rendering here; :mod:`gpudoctor.service.install` writes them):

* ``/etc/systemd/system/gpudoctor-NAME.service`` runs the wrapper; ``Restart=on-failure``
  retries a failed step; ``ConditionPathExists=!OUT/.gpudoctor-service-done`` makes
  every boot after the campaign finished a no-op.
* ``/usr/local/sbin/gpudoctor-NAME``: a POSIX sh script (runnable by hand too):

  1. ``gpudoctor check ARGS`` until it exits 0, sleeping MIN, 2*MIN, ... MAX seconds
     between tries; each failed try prints ONE journal line with the FAIL verdicts;
  2. ``gpudoctor weights ensure REPO --to DIR --mirror MIRROR`` (when a repo is given);
  3. ``gpudoctor bench PLAN --out OUT`` (resumes by default: every recorded cell is kept);
  4. once bench exits 0, ``gpudoctor service mark-done OUT/.gpudoctor-service-done``
     creates the done marker (``O_CREAT|O_EXCL|O_NOFOLLOW`` in a trusted directory: a
     planted link makes it fail, never write elsewhere), then exit 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpudoctor.service.unitfile import (
    UNIT_DIR,
    ServiceError,
    check_name,
    check_path,
    check_words,
    exec_line,
    sh_words,
)

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import ModelSpec

WRAPPER_DIR = "/usr/local/sbin"
DONE_MARKER = ".gpudoctor-service-done"
UNIT_FIRST_LINE = "# Written by `gpudoctor service install`: run it again to change this unit."


@dataclass(frozen=True)
class Weights:
    """What ``gpudoctor weights ensure`` restores before the campaign.

    Attributes:
        repo: Hub repository id (``org/name``).
        to: the target directory (tmpfs, e.g. ``/dev/shm/qwen``).
        mirror: the persistent mirror root (``--mirror``), or None (download from the Hub).
        revision: a pinned revision, or None (whatever is complete locally is accepted).
    """

    repo: str
    to: str
    mirror: str | None = None
    revision: str | None = None

    def argv(self) -> list[str]:
        """Return the ``weights ensure`` arguments (after ``gpudoctor``)."""
        argv = ["weights", "ensure", self.repo, "--to", self.to]
        if self.mirror:
            argv += ["--mirror", self.mirror]
        if self.revision:
            argv += ["--revision", self.revision]
        return argv


@dataclass(frozen=True)
class CampaignService:
    """One campaign's boot unit.

    Attributes:
        name: the unit is ``gpudoctor-NAME.service``, the wrapper ``gpudoctor-NAME``.
        plan: the bench plan file (absolute).
        out: the run directory (absolute); it holds the done marker.
        gpudoctor: the command that runs gpudoctor (e.g. ``["/opt/venv/bin/python", "-m",
            "gpudoctor"]``), absolute.
        check_args: extra ``gpudoctor check`` arguments (``--device``, ``--only`` ...).
        weights: what to restore first, or None (the plan's own model step still runs).
        bench_args: extra ``gpudoctor bench`` arguments.
        backoff_min_s, backoff_max_s: seconds between ``check`` tries (doubling).
        restart_s: systemd's ``RestartSec`` after a failed step.
        after_network: order the unit after ``network-online.target`` (the weights may
            come from the Hub); otherwise a CT whose network never comes online starts
            the campaign at once.
    """

    name: str
    plan: str
    out: str
    gpudoctor: tuple[str, ...]
    check_args: tuple[str, ...] = ()
    weights: Weights | None = None
    bench_args: tuple[str, ...] = ()
    backoff_min_s: int = 5
    backoff_max_s: int = 300
    restart_s: int = 60
    after_network: bool = False

    def __post_init__(self) -> None:
        check_name(self.name)
        check_path(self.plan, "the plan")
        check_path(self.out, "--out")
        check_words(self.gpudoctor, "--gpudoctor")
        check_words(self.check_args, "--check-arg")
        check_words(self.bench_args, "a bench argument")
        if self.weights:
            check_words(self.weights.argv(), "the weights step")
        if not self.gpudoctor or not self.gpudoctor[0].startswith("/"):
            raise ServiceError("the gpudoctor command must start with an absolute path")
        if not 1 <= self.backoff_min_s <= self.backoff_max_s:
            raise ServiceError("backoff: need 1 <= min <= max seconds")

    @property
    def unit_name(self) -> str:
        """Return ``gpudoctor-NAME.service``."""
        return f"gpudoctor-{self.name}.service"

    @property
    def unit_path(self) -> str:
        """Return where the unit goes (``/etc/systemd/system/gpudoctor-NAME.service``)."""
        return f"{UNIT_DIR}/{self.unit_name}"

    @property
    def wrapper_path(self) -> str:
        """Return where the wrapper goes (``/usr/local/sbin/gpudoctor-NAME``)."""
        return f"{WRAPPER_DIR}/gpudoctor-{self.name}"

    @property
    def done_marker(self) -> str:
        """Return the file that says the campaign is done (``OUT/.gpudoctor-service-done``)."""
        return f"{self.out.rstrip('/')}/{DONE_MARKER}"


def render_unit(svc: CampaignService) -> str:
    """Return the text of ``gpudoctor-NAME.service``."""
    title = "gpudoctor campaign" if svc.name == "campaign" else f"gpudoctor campaign {svc.name}"
    order = (
        "Wants=network-online.target\nAfter=network-online.target local-fs.target"
        if svc.after_network
        else "After=local-fs.target"
    )
    return f"""\
{UNIT_FIRST_LINE}
[Unit]
Description={title}: wait for the GPU, restore the weights, resume the benchmark
{order}
ConditionPathExists=!{svc.done_marker.replace("%", "%%")}
StartLimitIntervalSec=0

[Service]
Type=exec
ExecStart={exec_line([svc.wrapper_path])}
Restart=on-failure
RestartSec={svc.restart_s}
TimeoutStopSec=90
KillMode=control-group
SyslogIdentifier=gpudoctor-{svc.name}
Environment=PYTHONUNBUFFERED=1

[Install]
WantedBy=multi-user.target
"""


def campaign_of(unit_text: str) -> str | None:
    """Return the run directory (``--out``) that an installed campaign unit serves, read
    from its ``ConditionPathExists=!OUT/.gpudoctor-service-done`` line; None when
    ``unit_text`` is not a unit ``service install`` wrote (issue 47.2)."""
    if not unit_text.startswith(UNIT_FIRST_LINE + "\n"):
        return None
    suffix = f"/{DONE_MARKER}"
    for line in unit_text.splitlines():
        if line.startswith("ConditionPathExists=!") and line.endswith(suffix):
            return line[len("ConditionPathExists=!") : -len(suffix)].replace("%%", "%")
    return None


def render_wrapper(svc: CampaignService) -> str:
    """Return the wrapper script the unit runs (POSIX sh; busybox sh runs it too)."""
    gd = sh_words(svc.gpudoctor)
    check = sh_words(["check", *svc.check_args])
    weights = (
        f"""log {sh_words(["restoring the weights: gpudoctor " + sh_words(svc.weights.argv())])}
{gd} {sh_words(svc.weights.argv())} || {{ rc=$?; log "weights ensure failed (exit $rc)"; exit "$rc"; }}
"""
        if svc.weights
        else 'log "no weights to restore (the plan\'s own model step runs in bench)"\n'
    )
    bench = sh_words(["bench", svc.plan, "--out", svc.out, *svc.bench_args])
    return f"""\
#!/bin/sh
# gpudoctor campaign "{svc.name}": written by `gpudoctor service install` (run it again to
# change this file). Started at boot by {svc.unit_name}; runnable by hand as well.
#   1. wait until `gpudoctor check` passes (backoff {svc.backoff_min_s}..{svc.backoff_max_s} s)
#   2. restore the weights   3. resume the campaign   4. stop once it is done
set -u
cd / || exit 1  # nothing of the caller's working directory is imported or read
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HOME=${{HOME:-/root}}
export PATH HOME
log() {{ echo "gpudoctor-{svc.name}: $*"; }}
DONE={sh_words([svc.done_marker])}
if [ -e "$DONE" ]; then log "campaign already done ($DONE): nothing to do"; exit 0; fi

delay={svc.backoff_min_s}
try=1
while :; do
  report=$({gd} {check} 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] && break
  why=$(printf '%s\\n' "$report" | grep -E '^(FAIL|ERROR) ' | head -n 4 | tr '\\n' ' ')
  [ -n "$why" ] || why=$(printf '%s\\n' "$report" | tail -n 1)
  log "waiting for the GPU: gpudoctor check failed (exit $rc, try $try): $why; retrying in ${{delay}}s"
  sleep "$delay"
  try=$((try + 1))
  delay=$((delay * 2))
  [ "$delay" -gt {svc.backoff_max_s} ] && delay={svc.backoff_max_s}
done
log "GPU ready: gpudoctor check passed (try $try)"

{weights}
log {sh_words(["resuming the campaign: gpudoctor " + bench])}
{gd} {bench}
rc=$?
if [ "$rc" -eq 0 ]; then
  {gd} {sh_words(["service", "mark-done", svc.done_marker])} || exit $?
  log "campaign done: {svc.unit_name} will not run again ($DONE)"
  exit 0
fi
log "campaign stopped: gpudoctor bench exit $rc"
exit "$rc"
"""


def choose_weights(
    model: ModelSpec, repo: str | None, to: str | None, mirror: str | None,
    revision: str | None,
) -> Weights | None:  # fmt: skip
    """Return what the wrapper restores: the plan's ``[model]`` repo/dir/mirror/revision,
    overridden by ``--repo/--to/--mirror/--revision``; None when there is nothing to
    restore. Raise ServiceError for an override bench would undo: a plan that names a repo
    has bench ensure it into its own ``dir`` again, so ``--repo``, ``--to`` and
    ``--revision`` must match it (else the weights would be restored twice), and ``--to``
    must be the directory the servers load."""
    if bool(repo) != bool(to) and not model.repo:
        raise ServiceError("--repo and --to go together")
    if model.repo and model.dir:
        for option, given, planned in (("--repo", repo, model.repo), ("--to", to, model.dir),
                                       ("--revision", revision, model.revision)):  # fmt: skip
            if given and planned and given.rstrip("/") != str(planned).rstrip("/"):
                raise ServiceError(
                    f"{option} {given} differs from the plan's [model] {option[2:]} {planned}:"
                    " bench ensures the plan's weights itself, so they would be restored twice;"
                    f" leave {option} out or change the plan"
                )
        return Weights(model.repo, str(model.dir), mirror or model.mirror,
                       revision or model.revision)  # fmt: skip
    if not (repo and to):
        return None
    if to.rstrip("/") != model.local_dir.rstrip("/"):
        raise ServiceError(
            f"--to {to} is not the directory the plan's servers load ({model.local_dir}):"
            " the restored weights would not be used; give --to "
            f"{model.local_dir} or change the plan"
        )
    return Weights(repo, to, mirror, revision)


def check_args_of(devices: Sequence[str], only: Sequence[str], extra: Sequence[str]) -> tuple:
    """Return ``gpudoctor check`` arguments for ``--device``/``--only`` values plus extras."""
    args: list[str] = []
    for device in devices:
        args += ["--device", device]
    for ident in only:
        args += ["--only", ident]
    return (*args, *extra)
