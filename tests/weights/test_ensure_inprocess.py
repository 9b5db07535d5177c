"""``weights ensure`` in this process (gpudoctor.weights.ensure.ensure) against the loopback
Hub (tests/weights/hub_server.py, huggingface_hub in process: tests/weights/hf_inprocess.py):
a download, the no-op, a repair, a restore from the mirror and the refusals, each stated
as what the user sees (the result, the one-line error, the files left on disk)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gpudoctor.weights import localfs
from gpudoctor.weights.ensure import EnsureRequest, EnsureResult, ensure
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import MANIFEST_NAME
from tests.weights.conftest import dir_files, model_part
from tests.weights.hf_inprocess import error_of
from tests.weights.hub_server import HubServer
from tests.weights.progress_recorder import Recorder

MODEL = {
    "model.safetensors": b"W" * 5000,
    "config.json": b'{"a": 1}\n',
    "tok/t.json": b"[1, 2]\n",
}


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gpudoctor's record of targets in the test's own folder, not /var/lib/gpudoctor."""
    state = tmp_path / "state"
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(state))
    return state


def _commit(hf: HubServer, files: dict[str, bytes] = MODEL, repo: str = "org/m") -> str:
    existing = hf.repos.get(repo) or hf.add_repo(repo)
    return existing.commit(files)


def _ensure(target: Path, **kwargs: object) -> EnsureResult:
    kwargs.setdefault("repo_id", "org/m")
    return ensure(EnsureRequest(target=target, **kwargs), Recorder())  # type: ignore[arg-type]


class _CtrlC(Recorder):
    """The user pressing Ctrl-C as the first downloaded bytes arrive."""

    def advance(self, path: str, nbytes: int) -> None:
        raise KeyboardInterrupt


def _refusal(target: Path, **kwargs: object) -> str:
    """Return the one-line message of the WeightsError ensure raises before touching anything."""
    with pytest.raises(WeightsError) as err:
        _ensure(target, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def _serve_bad_bytes(hf: HubServer, repo: str, sha: str, path: str) -> None:
    """Make the Hub send other bytes of the same size for ``path`` (its listing unchanged)."""
    source = hf.repos[repo].commits[sha][path].source
    source.write_bytes(b"X" * source.stat().st_size)


# --- a download, then the no-op ------------------------------------------------------------


def test_a_first_run_downloads_the_model_and_seals_it(hf: HubServer, tmp_path: Path) -> None:
    sha = _commit(hf)
    target = tmp_path / "shm" / "m"
    target.parent.mkdir()
    before = time.monotonic()
    result = _ensure(target)
    assert 0 < result.seconds <= time.monotonic() - before  # the run's own duration
    assert model_part(dir_files(target)) == MODEL
    manifest = localfs.read_manifest(target)
    assert manifest is not None and manifest.revision == sha and manifest.repo_id == "org/m"
    assert result.action == "downloaded" and result.source == "hub"
    assert (result.repo_id, result.revision, result.target) == ("org/m", sha, str(target))
    assert (result.files_total, result.bytes_total) == (3, sum(map(len, MODEL.values())))
    assert (result.files_fetched, result.bytes_fetched) == (3, result.bytes_total)
    assert result.warnings == () and result.mirror_problem is None
    assert not result.mirror_updated and result.verify == "quick"
    assert not localfs.partial_dir(target).exists()
    assert result.to_dict()["warnings"] == [] and json.dumps(result.to_dict())


def test_a_complete_target_is_left_alone_without_asking_the_hub(
    hf: HubServer, tmp_path: Path
) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    hf.clear_log()
    again = _ensure(target)
    assert hf.requests == []
    assert (again.action, again.source, again.revision) == ("none", "local", sha)
    assert (again.files_total, again.files_fetched, again.bytes_fetched) == (3, 0, 0)
    assert again.bytes_total == sum(map(len, MODEL.values()))
    assert again.warnings == () and again.mirror_problem is None and not again.mirror_updated
    assert (again.repo_id, again.target) == ("org/m", str(target))
    before = time.monotonic()
    full = _ensure(target, verify="full")  # hashed under the lock, then found complete
    assert 0 < full.seconds <= time.monotonic() - before  # measured, not the default 0
    assert (full.repo_id, full.target, full.action) == ("org/m", str(target), "none")
    hf.clear_log()
    pinned = _ensure(target, revision=sha[:8])  # the same revision, named by a short sha
    assert pinned.action == "none" and hf.requests == []


def test_full_verify_of_a_complete_target_hashes_it_and_fetches_nothing(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    hf.clear_log()
    result = _ensure(target, verify="full")
    assert (result.action, result.verify, result.files_fetched) == ("none", "full", 0)
    assert hf.file_gets() == []


def test_an_older_revision_is_fetched_as_asked_not_main(hf: HubServer, tmp_path: Path) -> None:
    old = _commit(hf)
    _commit(hf, {**MODEL, "config.json": b'{"a": 9}\n'})  # main moves on, same sizes
    result = _ensure(tmp_path / "m", revision=old)
    assert result.revision == old
    assert model_part(dir_files(tmp_path / "m")) == MODEL


def test_a_model_file_named_like_a_leftover_is_kept(hf: HubServer, tmp_path: Path) -> None:
    files = {**MODEL, "uv.lock": b"version = 1\n", "notes.partial": b"draft\n"}
    _commit(hf, files)
    _ensure(tmp_path / "m")
    assert model_part(dir_files(tmp_path / "m")) == files


def test_max_workers_1_downloads_big_files_over_one_connection(
    hf: HubServer, tmp_path: Path
) -> None:
    from gpudoctor.weights.fetch import RANGED_MIN_BYTES

    shards = {f"model-{i}.safetensors": os.urandom(RANGED_MIN_BYTES + i) for i in (1, 2)}
    _commit(hf, shards)  # two files fetched by ranges: two connections when allowed
    _ensure(tmp_path / "m", max_workers=1)
    assert len({r.port for r in hf.file_gets()}) == 1
    assert model_part(dir_files(tmp_path / "m")) == shards


def test_a_target_of_another_repository_is_refused(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    _commit(hf, {"config.json": b"{}"}, repo="org/other")
    target = tmp_path / "m"
    _ensure(target)
    err = error_of(lambda: _ensure(target, repo_id="org/other"))
    assert str(err).startswith(f"{target} holds org/m, not org/other: choose another --to")
    assert model_part(dir_files(target)) == MODEL


# --- the request checked before anything is touched ------------------------------------------


@pytest.mark.parametrize("repo_id", ["org/a..b", "org/../x", "-org/m", "org/m/extra", "org m", ""])
def test_an_invalid_repository_id_is_refused(tmp_path: Path, repo_id: str) -> None:
    assert (
        _refusal(tmp_path / "m", repo_id=repo_id)
        == f"invalid repository id {repo_id!r} (expected ORG/NAME)"
    )
    assert not (tmp_path / "m").exists()


def test_a_repository_without_an_org_is_accepted(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf, repo="gpt2")
    assert _ensure(tmp_path / "m", repo_id="gpt2").action == "downloaded"


def test_an_unknown_verify_mode_is_refused(tmp_path: Path) -> None:
    assert _refusal(tmp_path / "m", verify="fast") == "invalid verify mode 'fast' (quick or full)"


def test_a_mount_point_is_refused_as_target() -> None:
    err = _refusal(Path("/proc"))
    assert err.startswith("/proc is a mount point: it cannot be replaced atomically;")
    assert err.endswith("(--to /proc/MODEL)")


def test_a_file_named_like_gpudoctor_s_bookkeeping_is_not_fetched(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf, {"config.json": b"{}", MANIFEST_NAME: b"{}"})
    err = error_of(lambda: _ensure(tmp_path / "m"))
    assert str(err) == (
        f"org/m has a file named {MANIFEST_NAME!r}, which collides with gpudoctor's own"
        " bookkeeping (.gpudoctor-*, .cache/huggingface/); refusing to fetch it"
    )
    assert not (tmp_path / "m").exists() and not localfs.partial_dir(tmp_path / "m").exists()


# --- repair and resume -------------------------------------------------------------------------


def test_a_damaged_target_is_repaired_in_place(hf: HubServer, tmp_path: Path) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    (target / "config.json").unlink()
    (target / "stray.bin").write_bytes(b"left by someone")
    hf.clear_log()
    result = _ensure(target)
    assert (result.action, result.source, result.revision) == ("repaired", "hub", sha)
    assert (result.files_fetched, result.bytes_fetched) == (1, len(MODEL["config.json"]))
    assert [r.path.rsplit("/", 1)[-1] for r in hf.file_gets()] == ["config.json"]
    assert not [r for r in hf.requests if r.path.startswith("/api/")]  # its own list serves
    assert model_part(dir_files(target)) == {**MODEL, "stray.bin": b"left by someone"}


def test_a_new_revision_replaces_only_the_files_that_changed(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    newer = {**MODEL, "config.json": b'{"a": 2}\n', "new.json": b"{}"}
    del newer["tok/t.json"]  # a file the new revision no longer has
    sha = _commit(hf, newer)
    hf.clear_log()
    result = _ensure(target, revision="main")
    assert (result.action, result.revision) == ("repaired", sha)
    assert model_part(dir_files(target)) == newer
    got = sorted(r.path.rsplit("/", 1)[-1] for r in hf.file_gets())
    assert got == ["config.json", "new.json"]  # the shard kept: the same in both revisions
    assert result.files_fetched == 2


def test_a_partial_directory_of_an_earlier_run_is_resumed(hf: HubServer, tmp_path: Path) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    partial = localfs.partial_dir(target)
    partial.mkdir()
    localfs.write_partial_marker(partial, "org/m", sha)
    (partial / "model.safetensors").write_bytes(MODEL["model.safetensors"])
    (partial / "config.json").write_bytes(MODEL["config.json"])
    hf.clear_log()
    result = _ensure(target)
    assert (result.action, result.files_fetched) == ("downloaded", 1)
    assert [r.path.rsplit("/", 1)[-1] for r in hf.file_gets()] == ["t.json"]
    assert model_part(dir_files(target)) == MODEL and not partial.exists()


class _CtrlCAfterOneFile(Recorder):
    """The user pressing Ctrl-C once the first file is finished."""

    def file_done(self, path: str) -> None:
        super().file_done(path)
        raise KeyboardInterrupt


def test_an_interrupted_first_run_leaves_a_partial_the_next_run_resumes(
    hf: HubServer, tmp_path: Path
) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        ensure(EnsureRequest("org/m", target, max_workers=1), _CtrlCAfterOneFile())
    partial = localfs.partial_dir(target)
    assert localfs.read_partial_marker(partial) == ("org/m", sha)  # whose files these are
    assert not target.exists()
    assert set(dir_files(partial)) & set(MODEL)  # at least the finished file
    result = _ensure(target)
    assert result.files_fetched < len(MODEL)  # the finished file(s) kept
    assert model_part(dir_files(target)) == MODEL


def test_an_unmarked_partial_directory_is_hashed_before_it_is_trusted(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    partial = localfs.partial_dir(target)
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"Z" * 5000)  # the right size, wrong bytes
    result = _ensure(target)
    assert model_part(dir_files(target)) == MODEL
    assert result.files_fetched == 3


def test_a_target_and_a_partial_directory_together_are_refused(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    (target / "config.json").unlink()
    localfs.partial_dir(target).mkdir()
    err = error_of(lambda: _ensure(target))
    partial = localfs.partial_dir(target)
    assert str(err) == f"both {target} and {partial} exist: remove the one you do not want"


def test_a_folder_from_another_downloader_is_adopted_without_its_leftovers(
    hf: HubServer, tmp_path: Path
) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    target.mkdir()
    (target / "model.safetensors").write_bytes(MODEL["model.safetensors"])
    (target / "shard.bin.lock").write_bytes(b"")  # what an interrupted downloader left
    (target / "notes.txt").write_bytes(b"the user's own file")
    result = _ensure(target)
    assert (result.action, result.revision) == ("repaired", sha)
    assert model_part(dir_files(target)) == {**MODEL, "notes.txt": b"the user's own file"}


def test_a_failed_repair_gives_the_directory_back_under_its_name(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    (target / "model.safetensors").unlink()
    hf.gated.add("org/m")  # every request now refused
    error_of(lambda: _ensure(target))
    assert not localfs.partial_dir(target).exists()
    assert dir_files(target).keys() == {"config.json", "tok/t.json", MANIFEST_NAME}


def test_an_interrupted_update_to_a_new_revision_drops_the_old_manifest(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    _commit(hf, {**MODEL, "extra.safetensors": b"E" * 100})
    with pytest.raises(KeyboardInterrupt):
        ensure(EnsureRequest("org/m", target, revision="main"), _CtrlC())
    assert not localfs.partial_dir(target).exists()
    left = dir_files(target)
    assert left["model.safetensors"] == MODEL["model.safetensors"]  # the shard is kept
    assert MANIFEST_NAME not in left  # no manifest: a mix of revisions is never complete


# --- bad bytes ---------------------------------------------------------------------------------


def test_a_source_that_keeps_sending_bad_bytes_fails_and_keeps_the_partial(
    hf: HubServer, tmp_path: Path
) -> None:
    sha = _commit(hf)
    _serve_bad_bytes(hf, "org/m", sha, "model.safetensors")
    target = tmp_path / "m"
    err = error_of(lambda: _ensure(target, verify="full"))
    partial = localfs.partial_dir(target)
    assert str(err).startswith("1 file(s) still wrong after re-download, e.g. model.safetensors")
    assert str(err).endswith(f"the source serves bad bytes. Kept in {partial}")
    assert partial.is_dir() and not target.exists()


# --- the mirror --------------------------------------------------------------------------------


def _mirrored(hf: HubServer, tmp_path: Path) -> tuple[str, Path]:
    """Commit MODEL, download it once with ``--mirror``; return its sha and the mirror root."""
    sha = _commit(hf)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    first = _ensure(tmp_path / "first", mirror=mirror)
    assert first.mirror_updated and first.source == "hub"
    assert model_part(dir_files(mirror / "org" / "m")) == MODEL
    return sha, mirror


def test_the_mirror_serves_a_second_target_without_the_hub(hf: HubServer, tmp_path: Path) -> None:
    sha, mirror = _mirrored(hf, tmp_path)
    hf.clear_log()
    result = _ensure(tmp_path / "second", mirror=mirror)
    assert hf.requests == []
    assert (result.action, result.source, result.revision) == ("restored", "mirror", sha)
    assert (result.files_fetched, result.mirror_updated) == (3, False)
    assert result.mirror_problem is None
    assert model_part(dir_files(tmp_path / "second")) == MODEL


def test_a_pinned_sha_the_mirror_holds_is_restored_without_the_hub(
    hf: HubServer, tmp_path: Path
) -> None:
    sha, mirror = _mirrored(hf, tmp_path)
    hf.gated.add("org/m")  # the Hub would refuse anything now
    result = _ensure(tmp_path / "second", mirror=mirror, revision=sha)
    assert (result.action, result.source, result.revision) == ("restored", "mirror", sha)


def test_the_mirror_serves_a_branch_it_holds_once_the_hub_names_its_sha(
    hf: HubServer, tmp_path: Path
) -> None:
    sha, mirror = _mirrored(hf, tmp_path)
    hf.clear_log()
    result = _ensure(tmp_path / "second", mirror=mirror, revision="main")
    assert (result.action, result.source, result.revision) == ("restored", "mirror", sha)
    assert hf.file_gets() == []


def test_a_mirror_of_an_older_revision_is_told_then_refilled(hf: HubServer, tmp_path: Path) -> None:
    _old, mirror = _mirrored(hf, tmp_path)
    newer = {**MODEL, "config.json": b'{"a": 3}\n'}
    sha = _commit(hf, newer)
    told: list[str] = []
    req = EnsureRequest("org/m", tmp_path / "second", revision="main", mirror=mirror)
    result = ensure(req, Recorder(), told.append)
    held = mirror / "org" / "m"
    problem = f"{held} holds revision {_old[:12]}, not main"
    assert told == [f"--mirror {mirror} cannot serve org/m: {problem}; fetching from the Hub"]
    assert (result.source, result.revision, result.mirror_problem) == ("hub", sha, problem)
    assert result.mirror_updated and model_part(dir_files(held)) == newer


def test_mirror_only_refuses_a_mirror_without_the_model(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    err = error_of(lambda: _ensure(tmp_path / "m", mirror=mirror, mirror_only=True))
    held = mirror / "org" / "m"
    assert str(err) == (
        f"--mirror-only: {mirror} holds no org/m ({held} does not exist); nothing was downloaded"
    )
    assert err.mirror_problem == f"{mirror} holds no org/m ({held} does not exist)"  # type: ignore[attr-defined]
    assert hf.requests == [] and not (tmp_path / "m").exists()


def test_mirror_only_refuses_a_mirror_of_another_revision(hf: HubServer, tmp_path: Path) -> None:
    old, mirror = _mirrored(hf, tmp_path)
    _commit(hf, {**MODEL, "config.json": b'{"a": 3}\n'})
    hf.clear_log()
    err = error_of(
        lambda: _ensure(tmp_path / "m", mirror=mirror, mirror_only=True, revision="main")
    )
    held = mirror / "org" / "m"
    assert str(err) == (
        f"--mirror-only: {held} holds revision {old[:12]}, not main; nothing was downloaded"
    )
    assert hf.file_gets() == [] and not (tmp_path / "m").exists()


def test_a_hub_failure_says_why_the_mirror_could_not_serve(hf: HubServer, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    err = error_of(lambda: _ensure(tmp_path / "m", repo_id="org/absent", mirror=mirror))
    problem = f"{mirror} holds no org/absent ({mirror / 'org' / 'absent'} does not exist)"
    assert str(err).endswith(f" (--mirror could not serve: {problem})")
    assert err.mirror_problem == problem  # type: ignore[attr-defined]


def test_a_hub_failure_without_a_mirror_has_no_mirror_problem(
    hf: HubServer, tmp_path: Path
) -> None:
    err = error_of(lambda: _ensure(tmp_path / "m", repo_id="org/absent"))
    assert "--mirror" not in str(err) and err.mirror_problem is None  # type: ignore[attr-defined]


def test_a_damaged_mirror_file_is_fetched_from_the_hub_instead(
    hf: HubServer, tmp_path: Path
) -> None:
    _sha, mirror = _mirrored(hf, tmp_path)
    (mirror / "org" / "m" / "model.safetensors").write_bytes(b"Z" * 5000)  # same size
    hf.clear_log()
    result = _ensure(tmp_path / "second", mirror=mirror)
    second = tmp_path / "second"
    assert result.warnings == (  # issue 47: the mirror's damage, which stays, and its cure
        f"1 file(s) of the mirror {mirror} failed sha256 (model.safetensors) and were fetched"
        " from the Hub instead; the mirror stays damaged: re-make it with gpudoctor weights"
        f" mirror org/m --to {mirror} --from {second}",
    )
    assert [r.path.rsplit("/", 1)[-1] for r in hf.file_gets()] == ["model.safetensors"]
    assert model_part(dir_files(tmp_path / "second")) == MODEL


def test_mirror_only_keeps_what_a_damaged_mirror_gave(hf: HubServer, tmp_path: Path) -> None:
    _sha, mirror = _mirrored(hf, tmp_path)
    (mirror / "org" / "m" / "model.safetensors").write_bytes(b"Z" * 5000)
    target = tmp_path / "second"
    hf.clear_log()
    err = error_of(lambda: _ensure(target, mirror=mirror, mirror_only=True))
    partial = localfs.partial_dir(target)
    assert str(err).startswith("--mirror-only: model.safetensors from the mirror failed verify")
    assert str(err).endswith(f"; nothing was downloaded. Kept in {partial}")
    assert hf.file_gets() == [] and partial.is_dir() and not target.exists()


def test_a_mirror_that_cannot_be_filled_is_a_warning(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    mirror = tmp_path / "mirror"
    (mirror / "org").mkdir(parents=True)
    (mirror / "org" / "m.partial").write_text("a file where the staging folder goes")
    result = _ensure(tmp_path / "m", mirror=mirror)
    assert not result.mirror_updated and result.action == "downloaded"
    assert len(result.warnings) == 1 and result.warnings[0].startswith("mirror not updated: ")
    assert model_part(dir_files(tmp_path / "m")) == MODEL


# --- what else the user sees: verification, progress, the record, space -----------------------


class _Phases(Recorder):
    """A Progress that keeps the phases it was told of, and the partial directory's mode."""

    def __init__(self, partial: Path) -> None:
        super().__init__()
        self.partial = partial
        self.phases: list[tuple[str, dict[str, int]]] = []
        self.modes: set[int] = set()

    def phase(self, name: str, files: dict[str, int]) -> Recorder:
        self.phases.append((name, dict(files)))
        return self

    def advance(self, path: str, nbytes: int) -> None:
        self.modes.add(self.partial.stat().st_mode & 0o777)
        super().advance(path, nbytes)


def test_the_progress_names_the_download_and_the_restore(hf: HubServer, tmp_path: Path) -> None:
    _sha, mirror = _mirrored(hf, tmp_path)
    target = tmp_path / "second"
    seen = _Phases(localfs.partial_dir(target))
    ensure(EnsureRequest("org/m", target, mirror=mirror), seen)
    sizes = {path: len(data) for path, data in MODEL.items()}
    assert seen.phases == [("restore from mirror", sizes)]
    other = tmp_path / "third"
    seen = _Phases(localfs.partial_dir(other))
    ensure(EnsureRequest("org/m", other), seen)
    assert seen.phases == [("download", sizes)]
    assert seen.modes == {0o700}  # nobody else reads a model while it is being fetched


def test_full_verify_finds_bytes_a_size_check_misses_and_repairs_them(
    hf: HubServer, tmp_path: Path
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    (target / "model.safetensors").write_bytes(b"Z" * 5000)
    assert _ensure(target).action == "none"  # quick: sizes only
    result = _ensure(target, verify="full")
    assert (result.action, result.files_fetched, result.verify) == ("repaired", 1, "full")
    assert model_part(dir_files(target)) == MODEL


def test_full_verify_hashes_against_the_hub_s_list_not_the_target_s_own(
    hf: HubServer, tmp_path: Path
) -> None:
    import hashlib
    from dataclasses import replace

    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    forged = b"Z" * 5000
    (target / "model.safetensors").write_bytes(forged)
    manifest = localfs.read_manifest(target)
    assert manifest is not None
    files = tuple(
        replace(f, sha256=hashlib.sha256(forged).hexdigest())
        if f.path == "model.safetensors"
        else f
        for f in manifest.files
    )
    localfs.write_manifest(target, replace(manifest, files=files))  # edited to match
    result = _ensure(target, verify="full")
    assert (result.action, result.files_fetched) == ("repaired", 1)
    assert model_part(dir_files(target)) == MODEL


def test_full_verify_checks_the_target_s_own_revision_not_a_newer_main(
    hf: HubServer, tmp_path: Path
) -> None:
    old = _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    _commit(hf, {**MODEL, "config.json": b'{"a": 9}\n'})
    result = _ensure(target, verify="full")
    assert (result.action, result.revision) == ("none", old)
    assert model_part(dir_files(target)) == MODEL


@pytest.mark.parametrize(
    ("verify", "leftover"),
    [("quick", "model.safetensors.incomplete"), ("full", "a.incomplete"), ("quick", "x.lock")],
)
def test_an_unfinished_download_left_in_a_target_is_cleaned_up(
    hf: HubServer, tmp_path: Path, verify: str, leftover: str
) -> None:
    _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    (target / leftover).write_bytes(b"half")
    hf.clear_log()
    result = _ensure(target, verify=verify)
    assert (result.action, result.files_fetched) == ("repaired", 0)
    assert model_part(dir_files(target)) == MODEL and hf.file_gets() == []


def test_a_repair_the_hub_cannot_make_right_keeps_the_target_unsealed(
    hf: HubServer, tmp_path: Path
) -> None:
    sha = _commit(hf)
    target = tmp_path / "m"
    _ensure(target)
    (target / "model.safetensors").write_bytes(b"Z" * 5000)
    _serve_bad_bytes(hf, "org/m", sha, "model.safetensors")
    err = error_of(lambda: _ensure(target, verify="full"))
    assert str(err).endswith(f"the source serves bad bytes. Kept in {target}")
    assert not localfs.partial_dir(target).exists()
    assert MANIFEST_NAME not in dir_files(target)  # its files are proven wrong: not complete


class _MirrorFileVanishes(Recorder):
    """The mirror losing a file once the restore has started (a disk pulled, another admin)."""

    def __init__(self, lost: Path) -> None:
        super().__init__()
        self.lost = lost

    def phase(self, name: str, files: dict[str, int]) -> Recorder:
        self.lost.unlink()
        return self


def test_a_mirror_file_lost_during_the_restore_is_one_error(hf: HubServer, tmp_path: Path) -> None:
    _sha, mirror = _mirrored(hf, tmp_path)
    lost = mirror / "org" / "m" / "config.json"
    req = EnsureRequest("org/m", tmp_path / "second", mirror=mirror)
    err = error_of(lambda: ensure(req, _MirrorFileVanishes(lost)))
    assert str(err).startswith("FileNotFoundError: ")
    assert "config.json" in str(err)


def test_a_bad_mirror_file_the_hub_cannot_replace_is_one_error(
    hf: HubServer, tmp_path: Path
) -> None:
    _sha, mirror = _mirrored(hf, tmp_path)
    (mirror / "org" / "m" / "model.safetensors").write_bytes(b"Z" * 5000)
    hf.gated.add("org/m")
    err = error_of(lambda: _ensure(tmp_path / "second", mirror=mirror))
    assert str(err).startswith("model.safetensors from the mirror failed verify (")
    assert ") and fetching it again failed: " in str(err)


def test_the_target_is_recorded_for_weights_status(
    hf: HubServer, tmp_path: Path, _state_dir: Path
) -> None:
    from gpudoctor.weights.record import TargetRecord, parse_records, record_path

    _sha, mirror = _mirrored(hf, tmp_path)
    _ensure(tmp_path / "pinned", revision="main")
    records = parse_records(record_path().read_text())
    assert records == {
        str(tmp_path / "first"): TargetRecord("org/m", None, str(mirror.absolute())),
        str(tmp_path / "pinned"): TargetRecord("org/m", "main", None),
    }


def test_a_record_that_cannot_be_written_is_a_warning(
    hf: HubServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit(hf)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(blocker))
    result = _ensure(tmp_path / "m")
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith(f"could not record the target in {blocker}/")
    assert model_part(dir_files(tmp_path / "m")) == MODEL


def test_a_model_too_big_for_the_target_is_refused_before_any_write(
    hf: HubServer, tmp_path: Path, tmpfs
) -> None:
    _commit(hf, {"model.safetensors": os.urandom(300_000)})
    shm = tmpfs("128k")
    err = error_of(lambda: _ensure(shm / "m"))
    assert str(err).startswith("not enough space for ")
    assert "the mirror copy" not in str(err)
    assert os.listdir(shm) == []


def test_a_mirror_too_small_for_the_copy_is_refused_before_any_write(
    hf: HubServer, tmp_path: Path, tmpfs
) -> None:
    _commit(hf, {"model.safetensors": os.urandom(300_000)})
    small = tmpfs("128k", name="mirror")
    err = error_of(lambda: _ensure(tmp_path / "m", mirror=small))
    assert str(err).startswith("not enough space for the mirror copy in ")
    assert os.listdir(small) == [] and not (tmp_path / "m").exists()


# --- nothing another user could have planted is followed ---------------------------------------


def test_a_symlink_as_target_is_refused(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "m"
    target.symlink_to(elsewhere)
    assert _refusal(target).startswith(f"{target} (--to) is a symlink (to {elsewhere}):")
    assert os.listdir(elsewhere) == []


def test_a_symlink_as_partial_directory_is_refused(hf: HubServer, tmp_path: Path) -> None:
    _commit(hf)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "m"
    partial = localfs.partial_dir(target)
    partial.symlink_to(elsewhere)
    err = error_of(lambda: _ensure(target))
    what = "the partial directory of an earlier run"
    assert str(err).startswith(f"{partial} ({what}) is a symlink (to {elsewhere}):")
    assert os.listdir(elsewhere) == [] and not target.exists()


def test_a_full_mirror_still_serves_what_it_holds(hf: HubServer, tmp_path: Path, tmpfs) -> None:
    shard = os.urandom(300_000)
    sha = _commit(hf, {"model.safetensors": shard})
    mirror = tmpfs("400k", name="mirror")
    assert _ensure(tmp_path / "first", mirror=mirror).mirror_updated
    result = _ensure(tmp_path / "second", mirror=mirror)  # no room for a second copy there
    assert (result.action, result.source, result.revision) == ("restored", "mirror", sha)
    assert (tmp_path / "second" / "model.safetensors").read_bytes() == shard


def test_refetch_warnings_tell_the_mirrors_damage_from_a_failed_verify(tmp_path: Path) -> None:
    """Issue 47: only files the mirror gave with a wrong sha256 are called its damage."""
    from gpudoctor.weights.complete import FileProblem
    from gpudoctor.weights.ensure import EnsureRequest, _refetch_warnings, _Source

    bad = [FileProblem(f"s{i}", "sha256", "x") for i in range(4)]
    short = FileProblem("c.json", "size", "y")
    req = EnsureRequest("org/m", tmp_path / "t", mirror=tmp_path / "m")
    mirror, hub_source = _Source((), "r", "mirror"), _Source((), "r", "hub")
    assert _refetch_warnings(req, mirror, [*bad, short], bad) == [
        "1 file(s) failed quick verify and were re-fetched",
        f"4 file(s) of the mirror {tmp_path / 'm'} failed sha256 (s0, s1, s2, ...) and were"
        " fetched from the Hub instead; the mirror stays damaged: re-make it with gpudoctor"
        f" weights mirror org/m --to {tmp_path / 'm'} --from {tmp_path / 't'}",
    ]
    assert _refetch_warnings(req, mirror, bad[:3], bad[:3])[0].startswith(
        f"3 file(s) of the mirror {tmp_path / 'm'} failed sha256 (s0, s1, s2) and"
    )
    assert _refetch_warnings(req, hub_source, bad[:1], bad[:1]) == [
        "1 file(s) failed quick verify and were re-fetched"
    ]
    no_mirror = EnsureRequest("org/m", tmp_path / "t")
    assert _refetch_warnings(no_mirror, mirror, bad[:1], bad[:1]) == [
        "1 file(s) failed quick verify and were re-fetched"
    ]
