"""``gpudoctor weights``: get a Hub model into a (tmpfs) directory and keep it there.

Exit codes: 0 ok; 1 error (one line on stderr, never a traceback; set
``GPUDOCTOR_DEBUG=1`` for one); 2 usage; 3 (``status`` only) the directory is not complete.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import click

from gpudoctor.exit_codes import ExitCode


class _ScrubbingStream:
    """A text stream that replaces the HF token with ``***`` in everything written."""

    def __init__(self, inner: TextIO, token: str) -> None:
        self._inner = inner
        self._token = token

    def write(self, text: str) -> int:
        self._inner.write(text.replace(self._token, "***"))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _guard_token() -> None:
    """Wrap stdout/stderr so the HF token can never be printed, whoever prints."""
    from gpudoctor.weights.hub import current_token

    token = current_token()
    if token and len(token) >= 4:
        sys.stdout = _ScrubbingStream(sys.stdout, token)  # type: ignore[assignment]
        sys.stderr = _ScrubbingStream(sys.stderr, token)  # type: ignore[assignment]


def _fail(message: str, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    from gpudoctor.errors import ERROR_HINT, PREFIX, error_line
    from gpudoctor.weights.hub import scrub

    line = error_line(scrub(message), ERROR_HINT)
    if as_json:
        click.echo(json.dumps({"ok": False, "error": line.removeprefix(PREFIX), **(extra or {})}))
    click.echo(line, err=True)
    sys.exit(ExitCode.ERROR)


def _run(as_json: bool, action: Any) -> Any:
    """Run ``action()``, turning every failure into a one-line error and exit 1."""
    from gpudoctor.weights.errors import WeightsError

    try:
        return action()
    except WeightsError as exc:
        problem = getattr(exc, "mirror_problem", None)
        _fail(str(exc), as_json, {"mirror_problem": problem} if problem else None)
    except KeyboardInterrupt:
        click.echo("gpudoctor: error: interrupted; run the same command again to resume", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # do not wait for downloads in flight; finished files are kept
    except Exception as exc:
        from gpudoctor.errors import debug_enabled

        if debug_enabled():
            raise
        from gpudoctor.weights.hub import translate_error

        _fail(str(translate_error(exc, "", None)), as_json)


@click.group(name="weights")
def weights() -> None:
    """Put model weights where the server reads them (tmpfs), fast, after every reboot.

    \b
    gpudoctor weights ensure Qwen/Qwen3-8B --to /dev/shm/qwen3 --mirror /var/lib/models
    gpudoctor weights status /dev/shm/qwen3
    gpudoctor weights mirror Qwen/Qwen3-8B --to /var/lib/models

    A directory is complete when its .gpudoctor-manifest.json lists every file, each
    has the listed size (quick) or sha256 (full), and no unfinished download is left in
    it. `gpudoctor check --model-dir` applies the same rule; without a manifest, status
    says "unmanaged" while check falls back to the safetensors index and headers.
    """


@weights.command()
@click.argument("repo_id")
@click.option(
    "--to",
    "target",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Model directory to fill, e.g. /dev/shm/qwen3 (built in DIR.partial beside it, then renamed).",
)
@click.option(
    "--revision",
    default=None,
    help="Branch, tag or commit sha. Default: what is already complete locally, else main.",
)
@click.option(
    "--mirror",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Disk mirror root (holds ORG/NAME). Restored from when it has the revision; "
    "filled after a download (hard links on the same filesystem, else a copy).",
)
@click.option(
    "--mirror-only",
    is_flag=True,
    help="Never download: when --mirror cannot serve (missing, no manifest, no such repo "
    "or revision, incomplete), exit 1 saying why. Without it the Hub is the fallback.",
)
@click.option(
    "--verify",
    type=click.Choice(["quick", "full"]),
    default="quick",
    show_default=True,
    help="quick: every file has the right size. full: also sha256 of LFS files vs the Hub's.",
)
@click.option(
    "--max-workers",
    type=click.IntRange(1, 64),
    default=16,
    show_default=True,
    help="Parallel downloads: connections (big files are fetched by ranges) and files.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def ensure(
    repo_id: str,
    target: Path,
    revision: str | None,
    mirror: Path | None,
    mirror_only: bool,
    verify: str,
    max_workers: int,
    as_json: bool,
    quiet: bool,
) -> None:
    """Make the --to directory hold the complete REPO_ID model; a no-op when it already does.

    \b
    Order: check the manifest (done if complete) -> space precheck (filesystem free
    space, and RAM for tmpfs) -> restore from --mirror, else download from the Hub
    (HF_ENDPOINT, token from HF_TOKEN or `hf auth login`) -> verify -> write the
    manifest -> atomic rename -> fill the mirror.
    When --mirror cannot serve, a warning line on stderr says why before any download
    (and `mirror_problem` in --json); --mirror-only makes that an error instead.
    Interrupted (Ctrl-C: exit 130 at once)? Run it again: every finished file is kept
    (the unit of resume is a file), from the mirror as from the Hub.
    """
    from gpudoctor.commands.options import require_writable_dir

    if mirror_only and mirror is None:
        raise click.UsageError("--mirror-only needs --mirror M")

    require_writable_dir(target, "--to")
    _guard_token()
    from gpudoctor.weights.ensure import EnsureRequest
    from gpudoctor.weights.ensure import ensure as run_ensure
    from gpudoctor.weights.progress import make_progress

    request = EnsureRequest(repo_id, target, revision, mirror, verify, max_workers, mirror_only)
    progress = make_progress(quiet=quiet or (as_json and not sys.stderr.isatty()))
    notify = lambda line: click.echo(f"warning: {line}", err=True)  # noqa: E731
    result = _run(as_json, lambda: run_ensure(request, progress, notify))
    if as_json:
        click.echo(json.dumps({"ok": True, **result.to_dict()}))
        return
    from gpudoctor.weights.progress import human_bytes

    what = f"{result.repo_id}@{result.revision[:12]} in {result.target}"
    size = f"{result.files_total} files, {human_bytes(result.bytes_total)}"
    if result.action == "none":
        click.echo(f"complete: {what} ({size}; nothing to do, {result.seconds:.2f} s)")
    else:
        fetched = f"{result.files_fetched} files, {human_bytes(result.bytes_fetched)}"
        hashed = "; every restored byte checked by sha256" if result.source == "mirror" else ""
        click.echo(
            f"{result.action} from {result.source}: {what} ({size}; fetched {fetched}"
            f" in {result.seconds:.1f} s; verify {result.verify}{hashed})"
        )
    if result.mirror_updated:
        click.echo(f"mirror updated: {mirror}")
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    private = _private_note(Path(result.target))
    if private:
        click.echo(f"note: {private}", err=True)


def _private_note(target: Path) -> str | None:
    """Return a note when ``target`` is a directory other users cannot enter (``ensure``
    builds it 0700): a server running as another user cannot load it. None otherwise."""
    import stat

    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return None
    if mode & 0o005 == 0o005:
        return None
    return (f"{target} is mode {mode:04o}: only its owner can read the model; for a server"
            f" running as another user: chmod -R go+rX {target}")  # fmt: skip


@weights.command()
@click.argument("target", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--verify",
    type=click.Choice(["quick", "full"]),
    default="quick",
    show_default=True,
    help="quick: sizes only (metadata). full: sha256 of every hashed file (reads all bytes).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def status(target: Path, verify: str, as_json: bool) -> None:
    """Say whether TARGET holds a complete model, from its manifest (no network).

    Exit 0 when complete, 3 when missing, unmanaged, untrusted (a symlink, another
    user's directory, or one others can write) or incomplete, 1 on error.
    """
    from gpudoctor.weights.progress import human_bytes, make_progress
    from gpudoctor.weights.status import status as run_status

    result = _run(as_json, lambda: run_status(target, make_progress(quiet=as_json), verify))
    if as_json:
        click.echo(json.dumps({"ok": True, **result.to_dict()}))
    else:
        if result.repo_id:
            click.echo(
                f"{result.state}: {result.repo_id}@{result.revision[:12]} in {result.target}"
                f" ({result.files_total} files, {human_bytes(result.bytes_total)},"
                f" manifest {result.created_at}, verify {result.verify})"
            )
        else:
            click.echo(f"{result.state}: {result.target} (no gpudoctor manifest)")
        for problem in result.problems:
            text = problem.detail if problem.path == "." else f"{problem.path} {problem.detail}"
            click.echo(f"  {problem.problem}: {text}")
        if result.partial:
            click.echo(f"  interrupted run left {result.partial}: `ensure` resumes from it")
    sys.exit(ExitCode.OK if result.complete else ExitCode.FAILED)


@weights.command()
@click.argument("repo_id", required=False)
@click.option(
    "--to",
    "root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Mirror root to fill (the model goes to M/ORG/NAME), e.g. /var/lib/models.",
)
@click.option(
    "--from",
    "source",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    help="Take the files from this complete local copy (a directory `weights ensure` made, "
    "checked by sha256 first) instead of the Hub.",
)
@click.option("--revision", default=None, help="Branch, tag or commit sha (default: main).")
@click.option(
    "--verify",
    "verify_root",
    type=click.Path(path_type=Path, file_okay=False),
    help="Check the mirror M instead: re-hash every file of every model (or of REPO_ID) "
    "against its manifest.",
)
@click.option(
    "--max-workers",
    type=click.IntRange(1, 64),
    default=16,
    show_default=True,
    help="Parallel downloads (from the Hub).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress output.")
def mirror(
    repo_id: str | None,
    root: Path | None,
    source: Path | None,
    revision: str | None,
    verify_root: Path | None,
    max_workers: int,
    as_json: bool,
    quiet: bool,
) -> None:
    """Make a disk mirror of REPO_ID for `ensure --mirror`, or check one.

    \b
    gpudoctor weights mirror Qwen/Qwen3-8B --to /var/lib/models
    gpudoctor weights mirror Qwen/Qwen3-8B --to /var/lib/models --from /dev/shm/qwen3
    gpudoctor weights mirror --verify /var/lib/models

    The mirror gets M/ORG/NAME with a manifest that holds the sha256 of every file
    (the Hub's for LFS files, hashed here for the rest), every file flushed to disk.
    The same trust rules as `ensure` apply (no symlinks, no directory another user
    owns or can write). Exit 0 done (--verify: intact), 1 error, 2 usage, 3 (--verify)
    a file is missing, of the wrong size or the wrong sha256 (each one is listed).
    """
    from gpudoctor.weights.progress import human_bytes, make_progress

    if verify_root is not None and (root is not None or source is not None):
        raise click.UsageError("--verify M checks a mirror; it takes no --to or --from")
    if verify_root is None and (repo_id is None or root is None):
        raise click.UsageError("give REPO_ID --to M (make a mirror) or --verify M (check one)")
    _guard_token()
    progress = make_progress(quiet=quiet or (as_json and not sys.stderr.isatty()))
    if verify_root is not None:
        from gpudoctor.weights.mirror_make import verify_mirror

        copies = _run(as_json, lambda: verify_mirror(verify_root, progress, repo_id))
        intact = all(c.intact for c in copies)
        if as_json:
            click.echo(
                json.dumps({"ok": True, "intact": intact, "models": [c.to_dict() for c in copies]})
            )
        for c in [] if as_json else copies:
            what = f"{c.repo_id}@{c.revision[:12]}" if c.repo_id else "(no manifest)"
            state = "intact" if c.intact else "NOT intact"
            click.echo(
                f"{state}: {what} in {c.path} ({c.files_total} files, {human_bytes(c.bytes_total)})"
            )
            for p in c.problems:
                click.echo(f"  {p.problem}: {p.path} {p.detail}")
        sys.exit(ExitCode.OK if intact else ExitCode.FAILED)
    from gpudoctor.weights.mirror_make import make_mirror

    assert repo_id is not None and root is not None
    made = _run(
        as_json,
        lambda: make_mirror(repo_id, root, progress, source, revision, max_workers),
    )
    if as_json:
        click.echo(json.dumps({"ok": True, **made.to_dict()}))
    else:
        click.echo(
            f"mirrored: {made.repo_id}@{made.revision[:12]} in {made.path}"
            f" ({made.files_total} files, {human_bytes(made.bytes_total)}, every sha256 in the manifest)"
        )


def main() -> None:
    """Run the ``weights`` group on its own (``python -m gpudoctor.commands.weights``), under
    gpudoctor's error policy (one line, exit codes of gpudoctor/errors.py)."""
    from gpudoctor.cli import main as cli_main

    sys.exit(cli_main(["weights", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
