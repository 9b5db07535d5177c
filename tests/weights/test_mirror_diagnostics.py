"""``ensure --mirror M`` says why M cannot serve, before any download and in the final
error; ``--mirror-only`` never downloads (issue 26.3). Real processes, the loopback Hub."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from gpudoctor.weights.manifest import MANIFEST_NAME
from tests.weights.conftest import WeightsCli, dir_files, make_model_files, model_part
from tests.weights.hub_server import HubServer
from tests.weights.test_ensure_cli import REPO, assert_one_line_error, publish


def filled_mirror(hub: HubServer, cli: WeightsCli, tmp_path: Path) -> Path:
    """Return a mirror root holding REPO at the Hub's main (filled by a first ensure)."""
    mirror = tmp_path / "mirror"
    run = cli.run("ensure", REPO, "--to", str(tmp_path / "first"), "--mirror", str(mirror), "-q")
    assert run.returncode == 0, run.output
    return mirror


def _new_revision(hub: HubServer, mirror: Path) -> None:
    files = make_model_files(seed=2)
    publish(hub, files)  # main moves on; the mirror keeps the old commit


CASES: dict[str, tuple[Callable[[HubServer, Path], None], str]] = {
    "mirror missing": (lambda hub, m: shutil.rmtree(m), "does not exist"),
    "no manifest": (lambda hub, m: (m / "acme/tiny-27b" / MANIFEST_NAME).unlink(), "has no valid"),
    "repo absent": (lambda hub, m: shutil.rmtree(m / "acme/tiny-27b"), "holds no acme/tiny-27b"),
    "revision absent": (_new_revision, "holds revision"),  # asked: --revision main
    "incomplete": (
        lambda hub, m: (m / "acme/tiny-27b/config.json").unlink(),
        "is incomplete: 1 file(s) missing or of the wrong size, e.g. config.json missing",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_reason_is_told_before_the_download_then_the_hub_serves(
    hub, cli: WeightsCli, tmp_path: Path, case: str
) -> None:
    publish(hub, make_model_files())
    mirror = filled_mirror(hub, cli, tmp_path)
    damage, reason = CASES[case]
    damage(hub, mirror)
    hub.clear_log()
    target = tmp_path / "model"

    extra = ("--revision", "main") if case == "revision absent" else ()  # else: offline OK

    run = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), *extra)

    assert run.returncode == 0, run.output
    assert run.stdout.startswith("downloaded from hub:") and "mirror updated" in run.stdout
    lines = run.stderr.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning: --mirror"))
    assert reason in lines[warning] and "fetching from the Hub" in lines[warning]
    first_download = next(i for i, line in enumerate(lines) if line.startswith("download:"))
    assert warning < first_download
    assert hub.file_gets()


def test_reason_is_in_the_json_result(hub, cli: WeightsCli, tmp_path: Path) -> None:
    publish(hub, make_model_files())
    mirror = tmp_path / "mirror"
    run = cli.run("ensure", REPO, "--to", str(tmp_path / "m"), "--mirror", str(mirror), "--json")
    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert (result["source"], result["mirror_updated"]) == ("hub", True)
    assert result["mirror_problem"] == f"{mirror} does not exist"
    again = cli.run("ensure", REPO, "--to", str(tmp_path / "n"), "--mirror", str(mirror), "--json")
    assert json.loads(again.stdout)["mirror_problem"] is None  # served now


def test_final_error_says_why_the_mirror_could_not_serve(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    hub.stop()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    args = ("ensure", REPO, "--to", str(tmp_path / "model"), "--mirror", str(mirror))

    run = cli.run(*args)
    as_json = cli.run(*args, "--json")

    assert_one_line_error(run, "cannot reach the Hub")
    assert f"(--mirror could not serve: {mirror} holds no {REPO}" in run.stderr
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["mirror_problem"].startswith(f"{mirror} holds no {REPO}")


def test_mirror_only_never_downloads(hub, cli: WeightsCli, tmp_path: Path) -> None:
    files = make_model_files()
    publish(hub, files)
    mirror = filled_mirror(hub, cli, tmp_path)
    hub.clear_log()
    target = tmp_path / "model"

    served = cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror), "--mirror-only")
    assert served.returncode == 0, served.output
    assert "restored from mirror" in served.stdout and hub.requests == []
    assert model_part(dir_files(target)) == files

    (mirror / "acme/tiny-27b/config.json").unlink()
    shutil.rmtree(target)
    refused = cli.run(
        "ensure", REPO, "--to", str(target), "--mirror", str(mirror), "--mirror-only", "--json"
    )
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["mirror_problem"].endswith("e.g. config.json missing")
    assert "--mirror-only: " in refused.stderr and "nothing was downloaded" in refused.stderr
    assert hub.requests == [] and not target.exists()

    _new_revision(hub, mirror)
    stale = cli.run(
        "ensure", REPO, "--to", str(target), "--mirror", str(tmp_path / "none"), "--mirror-only"
    )
    assert_one_line_error(stale, f"--mirror-only: {tmp_path / 'none'} does not exist")
    usage = cli.run("ensure", REPO, "--to", str(target), "--mirror-only")
    assert usage.returncode == 2 and "--mirror-only needs --mirror" in usage.stderr
