"""``gpudoctor service``: systemd units that make a CT heal itself after a reboot, the
textfile timer that feeds Prometheus, and the alerting rules."""

from __future__ import annotations

import os
import stat
import sys

import click

from gpudoctor.commands.options import FORCE_OUTPUT

GPUDOCTOR_HELP = (
    "Command that runs gpudoctor in the units (default: this interpreter with -I -m "
    "gpudoctor; -I is added to a PYTHON -m gpudoctor command)."
)


def _gpudoctor_argv(value: str | None) -> tuple[str, ...]:
    """Return the command the units run gpudoctor with: ``value`` split like a shell
    would, else this interpreter; ``PYTHON -m gpudoctor`` gets ``-I`` (isolated mode: the
    working directory, PYTHONPATH and the user's site-packages are not on sys.path)."""
    import shlex

    try:
        argv = tuple(shlex.split(value)) if value else (sys.executable, "-m", "gpudoctor")
    except ValueError as exc:  # an unclosed quote
        raise click.BadParameter(str(exc), param_hint="--gpudoctor") from exc
    if not argv:
        raise click.BadParameter("an empty command", param_hint="--gpudoctor")
    argv = (os.path.abspath(argv[0]) if argv[0].startswith("/") else argv[0], *argv[1:])
    if argv[1:3] == ("-m", "gpudoctor"):
        argv = (argv[0], "-I", *argv[1:])
    return argv


NOW = click.option(
    "--now", is_flag=True, help="Also `systemctl daemon-reload` and start it (root / only)."
)


def _report(done: list, root: str, unit: str, now: bool) -> None:
    """Print what was written (or found unchanged); with ``now``, reload systemd and start
    ``unit`` (``systemctl daemon-reload && systemctl start UNIT``)."""
    import subprocess

    for item in done:
        click.echo(f"{item.action} {item.path}")
    if root != "/":
        click.echo(f"installed under {root} and enabled there (runs at that system's next boot)")
        return
    if not now:
        reload = "systemctl daemon-reload && " if any(d.action == "wrote" for d in done) else ""
        click.echo(f"enabled at boot; start now with: {reload}systemctl start {unit}")
        return
    for argv in (["systemctl", "daemon-reload"], ["systemctl", "start", "--no-block", unit]):
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise click.ClickException(
                f"{' '.join(argv)}: {exc}; start it at the next boot"
            ) from exc
        if result.returncode != 0:
            raise click.ClickException(
                f"{' '.join(argv)} failed: {result.stderr.strip()[-300:]}; the unit is installed "
                "and enabled, it starts at the next boot"
            )
    click.echo(f"enabled at boot and started: {unit} (journalctl -u {unit} -f)")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def service() -> None:
    """Self-healing CTs and alerts: boot unit, Prometheus textfile timer, alert rules.

    \b
    Examples:
      gpudoctor service install plan.toml --out /var/lib/runs/q --device /dev/nvidia0
      gpudoctor service install-timer --ct 200 --ct 201      # on the node
      gpudoctor service rules -o /etc/prometheus/rules.d/gpudoctor.yml
    """


@service.command()
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(), help="The campaign's run directory.")
@click.option("--name", default="campaign", show_default=True, help="Unit gpudoctor-NAME.service.")
@click.option("--repo", help="Hub repo to restore first (default: the plan's [model] repo).")
@click.option("--to", "to", help="Weights directory (default and only choice when the plan names "
              "a repo: the plan's dir; for a plan's local path: that path).")  # fmt: skip
@click.option("--mirror", help="Persistent mirror root (default: the plan's [model] mirror).")
@click.option("--revision", help="Pinned revision (default: the plan's, else any complete one).")
@click.option("--device", "devices", multiple=True, metavar="PATH[:DRIVER]",
              help="Passed to `gpudoctor check` while waiting for the GPU. Repeatable.")  # fmt: skip
@click.option("--only", multiple=True, metavar="ID",
              help="Checks that must pass before the campaign (default: all). Repeatable.")  # fmt: skip
@click.option("--check-arg", "check_extra", multiple=True, metavar="ARG",
              help="Any other `gpudoctor check` argument. Repeatable.")  # fmt: skip
@click.option("--backoff", default="5:300", show_default=True, metavar="MIN:MAX",
              help="Seconds between GPU checks: MIN, doubling up to MAX.")  # fmt: skip
@click.option("--gpudoctor", "gpudoctor_cmd", metavar="CMD", help=GPUDOCTOR_HELP)
@click.option("--after-network", is_flag=True,
              help="Order the unit after network-online.target (default: only when the "
              "weights may come from the Hub, i.e. no --mirror).")  # fmt: skip
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Install under this root (a CT's rootfs, an image) instead of /; PLAN, "
              "--out and the interpreter are then paths inside it (resolved like chroot).")  # fmt: skip
@NOW
@click.option("--force", is_flag=True, help="Replace gpudoctor-NAME.service even when it "
              "serves another campaign (another --out) or gpudoctor did not write it.")  # fmt: skip
def install(
    plan: str, out: str, name: str, repo: str | None, to: str | None, mirror: str | None,
    revision: str | None, devices: tuple[str, ...], only: tuple[str, ...],
    check_extra: tuple[str, ...], backoff: str, gpudoctor_cmd: str | None,
    after_network: bool, root: str, now: bool, force: bool = False,
) -> None:  # fmt: skip
    """Write the CT's boot unit: wait for the GPU, restore the weights, resume PLAN.

    At every boot until the campaign is done, gpudoctor-NAME.service runs
    /usr/local/sbin/gpudoctor-NAME: `gpudoctor check` until it passes (one journal line
    per failed try), `gpudoctor weights ensure`, then `gpudoctor bench PLAN --out OUT`
    (which resumes: no cell runs twice). Once bench exits 0 it leaves
    OUT/.gpudoctor-service-done and later boots do nothing.

    The unit runs as root, so install refuses a plan, a directory above it, a program
    it names, the interpreter or --out that anyone but root can change. Run again with
    the same options, it reports each file "unchanged". A unit of that --name that
    serves another --out (another campaign) is never replaced unless --force is given.
    """
    from gpudoctor.service.campaign import (
        CampaignService,
        check_args_of,
        choose_weights,
        render_unit,
        render_wrapper,
    )
    from gpudoctor.service.install import UnitFile
    from gpudoctor.service.install import install as do_install
    from gpudoctor.service.unitfile import ServiceError

    try:
        low, _, high = backoff.partition(":")
        backoff_min, backoff_max = int(low), int(high or low)
    except ValueError as exc:
        raise click.BadParameter("expected MIN:MAX seconds", param_hint="--backoff") from exc
    # PLAN and OUT are paths as the target system sees them; with --root they are resolved
    # inside that root (a CT's rootfs mounted on the host) as chroot would.
    root = os.path.abspath(root)
    if not os.path.isdir(root):
        raise click.BadParameter(f"{root} is not a directory", param_hint="--root")
    if root != "/" and not os.path.isabs(out):
        raise click.BadParameter(
            f"{out} is relative: with --root give the run directory as the system under"
            f" {root} sees it (--out /var/lib/runs/{os.path.basename(out.rstrip('/')) or 'q'})",
            param_hint="--out",
        )
    plan = os.path.abspath(plan) if root == "/" else os.path.join("/", plan)
    loaded = _load_plan_in_root(root, plan)
    try:
        weights = choose_weights(loaded.model, repo, to and os.path.abspath(to), mirror, revision)
        svc = CampaignService(
            name=name,
            plan=plan,
            out=os.path.abspath(out),
            gpudoctor=_gpudoctor_argv(gpudoctor_cmd),
            check_args=check_args_of(devices, only, check_extra),
            weights=weights,
            backoff_min_s=backoff_min,
            backoff_max_s=backoff_max,
            after_network=after_network or bool(weights and not weights.mirror),
        )
    except ServiceError as exc:
        raise click.UsageError(str(exc)) from exc
    svc = _trusted_service(root, svc, loaded, gpudoctor_cmd is None)
    if not force:
        _refuse_another_campaign(root, svc)
    files = [
        UnitFile(svc.wrapper_path, render_wrapper(svc), 0o755),
        UnitFile(svc.unit_path, render_unit(svc), 0o644, "multi-user.target"),
    ]
    try:
        done = do_install(files, root)
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the unit: {exc}; run as root or use --root"
        ) from exc
    _report(done, root, svc.unit_name, now)


def _refuse_another_campaign(root: str, svc) -> None:  # type: ignore[no-untyped-def]
    """Raise ClickException (nothing written) when ``svc``'s unit is already installed
    under ``root`` for another run directory, or is a unit gpudoctor did not write: a
    second campaign must never silently take the first one's boot unit (issue 47.2)."""
    from gpudoctor import fsio, fsio_root
    from gpudoctor.service.campaign import campaign_of

    try:
        text = fsio_root.read_under_root(root, svc.unit_path).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError):
        return
    except fsio.FsioError as exc:
        if exc.errno == 2:
            return
        raise click.ClickException(f"cannot read the installed unit: {exc}") from None
    served = campaign_of(text)
    if served is not None and served.rstrip("/") == svc.out.rstrip("/"):
        return
    what = (f"serves another campaign (--out {served})" if served is not None
            else "was not written by gpudoctor service install")  # fmt: skip
    raise click.ClickException(
        f"{svc.unit_name} {what}; give --name NAME to install this campaign beside it,"
        " or --force to replace it (nothing was written)"
    )


def _load_plan_in_root(root: str, plan: str):  # type: ignore[no-untyped-def]
    """Return the Plan at ``plan`` read inside ``root`` (links resolved within it)."""
    from pathlib import PurePosixPath

    from gpudoctor import fsio, fsio_root
    from gpudoctor.bench.plan import PlanError, decode_plan, parse_plan

    shown = plan if root == "/" else f"{root.rstrip('/')}{plan}"
    try:
        text = decode_plan(fsio_root.read_under_root(root, plan), shown)
    except PlanError as exc:
        raise click.ClickException(str(exc)) from None
    except FileNotFoundError as exc:
        raise click.BadParameter(
            f"no plan file at {exc.filename or plan}", param_hint="PLAN"
        ) from None
    except fsio.FsioError as exc:
        if exc.errno == 2:
            where = f"{plan} inside {root} ({exc})" if root != "/" else plan
            raise click.BadParameter(f"no plan file at {where}", param_hint="PLAN") from None
        raise click.ClickException(f"cannot read the plan: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot read the plan {plan}: {exc}") from None
    try:
        return parse_plan(text, shown, base_dir=PurePosixPath(plan).parent)  # type: ignore[arg-type]
    except PlanError as exc:
        raise click.ClickException(str(exc)) from exc


def _trusted_service(root: str, svc, plan, default_cmd: bool):  # type: ignore[no-untyped-def]
    """Return ``svc`` once what its unit runs as root is root's alone (the plan and its
    directories, the programs it names, the interpreter, --out), with the interpreter
    found inside ``root``; ClickException naming the path and its owner otherwise."""
    import dataclasses

    from gpudoctor import fsio
    from gpudoctor.service import trust

    try:
        fsio.check_ancestors(root, "--root")
        trusted = trust.owners(root)
        command = svc.gpudoctor
        found = trust.resolve(root, command[0])
        if not trust.is_executable(found) and default_cmd and root != "/":
            script = trust.find_program(root, "gpudoctor")  # a pip-installed console script
            if trust.is_executable(trust.resolve(root, script)):
                command, found = (script,), trust.resolve(root, script)
        if not trust.is_executable(found):
            where = f"inside {root}" if root != "/" else "on this machine"
            raise click.ClickException(
                f"{command[0]} (the interpreter the unit runs) is not an executable file "
                f"{where}: the unit would fail at boot; install gpudoctor there and give "
                "--gpudoctor 'PYTHON -m gpudoctor' (PYTHON as a path inside the root)"
            )
        trust.judge(root, command[0], "the interpreter the unit runs", trusted)
        trust.judge(root, svc.plan, "the plan", trusted)
        engine = plan.engine
        trust.check_programs(root, [w for w in (engine.command[:1] or ()) if w] + (
            [engine.python] if engine.python else []), trusted)  # fmt: skip
        trust.judge(root, svc.out, "--out", trusted)
    except fsio.FsioError as exc:
        raise click.ClickException(f"refusing to install: {exc}") from None
    return dataclasses.replace(svc, gpudoctor=command)


@service.command("mark-done", hidden=True)
@click.argument("marker", type=click.Path(dir_okay=False))
def mark_done(marker: str) -> None:
    """Create the campaign's done marker (what the wrapper runs once bench exits 0).

    The marker is created O_CREAT|O_EXCL|O_NOFOLLOW in a directory that belongs to
    root or the caller and that no one else can write: a planted symlink or a directory
    another user controls is refused, never followed. An existing regular file is kept.
    """
    from gpudoctor import fsio

    path = os.path.abspath(marker)
    try:
        dir_fd = fsio.open_dir(os.path.dirname(path), require_trusted_dir=True)
        try:
            st = os.stat(os.path.basename(path), dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        try:
            if st is None or not stat.S_ISREG(st.st_mode):
                fsio.create_new(path, b"", dir_fd=dir_fd)  # refuses a link or FIFO there
            else:
                fsio.judge_owner(path, st, "the done marker", f"remove it (rm {path})")
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise click.ClickException(f"cannot create the done marker: {exc}") from None


@service.command("install-timer")
@click.option("--dir", "directory", default="/var/lib/prometheus/node-exporter",
              show_default=True, help="node_exporter's --collector.textfile.directory.")  # fmt: skip
@click.option("--every", default=5, show_default=True, type=int, help="Minutes between runs.")
@click.option("--ct", "cts", multiple=True, metavar="ID",
              help="Also check this CT of the node (one textfile each). Repeatable.")  # fmt: skip
@click.option("--check-arg", "check_extra", multiple=True, metavar="ARG",
              help="Any other `gpudoctor check` argument (--device, --flavor ...). Repeatable.")  # fmt: skip
@click.option("--gpudoctor", "gpudoctor_cmd", metavar="CMD", help=GPUDOCTOR_HELP)
@click.option("--root", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Install under this root instead of /.")  # fmt: skip
@NOW
def install_timer(
    directory: str, every: int, cts: tuple[str, ...], check_extra: tuple[str, ...],
    gpudoctor_cmd: str | None, root: str, now: bool,
) -> None:  # fmt: skip
    """Write gpudoctor-textfile.{service,timer}: the Prometheus textfile every N minutes.

    The node's own check goes to DIR/gpudoctor.prom, each --ct to DIR/gpudoctor-ct-ID.prom.
    Alert on them with `gpudoctor service rules`.
    """
    from gpudoctor.service.install import UnitFile
    from gpudoctor.service.install import install as do_install
    from gpudoctor.service.textfile import TextfileTimer, render_service, render_timer
    from gpudoctor.service.unitfile import ServiceError

    try:
        timer = TextfileTimer(os.path.abspath(directory), _gpudoctor_argv(gpudoctor_cmd),
                              every, cts, check_extra)  # fmt: skip
    except ServiceError as exc:
        raise click.UsageError(str(exc)) from exc
    files = [
        UnitFile(timer.service_path, render_service(timer)),
        UnitFile(timer.timer_path, render_timer(timer), 0o644, "timers.target"),
    ]
    try:
        paths = do_install(files, root)
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the units: {exc}; run as root or use --root"
        ) from exc
    _report(paths, root, f"gpudoctor-{timer.name}.timer", now)


@service.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the rules to this file (e.g. /etc/prometheus/rules.d/gpudoctor.yml).")  # fmt: skip
@FORCE_OUTPUT
def rules(output: str | None, force: bool = False) -> None:
    """Print (or write) the Prometheus alerting rules over gpudoctor's metrics.

    Alerts: GpudoctorCtGpuUnusable, GpudoctorHostDriverMissing, GpudoctorResultStale,
    GpudoctorTargetUnreachable, GpudoctorFragileConfig, GpudoctorGpuXid,
    GpudoctorNextKernelWithoutDriver. Add the file to `rule_files:` in prometheus.yml
    and reload Prometheus.
    """
    from gpudoctor.commands import output_owner
    from gpudoctor.commands.options import require_writable_file
    from gpudoctor.service import alert_rules_text

    require_writable_file(output, "-o", output_owner.alert_rules, force)
    text = alert_rules_text()
    if not output:
        click.echo(text, nl=False)
        return
    from gpudoctor.commands.options import write_named_output

    write_named_output(os.path.abspath(output), text, "-o")
    click.echo(f"wrote {output}; add it to rule_files: in prometheus.yml, then reload Prometheus")
