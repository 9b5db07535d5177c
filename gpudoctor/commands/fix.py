"""``gpudoctor fix``: repair a container's GPU access on its Proxmox / LXC host, safely."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from gpudoctor.commands.options import (
    ACCEPT_NEW_HOST_KEY,
    FLAVOR,
    KNOWN_HOSTS,
    LXCPATH,
    api_credentials,
    api_options,
    cluster_option,
    exclusive,
    inventory_option,
    non_empty_host,
    require_writable_dir,
)
from gpudoctor.exit_codes import ExitCode


def _say(text: str) -> None:
    """Print a progress line on stderr (the report goes to stdout)."""
    click.echo(f"gpudoctor: {text}", err=True)


def _show_plan(plan: Any, out: Any) -> None:
    """Print the plan for humans: the diff (coloured on a terminal), reasons, warnings."""
    from gpudoctor.terminal import live

    color = live(sys.stdout)
    for line in plan.diff.splitlines():
        style = None
        if line.startswith("+") and not line.startswith("+++"):
            style = "green"
        elif line.startswith("-") and not line.startswith("---"):
            style = "red"
        out(click.style(line, fg=style) if color and style else line)
    for reason in plan.explanation:
        out(f"  why: {reason}")
    for warning in plan.warnings:
        out(f"  warning: {warning}")


def _open_host(spec: str, known_hosts: str | None, accept_new: bool, identity: str | None) -> Any:
    from gpudoctor.hosts.connect import open_host

    opts: dict[str, Any] = {"known_hosts": known_hosts, "accept_new_host_key": accept_new}
    if identity:
        opts["key_filename"] = identity
    return open_host(spec, **opts)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--host",
    "host_spec",
    metavar="HOST",
    help="The CT's host: root@pve1, root@10.0.0.5:2222, an ~/.ssh/config alias, "
    "or 'local' (the default) when running on the host itself.",
    callback=non_empty_host,
)
@click.option("--ct", metavar="ID", help="Proxmox VMID (200) or plain LXC container name.")
@FLAVOR
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="PATH",
    help="Pass this character device (or a directory under /dev holding them) instead of "
    "every /dev/nvidia* node. A path the CT config already bind-mounts names its host "
    "source. Anything else (/root, a file) is refused. Repeatable.",
)
@click.option(
    "--mode",
    type=click.Choice(["auto", "devn", "rules", "raw"]),
    default="auto",
    show_default=True,
    help="devn: Proxmox devN entries (PVE >= 8.1; re-read at every start, so they survive "
    "a moving major), replacing the NVIDIA bind mounts and rules they make redundant. "
    "rules: lxc.cgroup2.devices.allow + lxc.mount.entry lines (raw: same). auto: devn on "
    "Proxmox VE >= 8.1 (pveversion), rules on older PVE and plain LXC.",
)
@click.option("--dev-gid", type=int, help="gid= for devN entries (default: the host node's).")
@click.option(
    "--prune", is_flag=True, help="Remove stale NVIDIA allow rules (only flagged without it)."
)
@click.option(
    "--driver-libs",
    type=click.Choice(["bind", "copy"]),
    help="Also give the CT the host's NVIDIA user-space driver. bind: read-only bind mounts "
    "of the files the host's driver lists (nvidia-container-cli list, the package's file "
    "list, else the libcuda directory's *.so.VERSION) into /usr/lib/gpudoctor-driver, "
    "nvidia-smi and firmware, + ldconfig in the CT: after a host driver upgrade a CT restart "
    "is all it takes. copy: print the exact-version install for inside the CT (breaks at the "
    "next host upgrade).",
)
@click.option("--dry-run", is_flag=True, help="Show the plan and the diff; change nothing.")
@click.option("-y", "--yes", is_flag=True, help="Apply without asking.")
@click.option("--no-restart", is_flag=True, help="Write the config but do not restart the CT.")
@click.option(
    "--host-prep",
    is_flag=True,
    help="Instead of a CT: install a systemd oneshot that creates /dev/nvidia-uvm at boot "
    "before containers start, and the triggers that run --follow-driver after a driver "
    "reload (a udev rule on the NVIDIA modules' load, a path unit on the moving nodes; "
    "--device PATH: watch that node too). With --cluster/--inventory: on each node where a "
    "CT's state shows the host lacked /dev/nvidia-uvm when the CT started.",
)
@click.option(
    "--follow-driver",
    is_flag=True,
    help="Instead of one CT: every CT of the node against the host's devices NOW (after a "
    "driver reload or upgrade moved a major): a missing allow rule added where a passed "
    "node's major moved, and a restart only for the CTs whose devices changed; CTs that "
    "pass no device, or whose devices are the host's, are not touched. What the unit "
    "--host-prep installs runs (journalctl -u gpudoctor-follow-driver).",
)
@click.option(
    "--if-host-changed",
    is_flag=True,
    help="With --follow-driver: do nothing when the host's devices are as the last follow "
    "left them (what the installed unit passes: a trigger with nothing changed is a no-op).",
)
@LXCPATH
@KNOWN_HOSTS
@ACCEPT_NEW_HOST_KEY
@click.option(
    "-i",
    "--identity-file",
    type=click.Path(dir_okay=False),
    help="SSH private key file (else ssh-agent and ~/.ssh/config).",
)
@click.option(
    "--api",
    metavar="URL",
    help="Proxmox API (https://pve1:8006) for CT status, restarts and task waiting. Raw "
    "lxc.* lines cannot be written through the API (Proxmox refuses them): --host is still "
    "needed for the config.",
)
@api_options
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON on stdout.")
@cluster_option("Fix")
@inventory_option("Fix")
@click.option(
    "--max-restarts",
    type=int,
    default=2,
    show_default=True,
    help="Fleet: CTs fixed (and so restarted) at once.",
)
@click.option(
    "--keep-going",
    is_flag=True,
    help="Fleet: go on after a CT was rolled back (default: stop there).",
)
@click.pass_context
def fix(ctx: click.Context, host_spec: str | None, ct: str | None, flavor: str,
        devices: tuple[str, ...], mode: str, dev_gid: int | None, prune: bool,
        driver_libs: str | None, dry_run: bool,
        yes: bool, no_restart: bool, host_prep: bool, follow_driver: bool,
        if_host_changed: bool, lxcpath: str | None,
        known_hosts: str | None, accept_new_host_key: bool, identity_file: str | None,
        api: str | None, as_json: bool, cluster: str | None = None,
        inventory_file: str | None = None, max_restarts: int = 2, keep_going: bool = False,
        **api_auth: Any) -> None:  # fmt: skip
    """Give a container back its GPUs: plan, diff, backup, locked write, restart, re-check.

    \b
    Examples:
      gpudoctor fix --host root@pve1 --ct 200             # plan + diff, asks to apply
      gpudoctor fix --host root@pve1 --ct 200 --yes       # apply, restart, re-check
      gpudoctor fix --host root@pve1 --ct 200 --dry-run   # diff only (exit 4: pending)
      gpudoctor fix --host local --ct 200 --mode rules    # old style, even on PVE >= 8.1
      gpudoctor fix --host root@box --ct web1 --flavor lxc --device /dev/dri
      gpudoctor fix --host root@pve1 --host-prep          # /dev/nvidia-uvm before CTs boot
      gpudoctor fix --follow-driver --yes                 # on the node, after a driver reload
      gpudoctor fix --host root@pve1 --ct 200 --driver-libs bind  # libs follow the host
      gpudoctor fix --cluster pve1 --yes                  # every GPU CT, 2 restarts at a time
      gpudoctor fix --inventory hosts.toml --ct 'llm-*' --dry-run

    It plans from the host's /proc/devices, /dev/nvidia* and pveversion (devN entries on
    Proxmox VE >= 8.1, else cgroup rules and bind mounts), shows the diff, saves backups,
    writes under the config's own lock only if it is unchanged since the plan, restarts a
    running CT and re-checks its devices inside, putting the old config back if they fail.
    A second run says "nothing to change". How each step works: docs/fix.md.

    \b
    Exit codes:
      0  applied, or nothing to change
      1  gpudoctor error (host unreachable, backup not saved, not a Proxmox host)
      2  usage error (bad option, --device that is missing or no character device)
      3  not applied, failed or rolled back (locked CT, changed since the plan, CT did
         not come back, device still fails), or nothing to pass through (no NVIDIA
         driver on the host and no --device)
      4  changes pending, nothing written: --dry-run found changes, or no --yes and
         no terminal to ask (or the answer was no)
    """
    from gpudoctor.hosts.base import HostError
    from gpudoctor.pve.apply import ApplyError, Layout
    from gpudoctor.pve.config import ConfigError
    from gpudoctor.pve.fixer import FixOptions
    from gpudoctor.pve.planner import FixPlanError, PlanOptions

    exclusive(cluster=cluster, inventory=inventory_file)
    if if_host_changed and not follow_driver:
        raise click.UsageError("--if-host-changed goes with --follow-driver")
    if follow_driver and (ct or host_prep or cluster or inventory_file or devices or api):
        raise click.UsageError(
            "--follow-driver looks at every CT of one node: it takes no --ct, --host-prep, "
            "--cluster, --inventory, --device or --api"
        )
    if host_spec and (cluster or inventory_file):  # as check says it
        raise click.UsageError("--host is for one machine; --cluster/--inventory name the nodes")
    if mode == "devn" and flavor == "lxc":
        raise click.UsageError(
            "--mode devn writes Proxmox devN entries; a plain LXC config (--flavor lxc) takes"
            " --mode rules (or auto)"
        )
    fleet = bool(cluster or inventory_file)
    from gpudoctor.commands.check import validate_lxcpath

    validate_lxcpath(lxcpath, flavor, fleet)  # as check: absolute, plain LXC, one host
    if not dry_run and (not host_prep or fleet):  # the local backup copy: before any work
        require_writable_dir(Layout.from_env().client_backup_dir, "GPUDOCTOR_CLIENT_BACKUP_DIR")
    _check_device_paths(devices)
    plan_options = PlanOptions(
        mode=mode,
        devices=tuple(p.rstrip("/") for p in devices),
        include_host_nvidia=not devices,
        prune=prune,
        dev_gid=dev_gid,
    )
    if cluster or inventory_file:
        from gpudoctor.commands.fix_cluster import ClusterFixRequest, run_cluster_fix

        template = FixOptions(
            ct="",
            flavor=flavor,
            plan=plan_options,
            dry_run=dry_run,
            yes=yes,
            restart=not no_restart,
            layout=Layout.from_env(),
            driver_libs=driver_libs or "",
        )
        request = ClusterFixRequest(
            cluster=cluster,
            inventory=inventory_file,
            ct=(ct,) if ct else (),
            max_restarts=max_restarts,
            keep_going=keep_going,
            known_hosts=known_hosts,
            accept_new_host_key=accept_new_host_key,
            identity_file=identity_file,
            as_json=as_json,
            host_prep=host_prep,
            credentials=api_credentials(api_auth),
        )
        ask = lambda question: sys.stdin.isatty() and click.confirm(question, default=False)  # noqa: E731
        ctx.exit(run_cluster_fix(request, template, click.echo, ask))
    if api and host_spec is None:
        raise click.UsageError(
            "raw lxc.* lines cannot be written through the Proxmox API (Proxmox refuses them, "
            "for API tokens too): add --host root@NODE so the config is edited over SSH"
        )
    settings = None
    if api:
        from gpudoctor.credentials import MISSING
        from gpudoctor.pve.api import ApiSettings

        auth = api_credentials(api_auth)
        if not auth.present():
            raise click.UsageError(f"--api: {MISSING}")
        settings = ApiSettings(api, auth.token, auth.verify, user=auth.user or "",
                               password=auth.password or "")  # fmt: skip
    host_spec = host_spec or "local"
    if not host_prep and not follow_driver and not ct:
        raise click.UsageError("--ct is required (or --host-prep, --follow-driver)")
    layout = Layout.from_env()
    if lxcpath:
        layout = Layout(**{**layout.__dict__, "lxcpath": lxcpath})
    try:
        host = _open_host(host_spec, known_hosts, accept_new_host_key, identity_file)
    except HostError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        if host_prep:
            follow = (("--flavor", "lxc") if flavor == "lxc" else ()) + (
                ("--lxcpath", lxcpath) if lxcpath else ()
            )  # the unit's own run: issue 47
            code = _run_host_prep(host, dry_run, yes, as_json, devices, follow)
        elif follow_driver:
            from gpudoctor.commands.fix_follow import run_follow

            code = run_follow(host, flavor, layout, (dry_run, yes, if_host_changed), as_json,
                              host_spec)  # fmt: skip
        else:
            options = FixOptions(ct=ct or "", flavor=flavor, plan=plan_options, dry_run=dry_run,
                                 yes=yes, restart=not no_restart, layout=layout, api=settings,
                                 driver_libs=driver_libs or "")  # fmt: skip
            code = _run_fix(host, options, host_spec, as_json)
    except (ApplyError, FixPlanError, ConfigError) as exc:
        code = _fail(str(exc), getattr(exc, "code", "error"), as_json)
    except HostError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        host.close()
    ctx.exit(code)


def _check_device_paths(devices: tuple[str, ...]) -> None:
    """Refuse relative paths and paths with ``.``/``..`` components (usage errors)."""
    import posixpath

    for path in devices:
        if not path.startswith("/"):
            raise click.BadParameter(f"{path!r} must be an absolute path", param_hint="--device")
        if posixpath.normpath(path) != path.rstrip("/") or "//" in path:
            raise click.BadParameter(
                f"{path!r}: write the path without '.', '..' or '//'", param_hint="--device"
            )


def _fail(message: str, code: str, as_json: bool) -> int:
    """Report a refusal or failure; return its exit code (2 usage, 1 gpudoctor/host
    error, 3 the fix was not applied / failed)."""
    from gpudoctor.errors import ERROR_HINT, error_line

    line = error_line(message, "see 'gpudoctor fix --help'" if code == "usage" else ERROR_HINT)
    errors = ("io", "not_pve", "unknown_ct", "api", "missing", "backup")
    exit_code = (
        ExitCode.USAGE if code == "usage" else ExitCode.ERROR if code in errors else ExitCode.FAILED
    )
    if as_json:
        doc = {"ok": False, "status": "failed", "error": code, "message": message,
               "exit_code": int(exit_code)}  # fmt: skip
        click.echo(json.dumps(doc, indent=2))
    click.echo(line, err=True)  # the documented one-line form (gpudoctor/errors.py)
    return exit_code


def _confirm(plan: Any) -> bool:
    if not sys.stdin.isatty():
        _say(
            "not applied: stdin is not a terminal; pass --yes to apply without asking "
            f"(exit {ExitCode.NOTHING_DONE}: changes pending)"
        )
        return False
    return click.confirm("Apply this change (backup first, then restart the CT)?", default=False)


def _run_fix(host: Any, options: Any, host_label: str, as_json: bool) -> int:
    from gpudoctor.pve.fixer import run_fix

    show = (lambda plan: None) if as_json else (lambda plan: _show_plan(plan, click.echo))
    outcome = run_fix(
        host, options, confirm=_confirm, progress=_say, host_label=host_label, on_plan=show
    )
    if as_json:
        click.echo(json.dumps(outcome.to_dict(), indent=2))
        return outcome.exit_code
    if outcome.plan is not None and not outcome.plan.changed:
        for warning in outcome.plan.warnings:
            click.echo(f"  warning: {warning}")
    if outcome.plan is not None and outcome.plan.changed:
        version = outcome.plan.pve_version
        click.echo(f"mode: {outcome.plan.mode}" + (f" (Proxmox VE {version})" if version else ""))
    if outcome.write is not None:
        click.echo(f"backup: {outcome.write.host_backup} (on the host), {outcome.client_backup}")
    for path, errname in outcome.after:
        click.echo(f"inside the CT: open({path}) -> {errname}")
    name = outcome.target.ct if outcome.target else ""
    click.echo(f"CT {name}: {outcome.message}")
    return outcome.exit_code


def _run_host_prep(host: Any, dry_run: bool, yes: bool, as_json: bool,
                   watch: tuple[str, ...] = (), follow: tuple[str, ...] = ()) -> int:  # fmt: skip
    from gpudoctor.pve.uvm_unit import run_host_prep

    def confirm(plan: Any) -> bool:
        """Show the host-prep plan, then ask; return True to apply."""
        _show_plan(plan, click.echo)
        return _confirm(plan)

    outcome = run_host_prep(host, dry_run=dry_run, yes=yes, confirm=confirm, progress=_say,
                            watch=tuple(p.rstrip("/") for p in watch),
                            follow_args=follow)  # fmt: skip
    if as_json:
        click.echo(json.dumps(outcome.to_dict(), indent=2))
    else:
        if outcome.plan.changed and (yes or dry_run):
            _show_plan(outcome.plan, click.echo)
        click.echo(outcome.message)
    return outcome.exit_code
