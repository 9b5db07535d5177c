"""``gpudoctor check``: run the catalogue here, on a host, inside a container, or on a fleet."""

from __future__ import annotations

import os
import sys

import click

from gpudoctor import errors
from gpudoctor.commands import output_owner
from gpudoctor.commands.options import (
    ACCEPT_NEW_HOST_KEY,
    CHECK_TIMEOUT,
    COUNT_MAX,
    FLAVOR,
    FORCE_OUTPUT,
    KNOWN_HOSTS,
    LXCPATH,
    SECONDS,
    api_options,
    cluster_option,
    exclusive,
    inventory_option,
    non_empty_host,
    require_writable_file,
    write_named_output,
)
from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.exit_codes import ExitCode
from gpudoctor.model import Report, Status
from gpudoctor.output import Format, render


def parse_devices(values: tuple[str, ...]) -> tuple[DeviceRequest, ...]:
    """Return the ``--device`` requests; raise click.BadParameter on a malformed one."""
    try:
        return tuple(DeviceRequest.parse(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--device") from exc


def split_ids(values: tuple[str, ...]) -> tuple[str, ...]:
    """Return check ids from repeated and comma-separated ``--only`` values."""
    return tuple(part.strip() for v in values for part in v.split(",") if part.strip())


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file + rename (node_exporter never reads half),
    mode 0644; a symlink, FIFO or device there is refused (:func:`gpudoctor.fsio.write_output`);
    returns None; OutputNotWritable naming the path when it cannot be written."""
    write_named_output(path, text, "-o")


def exit_code(reports: list[Report]) -> int:
    """Return 3 when any finding is FAIL or ERROR, 4 when every finding is SKIP (nothing
    was checked), else 0 (warnings allowed)."""
    bad = {Status.FAIL, Status.ERROR}
    findings = [f for r in reports for f in r.findings]
    if any(f.status in bad for f in findings):
        return ExitCode.FAILED
    if all(f.status is Status.SKIP for f in findings):
        return ExitCode.NOTHING_DONE
    return ExitCode.OK


def nothing_checked_line(reports: list[Report]) -> str:
    """Return the stderr line of a run whose every check SKIPped (exit NOTHING_DONE, 4)."""
    findings = [f for r in reports for f in r.findings]
    why = f" (first: {findings[0].check_id}: {findings[0].message})" if findings else ""
    return (
        f"gpudoctor: nothing was checked: all {len(findings)} finding(s) are SKIP{why}; run "
        f"it where the GPU is, or widen --only (exit {ExitCode.NOTHING_DONE})"
    )


def validate_selection(only: tuple[str, ...], ct: str | None, flavor: str, fleet: bool) -> None:
    """Raise click.UsageError for a --ct or --only that cannot work, before any work."""
    if ct and flavor == "pve" and not fleet and not ct.isdigit():
        raise click.UsageError(
            f"--ct {ct!r}: a Proxmox CT id is a number (200); for a plain LXC container "
            "name add --flavor lxc"
        )
    if not only or ct or fleet:
        return
    from gpudoctor.registry import load_catalogue

    catalogue = load_catalogue()
    for wanted in only:
        matching = [s for s in catalogue if wanted in (s.id, s.family)]
        if matching and all(s.scope == "ct_host" for s in matching):
            raise click.UsageError(
                f"--only {wanted} reads a container's config on its host: it needs --ct ID "
                "(and --host HOST when the host is remote)"
            )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice([f.value for f in Format]),
    default="human",
    show_default=True,
    help="Report format; prometheus writes node_exporter textfile gauges.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="Write the report to this "
    "file atomically (for node_exporter's textfile collector) instead of stdout.",
)
@FORCE_OUTPUT
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="PATH[:DRIVER]",
    help="Also probe this device node (/dev/dri/card0:drm); with :DRIVER its major must "
    "match /proc/devices. Repeatable.",
)
@click.option(
    "--model-dir",
    "model_dirs",
    multiple=True,
    metavar="DIR",
    help="A model directory that must be complete (e.g. /dev/shm/qwen). Repeatable.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="ID",
    help="Run only these checks or families "
    "(device, cuda.init); their requirements run too. Repeatable or comma-separated.",
)
@CHECK_TIMEOUT
@click.option(
    "--host",
    "host_spec",
    metavar="HOST",
    help="Check a remote host over SSH (root@pve1, an ~/.ssh/config alias), or 'local'.",
    callback=non_empty_host,
)
@click.option(
    "--ct",
    metavar="ID",
    help="Check inside this container (pct exec / lxc-attach on "
    "its host) and its config and hooks on the host (ct.device_rules, ct.hooks).",
)
@FLAVOR
@LXCPATH
@click.option(
    "--expect-gpus",
    type=click.IntRange(min=0, max=COUNT_MAX),
    help="GPUs the workload needs (e.g. the bench plan's TP).",
)
@click.option(
    "--deep", is_flag=True, help="Also run slow opt-in checks (NCCL all-reduce across GPUs)."
)
@KNOWN_HOSTS
@ACCEPT_NEW_HOST_KEY
@click.option("-v", "--verbose", is_flag=True, help="Show the evidence of passing checks too.")
@cluster_option("Check")
@inventory_option("Check")
@click.option(
    "--parallel",
    type=click.IntRange(min=1, max=COUNT_MAX),
    default=8,
    show_default=True,
    help="Fleet: targets checked at once (at most 4 per node).",
)
@click.option(
    "--target-timeout",
    type=SECONDS,
    default=120.0,
    show_default=True,
    help="Fleet: seconds one node or CT may take before it is reported ERROR.",
)
@api_options
@click.pass_context
def check(
    ctx: click.Context,
    as_json: bool,
    fmt: str,
    output: str | None,
    devices: tuple[str, ...],
    model_dirs: tuple[str, ...],
    only: tuple[str, ...],
    timeout: float,
    host_spec: str | None,
    ct: str | None,
    flavor: str,
    lxcpath: str | None,
    expect_gpus: int | None,
    deep: bool,
    known_hosts: str | None,
    accept_new_host_key: bool,
    verbose: bool,
    cluster: str | None = None,
    inventory_file: str | None = None,
    parallel: int = 8,
    target_timeout: float = 120.0,
    force: bool = False,
    **api: object,
) -> None:
    """Diagnose GPU access: driver, device nodes and their cgroup policy, CUDA, NVML, weights.

    \b
    Examples:
      gpudoctor check                                  # here (inside the CT, or on a host)
      gpudoctor check --model-dir /dev/shm/qwen36      # ... and the tmpfs weights
      gpudoctor check --host root@pve1 --ct 200        # CT 200 from outside, plus its config
      gpudoctor check --json | jq '.findings[] | select(.status=="FAIL")'
      gpudoctor check --format prometheus -o /var/lib/node_exporter/gpudoctor.prom
      gpudoctor check --cluster pve1                   # every GPU CT of the cluster
      gpudoctor check --inventory hosts.toml --ct 'llm-*' --parallel 16

    Each finding names its evidence and the exact remedy. Exit: 0 healthy (warnings
    allowed), 3 at least one FAIL or ERROR, 4 nothing was checked (every check SKIPped),
    1 gpudoctor error (host unreachable: the -o textfile still says so), 2 usage error.
    """
    from gpudoctor.hosts.base import HostError

    fleet = bool(cluster or inventory_file)
    exclusive(cluster=cluster, inventory=inventory_file)
    if fleet and host_spec:
        raise click.UsageError("--host is for one machine; --cluster/--inventory name the nodes")
    validate_selection(split_ids(only), ct, flavor, fleet)
    validate_lxcpath(lxcpath, flavor, fleet)
    require_writable_file(output, "-o", output_owner.check_report, force)

    options = CheckOptions(
        devices=parse_devices(devices),
        model_dirs=tuple(os.path.abspath(d) if not host_spec and not ct else d for d in model_dirs),
        only=split_ids(only),
        timeout_s=timeout,
        probe_timeout_s=timeout,
        ct=ct,
        flavor=flavor,
        lxcpath=lxcpath,
        fix_host=host_spec if host_spec and host_spec != "local" else ("local" if ct else None),
        expect_gpus=expect_gpus,
        deep=deep,
    )
    fmt_enum = Format.JSON if as_json else Format(fmt)
    local_facts = prestart_local_probe(options, host_spec, ct, fleet)
    from gpudoctor.runner import run_checks

    if fleet:
        from dataclasses import replace

        from gpudoctor.commands.check_fleet import run_fleet_command
        from gpudoctor.commands.options import api_credentials
        from gpudoctor.fleet.request import FleetRequest

        request = FleetRequest(cluster, inventory_file, (ct,) if ct else (), parallel,
                               target_timeout, known_hosts=known_hosts,
                               accept_new_host_key=accept_new_host_key,
                               credentials=api_credentials(api))  # fmt: skip
        options = replace(options, ct=None, model_dirs=tuple(model_dirs))
        ctx.exit(run_fleet_command(request, options, fmt_enum, output, verbose, write_atomically))
    try:
        target, ct_host, closers = open_targets(
            host_spec, ct, flavor, known_hosts, accept_new_host_key, lxcpath
        )
        try:
            report = run_checks(
                target, options, ct_host=ct_host, progress=progress_printer(), facts=local_facts
            )
        finally:
            for host in closers:
                host.close()
    except HostError as exc:
        record_unreachable(fmt_enum, output, target_label(host_spec, ct, flavor), str(exc))
        raise  # one line from the error policy (gpudoctor/errors.py), exit 1
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except Exception as exc:  # still say so in the textfile: never leave the last green run
        failure = f"gpudoctor failed: {type(exc).__name__}: {exc}"
        record_unreachable(fmt_enum, output, target_label(host_spec, ct, flavor), failure)
        raise
    emit([report], fmt_enum, output, verbose)
    code = exit_code([report])
    if code == ExitCode.NOTHING_DONE:
        click.echo(nothing_checked_line([report]), err=True)
    ctx.exit(code)


def validate_lxcpath(lxcpath: str | None, flavor: str, fleet: bool) -> None:
    """Raise click.UsageError for a ``--lxcpath`` that cannot apply (before any work)."""
    if not lxcpath:
        return
    if fleet:
        raise click.UsageError(
            "--lxcpath is for one host; in an inventory set lxcpath per node (docs/fleet.md)"
        )
    if flavor != "lxc":
        raise click.UsageError("--lxcpath is for plain LXC containers: add --flavor lxc")
    if not lxcpath.startswith("/"):
        raise click.UsageError(f"--lxcpath {lxcpath!r}: give an absolute directory")


def target_label(host_spec: str | None, ct: str | None, flavor: str) -> str:
    """Return the name a report of these options has (``root@pve1/ct200``, ``local``)."""
    base = host_spec if host_spec and host_spec != "local" else "local"
    if ct is None:
        return base
    return f"{base}/ct{ct}" if flavor == "pve" else f"{base}/{ct}"


def record_unreachable(fmt: Format, output: str | None, target: str, message: str) -> None:
    """Write the -o Prometheus textfile of a run that could not reach its target
    (``gpudoctor_up 0``, status 4): monitoring never keeps showing the last green run."""
    if output and fmt is Format.PROMETHEUS:
        from gpudoctor.output.prometheus import textfile, unreachable_report

        write_atomically(output, textfile([unreachable_report(target, message)], output))


def prestart_local_probe(options: CheckOptions, host_spec, ct, fleet):  # type: ignore[no-untyped-def]
    """Start the CUDA/NVML probe on this machine at once (before the catalogue is even
    imported) when the whole catalogue runs locally; return its FactCache, else None.
    This is what keeps `gpudoctor check` within about one cuInit (docs/performance.md)."""
    if (host_spec and host_spec != "local") or ct or fleet or options.only:
        return None
    from gpudoctor.context import FactCache
    from gpudoctor.hosts.local import LocalHost

    facts = FactCache(LocalHost(), options)
    facts.start_gpu_probe()
    return facts


def open_targets(host_spec, ct, flavor, known_hosts, accept_new, lxcpath=None):  # type: ignore[no-untyped-def]
    """Return (target host, CT host or None, hosts to close) for the command-line options
    (``lxcpath``: ``--lxcpath``, the container's LXC directory for flavor ``lxc``)."""
    from gpudoctor.hosts.connect import open_container, open_host

    opts = {"known_hosts": known_hosts, "accept_new_host_key": accept_new}
    host = open_host(host_spec or "local", **opts) if host_spec and host_spec != "local" else None
    if host is not None:
        host.connect()  # unreachable: one line (and up 0 in the textfile), not N ERRORs
    if host is None:
        from gpudoctor.hosts.local import LocalHost

        host = LocalHost()
    if ct is None:
        return host, None, [host]
    container = open_container(host, ct, flavor=flavor, lxcpath=lxcpath)
    return container, host, [container, host]


def emit(reports: list[Report], fmt: Format, output: str | None, verbose: bool) -> None:
    """Write the reports to ``output`` (atomically) or stdout."""
    if output and fmt is Format.PROMETHEUS:
        from gpudoctor.output.prometheus import textfile

        write_atomically(output, textfile(reports, output))
    elif output:
        import io

        buffer = io.StringIO()
        render(reports, fmt, buffer, verbose=verbose)
        write_atomically(output, buffer.getvalue())
    else:
        try:
            render(reports, fmt, sys.stdout, verbose=verbose)
            sys.stdout.flush()
        except BrokenPipeError:  # `check | head -1`: the reader took what it wanted; the
            errors.silence_stdout()  # verdict (the exit code) stands, as `check > FILE`'s
        except SystemExit as exc:  # rich's Console ends a broken pipe with SystemExit(1)
            if not isinstance(exc.__context__, BrokenPipeError):
                raise
            errors.silence_stdout()


def progress_printer():  # type: ignore[no-untyped-def]
    """Return a progress callback that prints finished checks to stderr on a terminal."""
    from gpudoctor.terminal import live

    if not live(sys.stderr):
        return None

    def show(result) -> None:  # type: ignore[no-untyped-def]
        sys.stderr.write(f"\r\033[K{result.check_id}: {result.status.value}")
        sys.stderr.flush()

    return show
