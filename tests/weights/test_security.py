"""Attacks on ``weights ensure`` through a world-writable tmpfs (issue 12.1).

Each test mounts a real tmpfs with mode 1777 (as /dev/shm is), lets a second user
(``nobody``, through ``setpriv``) plant files there, then runs the real CLI as root
and asserts that the attack fails. The pytest tmp directory (mode 0700) is opened
to ``nobody`` only down to the mount point.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.weights.manifest import MANIFEST_NAME
from tests.fakes import mkdir_race
from tests.weights.conftest import (
    REPO_ROOT,
    CliRun,
    WeightsCli,
    dir_files,
    make_model_files,
    model_part,
)
from tests.weights.hub_server import HubServer
from tests.weights.test_ensure_cli import REPO, assert_one_line_error, publish

NOBODY = 65534


def as_nobody(script: str, **kwargs) -> subprocess.Popen | subprocess.CompletedProcess:
    """Run ``sh -c script`` as uid/gid 65534 with no supplementary groups (the attacker)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as a second user")
    command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    command += ["sh", "-c", script]
    if kwargs.pop("background", False):
        return subprocess.Popen(command, **kwargs)
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs)


@pytest.fixture
def tmp_path(public_tmp_path: Path) -> Path:
    """Files here must be reachable by ``nobody`` (see tests/conftest.py public_tmp_path)."""
    return public_tmp_path


@pytest.fixture
def shm(tmpfs, tmp_path: Path) -> Path:
    """A real tmpfs mounted with mode 1777, reachable by ``nobody``."""
    point = tmpfs("64m", mode="1777")
    for parent in (point.parent, *point.parent.parents):
        if parent == Path("/"):
            break
        os.chmod(parent, os.stat(parent).st_mode | 0o011)  # x for others, nothing more
    return point


def complete_copy(cli: WeightsCli, hub: HubServer, files: dict[str, bytes], where: Path) -> Path:
    """A genuine complete model directory made by ensure (for the attacker to copy from)."""
    publish(hub, files)
    run = cli.run("ensure", REPO, "--to", str(where), "-q")
    assert run.returncode == 0, run.output
    os.chmod(where, 0o755)
    for p in where.iterdir():
        os.chmod(p, 0o644) if p.is_file() else None
    return where


def test_planted_target_with_copied_manifest_is_refused(
    hub, cli: WeightsCli, shm: Path, tmp_path: Path
) -> None:
    """Attack: nobody pre-creates --to with a tampered shard of the right size and a copied
    manifest, so that root reports it complete (even with --verify full) and serves it."""
    files = make_model_files()
    genuine = complete_copy(cli, hub, files, tmp_path / "pub" / "genuine")
    os.chmod(tmp_path / "pub", 0o755)
    shard = "model-00001-of-00003.safetensors"
    as_nobody(
        f"mkdir {shm}/model && cp -r {genuine}/. {shm}/model/ && "
        f"printf 'EVIL' | dd of={shm}/model/{shard} bs=1 seek=100 conv=notrunc status=none"
    )
    for verify in ("quick", "full"):
        run = cli.run("ensure", REPO, "--to", str(shm / "model"), "--verify", verify)
        assert_one_line_error(run, "belongs to nobody (uid 65534)")
        assert "rm -rf --one-file-system" in run.stderr
    assert b"EVIL" in (shm / "model" / shard).read_bytes()  # untouched, and never published
    status = cli.run("status", str(shm / "model"), "--json")
    assert status.returncode == 3 and json.loads(status.stdout)["state"] == "untrusted"


def test_other_writable_target_is_refused(hub, cli: WeightsCli, shm: Path, tmp_path: Path) -> None:
    """Attack: a root-owned --to left mode 0777; nobody swaps a shard and the manifest in it."""
    files = make_model_files()
    publish(hub, files)
    assert cli.run("ensure", REPO, "--to", str(shm / "model"), "-q").returncode == 0
    os.chmod(shm / "model", 0o777)
    as_nobody(f"rm -f {shm}/model/config.json && echo '{{}}' > {shm}/model/config.json")
    run = cli.run("ensure", REPO, "--to", str(shm / "model"))
    assert_one_line_error(run, "is writable by others (mode 0777)")


def test_verify_full_uses_the_hubs_hashes_not_the_targets_manifest(
    hub, cli: WeightsCli, shm: Path
) -> None:
    """Attack: a shard replaced by same-size bytes and the target's manifest rewritten to
    their sha256; --verify full must compare with the Hub's hashes and heal the file."""
    files = make_model_files()
    publish(hub, files)
    target = shm / "model"
    assert cli.run("ensure", REPO, "--to", str(target), "-q").returncode == 0
    shard = "model-00002-of-00003.safetensors"
    evil = os.urandom(len(files[shard]))
    (target / shard).write_bytes(evil)
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    for entry in manifest["files"]:
        if entry["path"] == shard:
            entry["sha256"] = hashlib.sha256(evil).hexdigest()
    (target / MANIFEST_NAME).write_text(json.dumps(manifest))

    run = cli.run("ensure", REPO, "--to", str(target), "--verify", "full", "--json")

    assert run.returncode == 0, run.output
    assert json.loads(run.stdout)["files_fetched"] == 1
    assert model_part(dir_files(target)) == files


def test_planted_partial_with_cache_symlink_writes_and_deletes_nothing_outside(
    hub, cli: WeightsCli, shm: Path, tmp_path: Path
) -> None:
    """Attack: nobody pre-creates DIR.partial with `.cache -> /victim`, so that root's
    download bookkeeping writes into (and its cleanup deletes from) a directory outside."""
    publish(hub, make_model_files())
    victim = tmp_path / "victim"
    (victim / "huggingface" / "download").mkdir(parents=True)
    precious = victim / "huggingface" / "download" / "model-00001-of-00003.safetensors.metadata"
    precious.write_text("keep me")
    (victim / "huggingface" / "keep.txt").write_text("keep me too")
    before = sorted(str(p) for p in victim.rglob("*"))
    as_nobody(f"mkdir {shm}/model.partial && ln -s {victim} {shm}/model.partial/.cache")

    run = cli.run("ensure", REPO, "--to", str(shm / "model"))

    assert_one_line_error(run, "belongs to nobody (uid 65534)")
    assert sorted(str(p) for p in victim.rglob("*")) == before
    assert precious.read_text() == "keep me"
    assert hub.file_gets() == []


def test_partial_and_target_symlinks_are_never_followed(
    hub, cli: WeightsCli, shm: Path, tmp_path: Path
) -> None:
    """Attack: nobody makes DIR.partial (then DIR) a symlink to a root-owned directory, so
    that root builds the model in, renames, or deletes files of that directory."""
    publish(hub, make_model_files())
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.json").write_text("root's own file")
    as_nobody(f"ln -s {victim} {shm}/model.partial")
    run = cli.run("ensure", REPO, "--to", str(shm / "model"))
    assert_one_line_error(run, "is a symlink")
    as_nobody(f"rm {shm}/model.partial && ln -s {victim} {shm}/model")
    run = cli.run("ensure", REPO, "--to", str(shm / "model"))
    assert_one_line_error(run, "is a symlink")
    assert sorted(os.listdir(victim)) == ["config.json"]
    assert (victim / "config.json").read_text() == "root's own file"
    assert hub.file_gets() == []


def test_lock_held_by_another_user_in_shm_does_not_block(hub, cli: WeightsCli, shm: Path) -> None:
    """Attack: nobody creates the old lock file /dev/shm/.DIR.gpudoctor-lock and holds a
    flock on it forever, so that every boot-time restore fails ("another run")."""
    files = make_model_files()
    publish(hub, files)
    holder = as_nobody(
        f"exec flock {shm}/.model.gpudoctor-lock sleep 60",
        background=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not (shm / ".model.gpudoctor-lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        run = cli.run("ensure", REPO, "--to", str(shm / "model"), "-q")
        assert run.returncode == 0, run.output
        assert model_part(dir_files(shm / "model")) == files
    finally:
        holder.kill()
        holder.wait()
    lock_dir = Path("/run/gpudoctor")
    st = os.lstat(lock_dir)
    assert st.st_uid == 0 and (st.st_mode & 0o777) == 0o700
    assert not any(
        name.endswith("gpudoctor-lock") and name != ".model.gpudoctor-lock"
        for name in os.listdir(shm)
    )


@pytest.mark.parametrize(
    "evil_path",
    [MANIFEST_NAME, ".gpudoctor-partial.json", ".cache/huggingface/download/x.metadata"],
)
def test_repo_file_named_like_gpudoctors_own_is_refused(
    hub, cli: WeightsCli, shm: Path, evil_path: str
) -> None:
    """Attack: a hostile Hub repo ships `.gpudoctor-manifest.json` (or hf's bookkeeping) that
    would overwrite gpudoctor's own record of what is complete."""
    files = make_model_files()
    files[evil_path] = json.dumps({"schema": "gpudoctor.manifest/1", "files": []}).encode()
    publish(hub, files)
    run = cli.run("ensure", REPO, "--to", str(shm / "model"))
    assert_one_line_error(run, "collides with gpudoctor's own bookkeeping")
    assert not (shm / "model").exists()
    assert hub.file_gets() == []


def test_mirror_under_another_users_directory_is_refused(hub, cli: WeightsCli, shm: Path) -> None:
    """Attack: the --mirror root lies in a directory nobody owns, so nobody can swap the
    mirror's files (or its staging dir) for links while root restores from or fills it."""
    publish(hub, make_model_files())
    as_nobody(f"mkdir {shm}/models")
    run = cli.run("ensure", REPO, "--to", str(shm / "model"), "--mirror", f"{shm}/models/m")
    assert_one_line_error(run, "belongs to nobody (uid 65534)")
    assert "above --mirror" in run.stderr
    assert not (shm / "model").exists() and hub.file_gets() == []


def test_group_writable_target_ancestor_and_manifest_are_refused_like_0777(
    hub, cli: WeightsCli, shm: Path
) -> None:
    """Issue 27.1: mode 0775 with a group another user is in is as open as 0777 for that
    user. nobody (group nogroup) edits a file in a root:nogroup 0775 --to; the same group
    write on an ancestor (not sticky) or on the manifest alone is refused too."""
    files = make_model_files()
    publish(hub, files)
    target = shm / "model"
    assert cli.run("ensure", REPO, "--to", str(target), "-q").returncode == 0
    os.chown(target, 0, NOBODY)
    os.chmod(target, 0o775)
    as_nobody(f"rm -f {target}/config.json && echo '{{}}' > {target}/config.json")
    run = cli.run("ensure", REPO, "--to", str(target))
    assert_one_line_error(run, "is writable by others (mode 0775)")
    status = cli.run("status", str(target), "--json")
    assert status.returncode == 3 and json.loads(status.stdout)["state"] == "untrusted"

    os.chmod(target, 0o755)
    os.chown(target / MANIFEST_NAME, 0, NOBODY)
    os.chmod(target / MANIFEST_NAME, 0o664)
    run = cli.run("ensure", REPO, "--to", str(target))
    assert_one_line_error(run, "a gpudoctor manifest) is writable by others (mode 0664)")

    parent = shm / "shared"
    parent.mkdir()
    os.chown(parent, 0, NOBODY)
    os.chmod(parent, 0o775)
    run = cli.run("ensure", REPO, "--to", str(parent / "model"))
    assert_one_line_error(run, "writable by others and not sticky (mode 0775)")
    assert not (parent / "model").exists()


def test_a_link_planted_as_an_existing_parent_of_to_is_refused_not_followed(
    hub, cli: WeightsCli, shm: Path, tmp_path: Path
) -> None:
    """Attack (issue 33.3): nobody plants ``/dev/shm/models -> ROOT_ONLY_DIR`` before root
    runs ``ensure --to /dev/shm/models/m``: the parent exists (it is a link), so nothing
    was judged and root's model landed in the directory the attacker chose."""
    files = make_model_files()
    publish(hub, files)
    chosen = tmp_path / "root-only"
    chosen.mkdir(mode=0o700)  # root's, where nobody can write: only the link leads there
    as_nobody(f"ln -s {chosen} {shm}/models")
    run = cli.run("ensure", REPO, "--to", str(shm / "models" / "m"))
    assert_one_line_error(run, "is a symlink of nobody (uid 65534)")
    assert list(chosen.iterdir()) == []
    # root's own link is followed as before (e.g. /var/run -> /run)
    (shm / "mine").symlink_to(chosen)
    assert cli.run("ensure", REPO, "--to", str(shm / "mine" / "m"), "-q").returncode == 0
    assert (chosen / "m" / "config.json").is_file()


def test_a_missing_level_nobody_makes_before_roots_mkdir_is_refused(
    hub, cli: WeightsCli, shm: Path
) -> None:
    """Attack (issue 46.4): ``/dev/shm/models/m`` after a reboot: ``models`` is missing.
    Root judged ``/dev/shm`` and is about to ``mkdir models``; nobody's real ``mkdir
    models`` lands first (that moment forced by tests/fakes/mkdir_race.py, never by luck).
    On the code before, ensure exited 0 ("every restored byte checked by sha256") with
    root's model in nobody's directory, where nobody could swap the files."""
    publish(hub, make_model_files())
    proc = subprocess.run(
        [sys.executable, "-c", mkdir_race.PRELUDE, "weights", "ensure", REPO, "--to",
         str(shm / "models" / "m")],
        capture_output=True, text=True, env=cli.env({"GPUDOCTOR_RACE_NAME": "models"}),
        cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    run = CliRun(proc.returncode, proc.stdout, proc.stderr)
    assert os.stat(shm / "models").st_uid == NOBODY  # nobody won the race, as forced
    assert_one_line_error(run, f"{shm}/models (above --to) belongs to nobody (uid 65534)")
    assert os.listdir(shm / "models") == []


@pytest.mark.parametrize("umask", [0o000, 0o002])
@pytest.mark.parametrize("same_fs", [True, False], ids=["hard-links", "copies"])
def test_mirror_from_gives_explicit_modes_whatever_the_umask(
    hub, cli: WeightsCli, shm: Path, tmp_path: Path, umask: int, same_fs: bool
) -> None:
    """Attack (issue 33.9): root runs ``weights mirror --from`` under umask 0 (a boot unit)
    or 002: the mirror's directories came out 0777 / 0775, nobody swapped a file in, and
    the next ``ensure --mirror`` refused the mirror. Every directory is 0755, every file
    writable by its owner only, nobody's write fails, and the mirror restores."""
    files = make_model_files()
    publish(hub, files)
    local = (tmp_path if same_fs else shm) / "local"
    assert cli.run("ensure", REPO, "--to", str(local), "-q").returncode == 0
    mirror = tmp_path / "mirror"
    old = os.umask(umask)
    try:
        run = cli.run("mirror", REPO, "--to", str(mirror), "--from", str(local))
    finally:
        os.umask(old)
    assert run.returncode == 0, run.output
    model = mirror / "acme" / "tiny-27b"
    made = [mirror, mirror / "acme", model, *(p for p in model.rglob("*") if p.is_dir())]
    assert {str(p): oct(p.stat().st_mode & 0o7777) for p in made} == {str(p): "0o755" for p in made}
    writable = [str(p) for p in model.rglob("*") if p.stat().st_mode & 0o022]
    assert writable == []
    planted = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", "sh", "-c",
         f"echo evil > {model}/tokenizer/evil && mv -f {model}/tokenizer/evil {model}/tokenizer/tokenizer_config.json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert planted.returncode != 0 and "Permission denied" in planted.stderr, planted
    restored = cli.run(
        "ensure", REPO, "--to", str(tmp_path / "again"), "--mirror", str(mirror), "--json"
    )
    assert restored.returncode == 0, restored.output
    assert json.loads(restored.stdout)["source"] == "mirror"
