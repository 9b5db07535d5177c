"""``weights mirror --from DIR`` and ``weights mirror --verify`` in-process (fast): the
copy is sealed (every file hashed and flushed, the manifest rewritten), a source that is
incomplete, foreign or of another revision is refused in one line with nothing written,
and a verify lists every bad and missing file of every model. Real files in tmp_path.
(The Hub path, ``weights mirror REPO --to M``, runs as a real process against the
loopback Hub in test_mirror_command.py.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpudoctor.weights.complete import FileProblem
from gpudoctor.weights.errors import WeightsError
from gpudoctor.weights.localfs import read_manifest, write_manifest
from gpudoctor.weights.manifest import MANIFEST_NAME, Manifest, ManifestFile
from gpudoctor.weights.mirror_make import (
    MirrorCopy,
    make_mirror,
    mirror_models,
    seal,
    verify_mirror,
)
from gpudoctor.weights.progress import Progress
from gpudoctor.weights.trust import UntrustedError

REPO = "acme/tiny-27b"
SHA = "0123456789abcdef0123456789abcdef01234567"
FILES = {"model.safetensors": b"w" * 3000, "config.json": b"{}\n", "tok/t.json": b"[1]\n"}
LFS = {"model.safetensors"}  # the Hub gives a sha256 for LFS files only


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hub_manifest(files: dict[str, bytes] = FILES, repo: str = REPO) -> Manifest:
    entries = tuple(
        ManifestFile(p, len(b), sha(b) if p in LFS else None) for p, b in sorted(files.items())
    )
    return Manifest(repo, SHA, entries, "2026-01-01T00:00:00Z")


def local_copy(path: Path, manifest: Manifest | None = None) -> Path:
    for rel, data in FILES.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    write_manifest(path, manifest or hub_manifest())
    return path


class Phases(Progress):
    def __init__(self) -> None:
        self.phases: list[tuple[str, dict[str, int]]] = []
        self.advanced: set[str] = set()

    def phase(self, name: str, files: dict[str, int]) -> Progress:
        self.phases.append((name, dict(files)))
        return self

    def advance(self, path: str, nbytes: int) -> None:
        self.advanced.add(path)


def test_seal_hashes_the_small_files_and_flushes_every_file(
    tmp_path: Path, fsynced: list[str]
) -> None:
    model = local_copy(tmp_path / "m")
    progress = Phases()
    sealed = seal(model, hub_manifest(), progress)
    assert {f.path: f.sha256 for f in sealed.files} == {p: sha(b) for p, b in FILES.items()}
    assert (sealed.repo_id, sealed.revision) == (REPO, SHA)
    assert sealed.created_at != "2026-01-01T00:00:00Z"  # when it was sealed
    assert read_manifest(model) == sealed
    assert progress.phases == [("hash", {"config.json": 3, "tok/t.json": 4})]
    assert progress.advanced == {"config.json", "tok/t.json"}  # bytes counted per file
    for rel in FILES:
        assert str(model / rel) in fsynced


def test_seal_never_follows_a_symlink_among_the_files(tmp_path: Path) -> None:
    model = local_copy(tmp_path / "m")
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(FILES["model.safetensors"])
    with pytest.raises(OSError):
        seal(model, hub_manifest(), Progress())


def test_mirror_from_a_complete_local_copy(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    root = tmp_path / "mirror"
    copy = make_mirror(REPO, root, Progress(), source=local, revision=SHA[:7])
    path = root / "acme" / "tiny-27b"
    assert copy == MirrorCopy(REPO, str(path), SHA, 3, 3007, ())
    assert copy.intact
    sealed = read_manifest(path)
    assert {f.path: f.sha256 for f in sealed.files} == {p: sha(b) for p, b in FILES.items()}
    assert {p: (path / p).read_bytes() for p in FILES} == FILES
    assert sorted(p.name for p in (root / "acme").iterdir()) == ["tiny-27b"]
    assert (root / "acme").stat().st_mode & 0o777 == 0o755


def test_a_source_without_a_manifest_is_refused_with_the_fix(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    (local / MANIFEST_NAME).unlink()
    with pytest.raises(WeightsError) as err:
        make_mirror(REPO, tmp_path / "mirror", Progress(), source=local)
    assert str(err.value) == (
        f"--from {local} has no gpudoctor {MANIFEST_NAME}: make it complete first"
        f" (gpudoctor weights ensure {REPO} --to {local}, which adopts an hf download)"
    )
    assert not (tmp_path / "mirror").exists()


def test_a_source_of_another_repository_is_refused(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local", hub_manifest(repo="acme/other"))
    with pytest.raises(WeightsError) as err:
        make_mirror(REPO, tmp_path / "mirror", Progress(), source=local)
    assert str(err.value) == f"--from {local} holds acme/other, not {REPO}"


def test_a_source_of_another_revision_is_refused(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    with pytest.raises(WeightsError) as err:
        make_mirror(REPO, tmp_path / "mirror", Progress(), source=local, revision="fedcba9")
    assert str(err.value) == f"--from {local} holds revision {SHA[:12]}, not fedcba9"
    assert not (tmp_path / "mirror").exists()


def test_a_source_with_a_flipped_bit_is_refused_and_nothing_written(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    (local / "model.safetensors").write_bytes(b"W" + FILES["model.safetensors"][1:])
    (local / "config.json").unlink()
    with pytest.raises(WeightsError) as err:
        make_mirror(REPO, tmp_path / "mirror", Progress(), source=local)
    assert str(err.value).startswith(
        f"--from {local} is not complete: 2 file(s) wrong, e.g. config.json missing;"
    )
    assert str(err.value).endswith("; nothing was written to the mirror")
    assert not (tmp_path / "mirror").exists()


def test_an_unfinished_download_in_the_source_is_refused(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    (local / "x.incomplete").write_bytes(b"")
    with pytest.raises(WeightsError, match="is not complete: 1 file"):
        make_mirror(REPO, tmp_path / "mirror", Progress(), source=local)


def test_untrusted_source_or_mirror_is_refused(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    os.chmod(local, 0o777)
    with pytest.raises(UntrustedError, match=r"\(--from\) is writable by others"):
        make_mirror(REPO, tmp_path / "mirror", Progress(), source=local)
    os.chmod(local, 0o755)
    root = tmp_path / "mirror"
    (root / "acme" / "tiny-27b").mkdir(parents=True)
    os.chmod(root / "acme" / "tiny-27b", 0o777)
    with pytest.raises(UntrustedError, match=r"\(the mirror\) is writable by others"):
        make_mirror(REPO, root, Progress(), source=local)
    os.chmod(root / "acme" / "tiny-27b", 0o755)
    os.chmod(root / "acme", 0o777)
    with pytest.raises(UntrustedError, match=r"\(above --to\) is writable by others"):
        make_mirror(REPO, root, Progress(), source=local)


def test_a_failed_write_is_one_line_naming_the_mirror(tmp_path: Path) -> None:
    local = local_copy(tmp_path / "local")
    root = tmp_path / "mirror"
    (root / "acme").mkdir(parents=True)
    (root / "acme" / "tiny-27b.partial").write_text("a file where the staging copy goes")
    with pytest.raises(WeightsError) as err:
        make_mirror(REPO, root, Progress(), source=local)
    path = root / "acme" / "tiny-27b"
    assert str(err.value).startswith(f"cannot write the mirror {path}: ")
    assert "\n" not in str(err.value)


def test_mirror_models_lists_org_name_and_top_level_models(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    for rel in ("acme/b", "acme/a", "zeta/x", "solo", "acme/b.partial", "acme/b.old"):
        local_copy(root / rel)
    local_copy(tmp_path / "elsewhere")
    (root / "acme" / "link").symlink_to(tmp_path / "elsewhere")
    (root / "linked").symlink_to(tmp_path / "elsewhere")
    (root / "top.partial" / "m").mkdir(parents=True)
    write_manifest(root / "top.partial" / "m", hub_manifest())
    (root / "acme" / "empty").mkdir()
    (root / "acme" / "file").write_text("x")
    (root / "notes.txt").write_text("x")
    expected = [root / "acme/a", root / "acme/b", root / "solo", root / "zeta/x"]
    assert mirror_models(root) == expected
    assert mirror_models(tmp_path / "none") == []


def test_verify_lists_every_bad_and_missing_file_of_every_model(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    for rel in ("acme/a", "acme/b"):
        local = local_copy(root / rel)
        seal(local, hub_manifest(), Progress())
    bad = root / "acme" / "b"
    (bad / "tok/t.json").write_bytes(b"[2]\n")
    (bad / "config.json").unlink()
    copies = verify_mirror(root, Progress())
    assert [c.path for c in copies] == [str(root / "acme/a"), str(bad)]
    assert copies[0].intact and copies[0].problems == ()
    assert (copies[0].repo_id, copies[0].revision, copies[0].files_total) == (REPO, SHA, 3)
    assert [(p.path, p.problem) for p in copies[1].problems] == [
        ("config.json", "missing"),
        ("tok/t.json", "sha256"),
    ]
    assert not copies[1].intact
    doc = copies[1].to_dict()
    assert doc["intact"] is False and doc["bytes_total"] == 3007
    assert doc["problems"][0] == {"path": "config.json", "problem": "missing", "detail": "missing"}


def test_verify_of_one_repository(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    seal(local_copy(root / "acme/a"), hub_manifest(repo="acme/a"), Progress())
    seal(local_copy(root / "acme/b"), hub_manifest(repo="acme/b"), Progress())
    (root / "acme/b/config.json").unlink()
    (copy,) = verify_mirror(root, Progress(), repo_id="acme/a")
    assert (copy.repo_id, copy.intact) == ("acme/a", True)
    with pytest.raises(WeightsError) as err:
        verify_mirror(root, Progress(), repo_id="acme/gone")
    assert str(err.value) == (
        f"mirror {root} holds no acme/gone ({root / 'acme' / 'gone'} does not exist)"
    )


def test_verify_a_model_whose_manifest_is_gone(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    local_copy(root / "acme/a")
    (root / "acme/a" / MANIFEST_NAME).unlink()
    (copy,) = verify_mirror(root, Progress(), repo_id="acme/a")
    assert copy == MirrorCopy(
        "acme/a",
        str(root / "acme/a"),
        "",
        0,
        0,
        (FileProblem(MANIFEST_NAME, "missing", "missing or invalid"),),
    )


def test_verify_refuses_a_missing_or_empty_or_untrusted_mirror(tmp_path: Path) -> None:
    with pytest.raises(WeightsError) as err:
        verify_mirror(tmp_path / "none", Progress())
    assert str(err.value) == f"mirror {tmp_path / 'none'} does not exist or is not a directory"
    (tmp_path / "file").write_text("x")
    with pytest.raises(WeightsError, match="does not exist or is not a directory"):
        verify_mirror(tmp_path / "file", Progress())
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError) as err:
        verify_mirror(tmp_path / "empty", Progress())
    assert str(err.value) == f"mirror {tmp_path / 'empty'} holds no model with a gpudoctor manifest"
    root = tmp_path / "open"
    local_copy(root / "acme/a")
    os.chmod(root, 0o777)
    with pytest.raises(UntrustedError, match=r"\(above --verify\) is writable by others"):
        verify_mirror(root, Progress())
    os.chmod(root, 0o755)
    os.chmod(root / "acme/a", 0o777)
    with pytest.raises(UntrustedError, match=r"\(the mirror\) is writable by others"):
        verify_mirror(root, Progress())


def test_verify_after_an_interrupted_refresh_checks_the_model_only(tmp_path: Path) -> None:
    """A refresh killed midway leaves ``NAME.partial`` (or ``NAME.old``) beside the model:
    ``weights mirror --verify`` checks the model, not the leftovers as extra models."""
    root = tmp_path / "mirror"
    for rel in ("acme/tiny-27b", "acme/tiny-27b.partial", "acme/tiny-27b.old"):
        seal(local_copy(root / rel), hub_manifest(), Progress())
    assert [c.path for c in verify_mirror(root, Progress())] == [str(root / "acme/tiny-27b")]


def test_seal_leaves_no_file_open(tmp_path: Path) -> None:
    """Sealing a mirror of thousands of files must not hold one descriptor per file."""
    model = local_copy(tmp_path / "m")
    seal(model, hub_manifest(), Progress())
    held = []
    for n in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # the listing's own descriptor
            continue
        held += [target] if target.startswith(str(model)) else []
    assert held == []


def _make_mirror_in_a_child(hub, tmp_path: Path, root: Path, revision: str | None) -> dict:
    """Run ``make_mirror(REPO, root)`` from the loopback Hub in a forked child of this
    process: huggingface_hub reads its HF_* variables once, at import (recipe pitfall 1),
    so it is imported there, with this test's endpoint and an empty HF_HOME, never into
    pytest. Return the child's MirrorCopy as a dict (or its error as ``{"error": ...}``)."""
    import json
    import sys
    import traceback

    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
                os.environ.pop(name, None)
            os.environ.update(
                HF_ENDPOINT=hub.url,
                HF_HOME=str(tmp_path / "hf-home"),
                HF_HUB_DISABLE_TELEMETRY="1",
                HF_HUB_DISABLE_UPDATE_CHECK="1",
            )
            for name in [m for m in sys.modules if m.startswith("huggingface_hub")]:
                del sys.modules[name]
            copy = make_mirror(REPO, root, Progress(), revision=revision)
            out.write_text(json.dumps(copy.to_dict()))
            code = 0
        except BaseException as exc:
            out.write_text(json.dumps({"error": f"{exc}", "trace": traceback.format_exc()}))
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
    return json.loads(out.read_text())


def test_mirror_from_the_hub_is_sealed_at_the_revision_asked(hub, tmp_path: Path) -> None:
    import sys

    from tests.weights.test_ensure_cli import publish

    hub_loaded = "huggingface_hub" in sys.modules  # by an earlier test of the session, maybe
    old = {"model.safetensors": b"v" * 3000, "config.json": b'{"v": 1}\n'}
    new = {"model.safetensors": b"n" * 4000, "config.json": b'{"v": 2}\n'}
    old_sha = publish(hub, old, repo_id=REPO, tag="v1")
    new_sha = publish(hub, new, repo_id=REPO)
    root = tmp_path / "mirror"
    plain = tmp_path / "plain"  # an hf download: no manifest
    plain.mkdir()
    (plain / "config.json").write_bytes(b"{}")
    with pytest.raises(WeightsError, match="has no gpudoctor"):
        make_mirror(REPO, root, Progress(), source=plain)
    path = root / "acme" / "tiny-27b"
    pinned = _make_mirror_in_a_child(hub, tmp_path, root, "v1")
    assert pinned == MirrorCopy(REPO, str(path), old_sha, 2, 3009, ()).to_dict() | {
        "intact": True
    }, pinned.get("trace")
    sealed = read_manifest(path)
    assert {f.path: f.sha256 for f in sealed.files} == {p: sha(b) for p, b in old.items()}
    assert {p: (path / p).read_bytes() for p in old} == old
    latest = _make_mirror_in_a_child(hub, tmp_path, root, "main")  # a refresh
    assert (latest.get("revision"), latest.get("bytes_total")) == (new_sha, 4009), latest
    assert {p: (path / p).read_bytes() for p in new} == new
    assert ("huggingface_hub" in sys.modules) == hub_loaded  # imported in the children only


def test_verify_reports_a_model_whose_manifest_is_broken_and_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "mirror"
    local_copy(root / "acme/a")
    (root / "acme/a" / MANIFEST_NAME).write_text("{broken")
    seal(local_copy(root / "acme/b"), hub_manifest(repo="acme/b"), Progress())
    broken, fine = verify_mirror(root, Progress())
    assert (broken.repo_id, broken.path, broken.intact) == ("", str(root / "acme/a"), False)
    assert (fine.repo_id, fine.intact) == ("acme/b", True)


def test_mirror_from_a_copy_on_another_filesystem_announces_the_copy(tmp_path: Path, tmpfs) -> None:
    local = local_copy(tmpfs("4m") / "local")
    progress = Phases()
    copy = make_mirror(REPO, tmp_path / "mirror", progress, source=local)
    assert copy.intact
    names = [name for name, _ in progress.phases]
    assert names == ["verify sha256", "copy to mirror", "hash"]


def test_verify_of_a_model_directory_points_to_weights_status(tmp_path: Path) -> None:
    """Issue 47: `weights mirror --verify DIR` on a model directory said "holds no model with
    a gpudoctor manifest"; it is a model directory, which `weights status --verify full`
    checks."""
    for marker in ("config.json", MANIFEST_NAME):
        model = tmp_path / marker.replace(".", "-")
        model.mkdir()
        (model / marker).write_text("{}")
        with pytest.raises(WeightsError) as err:
            verify_mirror(model, Progress())
        assert str(err.value) == (
            f"{model} is a model directory, not a mirror root (M with ORG/NAME under it); check"
            f" it with: gpudoctor weights status {model} --verify full"
        )
    odd = tmp_path / "odd"
    (odd / "config.json").mkdir(parents=True)  # a directory of that name: no model
    with pytest.raises(WeightsError, match="holds no model with a gpudoctor manifest"):
        verify_mirror(odd, Progress())
