"""File-system side of the weights workflow: manifests on disk, sizes, locks, renames.

Every function here touches the local file system; the decisions that use their
results live in :mod:`gpudoctor.weights.plan`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, parse_manifest

HF_LOCAL_CACHE = Path(".cache") / "huggingface"


def partial_dir(target: Path) -> Path:
    """Return the ``*.partial`` sibling where an incomplete copy of ``target`` is built."""
    return target.with_name(target.name + ".partial")


def lock_path(target: Path) -> Path:
    """Return the lock file that serialises runs on ``target`` (in our private lock dir)."""
    from gpudoctor.weights.trust import lock_path as private_lock_path

    return private_lock_path(target)


def mirror_dir(mirror_root: Path, repo_id: str) -> Path:
    """Return where the mirror keeps ``repo_id`` (``MIRROR/org/name``)."""
    return mirror_root.joinpath(*repo_id.split("/"))


def read_trusted_text(path: Path, what: str) -> str | None:
    """Return the text of ``path`` if it exists, read without following a symlink.

    Raises UntrustedError when another user owns it or others can write it.
    """
    from gpudoctor.weights.trust import open_trusted

    fd = open_trusted(path, what)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(64 << 20).decode("utf-8", "replace")


def read_manifest(directory: Path) -> Manifest | None:
    """Return the manifest in ``directory``, or None when absent or invalid.

    Raises UntrustedError for a manifest that is a symlink, another user's, or
    writable by others (see :mod:`gpudoctor.weights.trust`).
    """
    try:
        text = read_trusted_text(directory / MANIFEST_NAME, "a gpudoctor manifest")
    except NotADirectoryError:
        return None
    if text is None:
        return None
    try:
        return parse_manifest(text)
    except ValueError:
        return None


def write_private(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically: a new temp file (``O_EXCL|O_NOFOLLOW``) + rename
    (:func:`gpudoctor.fsio.atomic_replace`); a new file gets ``mode`` less the umask."""
    fsio.atomic_replace(
        path,
        text,
        create_mode=mode,
        keep_mode=False,
        refuse_non_regular=False,
        follow_dir_link=True,
    )


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``directory/.gpudoctor-manifest.json`` atomically (temp file + rename)."""
    write_private(directory / MANIFEST_NAME, manifest.to_json())


def file_sizes(
    directory: Path, paths: Iterable[str], follow_symlinks: bool = False
) -> dict[str, int | None]:
    """Return {path: size in bytes, or None when missing / not a regular file} (``stat``).

    A symlink counts as missing unless ``follow_symlinks`` (used for a mirror only).
    """
    sizes: dict[str, int | None] = {}
    for rel in paths:
        try:
            st = os.stat(directory / rel, follow_symlinks=follow_symlinks)
        except OSError:
            sizes[rel] = None
            continue
        sizes[rel] = st.st_size if (st.st_mode & 0o170000) == 0o100000 else None
    return sizes


def list_names(directory: Path) -> list[str]:
    """Return the names in ``directory`` (``ls -A``); [] when it is absent or a symlink."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def remove_leftovers(directory: Path, names: Iterable[str]) -> None:
    """Delete unfinished-download leftovers (top-level names) without following links."""
    for name in names:
        path = directory / name
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)


def remove_files(directory: Path, paths: Iterable[str]) -> None:
    """Delete ``paths`` under ``directory`` (missing ones are fine), and hf's metadata for them."""
    for rel in paths:
        for victim in (
            directory / rel,
            directory / HF_LOCAL_CACHE / "download" / (rel + ".metadata"),
        ):
            with contextlib.suppress(FileNotFoundError):
                victim.unlink()


def make_dirs(root: Path, rel_dir: str | Path, mode: int = 0o755) -> Path:
    """``mkdir -p root/rel_dir``, refusing to pass through a symlink; return the directory.

    Each part is created with ``mode`` or, when it exists, checked with ``lstat``
    to be a real directory (a planted symlink raises FsioError, errno ENOTDIR).
    """
    return fsio.make_dirs(root, rel_dir, mode)


def private_subdir(root: Path, name: str) -> Path:
    """Return ``root/name``, created 0700 if absent; it must be a real directory of ours."""
    path = make_dirs(root, name, 0o700)
    st = os.lstat(path)
    if st.st_uid != os.geteuid():
        raise WeightsError(f"{path} belongs to uid {st.st_uid}, not to us: remove it")
    return path


def move_into(temp: Path, dest: Path, rel: str) -> None:
    """Rename the finished ``temp`` to ``dest/rel`` (parents made without following links)."""
    make_dirs(dest, Path(rel).parent)
    os.rename(temp, dest / rel)


INCOMPLETE_DIR = ".gpudoctor-incomplete"


def clean_incomplete(directory: Path) -> int:
    """Delete orphaned ``*.incomplete`` temp files (ours and huggingface_hub's); return how many."""
    count = 0
    ours = directory / INCOMPLETE_DIR
    if ours.is_dir() and not ours.is_symlink():
        for item in os.listdir(ours):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ours / item)
                count += 1
    root = directory / HF_LOCAL_CACHE / "download"
    if root.is_dir():
        for item in root.rglob("*.incomplete"):
            with contextlib.suppress(FileNotFoundError):
                item.unlink()
                count += 1
    return count


def drop_hf_cache(directory: Path) -> None:
    """Remove huggingface_hub's ``local_dir`` bookkeeping (``.cache/huggingface``) and ours."""
    shutil.rmtree(directory / INCOMPLETE_DIR, ignore_errors=True)
    shutil.rmtree(directory / HF_LOCAL_CACHE, ignore_errors=True)
    with contextlib.suppress(OSError):
        (directory / ".cache").rmdir()  # only when empty


@contextlib.contextmanager
def locked(target: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``target``'s lock file; fail at once if another run has
    it. The lock file is removed when the run ends (issue 34.8: one per target was left in
    /run/gpudoctor forever): a run that locked a file its holder had just removed sees that
    the path no longer names its file, and takes the path's new file instead."""
    path = lock_path(target)
    while True:
        try:
            fd = fsio.open_lock(path, mode=0o600, follow_dir_link=True)
        except PermissionError:
            raise WeightsError(f"permission denied: cannot write in {path.parent}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise WeightsError(f"another gpudoctor run is working on {target}") from None
            raise
        if _names_fd(path, fd):
            break
        os.close(fd)  # removed by the run before us between our open and our lock
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # still held: nobody else can have locked this file meanwhile
        os.close(fd)


def _names_fd(path: Path, fd: int) -> bool:
    """Return True when ``path`` is (still) the file open as ``fd`` (same device and inode)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def publish(partial: Path, target: Path) -> None:
    """Atomically move the finished ``partial`` directory to ``target`` (``mv -T``)."""
    os.rename(partial, target)


def link_or_copy_tree(source: Path, dest: Path, paths: Iterable[str], use_links: bool) -> None:
    """Fill ``dest`` with ``paths`` from ``source``: hard links (``cp -al``) or copies.

    Directories are made 0755 whatever the umask (:func:`make_dirs`); copies are 0644
    and flushed to disk (``fsync``) so the mirror survives a power cut.
    """
    for rel in paths:
        src, dst = source / rel, dest / rel
        make_dirs(dest, Path(rel).parent)  # 0755 whatever the umask, never through a link
        with contextlib.suppress(FileNotFoundError):
            dst.unlink()
        if use_links:
            os.link(src, dst)
        else:
            shutil.copyfile(src, dst)
            fd = os.open(dst, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, 0o644)  # copyfile leaves 0666 & ~umask: 0666 under umask 0
                os.fsync(fd)
            finally:
                os.close(fd)


PARTIAL_MARKER = ".gpudoctor-partial.json"


def write_partial_marker(partial: Path, repo_id: str, revision: str) -> None:
    """Record in ``partial`` which repo and revision it is being built for."""
    import json

    write_private(partial / PARTIAL_MARKER, json.dumps({"repo_id": repo_id, "revision": revision}))


def read_partial_marker(partial: Path) -> tuple[str, str] | None:
    """Return (repo_id, revision) recorded in ``partial``, or None."""
    import json

    try:
        doc = json.loads(read_trusted_text(partial / PARTIAL_MARKER, "a partial marker") or "")
        return str(doc["repo_id"]), str(doc["revision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remove_partial_marker(partial: Path) -> None:
    """Delete the partial marker (before the directory is published)."""
    with contextlib.suppress(FileNotFoundError):
        (partial / PARTIAL_MARKER).unlink()
