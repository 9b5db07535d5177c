"""`weights ensure` removes its lock file when it ends (issue 34.8: /run/gpudoctor kept one
per target forever), and a second run during the first is still refused. Real processes,
the loopback Hub."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.weights import localfs
from tests.weights.conftest import WeightsCli, make_model_files
from tests.weights.test_ensure_cli import REPO, assert_one_line_error, publish


def test_lock_file_removed_after_ensure_and_held_while_it_runs(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    publish(hub, make_model_files())
    target = tmp_path / "model"
    lock = localfs.lock_path(target)
    for _ in range(2):  # a download, then the no-op on the complete copy
        done = cli.run("ensure", REPO, "--to", str(target), "-q")
        assert done.returncode == 0, done.output
        assert not lock.exists(), lock
    other = tmp_path / "other"
    with localfs.locked(other):  # another run holds it: refused, and its lock stays
        busy = cli.run("ensure", REPO, "--to", str(other), "-q")
        assert_one_line_error(busy, f"another gpudoctor run is working on {other}")
        assert localfs.lock_path(other).exists()
    assert not localfs.lock_path(other).exists()


def test_a_target_only_root_can_read_is_said(hub, cli: WeightsCli, tmp_path: Path) -> None:
    """34.8: weights targets end up 0700 and a server running as another user cannot read
    them: `ensure` says so and how to open it; once opened, nothing is said."""
    import os

    publish(hub, make_model_files())
    target = tmp_path / "model"
    done = cli.run("ensure", REPO, "--to", str(target))
    assert done.returncode == 0, done.output
    assert f"note: {target} is mode 0700" in done.stderr
    assert f"chmod -R go+rX {target}" in done.stderr
    os.chmod(target, 0o755)
    again = cli.run("ensure", REPO, "--to", str(target))
    assert again.returncode == 0 and "note:" not in again.stderr, again.output
