"""The ``gpudoctor`` command line: a root group whose subcommands load on first use.

Only click is imported at start-up, so ``gpudoctor --help`` stays fast; each
subcommand's module (and its heavy dependencies) is imported when it is invoked.
Exit codes: 0 healthy / done, 1 gpudoctor's own error, 2 usage, 3 at least one FAIL.
"""

from __future__ import annotations

import importlib
import sys

import click

from gpudoctor import __version__

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FAIL = 0, 1, 2, 3

# name -> (module:attribute, one-line help shown by `gpudoctor --help`)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check": (
        "gpudoctor.commands.check:check",
        "Diagnose GPU access here, on a host, in a CT or a fleet.",
    ),
    "fix": (
        "gpudoctor.commands.fix:fix",
        "Repair a container's GPU access on its Proxmox/LXC host, safely.",
    ),
    "weights": (
        "gpudoctor.commands.weights:weights",
        "Restore or download model weights into tmpfs.",
    ),
    "bench": ("gpudoctor.commands.bench:bench", "Run, resume and report a benchmark matrix."),
    "list": (
        "gpudoctor.commands.list:list_checks",
        "List the check catalogue (ids, titles, severity).",
    ),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module_name, _, attr = SUBCOMMANDS[name][0].partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise click.ClickException(f"'{name}' is unavailable: {exc}") from exc
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(n, SUBCOMMANDS[n][1]) for n in sorted(SUBCOMMANDS)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpudoctor")
def cli() -> None:
    """gpudoctor: find and fix why CUDA broke in your GPU container, then get the benchmark going.

    \b
    Typical session after a Proxmox host reboot:
      gpudoctor check                                 # inside the CT: what is broken, and the remedy
      gpudoctor fix --host root@pve1 --ct 200         # on its host: plan, diff, backup, apply, re-check
      gpudoctor weights ensure Qwen/Qwen3-8B --to /dev/shm/qwen3 --mirror /var/lib/models
      gpudoctor bench plan.toml --out runs/qwen3      # runs or resumes the matrix

    Exit codes: 0 healthy, 1 gpudoctor error, 2 usage error, 3 at least one FAIL.
    """


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code (never raises for expected errors)."""
    try:
        code = cli.main(args=argv, prog_name="gpudoctor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.UsageError as exc:
        exc.show()
        return EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code if exc.exit_code not in (None, 0) else EXIT_ERROR
    except click.Abort:
        click.echo("gpudoctor: aborted", err=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        click.echo("gpudoctor: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    return code if isinstance(code, int) else EXIT_OK


def run() -> None:
    """Console-script entry point: exit with :func:`main`'s code."""
    sys.exit(main())
