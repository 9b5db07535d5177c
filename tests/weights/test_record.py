"""The record of where each target's model comes from (``weights-targets.json``): what
``check`` reads to say how to restore a directory a reboot emptied. Written by root only,
merged with what is there, never a reason for ``ensure`` to fail. Real files in tmp_path
(``GPUDOCTOR_STATE_DIR`` points there); a real child process that drops to another user."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpudoctor.weights.record import RECORD_NAME, TargetRecord, parse_records, record_path, remember


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if os.geteuid() != 0:
        pytest.skip("the record is written only by root")
    path = tmp_path / "state"
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(path))
    return path


def test_an_empty_state_dir_variable_means_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", "")
    assert record_path() == Path("/var/lib/gpudoctor") / RECORD_NAME


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]", '{"targets": null}', "{}"])
def test_an_absent_or_unreadable_record_holds_nothing(text: str | None) -> None:
    assert parse_records(text) == {}


def test_parse_keeps_valid_entries_and_drops_mistyped_fields() -> None:
    doc = {
        "targets": {
            "/m/a": {"repo_id": "acme/a", "revision": "v1", "mirror": "/mirror"},
            "/m/b": {"repo_id": "acme/b", "revision": 3, "mirror": ["x"]},
            "/m/c": {"revision": "v1"},  # no repository: useless
            "/m/d": "acme/d",
            "/m/e": {"repo_id": 7},
        }
    }
    assert parse_records(json.dumps(doc)) == {
        "/m/a": TargetRecord("acme/a", "v1", "/mirror"),
        "/m/b": TargetRecord("acme/b", None, None),
    }


def test_remember_writes_then_merges_sorted(state: Path, tmp_path: Path) -> None:
    assert remember(tmp_path / "m2", TargetRecord("acme/two", None, "/mirror")) is None
    assert remember(tmp_path / "m1", TargetRecord("acme/one", "v1")) is None
    path = state / RECORD_NAME
    text = path.read_text()
    assert text.endswith("}\n")
    doc = json.loads(text)
    assert list(doc["targets"]) == [str(tmp_path / "m1"), str(tmp_path / "m2")]
    assert doc["targets"][str(tmp_path / "m2")] == {
        "repo_id": "acme/two",
        "revision": None,
        "mirror": "/mirror",
    }
    assert parse_records(text)[str(tmp_path / "m1")] == TargetRecord("acme/one", "v1", None)
    assert text == json.dumps(doc, indent=1) + "\n"


def test_remember_replaces_a_target_s_old_entry(state: Path, tmp_path: Path) -> None:
    remember(tmp_path / "m", TargetRecord("acme/old"))
    remember(tmp_path / "m", TargetRecord("acme/new", "v2"))
    records = parse_records((state / RECORD_NAME).read_text())
    assert records == {str(tmp_path / "m"): TargetRecord("acme/new", "v2")}


def test_a_record_that_cannot_be_written_is_a_warning_line(state: Path, tmp_path: Path) -> None:
    state.write_text("a file where the state directory belongs")
    warning = remember(tmp_path / "m", TargetRecord("acme/a"))
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"could not record the target in {state / RECORD_NAME}: ")


def test_a_state_dir_others_can_write_is_not_trusted(state: Path, tmp_path: Path) -> None:
    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)
    warning = remember(tmp_path / "m", TargetRecord("acme/a"))
    assert warning is not None and warning.startswith("could not record the target in")
    assert f"{state} (gpudoctor's state directory) is writable by others" in warning
    assert not (state / RECORD_NAME).exists()


def test_a_record_that_is_a_symlink_is_not_followed(state: Path, tmp_path: Path) -> None:
    state.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (state / RECORD_NAME).symlink_to(elsewhere)
    warning = remember(tmp_path / "m", TargetRecord("acme/a"))
    assert warning is not None
    assert f"{state / RECORD_NAME} (the weights record) is a symlink" in warning
    assert elsewhere.read_text() == "{}"


def test_the_state_dir_is_made_when_missing(state: Path, tmp_path: Path) -> None:
    assert not state.exists()
    assert remember(tmp_path / "m", TargetRecord("acme/a")) is None
    assert (state / RECORD_NAME).is_file()


def test_a_user_other_than_root_records_nothing(state: Path, tmp_path: Path) -> None:
    """Run in a forked child that has dropped to nobody: no record, no warning."""
    state.mkdir(mode=0o777)
    os.chmod(state, 0o777)  # nobody could write here: only the uid check stops it
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            result = remember(tmp_path / "m", TargetRecord("acme/a"))
            code = 0 if result is None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert list(state.iterdir()) == []
