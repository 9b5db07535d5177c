"""The pure steps of a launch, in-process and fast: which recorded cells a retry measures
again, how a workload is fitted into the server's context, when the streamed text is kept,
the plan's missing paths, the run's id, the flags checked against the engine's real
``--help`` (a small program in tmp_path: the ``command`` engine runs it as it would run
``llama-server --help``) and each cell's decision (run, done, skipped by a quirk)."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.engines import engine_for
from gpudoctor.bench.launch.steps import (
    CampaignError,
    Decision,
    EngineMissing,
    LaunchOptions,
    clamp_workload,
    decide,
    keeps_text,
    load_generator_problems,
    model_problems,
    retried,
    run_id,
    skip_reason,
    validate_flags,
    with_legacy_keys,
)
from gpudoctor.bench.plan import Limits, Plan, ServerConfig, load_plan
from gpudoctor.bench.plan.quirks import Quirk

HELP = "usage: server [--model M] [--port P] [--ctx-size N] [--threads N]\n"


def _plan(tmp_path: Path, configs: str, program: Path | None = None, extra: str = "") -> Plan:
    (tmp_path / "m").mkdir(exist_ok=True)
    program = program or tmp_path / "server"
    path = tmp_path / "plan.toml"
    path.write_text(
        f'name = "steps"\n[model]\npath = "m"\n{extra}[engine]\nname = "command"\n'
        f'command = ["{program}", "--model", "{{model}}", "--port", "{{port}}"]\n'
        f'version = "v1"\n[axes]\nconcurrency = [1, 2]\n{configs}'
    )
    return load_plan(path)


def _program(path: Path, help_text: str, code: int = 0) -> Path:
    """Write an executable whose ``--help`` prints ``help_text`` (and logs each run)."""
    log = path.with_suffix(".runs")
    path.write_text(f"#!/bin/sh\necho run >> '{log}'\ncat <<'EOF'\n{help_text}EOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _runs(program: Path) -> int:
    log = program.with_suffix(".runs")
    return len(log.read_text().splitlines()) if log.exists() else 0


# --- which recorded cells a retry measures again -----------------------------------------


@pytest.mark.parametrize(
    ("record", "crashed", "failed", "again"),
    [({"status": "crashed"}, True, False, True), ({"status": "crashed"}, False, False, False),
     ({"status": "crashed"}, False, True, False),
     ({"status": "skipped", "retryable": True}, True, False, True),
     ({"status": "skipped", "retryable": True}, False, False, False),
     ({"status": "skipped", "retryable": False}, True, True, False),
     ({"status": "failed"}, False, True, True), ({"status": "failed"}, True, False, False),
     ({"status": "ok"}, True, True, False), ({}, True, True, False)],
)  # fmt: skip
def test_a_retry_measures_again_only_what_its_flag_names(
    record: dict, crashed: bool, failed: bool, again: bool
) -> None:
    options = LaunchOptions(out=Path("run"), retry_crashed=crashed, retry_failed=failed)
    assert retried(record, options) is again


def test_launch_options_default_to_a_resume_with_preflight_and_no_retry() -> None:
    options = LaunchOptions(out=Path("run"))
    assert (options.resume, options.retry_crashed, options.retry_failed) == (None, False, False)
    assert options.preflight is True
    assert (options.quirks_path, options.help_cache, options.shard) == (None, None, None)


# --- fitting a workload into the server's context ----------------------------------------


def test_a_random_workload_that_fits_is_sent_as_asked_with_every_fact() -> None:
    w = WorkloadSpec(input_len=100, output_len=20)
    fitted, facts = clamp_workload(w, 1000, Limits(template_overhead=8, min_input_len=4))
    assert fitted == w
    assert facts == {"max_context": 1000, "requested_input_len": 100, "input_len": 100,
                     "output_len": 20, "template_overhead": 8, "clamped": False}  # fmt: skip


def test_an_unknown_context_is_noted_and_nothing_cut() -> None:
    w = WorkloadSpec(input_len=100_000, output_len=20)
    fitted, facts = clamp_workload(w, None, Limits())
    assert fitted is w and facts["clamped"] is False and facts["input_len"] == 100_000
    assert facts["note"] == "the server did not report its context length; not clamped"


def test_a_random_input_too_long_is_shortened_to_the_budget() -> None:
    w = WorkloadSpec(input_len=5000, output_len=100)
    fitted, facts = clamp_workload(w, 2048, Limits(template_overhead=32, min_input_len=16))
    assert fitted is not None and fitted.input_len == 1916 and fitted.output_len == 100
    assert (facts["input_len"], facts["requested_input_len"], facts["clamped"]) == (
        1916,
        5000,
        True,
    )
    assert "note" not in facts


def test_a_random_input_that_cannot_fit_is_refused_with_the_arithmetic() -> None:
    w = WorkloadSpec(input_len=500, output_len=2020)
    fitted, facts = clamp_workload(w, 2048, Limits(template_overhead=16, min_input_len=16))
    assert fitted is None
    assert facts["note"] == ("output_len 2020 + overhead 16 leaves 12 input tokens of a "
                             "2048-token context (minimum 16)")  # fmt: skip
    assert facts["clamped"] is False


@pytest.mark.parametrize("kind", ["jsonl", "multi_turn", "shared_prefix"])
def test_a_dataset_is_cut_per_prompt_to_the_context_left_after_the_overhead(kind: str) -> None:
    w = WorkloadSpec(kind=kind, input_len=100_000, output_len=100, dataset_path="d.jsonl")
    limits = Limits(template_overhead=32, min_input_len=16)
    fitted, facts = clamp_workload(w, 2048, limits)
    assert fitted is w  # each prompt is cut when the cell builds it
    assert facts["kind"] == kind and facts["max_total_tokens"] == 2016
    assert facts["clamped"] is False and "note" not in facts
    # exactly the minimum input left is still a usable cell; one token less is not
    w = WorkloadSpec(kind=kind, output_len=2000, dataset_path="d.jsonl")
    assert clamp_workload(w, 2048, limits)[0] is w
    w = WorkloadSpec(kind=kind, output_len=2001, dataset_path="d.jsonl")
    fitted, facts = clamp_workload(w, 2048, limits)
    assert fitted is None and facts["max_total_tokens"] == 2016
    assert facts["note"] == ("output_len 2001 + overhead 32 leaves 15 input tokens of a "
                             "2048-token context (minimum 16)")  # fmt: skip


@pytest.mark.parametrize("kind", ["trace", "sharegpt"])
def test_a_dataset_with_its_own_output_lengths_is_never_refused_for_output_len(kind: str) -> None:
    w = WorkloadSpec(kind=kind, output_len=5000, dataset_path="d.jsonl")
    fitted, facts = clamp_workload(w, 2048, Limits(template_overhead=32, min_input_len=16))
    assert fitted is w and facts["max_total_tokens"] == 2016 and "note" not in facts


# --- the streamed text kept ---------------------------------------------------------------


def _config(*args: tuple[str, object]) -> ServerConfig:
    return ServerConfig(name="c", tp=1, args=tuple(args), env=(), concurrencies=(1,), key="k")


def test_the_text_is_kept_for_speculative_configs_unless_the_plan_says() -> None:
    auto = Limits()
    assert keeps_text(auto, _config(("speculative-algorithm", "EAGLE"))) is True
    assert keeps_text(auto, _config(("threads", 4), ("speculative-num-steps", 3))) is True
    assert keeps_text(auto, _config(("speculative-decoding", True))) is True
    assert keeps_text(auto, _config(("speculative-decoding", False))) is False
    assert keeps_text(auto, _config(("speculative-decoding", None))) is False
    assert keeps_text(auto, _config(("no-speculative", True))) is False
    assert keeps_text(auto, _config()) is False
    assert keeps_text(Limits(keep_text=True), _config()) is True
    assert keeps_text(Limits(keep_text=False), _config(("speculative-algorithm", "EAGLE"))) is False


# --- the plan's paths, the run's id ------------------------------------------------------


def test_every_missing_local_path_is_named_with_its_key(tmp_path: Path) -> None:
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\n')
    assert model_problems(plan) == []
    text = (
        (tmp_path / "plan.toml")
        .read_text()
        .replace('[model]\npath = "m"\n', '[model]\npath = "gone"\ntokenizer = "tok"\n')
    )
    text = text.replace("[axes]", '[workload]\nkind = "jsonl"\ndataset_path = "d.jsonl"\n[axes]')
    (tmp_path / "plan.toml").write_text(text)
    plan = load_plan(tmp_path / "plan.toml")
    fix = "fix the path (relative paths are relative to the plan file)"
    assert model_problems(plan) == [
        f"{plan.source}: model.{key} {tmp_path / name} does not exist; {fix}"
        for key, name in (("path", "gone"), ("tokenizer", "tok"))
    ] + [f"{plan.source}: workload.dataset_path {tmp_path / 'd.jsonl'} does not exist; {fix}"]
    (tmp_path / "gone").mkdir()
    for name in ("tok", "d.jsonl"):
        (tmp_path / name).touch()
    assert model_problems(load_plan(tmp_path / "plan.toml")) == []


def _chat_plan(tmp_path: Path, model: Path, api: str = "chat") -> Plan:
    path = tmp_path / "chat.toml"
    path.write_text(
        f'name = "chat"\n[model]\npath = "{model}"\n[engine]\nname = "vllm"\n'
        f'[workload]\napi = "{api}"\n[axes]\nconcurrency = [1]\n'
    )
    return load_plan(path)


def test_a_chat_workload_needs_the_models_chat_template(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    (base / "chat_template.jinja").unlink()
    plan = _chat_plan(tmp_path, base)
    assert model_problems(plan) == [
        f'{plan.source}: workload.api = "chat" needs a chat template, and the tokenizer in {base}'
        ' has none (a base model); use api = "completions"'
    ]
    assert model_problems(_chat_plan(tmp_path, base, api="completions")) == []
    assert model_problems(_chat_plan(tmp_path, tiny_model_dir)) == []


def test_a_tokenizer_not_on_disk_or_unreadable_is_not_judged_for_chat(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert model_problems(_chat_plan(tmp_path, empty)) == []  # the weights step fetches it later
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer_config.json").write_text("{ not json")
    assert model_problems(_chat_plan(tmp_path, broken)) == []  # the cell names its own error


def test_a_missing_transformers_is_a_problem_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    assert load_generator_problems() == []
    monkeypatch.setitem(sys.modules, "transformers", None)  # what an uninstalled package gives
    assert load_generator_problems() == [
        "the load generator needs transformers to read the model's tokenizer (prompt lengths,"
        " context clamping); install it: pip install 'gpudoctor[bench]'"
    ]
    assert model_problems(_plan(tmp_path, '[[configs]]\nname = "a"\n')) == []  # its own list


def test_a_model_path_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    """Issue 47: `[model] path` = a file failed 9 s later with the Hub's "Repo id must be in
    the form ..."; it is a file, not a repo id. The directory holding it is named when it
    holds a config.json."""
    _plan(tmp_path, '[[configs]]\nname = "a"\n')
    text = (tmp_path / "plan.toml").read_text()
    (tmp_path / "plan.toml").write_text(text.replace('path = "m"', 'path = "m/w.safetensors"'))
    model = tmp_path / "m"
    (model / "w.safetensors").write_bytes(b"")
    plan = load_plan(tmp_path / "plan.toml")
    start = f"{plan.source}: model.path {model / 'w.safetensors'} is a file, not a model directory"
    assert model_problems(plan) == [
        f"{start}; give the directory that holds config.json and the weights"
    ]
    (model / "config.json").write_text("{}")
    assert model_problems(plan) == [
        f"{start}; give the directory that holds config.json and the weights ({model})"
    ]
    (model / "config.json").unlink()
    (model / "config.json").mkdir()  # not a file: not a model's config
    assert model_problems(plan)[0].endswith("and the weights")


def test_a_run_id_names_the_run_directory_wherever_it_is_named_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    rid = run_id(out)
    assert re.fullmatch(r"gdb-[0-9a-f]{12}", rid)
    monkeypatch.chdir(tmp_path)
    assert run_id(Path("run")) == rid == run_id(tmp_path / "x" / ".." / "run")
    assert run_id(tmp_path / "other") != rid


# --- the flags against the engine's --help -----------------------------------------------


def test_known_flags_pass_and_the_help_is_returned(tmp_path: Path) -> None:
    program = _program(tmp_path / "server", HELP)
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { ctx-size = 4096, threads = 2 }\n')
    assert validate_flags(plan, engine_for(plan.engine), None) == HELP
    assert _runs(program) == 1


def test_each_unknown_flag_is_named_with_its_configs_and_a_suggestion(tmp_path: Path) -> None:
    _program(tmp_path / "server", HELP)
    plan = _plan(
        tmp_path,
        '[[configs]]\nname = "a"\nargs = { ctx-sise = 4096 }\n'
        '[[configs]]\nname = "b"\nargs = { ctx-sise = 8192, zzz = 1 }\n',
    )
    with pytest.raises(CampaignError) as caught:
        validate_flags(plan, engine_for(plan.engine), None)
    assert not isinstance(caught.value, EngineMissing)
    assert str(caught.value) == (
        f"{plan.source}: unknown flag --ctx-sise (did you mean --ctx-size?), used by a@tp1, "
        "b@tp1; unknown flag --zzz, used by b@tp1"
    )


def test_a_stale_cached_help_is_refreshed_once_before_a_flag_is_refused(tmp_path: Path) -> None:
    program = _program(tmp_path / "server", HELP)
    cache = tmp_path / "help-cache"
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { threads = 2 }\n')
    engine = engine_for(plan.engine)
    assert validate_flags(plan, engine, cache) == HELP and _runs(program) == 1
    assert validate_flags(plan, engine, cache) == HELP and _runs(program) == 1  # from the cache
    # the engine is reinstalled (same version) with a new flag: the cache predates it
    newer = HELP + "  --spec-draft N\n"
    _program(program, newer)
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { spec-draft = 2 }\n')
    assert validate_flags(plan, engine_for(plan.engine), cache) == newer
    assert _runs(program) == 2
    assert validate_flags(plan, engine_for(plan.engine), cache) == newer  # the cache was renewed
    assert _runs(program) == 2
    # a flag the fresh help does not know either is refused after that one refresh
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { spec-draftt = 2 }\n')
    with pytest.raises(CampaignError, match=r"unknown flag --spec-draftt \(did you mean "):
        validate_flags(plan, engine_for(plan.engine), cache)
    assert _runs(program) == 3


def test_a_missing_engine_is_engine_missing_and_a_broken_one_a_campaign_error(
    tmp_path: Path,
) -> None:
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\n', program=tmp_path / "nowhere")
    with pytest.raises(EngineMissing, match=f"^command: {tmp_path / 'nowhere'} not found$"):
        validate_flags(plan, engine_for(plan.engine), None)
    _program(tmp_path / "server", "Traceback: ImportError\n", code=1)
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { threads = 2 }\n')
    with pytest.raises(CampaignError, match=r"--help` failed: Traceback: ImportError$") as caught:
        validate_flags(plan, engine_for(plan.engine), None)
    assert not isinstance(caught.value, EngineMissing)
    assert isinstance(caught.value.__cause__, Exception)


def test_a_help_without_flags_is_named_as_such_and_needed_only_for_args(tmp_path: Path) -> None:
    """Issue 47: a wrapper whose --help prints a usage line read "`--help` failed"; it did not
    fail, it lists no --flag to check the plan's args against. Without args nothing is
    checked (a `sh -c` launcher passes), but the program must exist."""
    program = _program(tmp_path / "server", "usage: server MODEL PORT\n")
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { threads = 2 }\n', program=program)
    with pytest.raises(CampaignError) as caught:
        validate_flags(plan, engine_for(plan.engine), None)
    assert str(caught.value) == (
        f"command: `{program} --help` printed no --flag, and the plan's args are checked against"
        " the flags a --help lists (usage: server MODEL PORT); put those flags in the command"
        " itself, or start a program whose --help lists them"
    )
    bare = _plan(tmp_path, '[[configs]]\nname = "a"\n', program=program)
    assert validate_flags(bare, engine_for(bare.engine), None) == ""
    assert _runs(program) == 1  # only the run with args asked for --help
    gone = _plan(tmp_path, '[[configs]]\nname = "a"\n', program=tmp_path / "gone")
    with pytest.raises(EngineMissing, match=f"^command: {tmp_path / 'gone'} not found$"):
        validate_flags(gone, engine_for(gone.engine), None)


# --- each cell's decision ----------------------------------------------------------------


def _quirk(**match: object) -> Quirk:
    return Quirk("q1", "*", "command", "*", tuple(match.items()), "hangs at start")


def test_each_cell_is_done_skipped_by_a_quirk_or_run_in_plan_order(tmp_path: Path) -> None:
    _program(tmp_path / "server", HELP)
    plan = _plan(
        tmp_path,
        '[[configs]]\nname = "a"\nargs = { threads = 2 }\n'
        '[[configs]]\nname = "b"\nargs = { threads = 8 }\n',
    )
    cells = plan.cells()
    done = {cells[0].key: {"status": "ok"}, cells[3].key: {}}
    decisions = decide(plan, done, [_quirk(threads=8)], "cpu", "v1", retry=False)
    assert decisions == [
        Decision(cells[0], "done", "ok"),
        Decision(cells[1], "run"),
        Decision(
            cells[2],
            "skip",
            "quirk q1 (in the shipped quirks table; --retry-crashed"
            " runs it anyway): hangs at start",
        ),
        Decision(cells[3], "done", ""),
    ]
    assert [(c.config.label, c.concurrency) for c in cells] == [
        ("a@tp1", 1), ("a@tp1", 2), ("b@tp1", 1), ("b@tp1", 2)
    ]  # fmt: skip
    # --retry-crashed measures a quirked configuration again (the quirk may be fixed)
    again = decide(plan, done, [_quirk(threads=8)], "cpu", "v1", retry=True)
    assert [d.action for d in again] == ["done", "run", "run", "done"]
    on_cpu = Quirk("q4", "cpu", "*", "*", (), "this host's architecture")
    assert [d.action for d in decide(plan, {}, [on_cpu], "cpu", "v1", False)] == ["skip"] * 4
    other_arch = Quirk("q2", "sm_90", "*", "*", (), "only there")
    assert [d.action for d in decide(plan, {}, [other_arch], "cpu", "v1", False)] == ["run"] * 4
    old = Quirk("q3", "*", "*", "v0*", (), "fixed in v1")
    assert [d.action for d in decide(plan, {}, [old], "cpu", "v1", False)] == ["run"] * 4
    assert [d.action for d in decide(plan, {}, [old], "cpu", "v0.9", False)] == ["skip"] * 4


def test_a_skip_names_the_quirks_table_and_how_to_run_it_anyway() -> None:
    """Issue 45.2: a skipped cell said only "quirk crash-...": not where that quirk lives
    (a local file that outlives the run) nor how to run the cell anyway."""
    local = Quirk("crash-abc", "cpu", "command", "*", (), "server exited", "/home/u/q.toml")
    assert skip_reason(local) == (
        "quirk crash-abc (in /home/u/q.toml; --retry-crashed runs it anyway): server exited"
    )
    assert skip_reason(_quirk()) == (
        "quirk q1 (in the shipped quirks table; --retry-crashed runs it anyway): hangs at start"
    )


def test_a_run_of_before_the_program_key_resumes_for_the_same_plan_only(tmp_path: Path) -> None:
    """Issue 45.2: a ``command`` plan's keys now name its program; the records a run wrote
    under the old keys are found under the new ones (the same plan only)."""
    _program(tmp_path / "server", HELP)
    plan = _plan(tmp_path, '[[configs]]\nname = "a"\nargs = { threads = 2 }\n')
    cells = plan.cells()
    legacy = [plan.legacy_cell_key(c) for c in cells]
    assert all(legacy) and not {c.key for c in cells} & set(legacy)
    assert cells[0].config.legacy_key and cells[0].config.legacy_key != cells[0].config.key
    old = {legacy[0]: {"key": legacy[0], "status": "ok"}, "other": {"status": "ok"}}
    found = with_legacy_keys(plan, old)
    assert found == {**old, cells[0].key: old[legacy[0]]}
    assert [d.action for d in decide(plan, found, [], "cpu", "v1", False)] == ["done", "run"]
    newer = {cells[0].key: {"status": "crashed"}, legacy[0]: {"status": "ok"}}
    assert with_legacy_keys(plan, newer)[cells[0].key] == {"status": "crashed"}  # new form wins
