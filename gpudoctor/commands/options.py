"""Command-line options that several commands share, defined once (``check`` and ``fix``:
``--flavor``, ``--lxcpath``, ``--known-hosts``, the API credentials, ...)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from gpudoctor.commands import output_owner
from gpudoctor.commands.output_owner import Recogniser

Decorator = Callable[[Any], Any]


class Seconds(click.FloatRange):
    """A duration in seconds: a number above 0 and at most a day (``1e400`` is inf, which
    no clock takes; ``nan`` compares false with every bound, so it is refused by name)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """Return the value as a float in (0, 86400]; fail (usage error) otherwise."""
        import math

        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


FORCE_OUTPUT = click.option(
    "--force",
    is_flag=True,
    help="Replace the -o file even when gpudoctor did not write it.",
)
SECONDS = Seconds(min=0, min_open=True, max=86400)
# A count option (GPUs, targets at once): at most this many.
COUNT_MAX = 4096

CHECK_TIMEOUT = click.option(
    "--timeout",
    type=SECONDS,
    default=20.0,
    show_default=True,
    help="Seconds each check (and the CUDA/NVML probe) may take.",
)
FLAVOR = click.option(
    "--flavor",
    type=click.Choice(["pve", "lxc"]),
    default="pve",
    show_default=True,
    help="How the container's host is managed: Proxmox VE (/etc/pve, pct) or plain LXC "
    "(/var/lib/lxc/NAME/config, lxc-attach).",
)
LXCPATH = click.option(
    "--lxcpath",
    metavar="DIR",
    help="LXC's container directory for --flavor lxc (lxc-attach/lxc-start -P DIR; "
    "default: lxc-config lxc.lxcpath). An inventory node's lxcpath is the same setting.",
)
KNOWN_HOSTS = click.option(
    "--known-hosts", type=click.Path(dir_okay=False), help="Extra known_hosts file."
)
ACCEPT_NEW_HOST_KEY = click.option(
    "--accept-new-host-key",
    is_flag=True,
    help="Trust and save the key of an SSH host never seen before (never a changed one).",
)


def cluster_option(verb: str) -> Decorator:
    """Return the ``--cluster HOST`` option of a fleet command (``verb``: Check, Fix)."""
    return click.option(
        "--cluster",
        metavar="HOST[:PORT]",
        help=f"{verb} every CT passing NVIDIA devices through on every node of this Proxmox "
        "cluster (its API over https lists them; the nodes are reached over SSH as root@NODE). "
        "--ct narrows it (ids, names, globs: 200,llm-*).",
    )


def inventory_option(verb: str) -> Decorator:
    """Return the ``--inventory FILE`` option of a fleet command (``verb``: Check, Fix)."""
    return click.option(
        "--inventory",
        "inventory_file",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        help=f"{verb} the nodes and CTs listed in this TOML file (see docs/fleet.md).",
    )


class OutputNotWritable(click.ClickException):
    """An output file or directory that cannot be written: found before any work, exit 1."""

    exit_code = 1


def _probe_directory(directory: str) -> str | None:
    """Return why no file can be created in ``directory`` (None when one can): a real
    create + delete of a temp file, as ``touch DIR/.x && rm DIR/.x`` would do."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".gpudoctor-probe-")
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(name)
    return None


def non_empty_host(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Return ``value`` (a --host spec) unless it is empty or blank (``--host ''``, an unset
    shell variable), which would silently mean this machine: click.BadParameter then."""
    if value is not None and not value.strip():
        raise click.BadParameter(
            "is empty: give user@host (an ~/.ssh/config alias, or 'local'), or leave --host"
            " out for this machine"
        )
    return value


def require_writable_file(
    path: str | os.PathLike[str] | None,
    option: str,
    recognise: Recogniser | None = None,
    force: bool = False,
) -> None:
    """Check, before any work starts, that the output file ``path`` can be written (its
    directory exists and takes a new file; ``path`` itself is not a directory) and, given
    ``recognise`` and not ``force``, that a file there is gpudoctor's own output
    (:mod:`gpudoctor.commands.output_owner`). Raise :class:`OutputNotWritable` (exit 1)
    with one line naming ``option`` otherwise; returns nothing."""

    if path is None:
        return
    text = os.fspath(path)
    if os.path.isdir(text):
        raise OutputNotWritable(f"cannot write {option} {text}: it is a directory; name a file")
    parent = os.path.dirname(os.path.abspath(text))
    why = "no such directory" if not os.path.isdir(parent) else _probe_directory(parent)
    if why is None:
        why = _not_a_regular_file(text)
    if why is None and os.path.lexists(text) and not os.access(text, os.W_OK):
        why = "permission denied"
    if why is not None:
        raise OutputNotWritable(
            f"cannot write {option} {text}: {why}; pick a writable path (nothing was done)"
        )
    why = None if recognise is None or force else output_owner.foreign(text, recognise)
    if why is not None:
        raise OutputNotWritable(
            f"cannot write {option} {text}: {why}; give --force to replace it, or pick"
            " another path (nothing was done)"
        )


def write_named_output(
    path: str | os.PathLike[str], data: bytes | str, option: str, mode: int = 0o644
) -> None:
    """Write the output file ``path`` (:func:`gpudoctor.fsio.write_output`); raise
    :class:`OutputNotWritable` naming ``option`` and the path when that fails (a full
    filesystem: issue 47); returns None. The file there, if any, is left as it was."""
    import errno

    from gpudoctor import fsio

    try:
        fsio.write_output(path, data, mode=mode)
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        todo = "free space there or pick another path" if full else "pick a writable path"
        raise OutputNotWritable(
            f"cannot write {option} {os.fspath(path)}: {exc.strerror or exc}; {todo}"
            " (a file already there is left as it was)"
        ) from exc


def _not_a_regular_file(path: str) -> str | None:
    """Return why ``path`` must not be written over (it is a symlink, FIFO, socket or
    device: ``stat -c %F``), or None for a regular file or a new path."""
    import stat

    from gpudoctor.fsio import kind_of

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        return None
    return f"it is {kind_of(st.st_mode)}; gpudoctor writes only to a regular file or a new path"


def require_writable_dir(path: str | os.PathLike[str] | None, option: str) -> None:
    """Check, before any work starts, that the output directory ``path`` exists and takes
    new files, or can be created (its nearest existing ancestor is a writable directory).
    Raise :class:`OutputNotWritable` (exit 1) with one line naming ``option`` otherwise;
    returns nothing. Creates nothing that stays (``mkdir -p`` is left to the command)."""

    if path is None:
        return
    text = os.fspath(path)
    existing = os.path.abspath(text)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        why = f"{existing} is not a directory"
    else:
        why = _probe_directory(existing)
    if why is not None:
        raise OutputNotWritable(
            f"cannot write {option} {text}: {why}; pick a writable directory (nothing was done)"
        )


def exclusive(**values: object) -> None:
    """Raise click.UsageError when more than one of these options was given
    (``exclusive(cluster=..., inventory=...)``); returns nothing."""
    given = [f"--{name.replace('_', '-')}" for name, value in values.items() if value]
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join(given)} exclude each other: pick one")


_API_OPTIONS: list[Decorator] = [
    click.option(
        "--api-token-id",
        envvar="PVE_TOKEN_ID",
        metavar="USER@REALM!ID",
        help="Proxmox API token id (or env PVE_TOKEN_ID); its secret from env "
        "PVE_TOKEN_SECRET or --api-token-secret-file.",
    ),
    click.option(
        "--api-token-secret-file",
        type=click.Path(exists=True, dir_okay=False),
        metavar="FILE",
        help="File holding the API token secret (else env PVE_TOKEN_SECRET).",
    ),
    click.option(
        "--api-user",
        envvar="PVE_USER",
        metavar="USER@REALM",
        help="Password login instead of a token (or env PVE_USER); the password from env "
        "PVE_PASSWORD or --api-password-file.",
    ),
    click.option(
        "--api-password-file",
        type=click.Path(exists=True, dir_okay=False),
        metavar="FILE",
        help="File holding the API password (else env PVE_PASSWORD).",
    ),
    click.option(
        "--api-ca-file",
        type=click.Path(exists=True, dir_okay=False),
        metavar="FILE",
        help="CA bundle that signed the API's certificate (Proxmox: "
        "/etc/pve/pve-root-ca.pem); default: system CAs.",
    ),
    click.option(
        "--api-insecure",
        is_flag=True,
        help="Do not verify the API's TLS certificate (warned about on every run).",
    ),
    # Secrets on the command line are visible in ps and shell history: still accepted
    # (hidden), with a warning. Their environment variables are the documented way.
    click.option("--api-token-secret", envvar="PVE_TOKEN_SECRET", hidden=True),
    click.option("--api-ca", type=click.Path(exists=True, dir_okay=False), hidden=True),
    click.option(
        "--api-token",
        envvar="GPUDOCTOR_API_TOKEN",
        hidden=True,
        metavar="USER@REALM!ID=SECRET",
    ),
    click.option("--api-password", envvar=["PVE_PASSWORD", "GPUDOCTOR_API_PASSWORD"], hidden=True),
]
_ARGV_SECRETS = ("api_token_secret", "api_token", "api_password")


def api_options(func: Any) -> Any:
    """Add the Proxmox API credential options (one scheme for check and fix, single host
    and fleet); the command receives them as keyword arguments for :func:`api_credentials`."""
    for option in reversed(_API_OPTIONS):
        func = option(func)
    return func


def _read_secret(path: str, option: str) -> str:
    """Return the secret in ``path`` (its first line, stripped); raise click.UsageError."""
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.read(4096).splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"cannot read {option} {path}: {exc}; check the file") from None
    if not first or not first[0].strip():
        raise click.UsageError(f"{option} {path} is empty; put the secret on its first line")
    if os.stat(path).st_mode & 0o077:
        click.echo(
            f"gpudoctor: warning: {option} {path} can be read by other users; chmod 600 {path}",
            err=True,
        )
    return first[0].strip()


def api_credentials(values: dict[str, Any]) -> Any:
    """Return the :class:`gpudoctor.credentials.ApiAuth` of the API options in ``values``.

    Warns on stderr (once per run) about a secret given in argv and about --api-insecure."""
    from click.core import ParameterSource

    from gpudoctor.credentials import ApiAuth

    ctx = click.get_current_context(silent=True)
    for name in _ARGV_SECRETS:
        if ctx is not None and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            flag = "--" + name.replace("_", "-")
            click.echo(
                f"gpudoctor: warning: {flag} on the command line is visible to every local "
                "user (ps, shell history); use its environment variable or a *-file option",
                err=True,
            )
    token_id, secret = values.get("api_token_id"), values.get("api_token_secret")
    if values.get("api_token"):
        token_id, _, secret = str(values["api_token"]).partition("=")
    if values.get("api_token_secret_file"):
        secret = _read_secret(values["api_token_secret_file"], "--api-token-secret-file")
    password = values.get("api_password")
    if values.get("api_password_file"):
        password = _read_secret(values["api_password_file"], "--api-password-file")
    if values.get("api_insecure"):
        click.echo(
            "gpudoctor: warning: --api-insecure: the Proxmox API's TLS certificate is not "
            "verified (pass --api-ca-file /etc/pve/pve-root-ca.pem instead)",
            err=True,
        )
    return ApiAuth(
        token_id=token_id or None,
        token_secret=secret or None,
        user=values.get("api_user") or None,
        password=password or None,
        ca_file=values.get("api_ca_file") or values.get("api_ca") or None,
        insecure=bool(values.get("api_insecure")),
    )
