"""``gpudoctor check``: run the catalogue here, on a host, inside a container, or on a fleet."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import click

from gpudoctor.cli import EXIT_FAIL, EXIT_OK
from gpudoctor.commands.options import (
    ACCEPT_NEW_HOST_KEY,
    FLAVOR,
    KNOWN_HOSTS,
    cluster_option,
    inventory_option,
)
from gpudoctor.context import CheckOptions, DeviceRequest
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
    """Write ``text`` to ``path`` via a temp file + rename (node_exporter never reads half)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)


def exit_code(reports: list[Report]) -> int:
    """Return 3 when any finding is FAIL or ERROR, else 0 (warnings allowed)."""
    bad = {Status.FAIL, Status.ERROR}
    return EXIT_FAIL if any(f.status in bad for r in reports for f in r.findings) else EXIT_OK


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
@click.option(
    "--timeout",
    type=float,
    default=20.0,
    show_default=True,
    help="Seconds each check (and the CUDA/NVML probe) may take.",
)
@click.option(
    "--host",
    "host_spec",
    metavar="HOST",
    help="Check a remote host over SSH (root@pve1, an ~/.ssh/config alias), or 'local'.",
)
@click.option(
    "--ct",
    metavar="ID",
    help="Check inside this container (pct exec / lxc-attach on "
    "its host) and its config on the host (ct.device_rules).",
)
@FLAVOR
@click.option("--expect-gpus", type=int, help="GPUs the workload needs (e.g. the bench plan's TP).")
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
    type=int,
    default=8,
    show_default=True,
    help="Fleet: targets checked at once (at most 4 per node).",
)
@click.option(
    "--target-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Fleet: seconds one node or CT may take before it is reported ERROR.",
)
@click.option(
    "--api-token-id",
    envvar="PVE_TOKEN_ID",
    metavar="USER@REALM!ID",
    help="Proxmox API token id (or env PVE_TOKEN_ID). Password login: env PVE_USER "
    "and PVE_PASSWORD.",
)
@click.option(
    "--api-token-secret",
    envvar="PVE_TOKEN_SECRET",
    metavar="SECRET",
    help="Proxmox API token secret (better: env PVE_TOKEN_SECRET). Never printed.",
)
@click.option(
    "--api-insecure",
    is_flag=True,
    help="Do not verify the API's TLS certificate "
    "(else system CAs, or REQUESTS_CA_BUNDLE=/path/to/pve-root-ca.pem).",
)
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
    expect_gpus: int | None,
    deep: bool,
    known_hosts: str | None,
    accept_new_host_key: bool,
    verbose: bool,
    cluster: str | None = None,
    inventory_file: str | None = None,
    parallel: int = 8,
    target_timeout: float = 120.0,
    api_token_id: str | None = None,
    api_token_secret: str | None = None,
    api_insecure: bool = False,
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
    allowed), 3 at least one FAIL or ERROR, 1 gpudoctor error, 2 usage error.
    """
    from gpudoctor.hosts.base import HostError

    options = CheckOptions(
        devices=parse_devices(devices),
        model_dirs=tuple(os.path.abspath(d) if not host_spec and not ct else d for d in model_dirs),
        only=split_ids(only),
        timeout_s=timeout,
        probe_timeout_s=timeout,
        ct=ct,
        flavor=flavor,
        fix_host=host_spec if host_spec and host_spec != "local" else ("local" if ct else None),
        expect_gpus=expect_gpus,
        deep=deep,
    )
    fmt_enum = Format.JSON if as_json else Format(fmt)
    local_facts = prestart_local_probe(options, host_spec, ct, cluster or inventory_file)
    from gpudoctor.runner import run_checks

    if cluster or inventory_file:
        if host_spec:
            raise click.UsageError(
                "--host is for one machine; --cluster/--inventory name the nodes"
            )
        from dataclasses import replace

        from gpudoctor.fleet.check_run import FleetRequest, run_fleet_command

        request = FleetRequest(cluster, inventory_file, (ct,) if ct else (), parallel,
                               target_timeout, api_token_id, api_token_secret, api_insecure,
                               known_hosts, accept_new_host_key)  # fmt: skip
        options = replace(options, ct=None, model_dirs=tuple(model_dirs))
        ctx.exit(run_fleet_command(request, options, fmt_enum, output, verbose, write_atomically))
    try:
        target, ct_host, closers = open_targets(
            host_spec, ct, flavor, known_hosts, accept_new_host_key
        )
        try:
            report = run_checks(
                target, options, ct_host=ct_host, progress=progress_printer(), facts=local_facts
            )
        finally:
            for host in closers:
                host.close()
    except HostError as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    emit([report], fmt_enum, output, verbose)
    ctx.exit(exit_code([report]))


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


def open_targets(host_spec, ct, flavor, known_hosts, accept_new):  # type: ignore[no-untyped-def]
    """Return (target host, CT host or None, hosts to close) for the command-line options."""
    from gpudoctor.hosts.connect import open_container, open_host

    opts = {"known_hosts": known_hosts, "accept_new_host_key": accept_new}
    host = open_host(host_spec or "local", **opts) if host_spec and host_spec != "local" else None
    if host is None:
        from gpudoctor.hosts.local import LocalHost

        host = LocalHost()
    if ct is None:
        return host, None, [host]
    container = open_container(host, ct, flavor=flavor)
    return container, host, [container, host]


def emit(reports: list[Report], fmt: Format, output: str | None, verbose: bool) -> None:
    """Write the reports to ``output`` (atomically) or stdout."""
    if output:
        import io

        buffer = io.StringIO()
        render(reports, fmt, buffer, verbose=verbose)
        write_atomically(output, buffer.getvalue())
    else:
        render(reports, fmt, sys.stdout, verbose=verbose)


def progress_printer():  # type: ignore[no-untyped-def]
    """Return a progress callback that prints finished checks to stderr on a terminal."""
    if not sys.stderr.isatty():
        return None

    def show(result) -> None:  # type: ignore[no-untyped-def]
        sys.stderr.write(f"\r\033[K{result.check_id}: {result.status.value}")
        sys.stderr.flush()

    return show
