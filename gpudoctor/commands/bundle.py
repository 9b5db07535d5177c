"""``gpudoctor bundle``: everything a supporter needs, in one redacted archive."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import click

from gpudoctor.commands import output_owner
from gpudoctor.commands.options import (
    ACCEPT_NEW_HOST_KEY,
    CHECK_TIMEOUT,
    FLAVOR,
    FORCE_OUTPUT,
    KNOWN_HOSTS,
    LXCPATH,
    require_writable_file,
    write_named_output,
)
from gpudoctor.exit_codes import ExitCode


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="The archive to write (default: ./gpudoctor-bundle-YYYYmmdd-HHMMSS.tar.gz, mode 0600).",
)
@click.option(
    "--host",
    "host_spec",
    metavar="HOST",
    help="Gather from a remote host over SSH (root@pve1, an ~/.ssh/config alias).",
)
@click.option("--ct", metavar="ID", help="Also check inside this container and include its config.")
@FLAVOR
@LXCPATH
@click.option(
    "--run",
    "run_dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="A bench run directory: include its status and failed cells (server log tails).",
)
@click.option(
    "--no-redact",
    is_flag=True,
    help="Keep host names, IPs, MAC addresses and user names (secrets are removed anyway).",
)
@CHECK_TIMEOUT
@KNOWN_HOSTS
@ACCEPT_NEW_HOST_KEY
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@FORCE_OUTPUT
@click.pass_context
def bundle(
    ctx: click.Context,
    output: str | None,
    host_spec: str | None,
    ct: str | None,
    flavor: str,
    lxcpath: str | None,
    run_dir: Path | None,
    no_redact: bool,
    timeout: float,
    known_hosts: str | None,
    accept_new_host_key: bool,
    as_json: bool,
    force: bool = False,
) -> None:
    """Gather what a supporter needs into one archive, redacted, to attach to an issue.

    \b
    Examples:
      gpudoctor bundle                                  # this machine (inside the CT, or a host)
      gpudoctor bundle --host root@pve1 --ct 200        # a CT and its host, over SSH
      gpudoctor bundle --run runs/qwen3 -o issue.tar.gz # ... with a bench run's failures

    \b
    The archive (gpudoctor-bundle/ inside) holds:
      check.json                the check report (gpudoctor check --json)
      ct/config.txt             the CT's config on its host (with --ct)
      host/*, local/*           uname, driver version and params, /proc/devices, device
                                nodes, modules, nvidia-smi -q, the kernel log's NVIDIA lines
      local/versions.json       gpudoctor's and Python's versions
      local/environment.txt     CUDA_*/NVIDIA_*/NCCL_*/HF_* variables (secret ones withheld)
      run/status.json, run/failures.jsonl   with --run
      MANIFEST.json             each file and the command it came from
      REDACTED.json             each placeholder (<host-1>, <ip-2>, <user-1>, <secret-1>),
                                its kind and the files it replaced a value in; no values

    Secrets (tokens, keys, passwords, the values of *TOKEN*/*SECRET*/*KEY* variables) are
    always replaced; host names, IPs, MAC addresses and user names too unless --no-redact.
    The same value gets the same placeholder in every file. Look inside before you share
    it: tar -xzf FILE && less gpudoctor-bundle/*.

    Exit: 0 written, 1 gpudoctor error (host unreachable, archive not writable), 2 usage.
    """
    from gpudoctor.support import bundle as bundle_mod
    from gpudoctor.support import gather

    if ct and flavor == "pve" and not ct.isdigit():
        raise click.UsageError(f"--ct {ct!r}: a Proxmox CT id is a number; add --flavor lxc")
    out = output or bundle_mod.default_name()
    require_writable_file(out, "-o", output_owner.bundle_archive, force)
    environ = bundle_mod.environ_copy()
    say = _progress(as_json)
    from gpudoctor.commands.check import open_targets

    target, ct_host, closers = open_targets(
        host_spec, ct, flavor, known_hosts, accept_new_host_key, lxcpath
    )
    try:
        host = ct_host if ct_host is not None else target
        remote = host_spec is not None and host_spec != "local"
        config = None
        if ct is not None:
            say(f"reading CT {ct}'s config")
            config = gather.ct_config(host, ct, flavor, lxcpath)
        if config is not None and config.refused:  # another user's config: not entered
            why = json.dumps({"error": f"not checked: {config.text[2:].strip()}"})
            items = [gather.Item("check.json", why + "\n", "gpudoctor check --json")]
            closers.remove(target)
            target.close()
        else:
            say("running the checks")
            items = [_check_item(target, ct_host, ct, flavor, lxcpath, timeout, host_spec)]
        if config is not None:
            items.append(config)
        say("reading device facts and the kernel log")
        items += gather.host_facts(host, "host" if remote or ct else "local")
        if remote or ct:
            from gpudoctor.hosts.local import LocalHost

            items += gather.host_facts(LocalHost(), "local")
        items += [gather.versions(), gather.environment(environ)]
        if run_dir is not None:
            say(f"reading run {run_dir}")
            items += gather.last_run(run_dir)
        names, users = bundle_mod.identities_of(closers, environ)
        for item in items:
            if item.name == "ct/config.txt":
                names |= gather.config_names(item.text)  # the node, the CT's host name
        redactor = bundle_mod.redactor_for(not no_redact, environ, names, users)
        done = bundle_mod.build(items, redactor)
    finally:
        for each in closers:
            each.close()
    write_named_output(out, done.data, "-o", mode=0o600)
    kinds: dict[str, int] = {}
    for entry in done.ledger:
        kinds[str(entry["kind"])] = kinds.get(str(entry["kind"]), 0) + 1
    if as_json:
        summary = {"archive": out, "files": list(done.names), "redacted": kinds,
                   "identities_redacted": not no_redact}  # fmt: skip
        click.echo(json.dumps(summary, indent=2))
    else:
        what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "nothing"
        click.echo(f"wrote {out}: {len(done.names)} files; replaced {what} (see REDACTED.json)")
    ctx.exit(ExitCode.OK)


def _check_item(target, ct_host, ct, flavor, lxcpath, timeout, host_spec):  # type: ignore[no-untyped-def]
    """Return the check report as the bundle's ``check.json`` Item (its error, when the
    run itself failed: the bundle is most needed when things are broken)."""
    from gpudoctor.context import CheckOptions
    from gpudoctor.output import Format, render
    from gpudoctor.runner import run_checks
    from gpudoctor.support.gather import Item

    options = CheckOptions(timeout_s=timeout, probe_timeout_s=timeout, ct=ct, flavor=flavor,
                           lxcpath=lxcpath, fix_host=host_spec or ("local" if ct else None))  # fmt: skip
    try:
        report = run_checks(target, options, ct_host=ct_host)
    except Exception as exc:  # recorded in the bundle, not lost
        text = json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n"
        return Item("check.json", text, "gpudoctor check --json")
    buffer = io.StringIO()
    render([report], Format.JSON, buffer, verbose=True)
    return Item("check.json", buffer.getvalue(), "gpudoctor check --json")


def _progress(quiet: bool):  # type: ignore[no-untyped-def]
    """Return a callback printing each step to stderr (nothing with --json)."""

    def say(step: str) -> None:
        if not quiet:
            sys.stderr.write(f"gpudoctor bundle: {step}\n")
            sys.stderr.flush()

    return say
