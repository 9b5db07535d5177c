"""Plan parsing, errors that name line and key, matrix expansion and stable keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpudoctor.bench.plan import PlanError, cell_key, config_key, load_plan, parse_plan
from gpudoctor.bench.plan_model import program_identity

EXAMPLES = Path(__file__).parents[3] / "docs" / "examples"

BASE = """\
name = "t"
[model]
path = "/models/m"
[engine]
name = "sglang"
args = { context-length = 4096 }
[axes]
tp = [1, 4]
concurrency = { 1 = [1], 4 = [1, 8, 2] }
[[configs]]
name = "auto"
[[configs]]
name = "ddtree-b{speculative-ddtree-budget}"
args = { speculative-algorithm = "DDTREE" }
sweep = { speculative-ddtree-budget = [15, 16] }
tp = [1]
[workload]
input_len = 100
output_len = 10
"""


def test_seed_plan_expands_to_the_campaign() -> None:
    plan = load_plan(EXAMPLES / "qwen36-dflash-ddtree.toml")
    labels = [c.label for c in plan.configs]
    assert "auto@tp1" in labels and "linear@tp4" in labels and "ddtree-b64@tp8" in labels
    assert {c.arg("speculative-ddtree-budget") for c in plan.configs} == {None, 15, 16, 32, 64}
    tp4 = next(c for c in plan.configs if c.label == "linear@tp4")
    assert tp4.concurrencies == (1, 2, 4, 8, 16, 32)
    assert next(c for c in plan.configs if c.label == "linear@tp1").concurrencies == (1,)
    assert all(c.arg("context-length") == 30720 for c in plan.configs)
    assert plan.model.repo == "Qwen/Qwen3.6-27B" and plan.model.dir.startswith("/dev/shm")
    assert len([ln for ln in plan.text.splitlines() if ln.strip() and not ln.startswith("#")]) <= 26


def test_cpu_example_parses() -> None:
    plan = load_plan(EXAMPLES / "cpu-tiny.toml")
    assert plan.engine.name == "transformers"
    assert len(plan.cells()) == 6
    assert plan.model.path == str((EXAMPLES.parents[1] / "runs" / "tiny-llm").resolve())


def test_sweep_names_tp_tables_and_sorting() -> None:
    plan = parse_plan(BASE)
    assert [c.label for c in plan.configs] == [
        "auto@tp1",
        "auto@tp4",
        "ddtree-b15@tp1",
        "ddtree-b16@tp1",
    ]
    assert plan.configs[1].concurrencies == (1, 2, 8)
    assert dict(plan.configs[2].args) == {
        "context-length": 4096, "speculative-algorithm": "DDTREE", "speculative-ddtree-budget": 15,
    }  # fmt: skip
    assert len(plan.cells()) == 1 + 3 + 1 + 1


def test_keys_are_stable_and_follow_the_resolved_config() -> None:
    a, b = parse_plan(BASE), parse_plan(BASE)
    assert [c.key for c in a.cells()] == [c.key for c in b.cells()]
    renamed = parse_plan(BASE.replace('name = "auto"', 'name = "baseline"'))
    assert renamed.configs[0].key == a.configs[0].key  # the name is not part of the config
    changed = parse_plan(BASE.replace("context-length = 4096", "context-length = 8192"))
    assert not {c.key for c in changed.cells()} & {c.key for c in a.cells()}
    longer = parse_plan(BASE.replace("input_len = 100", "input_len = 200"))
    assert longer.configs[0].key == a.configs[0].key  # same server ...
    assert longer.cells()[0].key != a.cells()[0].key  # ... different cell
    assert len({c.key for c in a.cells()}) == len(a.cells())


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("[axes]", "[axes]\nbogus = 1"), "plan.toml:8: axes.bogus: unknown key"),
        (("tp = [1, 4]", 'tp = ["one"]'), "plan.toml:8: axes.tp: expected a non-empty list of positive integers"),
        (("input_len = 100", "input_len = 0"), "plan.toml:18: workload.input_len: must be at least 1"),
        (('name = "sglang"', 'name = "tgi"'), "plan.toml:5: engine.name: expected one of sglang, vllm"),
        (("context-length = 4096", "--context-length = 4096"), "engine.args.--context-length: write flag names without"),
        (("sweep = { speculative-ddtree-budget = [15, 16] }", "sweep = { speculative-ddtree-budget = 15 }"),
         "plan.toml:15: configs[1].sweep.speculative-ddtree-budget: expected a non-empty list"),
        (('name = "auto"', 'name = "ddtree-b15"\ntp = [1]\nargs = { speculative-algorithm = "DDTREE", speculative-ddtree-budget = 15 }'),
         "appears twice"),
        (('name = "auto"', 'name = "auto"\n[[configs]]\nname = "auto2"'), "auto2@tp1 is the same server configuration as auto@tp1"),
        (("concurrency = { 1 = [1], 4 = [1, 8, 2] }", "concurrency = { 1 = [1] }"), "axes.concurrency: no concurrency list for tp = 4"),
        (('path = "/models/m"', 'repo = "org/m"'), "model.dir: missing"),
        (("input_len = 100", "input_len = 100\nignore_eos = 1"), "workload.ignore_eos: expected a boolean"),
    ],
)  # fmt: skip
def test_errors_name_line_and_key(edit: tuple[str, str], expected: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan(BASE.replace(*edit), "plan.toml")
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_toml_syntax_error_and_transformers_tp(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"plan.toml: not valid TOML: .*line 2"):
        parse_plan('name = "x"\n[model\n', "plan.toml")
    text = BASE.replace('name = "sglang"', 'name = "transformers"')
    with pytest.raises(PlanError, match="runs tp = 1 only"):
        parse_plan(text)
    with pytest.raises(PlanError, match="cannot read plan"):
        load_plan(tmp_path / "missing.toml")


def test_limits_deadlines_and_keep_text() -> None:
    from gpudoctor.bench.launch.steps import keeps_text

    plan = parse_plan(BASE)
    assert plan.limits.request_timeout_s == 600 and plan.limits.cell_timeout_s == 3600
    by_name = {c.name: c for c in plan.configs}
    assert keeps_text(plan.limits, by_name["ddtree-b15"])  # speculative: text for the ITL split
    assert not keeps_text(plan.limits, by_name["auto"])
    plan = parse_plan(BASE + "[limits]\ncell_timeout_s = 90\nkeep_text = true\n")
    assert plan.limits.cell_timeout_s == 90 and keeps_text(plan.limits, by_name["auto"])
    with pytest.raises(PlanError, match=r"limits.cell_timeout_s: must be > 0"):
        parse_plan(BASE + "[limits]\ncell_timeout_s = 0\n")
    with pytest.raises(PlanError, match=r"limits.keep_text: expected"):
        parse_plan(BASE + '[limits]\nkeep_text = "yes"\n')


def test_cell_keys_do_not_move_when_a_later_workload_field_is_unset() -> None:
    """Resume matches cells by key: adding an optional workload field must not change the
    keys of plans that do not set it (runs recorded before would all rerun)."""
    import dataclasses
    import hashlib
    import json

    plan = parse_plan(BASE)
    cell = plan.cells()[0]
    first_fields = ("kind", "input_len", "output_len", "range_ratio", "num_prompts", "seed",
                    "dataset_path", "ignore_eos", "api", "warmup", "request_rate")  # fmt: skip
    before = {k: v for k, v in dataclasses.asdict(plan.workload).items() if k in first_fields}
    blob = {"config": cell.config.key, "concurrency": cell.concurrency, "workload": before,
            "slo": dataclasses.asdict(plan.slo) if plan.slo else None}  # fmt: skip
    digest = hashlib.sha256(json.dumps(blob, sort_keys=True, separators=(",", ":"),
                                       default=list).encode()).hexdigest()[:16]  # fmt: skip
    assert cell.key == digest
    for later in ("prompts_per_concurrency = 4", "burstiness = 0.5"):
        changed = parse_plan(BASE.replace("[workload]", f"[workload]\n{later}"))
        assert changed.cells()[0].key != cell.key


def test_a_request_field_the_engine_rejects_is_a_plan_error_naming_engine_and_fix() -> None:
    """Issue 31: `transformers serve` answers HTTP 422 to `ignore_eos`; sglang and vllm
    take it; the `command` engine is unknown (its warmup decides)."""
    transformers = (BASE.replace('name = "sglang"', 'name = "transformers"')
                    .replace("tp = [1, 4]", "tp = [1]").replace("concurrency = { 1 = [1], 4 = [1, 8, 2] }",
                                                              "concurrency = [1]"))  # fmt: skip
    assert not parse_plan(transformers).workload.ignore_eos  # unset: the engine's default
    explicit = transformers.replace("[workload]", "[workload]\nignore_eos = true")
    with pytest.raises(PlanError, match=r"workload.ignore_eos: the transformers engine rejects "
                       r"the request field 'ignore_eos'.*set ignore_eos = false in \[workload\]"):  # fmt: skip
        parse_plan(explicit)
    assert parse_plan(transformers.replace("[workload]", "[workload]\nignore_eos = false"))
    assert parse_plan(BASE).workload.ignore_eos  # sglang takes it
    assert parse_plan(BASE.replace('name = "sglang"', 'name = "vllm"'))


COMMAND = """\
[model]
path = "/models/m"
[engine]
name = "command"
command = ["{program}", "--port", "{{port}}"]
version = "1"
[[configs]]
name = "a"
"""


def test_a_configuration_key_names_the_program_the_old_form_is_kept_beside() -> None:
    """Issue 45.2: four plans with different server programs shared one key, so one crash
    quirk skipped them all, and --resume and compare mixed their cells."""
    keys = {p: parse_plan(COMMAND.format(program=p)).configs[0] for p in ("/a/srv", "/b/srv")}
    a, b = keys["/a/srv"], keys["/b/srv"]
    model = parse_plan(COMMAND.format(program="/x")).model
    assert a.key != b.key and a.legacy_key == b.legacy_key  # the old form named no program
    assert a.legacy_key not in (a.key, b.key)
    assert a.key == config_key("command", model, 1, a.args, a.env,
                               ("command", "/a/srv", "--port", "{port}", "version=1"))  # fmt: skip
    assert a.legacy_key == config_key("command", model, 1, a.args, a.env)
    other_version = parse_plan(COMMAND.format(program="/a/srv").replace('"1"', '"2"'))
    assert other_version.configs[0].key != a.key
    # an engine on gpudoctor's own interpreter keeps its key; engine.python names another
    plain = parse_plan(BASE).configs[0]
    assert plain.legacy_key == "" and plain.key == config_key(
        "sglang", parse_plan(BASE).model, 1, plain.args, plain.env
    )
    venv = parse_plan(BASE.replace('name = "sglang"', 'name = "sglang"\npython = "/v/bin/python"'))
    assert venv.configs[0].key != plain.key and venv.configs[0].legacy_key == plain.key
    assert program_identity(venv.engine) == ("python", "/v/bin/python")
    assert program_identity(parse_plan(BASE).engine) == ()
    plan = parse_plan(COMMAND.format(program="/a/srv"))
    cell = plan.cells()[0]
    old = dataclasses.replace(cell.config, key=cell.config.legacy_key, legacy_key="")
    assert plan.legacy_cell_key(cell) == cell_key(old, cell.concurrency, plan.workload, plan.slo)
    assert parse_plan(BASE).legacy_cell_key(parse_plan(BASE).cells()[0]) is None
