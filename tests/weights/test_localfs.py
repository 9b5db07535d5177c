"""The file-system side of ``weights``, in-process on real files in tmp_path (fast): where
things live, what counts as a file, leftovers removed without following a link, the
per-target lock, hard links or flushed copies for the mirror, the partial marker."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

import pytest

from gpudoctor import fsio
from gpudoctor.weights import localfs
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, ManifestFile
from gpudoctor.weights.trust import UntrustedError

MANIFEST = Manifest("acme/x", "a" * 40, (ManifestFile("w.bin", 3, None),), "2026-12-04T10:00:00Z")


def test_where_things_live(tmp_path: Path) -> None:
    assert localfs.partial_dir(tmp_path / "m") == tmp_path / "m.partial"
    assert localfs.mirror_dir(tmp_path, "acme/x") == tmp_path / "acme" / "x"
    assert localfs.mirror_dir(tmp_path, "solo") == tmp_path / "solo"
    lock = localfs.lock_path(tmp_path / "m")
    assert lock.name.startswith("weights-m-") and lock.suffix == ".lock"
    assert lock != localfs.lock_path(tmp_path / "other" / "m")


def test_read_trusted_text(tmp_path: Path) -> None:
    assert localfs.read_trusted_text(tmp_path / "absent", "a file") is None
    (tmp_path / "f").write_bytes("héllo \xff".encode("latin-1"))
    assert localfs.read_trusted_text(tmp_path / "f", "a file") == "h\ufffdllo \ufffd"
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(UntrustedError, match=r"link \(the thing\) is a symlink"):
        localfs.read_trusted_text(tmp_path / "link", "the thing")


def test_read_manifest_absent_invalid_valid_and_under_a_file(tmp_path: Path) -> None:
    assert localfs.read_manifest(tmp_path) is None
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    assert localfs.read_manifest(tmp_path) is None
    localfs.write_manifest(tmp_path, MANIFEST)
    assert localfs.read_manifest(tmp_path) == MANIFEST
    assert (tmp_path / MANIFEST_NAME).read_text() == MANIFEST.to_json()
    (tmp_path / "file").write_text("x")
    assert localfs.read_manifest(tmp_path / "file") is None  # ENOTDIR: no manifest
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / MANIFEST_NAME).symlink_to(tmp_path / MANIFEST_NAME)
    with pytest.raises(UntrustedError, match=r"\(a gpudoctor manifest\) is a symlink"):
        localfs.read_manifest(tmp_path / "linked")


def test_write_private_makes_a_file_others_cannot_write(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        localfs.write_private(tmp_path / "a", "one")
        localfs.write_private(tmp_path / "b", "two", mode=0o600)
    finally:
        os.umask(old)
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o600
    localfs.write_private(tmp_path / "a", "again")
    assert (tmp_path / "a").read_text() == "again"


def test_file_sizes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"12345")
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "f")
    (tmp_path / "x.sh").write_bytes(b"#!")
    os.chmod(tmp_path / "x.sh", 0o755)  # an executable file is a file too
    paths = ["gone", "f", "d", "l", "x.sh"]
    assert localfs.file_sizes(tmp_path, paths) == {
        "gone": None, "f": 5, "d": None, "l": None, "x.sh": 2
    }  # fmt: skip
    followed = localfs.file_sizes(tmp_path, paths, follow_symlinks=True)
    assert followed == {"gone": None, "f": 5, "d": None, "l": 5, "x.sh": 2}


def test_list_names(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".hidden").write_text("x")
    (tmp_path / "d" / "a").write_text("x")
    (tmp_path / "l").symlink_to(tmp_path / "d")
    assert sorted(localfs.list_names(tmp_path / "d")) == [".hidden", "a"]
    assert localfs.list_names(tmp_path / "l") == []
    assert localfs.list_names(tmp_path / "gone") == []
    assert localfs.list_names(tmp_path / "d" / "a") == []  # a file: no names
    assert _open_under(tmp_path) == []


def test_remove_leftovers_never_follows_a_link(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    model = tmp_path / "m"
    (model / "half.partial").mkdir(parents=True)
    (model / "half.partial" / "f").write_text("x")
    (model / "x.incomplete").write_text("x")
    (model / "linked.lock").symlink_to(keep)
    localfs.remove_leftovers(model, ["half.partial", "x.incomplete", "linked.lock", "gone"])
    assert localfs.list_names(model) == []
    assert (keep / "precious").exists()


def test_remove_files_and_their_hf_metadata(tmp_path: Path) -> None:
    meta = tmp_path / ".cache" / "huggingface" / "download" / "sub"
    meta.mkdir(parents=True)
    (meta / "w.bin.metadata").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.bin").write_text("x")
    (tmp_path / "other.bin").write_text("x")
    localfs.remove_files(tmp_path, ["sub/w.bin", "gone.bin"])
    assert not (tmp_path / "sub" / "w.bin").exists()
    assert not (meta / "w.bin.metadata").exists()
    assert (tmp_path / "other.bin").exists()


def test_make_dirs_and_move_into_never_pass_a_link(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        made = localfs.make_dirs(tmp_path, "a/b")
    finally:
        os.umask(old)
    assert made == tmp_path / "a" / "b"
    assert [(tmp_path / p).stat().st_mode & 0o777 for p in ("a", "a/b")] == [0o755, 0o755]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "sub").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "temp").write_text("bytes")
    with pytest.raises(OSError):
        localfs.move_into(tmp_path / "temp", tmp_path / "dest", "sub/w.bin")
    assert list((tmp_path / "elsewhere").iterdir()) == []
    localfs.move_into(tmp_path / "temp", tmp_path / "dest", "ok/w.bin")
    assert (tmp_path / "dest" / "ok" / "w.bin").read_text() == "bytes"
    assert not (tmp_path / "temp").exists()


def test_private_subdir_is_ours_and_0700(tmp_path: Path) -> None:
    path = localfs.private_subdir(tmp_path, ".work")
    assert path == tmp_path / ".work" and path.stat().st_mode & 0o777 == 0o700
    assert localfs.private_subdir(tmp_path, ".work") == path
    os.chown(path, 65534, 65534)
    with pytest.raises(WeightsError) as err:
        localfs.private_subdir(tmp_path, ".work")
    assert str(err.value) == f"{path} belongs to uid 65534, not to us: remove it"


def test_clean_incomplete_counts_ours_and_hf_s(tmp_path: Path) -> None:
    ours = tmp_path / localfs.INCOMPLETE_DIR
    ours.mkdir()
    (ours / "a.incomplete").write_text("x")
    (ours / "b.incomplete").write_text("x")
    hf = tmp_path / ".cache" / "huggingface" / "download" / "sub"
    hf.mkdir(parents=True)
    (hf / "c.incomplete").write_text("x")
    (hf / "c.metadata").write_text("x")
    assert localfs.clean_incomplete(tmp_path) == 3
    assert list(ours.iterdir()) == [] and [p.name for p in hf.iterdir()] == ["c.metadata"]
    assert localfs.clean_incomplete(tmp_path / "absent") == 0


def test_clean_incomplete_never_follows_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("x")
    model = tmp_path / "m"
    model.mkdir()
    (model / localfs.INCOMPLETE_DIR).symlink_to(victim)
    assert localfs.clean_incomplete(model) == 0
    assert (victim / "precious").exists()


def test_drop_hf_cache_keeps_a_cache_dir_that_holds_more(tmp_path: Path) -> None:
    for d in (localfs.INCOMPLETE_DIR, ".cache/huggingface/download"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "f").write_text("x")
    (tmp_path / ".cache" / "pip").mkdir()
    localfs.drop_hf_cache(tmp_path)
    assert sorted(localfs.list_names(tmp_path)) == [".cache"]
    assert localfs.list_names(tmp_path / ".cache") == ["pip"]
    (tmp_path / ".cache" / "pip").rmdir()
    localfs.drop_hf_cache(tmp_path)
    assert localfs.list_names(tmp_path) == []


def test_the_lock_refuses_a_second_run_and_is_removed_after(tmp_path: Path) -> None:
    target = tmp_path / "model"
    path = localfs.lock_path(target)
    with localfs.locked(target):
        assert path.exists() and path.stat().st_mode & 0o777 == 0o600
        with pytest.raises(WeightsError) as err, localfs.locked(target):
            pass
        assert str(err.value) == f"another gpudoctor run is working on {target}"
        assert path.exists()  # the refused run leaves the holder's lock alone
    assert not path.exists()
    with localfs.locked(target):  # free again
        pass


def test_the_lock_is_released_when_the_run_fails(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with pytest.raises(RuntimeError), localfs.locked(target):
        raise RuntimeError("boom")
    assert not localfs.lock_path(target).exists()
    fd = os.open(localfs.lock_path(target), os.O_RDWR | os.O_CREAT, 0o600)
    try:  # nobody holds the lock now: flock succeeds at once
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
        os.unlink(localfs.lock_path(target))


def test_the_lock_file_s_descriptor_is_closed_after_the_run(tmp_path: Path) -> None:
    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    before = open_fds()
    with localfs.locked(tmp_path / "m"):
        pass
    with (
        pytest.raises(WeightsError),
        localfs.locked(tmp_path / "n"),
        localfs.locked(tmp_path / "n"),
    ):
        pass
    assert open_fds() == before


def test_a_lock_taken_after_its_holder_removed_the_file_is_the_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A ends (removes its lock file) while run B had opened the old file: B must not
    hold a lock on a file no path names (a third run would lock the new one beside it)."""
    target = tmp_path / "model"
    path = localfs.lock_path(target)
    real_open_lock = fsio.open_lock
    first = threading.Event()

    def open_then_lose_the_path(*args, **kwargs):
        fd = real_open_lock(*args, **kwargs)
        if not first.is_set():  # the holder removes the file between our open and our lock
            first.set()
            os.unlink(path)
        return fd

    monkeypatch.setattr(fsio, "open_lock", open_then_lose_the_path)
    with localfs.locked(target):
        held = [n for n in os.listdir("/proc/self/fd") if _points_to(n, path)]
        assert path.exists() and len(held) == 1  # the removed file's descriptor closed
    assert first.is_set() and not path.exists()


def _points_to(fd_name: str, path: Path) -> bool:
    """True for a descriptor of ``path``, or of the file removed from there (`` (deleted)``)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd_name}").startswith(str(path))
    except OSError:
        return False


def _open_under(root: Path) -> list[str]:
    """Return what this process holds open under ``root`` (``ls -l /proc/self/fd``)."""
    return [
        os.readlink(f"/proc/self/fd/{n}")
        for n in os.listdir("/proc/self/fd")
        if _points_to(n, root)
    ]


def test_publish_renames_the_partial_into_place(tmp_path: Path) -> None:
    (tmp_path / "m.partial").mkdir()
    (tmp_path / "m.partial" / "f").write_text("x")
    localfs.publish(tmp_path / "m.partial", tmp_path / "m")
    assert (tmp_path / "m" / "f").read_text() == "x" and not (tmp_path / "m.partial").exists()


@pytest.mark.parametrize("use_links", [True, False])
def test_link_or_copy_tree(tmp_path: Path, use_links: bool) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"weights")
    (src / "c.json").write_bytes(b"{}")
    (dst / "sub").mkdir(parents=True)
    (dst / "sub" / "w.bin").write_bytes(b"stale")  # replaced, not appended to
    old = os.umask(0)
    try:
        localfs.link_or_copy_tree(src, dst, ["sub/w.bin", "c.json"], use_links)
    finally:
        os.umask(old)
    for rel in ("sub/w.bin", "c.json"):
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
        same = (dst / rel).stat().st_ino == (src / rel).stat().st_ino
        assert same is use_links
        if not use_links:
            assert (dst / rel).stat().st_mode & 0o777 == 0o644
    assert _open_under(tmp_path) == []  # every copy's descriptor closed


def test_partial_marker_round_trip_and_bad_markers(tmp_path: Path) -> None:
    partial = tmp_path / "m.partial"
    partial.mkdir()
    assert localfs.read_partial_marker(partial) is None
    localfs.write_partial_marker(partial, "acme/x", "b" * 40)
    assert localfs.read_partial_marker(partial) == ("acme/x", "b" * 40)
    marker = partial / localfs.PARTIAL_MARKER
    assert json.loads(marker.read_text()) == {"repo_id": "acme/x", "revision": "b" * 40}
    for text in ("not json", "[]", '{"repo_id": "acme/x"}'):
        marker.write_text(text)
        assert localfs.read_partial_marker(partial) is None
    localfs.remove_partial_marker(partial)
    localfs.remove_partial_marker(partial)  # already gone: fine
    assert not marker.exists()
