"""Engine adapters: the commands they build, checked against recorded real --help outputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpudoctor.bench.engines import ENGINES, Engine, EngineError, engine_for
from gpudoctor.bench.engines.base import flags_in_help, render_args
from gpudoctor.bench.engines.transformers import context_from_model_dir
from gpudoctor.bench.plan import PlanError, load_plan, parse_plan
from tests.bench.campaign_support import DATA

EXAMPLES = Path(__file__).parents[3] / "docs" / "examples"
SGLANG_HELP = (DATA / "sglang-0.5.23-launch_server-help.txt").read_text()
DDTREE_HELP = SGLANG_HELP + (DATA / "sglang-ddtree-pr27509-extra-flags.txt").read_text()
VLLM_HELP = (DATA / "vllm-0.32.0-serve-help-all.txt").read_text()
TRANSFORMERS_HELP = (DATA / "transformers-5.24.0-serve-help.txt").read_text()


def _flags_of(argv: list[str]) -> list[str]:
    return [w for w in argv if w.startswith("--")]


def _plan_for(name: str):
    command = '\ncommand = ["srv", "--port", "{port}"]' if name == "command" else ""
    return parse_plan(f'[model]\npath = "/m"\n[engine]\nname = "{name}"{command}\n')


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_name_of_the_table_parses_and_builds_its_class(name: str) -> None:
    engine = engine_for(_plan_for(name).engine)
    assert type(engine) is ENGINES[name] and isinstance(engine, Engine)


def test_the_parser_refuses_a_name_outside_the_table() -> None:
    with pytest.raises(PlanError, match="expected one of sglang, vllm, transformers, command"):
        _plan_for("tgi")
    spec = dataclasses.replace(_plan_for("vllm").engine, name="tgi")
    with pytest.raises(EngineError, match="unknown engine 'tgi'"):
        engine_for(spec)


def test_recorded_helps_are_real_flag_lists() -> None:
    assert len(flags_in_help(SGLANG_HELP)) > 500
    assert {"--tp-size", "--speculative-algorithm", "--speculative-num-draft-tokens",
            "--speculative-eagle-topk", "--speculative-num-steps", "--context-length"} <= flags_in_help(SGLANG_HELP)  # fmt: skip
    assert "--speculative-ddtree-budget" not in flags_in_help(SGLANG_HELP)
    assert {"--tensor-parallel-size", "--max-model-len", "--speculative-config"} <= flags_in_help(
        VLLM_HELP
    )
    assert {"--continuous-batching", "--cb-num-blocks", "--device"} <= flags_in_help(
        TRANSFORMERS_HELP
    )


def test_sglang_seed_plan_commands_use_only_real_flags() -> None:
    plan = load_plan(EXAMPLES / "qwen36-dflash-ddtree.toml")
    engine = engine_for(plan.engine)
    assert engine.check_flags(plan.configs, DDTREE_HELP) == []
    known = flags_in_help(DDTREE_HELP)
    for config in plan.configs:
        argv = engine.command(config, plan.model, 30001)
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        assert set(_flags_of(argv)) <= known, config.label
        assert argv[argv.index("--tp-size") + 1] == str(config.tp)
        assert argv[argv.index("--model-path") + 1] == "/dev/shm/models/Qwen3.6-27B"
        assert argv[argv.index("--port") + 1] == "30001"
    ddtree = next(c for c in plan.configs if c.label == "ddtree-b32@tp4")
    argv = engine.command(ddtree, plan.model, 1)
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "32"
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert "--trust-remote-code" in argv and "true" not in [w.lower() for w in argv]
    assert engine.flush_cache_path == "/flush_cache" and engine.ready_path == "/health_generate"


def test_released_sglang_refuses_the_ddtree_flag_by_name() -> None:
    plan = load_plan(EXAMPLES / "qwen36-dflash-ddtree.toml")
    problems = engine_for(plan.engine).check_flags(plan.configs, SGLANG_HELP)
    assert [p.flag for p in problems] == ["--speculative-ddtree-budget"]
    assert "ddtree-b15@tp1" in problems[0].configs and len(problems[0].configs) == 12


def test_misspelled_flag_gets_a_suggestion() -> None:
    text = (
        (EXAMPLES / "qwen36-dflash-ddtree.toml")
        .read_text()
        .replace("mem-fraction-static", "mem-fracton-static")
    )
    plan = parse_plan(text)
    problems = engine_for(plan.engine).check_flags(plan.configs, DDTREE_HELP)
    assert len(problems) == 1
    assert problems[0].flag == "--mem-fracton-static"
    assert problems[0].suggestion == "--mem-fraction-static"
    assert "did you mean --mem-fraction-static?" in problems[0].message()


def test_reserved_flags_are_refused() -> None:
    """A flag gpudoctor sets itself is refused when the plan is read (both dry-run modes)
    and, for a config built otherwise, by check_flags; never "did you mean (set by...)?"."""
    for where in ("[engine]\nname = 'sglang'\nargs = { tp-size = 2 }\n",
                  "[engine]\nname = 'sglang'\n[[configs]]\nname = 'a'\nargs = { model = 'x' }\n",
                  "[engine]\nname = 'vllm'\n[[configs]]\nname = 'a'\nsweep = { port = [1, 2] }\n"):  # fmt: skip
        with pytest.raises(PlanError, match=r"is set by gpudoctor .*; remove \S+ from the plan"):
            parse_plan('[model]\npath = "/m"\n' + where)
    plan = parse_plan('[model]\npath = "/m"\n[engine]\nname = "sglang"\n')
    config = dataclasses.replace(plan.configs[0], args=(("tp-size", 2),))
    problems = engine_for(plan.engine).check_flags([config], SGLANG_HELP)
    assert problems[0].flag == "--tp-size" and problems[0].reserved
    assert problems[0].message() == "--tp-size is set by gpudoctor; remove it, used by default@tp1"


VLLM_PLAN = """\
[model]
path = "/dev/shm/models/Qwen3.6-27B"
served_name = "qwen36"
[engine]
name = "vllm"
args = { max-model-len = 30720, gpu-memory-utilization = 0.9, enable-prefix-caching = true }
[axes]
tp = [1, 4]
[[configs]]
name = "auto"
[[configs]]
name = "dflash"
args = { speculative-config = { method = "dflash", model = "z-lab/Qwen3.6-27B-DFlash", num_speculative_tokens = 15 } }
"""


def test_vllm_commands_use_only_real_flags() -> None:
    plan = parse_plan(VLLM_PLAN)
    engine = engine_for(plan.engine)
    assert engine.check_flags(plan.configs, VLLM_HELP) == []
    known = flags_in_help(VLLM_HELP)
    for config in plan.configs:
        argv = engine.command(config, plan.model, 8000)
        assert set(_flags_of(argv)) <= known
        assert (
            argv[argv.index("serve") + 1] == "/dev/shm/models/Qwen3.6-27B"
        )  # positional model_tag
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(config.tp)
        assert argv[argv.index("--served-model-name") + 1] == "qwen36"
    dflash = next(c for c in plan.configs if c.label == "dflash@tp4")
    argv = engine.command(dflash, plan.model, 8000)
    spec = argv[argv.index("--speculative-config") + 1]
    assert (
        spec
        == '{"method": "dflash", "model": "z-lab/Qwen3.6-27B-DFlash", "num_speculative_tokens": 15}'
    )
    assert engine.served_model(plan.model) == "qwen36"
    typo = parse_plan(VLLM_PLAN.replace("max-model-len", "max-model-length"))
    assert [p.flag for p in engine.check_flags(typo.configs, VLLM_HELP)] == ["--max-model-length"]


def test_transformers_command_and_context(tiny_model_dir: Path) -> None:
    plan = load_plan(EXAMPLES / "cpu-tiny.toml")
    plan = dataclasses.replace(
        plan, model=dataclasses.replace(plan.model, path=str(tiny_model_dir))
    )
    engine = engine_for(plan.engine)
    assert engine.check_flags(plan.configs, TRANSFORMERS_HELP) == []
    argv = engine.command(plan.configs[1], plan.model, 8000)
    assert argv[1:3] == ["serve", str(tiny_model_dir)]
    assert argv[3:] == ["--host", "127.0.0.1", "--port", "8000", "--device", "cpu", "--log-level", "info",
                        "--continuous-batching", "--cb-num-blocks", "256", "--cb-max-batch-tokens", "1024"]  # fmt: skip
    assert engine.environment(plan.configs[0])["HF_HUB_OFFLINE"] == "1"
    assert context_from_model_dir(str(tiny_model_dir)) == 2048
    assert engine.served_model(plan.model) == str(tiny_model_dir)


@pytest.mark.parametrize(
    ("args", "argv"),
    [
        ((("a", True), ("b", False), ("c", 3)), ["--a", "--c", "3"]),
        ((("cuda-graph-bs", (1, 2, 4)),), ["--cuda-graph-bs", "1", "2", "4"]),
        ((("x", 0.85),), ["--x", "0.85"]),
    ],
)
def test_render_args(args: tuple, argv: list[str]) -> None:
    assert render_args(args) == argv


def test_installed_transformers_help_is_parsed() -> None:
    """The real `transformers serve --help` of this environment validates the CPU plan."""
    plan = load_plan(EXAMPLES / "cpu-tiny.toml")
    engine = engine_for(plan.engine)
    assert engine.version() == "5.24.0"
    text = engine.help_text()
    assert engine.check_flags(plan.configs, text) == []
    assert flags_in_help(text) >= flags_in_help(TRANSFORMERS_HELP) - {"--no-truncate"}


def test_stale_cached_help_is_refreshed_before_refusing(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A branch installed over the same version (DDTree on sglang) adds flags: a cached
    --help without them must not refuse the plan; a real typo still is refused."""
    from gpudoctor.bench.launch.steps import CampaignError, validate_flags
    from tests.bench.campaign_support import stub_plan

    one = '[[configs]]\nname = "a"\n'
    plan = parse_plan(stub_plan(tiny_model_dir, configs=one, server_args="token-delay-ms = 1"))
    engine = engine_for(plan.engine)
    cache = tmp_path / "help"
    fresh = engine.help_text(cache)
    (cached,) = cache.glob("*.help.txt")
    cached.write_text(fresh.replace("--token-delay-ms", "--other"))  # stale: lacks the flag
    assert "--token-delay-ms" in validate_flags(plan, engine, cache)
    assert "--token-delay-ms" in cached.read_text()  # the cache was rewritten
    typo = parse_plan(stub_plan(tiny_model_dir, configs=one, server_args="token-delay = 1"))
    with pytest.raises(
        CampaignError, match=r"unknown flag --token-delay \(did you mean --token-delay-ms\?\)"
    ):
        validate_flags(typo, engine, cache)


def _contract() -> dict:
    import tomllib

    return tomllib.loads((DATA / "sglang-api-contract.toml").read_text())


def test_sglang_contract_names_its_sources() -> None:
    contract = _contract()
    for source in contract["source"].values():
        assert source["repo"] == "sgl-project/sglang"
        assert len(source["commit"]) == 40 and source["path"].startswith("python/sglang/srt/")


def test_sglang_adapter_uses_only_flags_and_endpoints_checked_in_sglang_source() -> None:
    """Every flag the adapter emits or reserves, and every flag of the seed plan, is a
    ServerArgs field in SGLang's source (the contract) and in the recorded 0.5.23 --help;
    every endpoint the adapter and the client call is a route there."""
    from gpudoctor.bench.load.accept_length import SERVER_INFO_PATHS
    from gpudoctor.bench.load.client import ClientOptions

    contract = _contract()
    flags = set(contract["flags"])
    endpoints = set(contract["endpoints"])
    plan = load_plan(EXAMPLES / "qwen36-dflash-ddtree.toml")
    engine = engine_for(plan.engine)
    released = flags_in_help(SGLANG_HELP)
    used = {f"--{r}" for r in engine.reserved} | {"--served-model-name"}
    for config in plan.configs:
        used |= {w for w in engine.command(config, plan.model, 1) if w.startswith("--")}
    used.discard("--speculative-ddtree-budget")  # the DDTree branch's flag, not in releases
    assert used <= flags, used - flags
    assert flags <= released, flags - released  # ... and the released parser has them all
    called = {f"GET {engine.ready_path}", "GET /v1/models", f"POST {engine.flush_cache_path}"}
    called |= {f"GET {p}" for p in SERVER_INFO_PATHS}
    for api in ("completions", "chat"):
        called.add("POST " + ClientOptions("", "m", api=api).url)
    assert called <= endpoints, called - endpoints


# ---------------------------------------------------------------- the real CLIs' own words


def test_vllm_flags_are_read_from_help_all_not_the_summary_help() -> None:
    engine = engine_for(parse_plan(VLLM_PLAN).engine)
    assert engine.help_argv()[-2:] == ["serve", "--help=all"]
    summary = VLLM_HELP.split("\n\n", 1)[0]  # vLLM's plain --help: a usage line, no flag
    assert "--max-model-len" not in flags_in_help(summary)
    assert len(flags_in_help(VLLM_HELP)) > 300


def test_a_value_outside_a_flags_choices_is_refused_with_the_closest_choice() -> None:
    from gpudoctor.bench.engines.base import choices_in_help

    assert {"auto", "float32", "bfloat16"} <= choices_in_help(VLLM_HELP)["--dtype"]
    assert "triton" in choices_in_help(SGLANG_HELP)["--attention-backend"]
    plan = parse_plan(
        VLLM_PLAN.replace("max-model-len = 30720,", 'dtype = "flaot32", max-model-len = 30720,')
    )
    problems = engine_for(plan.engine).check_flags(plan.configs, VLLM_HELP)
    assert [(p.flag, p.value, p.suggestion) for p in problems] == [
        ("--dtype", "flaot32", "float32")
    ]
    assert problems[0].message() == (
        "--dtype does not accept 'flaot32' (did you mean 'float32'?), used by auto@tp1, auto@tp4,"
        " dflash@tp1, dflash@tp4"
    )
    fine = parse_plan(
        VLLM_PLAN.replace("max-model-len = 30720,", 'dtype = "float32", max-model-len = 30720,')
    )
    assert engine_for(fine.engine).check_flags(fine.configs, VLLM_HELP) == []


def test_every_word_of_a_list_value_is_checked_and_a_bare_flag_has_none() -> None:
    help_text = "  --mode {a,b}\n  --on\n"
    plan = parse_plan('[model]\npath = "/m"\n[engine]\nname = "vllm"\n')
    config = dataclasses.replace(plan.configs[0], args=(("mode", ("a", "c")), ("on", True)))
    problems = engine_for(plan.engine).check_flags([config], help_text)
    assert [(p.flag, p.value, p.suggestion) for p in problems] == [("--mode", "c", "")]
    assert problems[0].message() == "--mode does not accept 'c', used by default@tp1"


@pytest.mark.parametrize("engine", ["vllm", "sglang", "transformers"])
def test_the_request_field_table_matches_the_engines_own_schema(engine: str) -> None:
    """ACCEPTS (what the plan check refuses before any server starts) against the request
    schema the real package defines (recorded by tests/bench/data/record_engines.py)."""
    import json

    from gpudoctor.bench.cell_spec import EXTENSION_FIELDS
    from gpudoctor.bench.engines.request_fields import ACCEPTS

    version = {"vllm": "0.32.0", "sglang": "0.5.23", "transformers": "5.24.0"}[engine]
    schema = json.loads((DATA / f"{engine}-{version}-request-fields.json").read_text())
    for field in EXTENSION_FIELDS:
        for api in ("completions", "chat"):
            # pydantic: "allow" keeps an unknown field, "ignore" drops it; both answer 200
            unknown_ok = schema[f"{api}_unknown_fields"] in ("allow", "ignore")
            accepted = field in schema[api] or unknown_ok
            assert ACCEPTS[engine][field] == accepted, (engine, api, field)
