"""The ``gpudoctor`` command line: a root group whose subcommands load on first use.

Only click is imported at start-up, so ``gpudoctor --help`` stays fast; each
subcommand's module (and its heavy dependencies) is imported when it is invoked.
Exit codes: 0 healthy / done, 1 gpudoctor's own error, 2 usage, 3 at least one FAIL,
130 interrupted (the error policy: :mod:`gpudoctor.errors`).
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from gpudoctor import __version__, errors
from gpudoctor.exit_codes import ExitCode
from gpudoctor.terminal import enforce_plain_output

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
    "service": ("gpudoctor.commands.service:service", "Self-healing CT boot unit; alerts."),
    "bundle": (
        "gpudoctor.commands.bundle:bundle",
        "Gather a redacted support archive (check, driver, kernel log, run failures).",
    ),
    "list": (
        "gpudoctor.commands.list:list_checks",
        "List the check catalogue (ids, titles, severity).",
    ),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when it is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """Return click's resolution of ``args``; an unknown command name is a usage error
        that names the nearest command (``chek``: did you mean 'check'?)."""
        name = click.utils.make_str(args[0])
        if name not in SUBCOMMANDS and not name.startswith("-"):
            import difflib

            near = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
            if near:
                ctx.fail(f"No such command '{name}'. Did you mean '{near[0]}'?")
        return super().resolve_command(ctx, args)

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
@click.version_option(__version__, "-V", "--version", prog_name="gpudoctor")
@click.option(
    "--debug",
    is_flag=True,
    envvar="GPUDOCTOR_DEBUG",
    help="Print a traceback with an error, and libraries' own logs (env GPUDOCTOR_DEBUG=1).",
)
def cli(debug: bool = False) -> None:
    """gpudoctor: find and fix why CUDA broke in your GPU container, then get the benchmark going.

    \b
    Typical session after a Proxmox host reboot:
      gpudoctor check                                 # inside the CT: what is broken, and the remedy
      gpudoctor fix --host root@pve1 --ct 200         # on its host: plan, diff, backup, apply, re-check
      gpudoctor weights ensure Qwen/Qwen3-8B --to /dev/shm/qwen3 --mirror /var/lib/models
      gpudoctor bench plan.toml --out runs/qwen3      # runs or resumes the matrix

    Exit codes: 0 healthy, 1 gpudoctor error, 2 usage error, 3 at least one FAIL,
    130 interrupted; each command's --help lists its own (check 4: nothing was
    checked; fix 4: changes pending). An error is one line on stderr:
    `gpudoctor: error: <what failed>; <what to do>` (--debug adds the traceback).
    """
    errors.set_debug(debug)
    errors.quiet_library_loggers()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code. Every failure becomes one line on stderr
    (:mod:`gpudoctor.errors`); a traceback only with ``--debug``."""
    args = list(sys.argv[1:] if argv is None else argv)
    head = args[: args.index("--")] if "--" in args else args
    errors.set_debug("--debug" in head)
    if "--debug" in head[1:]:  # `gpudoctor check --debug`: the root's option, wherever it is
        args = ["--debug", *(a for a in head if a != "--debug"), *args[len(head) :]]
    errors.quiet_library_loggers()
    errors.quiet_thread_tracebacks()
    enforce_plain_output()
    try:
        code = cli.main(args=args, prog_name="gpudoctor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code or 0)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `gpudoctor`, `gpudoctor bench`: help
            click.echo(exc.format_message())
            what = "no command given"
            return errors.report(what, "pick one of the commands above", ExitCode.USAGE, args)
        path = exc.ctx.command_path if exc.ctx is not None else "gpudoctor"
        hint = errors.USAGE_HINT.format(command=command_path(args) if path == "gpudoctor" else path)
        return errors.report(exc.format_message(), hint, ExitCode.USAGE, args)
    except click.ClickException as exc:
        code = exc.exit_code if exc.exit_code not in (None, 0) else ExitCode.ERROR
        if code == ExitCode.INTERRUPTED:
            return errors.report(exc.format_message(), "", code, args)
        return errors.report(exc.format_message(), errors.ERROR_HINT, code, args)
    except click.Abort as exc:  # click turns Ctrl-C (and EOF at a prompt) into Abort
        if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
            what = "interrupted"
            return errors.report(what, "run the same command again", ExitCode.INTERRUPTED, args)
        return errors.report("aborted", "nothing more was done; run it again", ExitCode.ERROR, args)
    except KeyboardInterrupt:
        what = "interrupted"
        return errors.report(what, "run the same command again", ExitCode.INTERRUPTED, args)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no "Exception ignored" at exit
        return ExitCode.OK
    except Exception as exc:
        if errors.debug_enabled():
            import traceback

            traceback.print_exc()
        if errors.stdout_failure(exc):
            errors.silence_stdout()
            what = f"cannot write to stdout: {exc.strerror}"
            return errors.report(what, "redirect the output somewhere it fits", ExitCode.ERROR, [])
        what, todo = errors.describe(exc)
        return errors.report(what, todo, ExitCode.ERROR, args)
    try:
        sys.stdout.flush()  # a full stdout fails here, not in "Exception ignored" at exit
    except OSError as exc:
        errors.silence_stdout()
        what = f"cannot write to stdout: {exc.strerror}"
        return errors.report(what, "redirect the output somewhere it fits", ExitCode.ERROR, [])
    return code if isinstance(code, int) else ExitCode.OK


def command_path(args: list[str]) -> str:
    """Return the command ``args`` name (``gpudoctor bench report``): the leading words that
    are (sub)command names, options skipped; for the help a parser's usage error points to."""
    path: list[str] = ["gpudoctor"]
    command: click.Command | None = cli
    for word in (a for a in args if not a.startswith("-")):
        if not isinstance(command, click.Group):
            break
        command = command.get_command(click.Context(command), word)
        if command is None:
            break
        path.append(word)
    return " ".join(path)


def run() -> None:
    """Console-script entry point: exit with :func:`main`'s code (at once after Ctrl-C,
    without waiting for worker threads; at once after a plain local ``check`` too)."""
    code = main()
    if code == ExitCode.INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if quick_exit_allowed(sys.argv[1:]):
        exit_now(code)
    sys.exit(code)


def quick_exit_allowed(args: list[str]) -> bool:
    """Return True when the finished command was a plain local ``check`` (the one whose
    latency matters, docs/performance.md) and no non-daemon thread is still running: then
    the interpreter's teardown (20-30 ms of module and object clean-up) can be skipped, as
    every file it wrote was closed by a ``with`` block."""
    import threading

    from gpudoctor.early_probe import wanted

    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    return wanted(args) and all(t.daemon for t in others)


def exit_now(code: int) -> None:
    """Flush stdout and stderr, run the ``atexit`` handlers, and ``os._exit(code)`` without
    the interpreter's teardown. Never returns."""
    import atexit
    import contextlib

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
