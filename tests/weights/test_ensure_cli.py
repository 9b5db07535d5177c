"""``gpudoctor weights ensure|status`` end to end: real processes, a real HTTP server on
127.0.0.1 standing for the Hub, real tmpfs mounts. Request counts are taken server-side."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from gpudoctor.weights.manifest import MANIFEST_NAME, parse_manifest
from tests.weights.conftest import WeightsCli, dir_files, make_model_files, model_part
from tests.weights.hub_server import HubServer

REPO = "acme/tiny-27b"


def publish(
    hub: HubServer, files: dict[str, bytes], repo_id: str = REPO, tag: str | None = None
) -> str:
    repo = hub.repos.get(repo_id) or hub.add_repo(repo_id)
    return repo.commit(files, tag=tag)


def assert_one_line_error(run, needle: str) -> None:
    assert run.returncode == 1, run.output
    assert "Traceback" not in run.output
    lines = [line for line in run.stderr.splitlines() if line.startswith("gpudoctor: error: ")]
    assert len(lines) == 1 and needle in lines[0], run.stderr


def test_fresh_download_into_real_tmpfs_writes_manifest(hub, cli: WeightsCli, tmpfs) -> None:
    files = make_model_files()
    sha = publish(hub, files)
    shm = tmpfs("32m")
    target = shm / "tiny"

    run = cli.run("ensure", REPO, "--to", str(target), "--json")

    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert (result["action"], result["source"], result["revision"]) == ("downloaded", "hub", sha)
    assert result["files_fetched"] == len(files)
    on_disk = dir_files(target)
    assert model_part(on_disk) == files
    manifest = parse_manifest(on_disk[MANIFEST_NAME].decode())
    assert manifest.revision == sha and manifest.total_size == sum(map(len, files.values()))
    shards = [f for f in manifest.files if f.path.endswith(".safetensors")]
    assert all(f.sha256 for f in shards) and len(shards) == 3
    assert sorted(os.listdir(shm)) == ["tiny"]  # no .partial and no lock file left here
    gets = sorted(r.path.rsplit("/", 1)[-1] for r in hub.file_gets())
    assert gets == sorted(p.rsplit("/", 1)[-1] for p in files)  # each file fetched once
    status = cli.run("status", str(target), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "complete"


def test_second_ensure_makes_no_request(hub, cli: WeightsCli, tmp_path: Path) -> None:
    publish(hub, make_model_files())
    target = tmp_path / "model"
    assert cli.run("ensure", REPO, "--to", str(target)).returncode == 0
    hub.clear_log()

    run = cli.run("ensure", REPO, "--to", str(target), "--json")

    assert run.returncode == 0, run.output
    assert json.loads(run.stdout)["action"] == "none"
    assert hub.requests == []


def test_truncated_shard_detected_and_refetched_alone(hub, cli: WeightsCli, tmpfs) -> None:
    files = make_model_files()
    publish(hub, files)
    target = tmpfs("32m") / "tiny"
    first = cli.run("ensure", REPO, "--to", str(target))
    assert first.returncode == 0, first.output
    # not a tty: plain progress lines on stderr, the result on stdout
    assert "download: 6 files, 3.6 MB" in first.stderr
    assert "download: done model-00001-of-00003.safetensors" in first.stderr
    assert first.stdout.startswith("downloaded from hub: acme/tiny-27b@")
    shard = "model-00002-of-00003.safetensors"
    os.truncate(target / shard, 1000)
    status = cli.run("status", str(target))
    assert status.returncode == 3 and f"size: {shard}" in status.stdout
    hub.clear_log()

    run = cli.run("ensure", REPO, "--to", str(target), "--json")

    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert (result["action"], result["files_fetched"]) == ("repaired", 1)
    assert [r.path.rsplit("/", 1)[-1] for r in hub.file_gets()] == [shard]
    assert model_part(dir_files(target)) == files


def test_bit_flip_caught_by_full_verify_only(hub, cli: WeightsCli, tmp_path: Path) -> None:
    files = make_model_files()
    publish(hub, files)
    target = tmp_path / "model"
    assert cli.run("ensure", REPO, "--to", str(target)).returncode == 0
    shard = "model-00001-of-00003.safetensors"
    with open(target / shard, "r+b") as handle:
        handle.seek(123_456)
        byte = handle.read(1)
        handle.seek(123_456)
        handle.write(bytes([byte[0] ^ 0x01]))
    quick = cli.run("status", str(target))
    assert quick.returncode == 0  # sizes are right: quick cannot see it, by design
    full = cli.run("status", str(target), "--verify", "full")
    assert full.returncode == 3 and f"sha256: {shard}" in full.stdout
    hub.clear_log()

    run = cli.run("ensure", REPO, "--to", str(target), "--verify", "full", "--json")

    assert run.returncode == 0, run.output
    assert json.loads(run.stdout)["files_fetched"] == 1
    assert [r.path.rsplit("/", 1)[-1] for r in hub.file_gets()] == [shard]
    assert model_part(dir_files(target)) == files
    assert cli.run("status", str(target), "--verify", "full").returncode == 0


def test_too_small_tmpfs_fails_before_writing(hub, cli: WeightsCli, tmpfs) -> None:
    publish(hub, make_model_files())
    shm = tmpfs("1m")

    run = cli.run("ensure", REPO, "--to", str(shm / "tiny"))

    assert_one_line_error(run, "not enough space")
    assert "need 3.6 MB" in run.stderr and "only 1.0 MB free" in run.stderr
    assert [p for p in os.listdir(shm) if not p.endswith("gpudoctor-lock")] == []
    assert os.statvfs(shm).f_bfree == os.statvfs(shm).f_blocks  # not a byte written
    assert hub.file_gets() == []


def test_download_fills_mirror_once_then_restore_needs_no_server(
    hub, cli: WeightsCli, tmpfs, tmp_path: Path
) -> None:
    files = make_model_files()
    sha = publish(hub, files)
    mirror = tmp_path / "mirror"
    first = tmpfs("32m", "shm1") / "tiny"
    run = cli.run("ensure", REPO, "--to", str(first), "--mirror", str(mirror), "--json")
    assert run.returncode == 0, run.output
    assert json.loads(run.stdout)["mirror_updated"] is True
    assert len(hub.file_gets()) == len(files)  # the mirror got it without a second download
    mirrored = mirror / "acme" / "tiny-27b"
    assert model_part(dir_files(mirrored)) == files
    assert parse_manifest((mirrored / MANIFEST_NAME).read_text()).revision == sha
    hub.stop()  # from now on any request would be refused

    second = tmpfs("32m", "shm2") / "tiny"
    run = cli.run("ensure", REPO, "--to", str(second), "--mirror", str(mirror), "--json")

    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert (result["action"], result["source"], result["revision"]) == ("restored", "mirror", sha)
    assert model_part(dir_files(second)) == files


def test_mirror_on_same_filesystem_uses_hard_links(hub, cli: WeightsCli, tmp_path: Path) -> None:
    publish(hub, make_model_files())
    target, mirror = tmp_path / "model", tmp_path / "mirror"
    assert cli.run("ensure", REPO, "--to", str(target), "--mirror", str(mirror)).returncode == 0
    shard = "model-00001-of-00003.safetensors"
    assert (target / shard).stat().st_ino == (mirror / "acme/tiny-27b" / shard).stat().st_ino


def test_sigkill_mid_download_then_rerun_keeps_finished_files(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    files = make_model_files(shard_sizes=(600_000, 600_000, 600_000, 600_000))
    publish(hub, files)
    hub.throttle_bytes_per_s = 1_000_000
    target = tmp_path / "model"
    partial = tmp_path / "model.partial"
    proc = cli.popen("ensure", REPO, "--to", str(target), "--max-workers", "1", "-q")
    shards = sorted(p for p in files if p.endswith(".safetensors"))
    deadline = time.monotonic() + 60
    finished: list[str] = []
    while time.monotonic() < deadline and not finished:
        finished = [s for s in shards if (partial / s).exists()]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert finished, "no shard finished before the deadline"
    assert not target.exists() and partial.is_dir()
    done_before = {s for s in shards if (partial / s).exists()}
    assert done_before != set(shards)
    hub.throttle_bytes_per_s = None
    hub.clear_log()

    run = cli.run("ensure", REPO, "--to", str(target), "--json")

    assert run.returncode == 0, run.output
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub.file_gets()}
    assert fetched.isdisjoint(done_before)
    assert fetched >= set(shards) - done_before
    assert model_part(dir_files(target)) == files
    assert not partial.exists()


def test_token_is_used_but_never_printed(hub, cli: WeightsCli, tmp_path: Path) -> None:
    publish(hub, make_model_files())
    token = "hf_TopSecretTokenValue0123456789"
    env = {"HF_TOKEN": token, "HF_HUB_VERBOSITY": "debug"}
    runs = [
        cli.run("ensure", REPO, "--to", str(tmp_path / "a"), env=env),
        cli.run("ensure", REPO, "--to", str(tmp_path / "a"), "--json", env=env),
        cli.run("ensure", "acme/missing", "--to", str(tmp_path / "b"), env=env),
        cli.run("ensure", REPO, "--to", str(tmp_path / "c"), "--revision", token, env=env),
        cli.run("status", str(tmp_path / "a"), env=env),
    ]
    assert [r.returncode for r in runs] == [0, 0, 1, 1, 0]
    assert any(r.authorization == f"Bearer {token}" for r in hub.requests)
    for run in runs:
        assert token not in run.output
    assert "***" in runs[3].stderr  # the token, echoed back as a revision, was masked


def test_unknown_repo_and_revision_are_one_line_errors(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    publish(hub, make_model_files())
    missing = cli.run("ensure", "acme/nope", "--to", str(tmp_path / "x"))
    assert_one_line_error(missing, "repository acme/nope not found")
    bad_rev = cli.run("ensure", REPO, "--to", str(tmp_path / "x"), "--revision", "v9")
    assert_one_line_error(bad_rev, "revision 'v9' not found")
    as_json = cli.run("ensure", "acme/nope", "--to", str(tmp_path / "x"), "--json")
    assert json.loads(as_json.stdout) == {
        "ok": False,
        "error": missing.stderr.strip().removeprefix("gpudoctor: error: "),
    }
    assert not (tmp_path / "x").exists()


def test_offline_with_nothing_local_is_one_line_error(hub, cli: WeightsCli, tmp_path: Path) -> None:
    publish(hub, make_model_files())
    run = cli.run("ensure", REPO, "--to", str(tmp_path / "x"), env={"HF_HUB_OFFLINE": "1"})
    assert_one_line_error(run, "offline")
    hub.stop()
    down = cli.run("ensure", REPO, "--to", str(tmp_path / "x"))
    assert_one_line_error(down, "cannot reach the Hub")


def test_usage_errors_exit_2(cli: WeightsCli) -> None:
    run = cli.run("ensure", REPO)
    assert run.returncode == 2 and "--to" in run.stderr
    run = cli.run("ensure", REPO, "--to", "/tmp/x", "--verify", "sometimes")
    assert run.returncode == 2


def test_read_only_target_is_one_line_error(hub, cli: WeightsCli, tmpfs) -> None:
    publish(hub, make_model_files())
    shm = tmpfs("8m")
    import subprocess

    subprocess.run(["mount", "-o", "remount,ro", str(shm)], check=True)
    run = cli.run("ensure", REPO, "--to", str(shm / "tiny"))
    assert_one_line_error(run, "Read-only file system")


def test_revision_pinning_and_update_keeps_unchanged_shards(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    old_files = make_model_files(seed=1)
    old_sha = publish(hub, old_files, tag="v1.0")
    new_files = dict(old_files)
    new_files["config.json"] = b'{"architectures": ["LlamaForCausalLM"], "v": 2}\n'
    new_files["model-00003-of-00003.safetensors"] = b"\x07" * 950_000
    new_sha = publish(hub, new_files)
    target = tmp_path / "model"

    pinned = cli.run("ensure", REPO, "--to", str(target), "--revision", "v1.0", "--json")
    assert pinned.returncode == 0, pinned.output
    assert json.loads(pinned.stdout)["revision"] == old_sha
    assert model_part(dir_files(target)) == old_files
    by_sha = cli.run("ensure", REPO, "--to", str(target), "--revision", old_sha[:10], "--json")
    assert json.loads(by_sha.stdout)["action"] == "none"
    hub.clear_log()

    latest = cli.run("ensure", REPO, "--to", str(target), "--revision", "main", "--json")

    assert latest.returncode == 0, latest.output
    assert json.loads(latest.stdout)["revision"] == new_sha
    assert model_part(dir_files(target)) == new_files
    fetched = {r.path.rsplit("/", 1)[-1] for r in hub.file_gets()}
    # Unchanged shards (same LFS sha256) are kept; small git files have no sha256 on the
    # Hub to compare with, so they are fetched again (a few kB).
    assert "model-00003-of-00003.safetensors" in fetched
    assert not fetched & {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"}


def test_status_of_missing_and_unmanaged_dirs(cli: WeightsCli, tmp_path: Path) -> None:
    missing = cli.run("status", str(tmp_path / "none"), "--json")
    assert missing.returncode == 3 and json.loads(missing.stdout)["state"] == "missing"
    (tmp_path / "plain").mkdir()
    plain = cli.run("status", str(tmp_path / "plain"))
    assert plain.returncode == 3 and plain.stdout.startswith("unmanaged:")


def test_concurrent_run_is_refused_and_mount_point_target_too(
    hub, cli: WeightsCli, tmp_path: Path, tmpfs
) -> None:
    publish(hub, make_model_files())
    hub.throttle_bytes_per_s = 1_000_000
    target = tmp_path / "model"
    first = cli.popen("ensure", REPO, "--to", str(target), "-q")
    try:
        deadline = time.monotonic() + 30
        while not hub.file_gets() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = cli.run("ensure", REPO, "--to", str(target))
        assert_one_line_error(second, "another gpudoctor run is working on")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    shm = tmpfs("8m")
    on_mount = cli.run("ensure", REPO, "--to", str(shm))
    assert_one_line_error(on_mount, "is a mount point")


def test_root_cli_exposes_the_weights_group(cli: WeightsCli, tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "weights", "status", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        env=cli.env(),
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("missing: ")


def test_server_sending_wrong_bytes_is_caught_by_full_verify(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    files = make_model_files()
    sha = publish(hub, files)
    shard = "model-00003-of-00003.safetensors"
    liar = tmp_path / "liar.bin"
    liar.write_bytes(bytes(len(files[shard])))  # right size, wrong content
    hub.repos[REPO].commits[sha][shard].source = liar
    target = tmp_path / "model"

    run = cli.run("ensure", REPO, "--to", str(target), "--verify", "full")

    assert_one_line_error(run, f"still wrong after re-download, e.g. {shard}")
    assert not target.exists()  # never published incomplete
    assert len([r for r in hub.file_gets() if r.path.endswith(shard)]) == 2


def test_damaged_mirror_is_not_trusted(hub, cli: WeightsCli, tmp_path: Path) -> None:
    files = make_model_files()
    publish(hub, files)
    mirror = tmp_path / "mirror"
    assert (
        cli.run("ensure", REPO, "--to", str(tmp_path / "a"), "--mirror", str(mirror)).returncode
        == 0
    )
    shard = mirror / "acme/tiny-27b/model-00001-of-00003.safetensors"
    shard.unlink()  # break the hard link first: only the mirror copy is damaged
    shard.write_bytes(b"short")
    hub.clear_log()

    run = cli.run("ensure", REPO, "--to", str(tmp_path / "b"), "--mirror", str(mirror), "--json")

    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    assert (result["source"], result["mirror_updated"]) == ("hub", True)
    assert model_part(dir_files(tmp_path / "b")) == files
    assert model_part(dir_files(mirror / "acme/tiny-27b")) == files  # mirror healed


def test_rich_progress_on_a_terminal(hub, cli: WeightsCli, tmp_path: Path) -> None:
    import shlex
    import shutil
    import subprocess

    if shutil.which("script") is None:
        import pytest

        pytest.skip("util-linux `script` (a pseudo-terminal) is not installed")
    publish(hub, make_model_files())
    command = shlex.join(
        cli.command("ensure", REPO, "--to", str(tmp_path / "m"), "--verify", "full")
    )
    proc = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        capture_output=True,
        text=True,
        env=cli.env({"COLUMNS": "120", "TERM": "xterm-256color"}),  # a colour terminal, not dumb
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    assert "download (6 files)" in proc.stdout and "verify sha256 (3 files)" in proc.stdout
    assert "━" in proc.stdout  # rich's bar, not the plain lines
    assert "download: done" not in proc.stdout


def test_no_permission_is_one_line_error(hub, cli: WeightsCli) -> None:
    import shutil
    import subprocess
    import tempfile

    import pytest

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the CLI as an unprivileged user")
    publish(hub, make_model_files())
    base = Path(tempfile.mkdtemp(prefix="gpudoctor-perm-"))
    try:
        base.chmod(0o755)
        (base / "root-only").mkdir(mode=0o755)
        home = base / "home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             *cli.command("ensure", REPO, "--to", str(base / "root-only" / "m"))],
            capture_output=True,
            text=True,
            env=cli.env({"HF_HOME": str(home), "HOME": str(home)}),
            cwd=Path(__file__).resolve().parents[2],
            timeout=60,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert proc.stderr.strip() == (
            f"gpudoctor: error: cannot write --to {base / 'root-only' / 'm'}: Permission denied; "
            "pick a writable directory (nothing was done)"
        )
        assert hub.file_gets() == []
    finally:
        shutil.rmtree(base)


def test_adopted_file_of_right_size_but_wrong_sha256_is_fetched_again(
    hub, cli: WeightsCli, tmp_path: Path
) -> None:
    """Issue 27.1: a directory gpudoctor did not write (no manifest, no partial marker, as
    `hf download` leaves it) is adopted; an LFS file of the right size is kept only when its
    sha256 matches the Hub's, so a damaged shard of the right size is fetched again."""
    files = make_model_files()
    publish(hub, files)
    target = tmp_path / "model"
    for rel, data in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_bytes(data)
    bad = "model-00002-of-00003.safetensors"
    (target / bad).write_bytes(bytes(len(files[bad])))  # right size, wrong bytes

    run = cli.run("ensure", REPO, "--to", str(target), "--json")

    assert run.returncode == 0, run.output
    result = json.loads(run.stdout)
    small = [p for p in files if not p.endswith(".safetensors")]
    assert (result["action"], result["files_fetched"]) == ("repaired", len(small) + 1)
    assert result["warnings"] == []  # caught by the adoption hash, not by a later verify
    fetched = sorted(r.path.rsplit("/", 1)[-1] for r in hub.file_gets())
    assert fetched == sorted([bad] + [p.rsplit("/", 1)[-1] for p in small])
    assert model_part(dir_files(target)) == files
