"""The disk mirror in-process (fast): why a mirror cannot serve a model, in the user's words,
and a refresh that swaps a complete copy in without ever leaving the mirror without one.

Real directories and files in tmp_path (and a real tmpfs for the copy across filesystems);
the one fake is the filesystem refusing a rename (``os.rename`` raising EIO for the new
copy only), standing in for a disk error or a filesystem gone read-only mid-swap (the
CLI-level test in test_mirror_swap_keeps_a_copy.py injects the same error with strace).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpudoctor.weights import mirror as mirror_mod
from gpudoctor.weights.localfs import read_manifest, write_manifest
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, ManifestFile
from gpudoctor.weights.mirror import MirrorState, fill_mirror, mirror_state, revision_problem
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.trust import UntrustedError

REPO = "acme/tiny-27b"
SHA = "0123456789abcdef0123456789abcdef01234567"
FILES = {"model.safetensors": b"w" * 3000, "config.json": b"{}\n", "tok/t.json": b"[1]\n"}


def manifest_of(files: dict[str, bytes], repo: str = REPO, revision: str = SHA) -> Manifest:
    entries = tuple(ManifestFile(p, len(b)) for p, b in sorted(files.items()))
    return Manifest(repo, revision, entries, "2026-12-04T10:00:00Z")


def put_model(directory: Path, files: dict[str, bytes], manifest: Manifest | None) -> Path:
    for rel, data in files.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    if manifest is not None:
        write_manifest(directory, manifest)
    return directory


def test_a_complete_copy_serves_with_its_manifest(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    put_model(root / "acme" / "tiny-27b", FILES, manifest_of(FILES))
    state = mirror_state(root, REPO)
    assert state == MirrorState(root / "acme" / "tiny-27b", manifest_of(FILES), None)


def test_a_missing_mirror_root_is_named(tmp_path: Path) -> None:
    root = tmp_path / "nowhere"
    state = mirror_state(root, REPO)
    assert (state.manifest, state.problem) == (None, f"{root} does not exist")
    assert state.path == root / "acme" / "tiny-27b"


def test_a_mirror_without_the_repository_says_which(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    root.mkdir()
    state = mirror_state(root, REPO)
    path = root / "acme" / "tiny-27b"
    assert state == MirrorState(path, None, f"{root} holds no {REPO} ({path} does not exist)")


def test_a_copy_without_a_manifest_cannot_serve(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    path = put_model(root / "acme" / "tiny-27b", FILES, None)
    state = mirror_state(root, REPO)
    assert state == MirrorState(path, None, f"{path} has no valid {MANIFEST_NAME}")


def test_a_manifest_for_another_repository_is_named(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    path = put_model(root / "acme" / "tiny-27b", FILES, manifest_of(FILES, repo="acme/other"))
    state = mirror_state(root, REPO)
    assert state == MirrorState(path, None, f"{path}'s manifest is for acme/other")


def test_an_incomplete_copy_counts_its_problems_and_shows_the_first(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    path = put_model(root / "acme" / "tiny-27b", FILES, manifest_of(FILES))
    (path / "config.json").unlink()
    (path / "model.safetensors").write_bytes(b"w" * 10)
    state = mirror_state(root, REPO)
    assert state == MirrorState(
        path,
        None,
        f"{path} is incomplete: 2 file(s) missing or of the wrong size, e.g. config.json missing",
    )


def test_a_mirror_of_hard_links_or_symlinks_serves(tmp_path: Path) -> None:
    """A mirror's files may be symlinks to the real bytes (made by hand): they count."""
    elsewhere = put_model(tmp_path / "real", FILES, None)
    root = tmp_path / "mirror"
    path = root / "acme" / "tiny-27b"
    path.mkdir(parents=True)
    for rel in FILES:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).symlink_to(elsewhere / rel)
    write_manifest(path, manifest_of(FILES))
    assert mirror_state(root, REPO).problem is None


def test_a_mirror_others_can_write_is_refused_naming_the_option(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    put_model(root / "acme" / "tiny-27b", FILES, manifest_of(FILES))
    os.chmod(root / "acme", 0o777)
    with pytest.raises(UntrustedError, match=r"acme \(above --mirror\) is writable by others"):
        mirror_state(root, REPO)


def test_a_model_directory_others_can_write_is_refused_as_the_mirror(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    path = put_model(root / "acme" / "tiny-27b", FILES, manifest_of(FILES))
    os.chmod(path, 0o777)
    with pytest.raises(UntrustedError, match=r"tiny-27b \(the mirror\) is writable by others"):
        mirror_state(root, REPO)


def test_revision_problem_names_the_held_revision_in_twelve_digits(tmp_path: Path) -> None:
    path = tmp_path / "m" / "acme" / "tiny-27b"
    held = MirrorState(path, manifest_of(FILES), None)
    assert revision_problem(held, "main") == f"{path} holds revision 0123456789ab, not main"
    unknown = MirrorState(path, None, "broken")
    assert revision_problem(unknown, "v2") == f"{path} holds revision ?, not v2"


def _fill(source: Path, mirror_path: Path, files: dict[str, bytes]) -> None:
    fill_mirror(source, mirror_path, manifest_of(files), Progress())


def assert_mirror_holds(mirror_path: Path, files: dict[str, bytes]) -> None:
    held = {
        str(p.relative_to(mirror_path)): p.read_bytes()
        for p in mirror_path.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    }
    assert held == files
    assert read_manifest(mirror_path) == manifest_of(files)
    siblings = sorted(p.name for p in mirror_path.parent.iterdir())
    assert siblings == [mirror_path.name]  # no NAME.partial, no NAME.old left


def test_fill_on_the_same_filesystem_hard_links(tmp_path: Path) -> None:
    source = put_model(tmp_path / "local", FILES, None)
    mirror_path = tmp_path / "mirror" / "acme" / "tiny-27b"
    mirror_path.parent.mkdir(parents=True)
    umask = os.umask(0o077)  # a strict umask: the mirror is still readable by every user
    try:
        _fill(source, mirror_path, FILES)
    finally:
        os.umask(umask)
    assert_mirror_holds(mirror_path, FILES)
    for rel in FILES:  # the same inode: no second copy of 140 GB on one disk
        assert (mirror_path / rel).stat().st_ino == (source / rel).stat().st_ino
    for d in (mirror_path, mirror_path / "tok"):
        assert d.stat().st_mode & 0o777 == 0o755


class Phases(Progress):
    """Records the phases a fill announces (what the user sees above the bars)."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, dict[str, int]]] = []

    def phase(self, name: str, files: dict[str, int]) -> Progress:
        self.phases.append((name, dict(files)))
        return self


def test_fill_across_filesystems_copies_flushed_to_disk(
    tmp_path: Path, tmpfs, fsynced: list[str]
) -> None:
    """A copy (not links) announced as one phase, each file flushed (fsync) before the
    swap: a power cut after ``weights mirror`` returned must not leave empty shards."""
    source = put_model(tmpfs("4m") / "local", FILES, None)
    mirror_path = tmp_path / "mirror" / "acme" / "tiny-27b"
    mirror_path.parent.mkdir(parents=True)
    progress = Phases()
    fill_mirror(source, mirror_path, manifest_of(FILES), progress)
    assert_mirror_holds(mirror_path, FILES)
    for rel in FILES:
        assert (mirror_path / rel).stat().st_dev != (source / rel).stat().st_dev
    assert progress.phases == [("copy to mirror", {p: len(b) for p, b in FILES.items()})]
    staged = [p for p in fsynced if "/tiny-27b.partial/" in p and p.endswith(".incomplete")]
    assert len(staged) == len(FILES), fsynced


def test_a_plain_refresh_replaces_the_old_copy(tmp_path: Path) -> None:
    old = {"model.safetensors": b"o" * 99}
    mirror_path = tmp_path / "mirror" / "acme" / "tiny-27b"
    put_model(mirror_path, old, manifest_of(old))
    source = put_model(tmp_path / "local", FILES, None)
    _fill(source, mirror_path, FILES)
    assert_mirror_holds(mirror_path, FILES)


def test_a_refresh_replaces_the_old_copy_and_cleans_leftovers(tmp_path: Path) -> None:
    old = {"model.safetensors": b"o" * 99, "gone.bin": b"old"}
    mirror_path = tmp_path / "mirror" / "acme" / "tiny-27b"
    put_model(mirror_path, old, manifest_of(old))
    for leftover in ("tiny-27b.partial", "tiny-27b.old"):
        put_model(mirror_path.with_name(leftover), {"junk.bin": b"half a shard"}, None)
    source = put_model(tmp_path / "local", FILES, None)
    _fill(source, mirror_path, FILES)
    assert_mirror_holds(mirror_path, FILES)


def test_a_failed_swap_keeps_the_complete_old_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new copy's rename fails (EIO): the old copy must still be whole somewhere in the
    mirror (under its name or NAME.old), never deleted before the new one is in."""
    old = {"model.safetensors": b"o" * 99, "config.json": b"{}\n"}
    mirror_path = tmp_path / "mirror" / "acme" / "tiny-27b"
    put_model(mirror_path, old, manifest_of(old))
    source = put_model(tmp_path / "local", FILES, None)
    real_rename = os.rename

    def rename_failing_for_the_new_copy(src, dst, *args, **kwargs):
        if Path(src).name == "tiny-27b.partial":
            raise OSError(errno.EIO, "Input/output error", str(src))
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(mirror_mod.os, "rename", rename_failing_for_the_new_copy)
    with pytest.raises(OSError):
        _fill(source, mirror_path, FILES)
    monkeypatch.undo()
    kept = [p for p in (mirror_path, mirror_path.with_name("tiny-27b.old")) if p.is_dir()]
    assert kept, sorted(p.name for p in mirror_path.parent.iterdir())
    assert (kept[0] / "model.safetensors").read_bytes() == b"o" * 99
    assert read_manifest(kept[0]) == manifest_of(old)
