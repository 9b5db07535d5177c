"""Every key of a plan's tables as its author meets it: a wrong type, a value out of its
range, a missing or contradictory key, each refused with one line naming the file, the
line and the key (``plan.toml:6: limits.cell_timeout_s: must be > 0, got 0``); an unset
key takes its documented default; numbers read as integers come out as floats where the
plan model holds seconds, ratios and rates."""

from __future__ import annotations

import dataclasses
from pathlib import Path, PurePosixPath

import pytest

from gpudoctor.bench.cell_spec import SLO, WorkloadSpec
from gpudoctor.bench.plan import (
    EngineSpec,
    HardwareSpec,
    Limits,
    ModelSpec,
    PlanError,
    PreflightSpec,
    parse_plan,
)

# lines 1-4; a table appended after it starts on line 5, its first key on line 6
HEAD = '[model]\npath = "/models/m"\n[engine]\nname = "vllm"\n'


def _error(text: str, source: str = "plan.toml") -> str:
    with pytest.raises(PlanError) as info:
        parse_plan(text, source)
    message = str(info.value)
    assert "\n" not in message
    return message


def _table(name: str, body: str) -> str:
    return HEAD + f"[{name}]\n{body}\n"


WORKLOAD_KEYS = ", ".join(sorted(f.name for f in dataclasses.fields(WorkloadSpec)))


@pytest.mark.parametrize(
    ("table", "body", "message"),
    [
        # [limits]
        ("limits", "bogus = 1", "plan.toml:6: limits.bogus: unknown key (allowed: cell_timeout_s, keep_text, max_failed_fraction, min_input_len, request_timeout_s, template_overhead)"),
        ("limits", "template_overhead = 1.5", "plan.toml:6: limits.template_overhead: expected an integer, got 1.5"),
        ("limits", "template_overhead = -1", "plan.toml:6: limits.template_overhead: must be at least 0, got -1"),
        ("limits", "min_input_len = true", "plan.toml:6: limits.min_input_len: expected an integer, got a boolean"),
        ("limits", "min_input_len = 0", "plan.toml:6: limits.min_input_len: must be at least 1, got 0"),
        ("limits", 'request_timeout_s = "10"', "plan.toml:6: limits.request_timeout_s: expected an integer or a number, got '10'"),
        ("limits", "request_timeout_s = 0", "plan.toml:6: limits.request_timeout_s: must be > 0, got 0"),
        ("limits", "request_timeout_s = inf", "plan.toml:6: limits.request_timeout_s: must be at most 604800, got inf"),
        ("limits", "cell_timeout_s = [1]", "plan.toml:6: limits.cell_timeout_s: expected an integer or a number, got [1]"),
        ("limits", "cell_timeout_s = 2592001", "plan.toml:6: limits.cell_timeout_s: must be at most 2592000, got 2592001"),
        ("limits", "keep_text = 1", "plan.toml:6: limits.keep_text: expected a boolean, got 1"),
        ("limits", 'max_failed_fraction = "1%"', "plan.toml:6: limits.max_failed_fraction: expected an integer or a number, got '1%'"),
        ("limits", "max_failed_fraction = 1", "plan.toml:6: limits.max_failed_fraction: must be in [0, 1), got 1"),
        ("limits", "max_failed_fraction = -0.5", "plan.toml:6: limits.max_failed_fraction: must be in [0, 1), got -0.5"),
        ("limits", "max_failed_fraction = nan", "plan.toml:6: limits.max_failed_fraction: must be in [0, 1), got nan"),
        # [preflight]
        ("preflight", "bogus = 1", "plan.toml:6: preflight.bogus: unknown key (allowed: enabled, expect_gpus, only)"),
        ("preflight", "enabled = 1", "plan.toml:6: preflight.enabled: expected a boolean, got 1"),
        ("preflight", 'only = "gpu"', "plan.toml:6: preflight.only: expected a list, got 'gpu'"),
        ("preflight", "only = [1]", "plan.toml:6: preflight.only: expected a list of check ids or families"),
        ("preflight", "expect_gpus = 2.0", "plan.toml:6: preflight.expect_gpus: expected an integer, got 2.0"),
        ("preflight", "expect_gpus = 0", "plan.toml:6: preflight.expect_gpus: must be at least 1, got 0"),
        ("preflight", "expect_gpus = 4097", "plan.toml:6: preflight.expect_gpus: must be at most 4096, got 4097"),
        # [hardware]
        ("hardware", "bogus = 1", "plan.toml:6: hardware.bogus: unknown key (allowed: gpus)"),
        ("hardware", "gpus = 0", "plan.toml:6: hardware.gpus: must be >= 1, got 0"),
        ("hardware", "gpus = [0, 2, 0]", "plan.toml:6: hardware.gpus: lists a GPU index twice"),
        ("hardware", "gpus = []", "plan.toml:6: hardware.gpus: expected a GPU count (4) or a list of GPU indices ([0, 1])"),
        ("hardware", "gpus = [-1]", "plan.toml:6: hardware.gpus: expected a GPU count (4) or a list of GPU indices ([0, 1])"),
        ("hardware", "gpus = [true]", "plan.toml:6: hardware.gpus: expected a GPU count (4) or a list of GPU indices ([0, 1])"),
        ("hardware", "gpus = true", "plan.toml:6: hardware.gpus: expected a GPU count (4) or a list of GPU indices ([0, 1])"),
        ("hardware", 'gpus = "all"', "plan.toml:6: hardware.gpus: expected a GPU count (4) or a list of GPU indices ([0, 1])"),
        ("hardware", "gpus = [0, 1.0]", "plan.toml:6: hardware.gpus: expected a GPU count (4) or a list of GPU indices ([0, 1])"),
        # [slo]
        ("slo", "ttft = 1", "plan.toml:6: slo.ttft: unknown key (allowed: e2el_ms, tpot_ms, ttft_ms)"),
        ("slo", 'ttft_ms = "1s"', "plan.toml:6: slo.ttft_ms: expected an integer or a number, got '1s'"),
        ("slo", "e2el_ms = 0", "plan.toml:6: slo.e2el_ms: must be > 0, got 0"),
        ("slo", "tpot_ms = true", "plan.toml:6: slo.tpot_ms: expected an integer or a number, got a boolean"),
        # [workload]
        ("workload", "bogus = 1", f"plan.toml:6: workload.bogus: unknown key (allowed: {WORKLOAD_KEYS})"),
        ("workload", "kind = 1", "plan.toml:6: workload.kind: expected a string, got 1"),
        ("workload", 'kind = "poisson"', "plan.toml:6: workload.kind: expected one of random, jsonl, sharegpt, multi_turn, shared_prefix, trace, got 'poisson'"),
        ("workload", "api = 1", "plan.toml:6: workload.api: expected a string, got 1"),
        ("workload", 'api = "embeddings"', "plan.toml:6: workload.api: expected completions or chat, got 'embeddings'"),
        ("workload", "dataset_path = 1", "plan.toml:6: workload.dataset_path: expected a string, got 1"),
        ("workload", 'kind = "jsonl"', "plan.toml:5: workload.dataset_path: missing: kind = jsonl needs a dataset_path"),
        ("workload", 'kind = "sharegpt"', "plan.toml:5: workload.dataset_path: missing: kind = sharegpt needs a dataset_path"),
        ("workload", 'kind = "trace"\ndataset_path = ""', "plan.toml:7: workload.dataset_path: missing: kind = trace needs a dataset_path"),
        ("workload", 'ignore_eos = "yes"', "plan.toml:6: workload.ignore_eos: expected a boolean, got 'yes'"),
        ("workload", "input_len = 1.5", "plan.toml:6: workload.input_len: expected an integer, got 1.5"),
        ("workload", "input_len = true", "plan.toml:6: workload.input_len: expected an integer, got a boolean"),
        ("workload", "seed = 1.0", "plan.toml:6: workload.seed: expected an integer, got 1.0"),
        ("workload", "seed = -1", "plan.toml:6: workload.seed: must be at least 0, got -1"),
        ("workload", "warmup = -1", "plan.toml:6: workload.warmup: must be at least 0, got -1"),
        ("workload", "output_len = 0", "plan.toml:6: workload.output_len: must be at least 1, got 0"),
        ("workload", "num_prompts = 0", "plan.toml:6: workload.num_prompts: must be at least 1, got 0"),
        ("workload", "prompts_per_concurrency = 0", "plan.toml:6: workload.prompts_per_concurrency: must be at least 1, got 0"),
        ("workload", "turns = 0", "plan.toml:6: workload.turns: must be at least 1, got 0"),
        ("workload", "groups = 0", "plan.toml:6: workload.groups: must be at least 1, got 0"),
        ("workload", "prompts_per_group = -3", "plan.toml:6: workload.prompts_per_group: must be at least 1, got -3"),
        ("workload", "system_prompt_len = 0", "plan.toml:6: workload.system_prompt_len: must be at least 1, got 0"),
        ("workload", "trace_block_size = 0", "plan.toml:6: workload.trace_block_size: must be at least 1, got 0"),
        ("workload", "turns = 2.5", "plan.toml:6: workload.turns: expected an integer, got 2.5"),
        ("workload", 'burstiness = "x"', "plan.toml:6: workload.burstiness: expected an integer or a number, got 'x'"),
        ("workload", "burstiness = 0", "plan.toml:6: workload.burstiness: must be > 0, got 0"),
        ("workload", "burstiness = nan", "plan.toml:6: workload.burstiness: must be > 0, got nan"),
        ("workload", "trace_slowdown = -1.5", "plan.toml:6: workload.trace_slowdown: must be > 0, got -1.5"),
        ("workload", "trace_slowdown = nan", "plan.toml:6: workload.trace_slowdown: must be > 0, got nan"),
        ("workload", "request_rate = 0", "plan.toml:6: workload.request_rate: must be > 0, got 0"),
        ("workload", "request_rate = -2.5", "plan.toml:6: workload.request_rate: must be > 0, got -2.5"),
        ("workload", "range_ratio = 0", "plan.toml:6: workload.range_ratio: must be in (0, 1], got 0"),
        ("workload", "range_ratio = 1.5", "plan.toml:6: workload.range_ratio: must be in (0, 1], got 1.5"),
        ("workload", 'range_ratio = "1"', "plan.toml:6: workload.range_ratio: expected an integer or a number, got '1'"),
    ],
)  # fmt: skip
def test_a_bad_key_in_a_table_is_one_line_naming_file_line_and_key(
    table: str, body: str, message: str
) -> None:
    assert _error(_table(table, body)) == message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("bogus = 1", "plan.toml:5: engine.bogus: unknown key (allowed: args, command, env, metrics_path, name, port_range, python, ready_path, server_url, startup_timeout_s, stop_timeout_s, version)"),
        ("python = 3", "plan.toml:5: engine.python: expected a string, got 3"),
        ("ready_path = 1", "plan.toml:5: engine.ready_path: expected a string, got 1"),
        ("version = 0.9", "plan.toml:5: engine.version: expected a string, got 0.9"),
        ("metrics_path = 1", "plan.toml:5: engine.metrics_path: expected a string, got 1"),
        ('metrics_path = "/metrics"', """plan.toml:5: engine.metrics_path: a path such as "/metrics", for name = "command" only (sglang and vllm: built in)"""),
        ('startup_timeout_s = "1h"', "plan.toml:5: engine.startup_timeout_s: expected an integer or a number, got '1h'"),
        ("startup_timeout_s = 0", "plan.toml:5: engine.startup_timeout_s: must be > 0, got 0"),
        ("startup_timeout_s = 604801", "plan.toml:5: engine.startup_timeout_s: must be at most 604800, got 604801"),
        ("stop_timeout_s = false", "plan.toml:5: engine.stop_timeout_s: expected an integer or a number, got a boolean"),
        ("stop_timeout_s = 86401", "plan.toml:5: engine.stop_timeout_s: must be at most 86400, got 86401"),
        ('command = "serve"', "plan.toml:5: engine.command: expected a list, got 'serve'"),
        ('command = ["serve", 1]', "plan.toml:5: engine.command: expected a list of strings (argv)"),
        ('command = ["serve", "{port}"]', 'plan.toml:5: engine.command: needed with name = "command" (and only then)'),
        ("args = 5", "plan.toml:5: engine.args: expected a table of server arguments (flag = value)"),
        ("args = { --port = 1 }", "plan.toml:5: engine.args.--port: write flag names without leading dashes (tp-size = 4)"),
        ('args = { "max len" = 1 }', "plan.toml:5: engine.args.max len: write flag names without leading dashes (tp-size = 4)"),
        ("args = { _x = 1 }", "plan.toml:5: engine.args._x: write flag names without leading dashes (tp-size = 4)"),
        ("args = { dtype = [1, true] }", "plan.toml:5: engine.args.dtype: a list value may hold strings and numbers only"),
        ("args = { dtype = [[1]] }", "plan.toml:5: engine.args.dtype: a list value may hold strings and numbers only"),
        ("args = { since = 1979-05-27 }", "plan.toml:5: engine.args.since: unsupported value datetime.date(1979, 5, 27)"),
        ("args = { port = 8000 }", "plan.toml:5: engine.args.port: --port is set by gpudoctor (it passes the model path, host, port and tp itself); remove port from the plan"),
        ('args = { host = "0.0.0.0" }', "plan.toml:5: engine.args.host: --host is set by gpudoctor (it passes the model path, host, port and tp itself); remove host from the plan"),
        ('args = { model = "/m" }', "plan.toml:5: engine.args.model: --model is set by gpudoctor (it passes the model path, host, port and tp itself); remove model from the plan"),
        ("args = { tensor-parallel-size = 2 }", "plan.toml:5: engine.args.tensor-parallel-size: --tensor-parallel-size is set by gpudoctor (it passes the model path, host, port and tp itself); remove tensor-parallel-size from the plan"),
        ("env = 5", "plan.toml:5: engine.env: expected a table of environment variables"),
        ("env = { CUDA_LAUNCH_BLOCKING = true }", "plan.toml:5: engine.env.CUDA_LAUNCH_BLOCKING: environment values must be strings or numbers"),
        ("env = { A = [1] }", "plan.toml:5: engine.env.A: environment values must be strings or numbers"),
    ],
)  # fmt: skip
def test_a_bad_engine_key_is_one_line_naming_file_line_and_key(body: str, message: str) -> None:
    assert _error(HEAD + body + "\n") == message


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ('name = 5', "plan.toml:2: engine.name: expected a string, got 5"),
        ('python = "/usr/bin/python3"', "plan.toml:1: engine.name: expected one of sglang, vllm, transformers, command, got None"),
        ('name = "command"', 'plan.toml:1: engine.command: needed with name = "command" (and only then)'),
        ('name = "command"\ncommand = ["serve"]', "plan.toml:3: engine.command: must contain {port} (gpudoctor picks a free port)"),
        ('name = "command"\ncommand = ["serve", "--port={port}"]\nmetrics_path = "metrics"', """plan.toml:4: engine.metrics_path: a path such as "/metrics", for name = "command" only (sglang and vllm: built in)"""),
        ('name = "sglang"\nargs = { tp-size = 2 }', "plan.toml:3: engine.args.tp-size: --tp-size is set by gpudoctor (it passes the model path, host, port and tp itself); remove tp-size from the plan"),
        ('name = "transformers"\nargs = { model = "/m" }', "plan.toml:3: engine.args.model: --model is set by gpudoctor (it passes the model path, host, port and tp itself); remove model from the plan"),
        ('name = "sglang"\nargs = { model-path = "/m" }', "plan.toml:3: engine.args.model-path: --model-path is set by gpudoctor (it passes the model path, host, port and tp itself); remove model-path from the plan"),
    ],
)  # fmt: skip
def test_the_engine_name_and_its_command(engine: str, message: str) -> None:
    assert _error(f'[engine]\n{engine}\n[model]\npath = "/m"\n') == message


def test_a_command_engine_and_the_defaults_of_an_engine() -> None:
    text = ('[model]\npath = "/m"\n[engine]\nname = "command"\n'
            'command = ["serve", "--port", "{port}"]\nmetrics_path = "/stats"\n')  # fmt: skip
    engine = parse_plan(text).engine
    assert engine == EngineSpec(
        name="command", command=("serve", "--port", "{port}"), metrics_path="/stats"
    )
    assert parse_plan(HEAD).engine == EngineSpec(name="vllm")
    assert parse_plan(HEAD).engine.startup_timeout_s == 900.0
    assert parse_plan(HEAD).engine.stop_timeout_s == 30.0


def test_the_engine_keys_as_given() -> None:
    text = HEAD + (
        'python = "/opt/venv/bin/python"\nready_path = "/health"\nversion = "0.9.1"\n'
        "startup_timeout_s = 60\nstop_timeout_s = 5\n"
        'args = { dtype = "bf16", max-model-len = 4096, gpu-memory-utilization = 0.9,'
        ' enforce-eager = true, cuda-graph-sizes = [1, 2, "4"],'
        ' speculative-config = { num_speculative_tokens = 3, method = "ngram" } }\n'
        'env = { B = "x", A = 1, C = 2.5 }\n'
    )
    engine = parse_plan(text).engine
    assert engine == EngineSpec(
        name="vllm",
        python="/opt/venv/bin/python",
        args=(("dtype", "bf16"), ("max-model-len", 4096), ("gpu-memory-utilization", 0.9),
              ("enforce-eager", True), ("cuda-graph-sizes", (1, 2, "4")),
              ("speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')),
        env=(("B", "x"), ("A", "1"), ("C", "2.5")),
        startup_timeout_s=60.0,
        stop_timeout_s=5.0,
        ready_path="/health",
        version="0.9.1",
    )  # fmt: skip
    assert isinstance(engine.startup_timeout_s, float) and isinstance(engine.stop_timeout_s, float)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("bogus = 1", "plan.toml:2: model.bogus: unknown key (allowed: dir, mirror, path, repo, revision, served_name, tokenizer)"),
        ("path = 1", "plan.toml:2: model.path: expected a string, got 1"),
        ('repo = ["a"]', "plan.toml:2: model.repo: expected a string, got ['a']"),
        ('path = "/m"\nrevision = 1', "plan.toml:3: model.revision: expected a string, got 1"),
        ('path = "/m"\ndir = 1', "plan.toml:3: model.dir: expected a string, got 1"),
        ('path = "/m"\nmirror = 1', "plan.toml:3: model.mirror: expected a string, got 1"),
        ('path = "/m"\nserved_name = 1', "plan.toml:3: model.served_name: expected a string, got 1"),
        ('path = "/m"\ntokenizer = 1', "plan.toml:3: model.tokenizer: expected a string, got 1"),
        ('path = "/m"\nrepo = "org/m"', "plan.toml:1: model: give exactly one of path (a local directory) or repo (a Hub repo)"),
        ('served_name = "m"', "plan.toml:1: model: give exactly one of path (a local directory) or repo (a Hub repo)"),
        ('path = ""', "plan.toml:1: model: give exactly one of path (a local directory) or repo (a Hub repo)"),
        ('repo = "org/m"', "plan.toml:1: model.dir: missing: where the repo's weights live (/dev/shm/NAME)"),
    ],
)  # fmt: skip
def test_a_bad_model_table_is_one_line_naming_file_line_and_key(model: str, message: str) -> None:
    assert _error(f'[model]\n{model}\n[engine]\nname = "vllm"\n') == message


def test_relative_model_paths_follow_the_plan_file(tmp_path: Path) -> None:
    text = ('[model]\nrepo = "org/m"\ndir = "weights"\nmirror = "../mirror"\n'
            'tokenizer = "tok"\nrevision = "main"\nserved_name = "m"\n[engine]\nname = "vllm"\n')  # fmt: skip
    (tmp_path / "real").mkdir()
    (tmp_path / "plans").symlink_to(tmp_path / "real")
    model = parse_plan(text, base_dir=tmp_path / "plans").model
    real = tmp_path.resolve() / "real"
    assert model == ModelSpec(repo="org/m", revision="main", dir=str(real / "weights"),
                              mirror=str(tmp_path.resolve() / "mirror"),
                              served_name="m", tokenizer=str(real / "tok"))  # fmt: skip
    other_root = parse_plan(text, base_dir=PurePosixPath("/srv/root/plans")).model
    assert (other_root.dir, other_root.mirror, other_root.tokenizer) == (
        "/srv/root/plans/weights", "/srv/root/mirror", "/srv/root/plans/tok",
    )  # fmt: skip
    assert parse_plan(text).model.dir == "weights"  # no base: as written
    local = parse_plan(
        '[model]\npath = "m"\n[engine]\nname = "vllm"\n', base_dir=PurePosixPath("/a")
    )
    assert local.model.path == "/a/m"
    absolute = parse_plan(HEAD, base_dir=PurePosixPath("/a"))
    assert absolute.model.path == "/models/m"


def test_the_defaults_of_the_tables() -> None:
    plan = parse_plan(HEAD, "runs/my-plan.toml")
    assert plan.name == "my-plan"
    assert plan.source == "runs/my-plan.toml" and plan.text == HEAD
    assert plan.model == ModelSpec(path="/models/m")
    assert plan.limits == Limits()
    assert (plan.limits.template_overhead, plan.limits.min_input_len) == (32, 16)
    assert (plan.limits.request_timeout_s, plan.limits.cell_timeout_s) == (600.0, 3600.0)
    assert (plan.limits.keep_text, plan.limits.max_failed_fraction) == (None, 0.01)
    assert plan.preflight == PreflightSpec(enabled=True, only=(), expect_gpus=None)
    assert plan.hardware == HardwareSpec(gpus=None, count=None)
    assert plan.workload == WorkloadSpec()
    assert plan.slo is None and plan.search is None and plan.repeats == 1
    assert [c.label for c in plan.configs] == ["default@tp1"]
    assert plan.configs[0].concurrencies == (1,) and plan.configs[0].request_rates == (None,)


def test_the_values_of_the_tables_as_given() -> None:
    text = (
        'name = "plan-name"\nrepeats = 3\n'
        + HEAD
        + (
            "[limits]\ntemplate_overhead = 0\nmin_input_len = 1\nrequest_timeout_s = 30\n"
            "cell_timeout_s = 120\nkeep_text = false\nmax_failed_fraction = 0\n"
            '[preflight]\nenabled = false\nonly = ["gpu", "nvidia.driver"]\nexpect_gpus = 4096\n'
            "[hardware]\ngpus = [3, 1]\n"
            "[slo]\nttft_ms = 200\ntpot_ms = 12.5\n"
            '[workload]\nkind = "shared_prefix"\napi = "chat"\ninput_len = 10\noutput_len = 5\n'
            "range_ratio = 1\nnum_prompts = 3\nseed = 7\nignore_eos = false\nwarmup = 0\n"
            "request_rate = 2\nburstiness = 1\ngroups = 2\nprompts_per_group = 3\n"
            "system_prompt_len = 4\nturns = 1\ntrace_slowdown = 2\ntrace_block_size = 1\n"
            "prompts_per_concurrency = 1\n"
        )
    )
    plan = parse_plan(text)
    assert plan.name == "plan-name" and plan.repeats == 3
    assert plan.limits == Limits(0, 1, 30.0, 120.0, False, 0.0)
    assert isinstance(plan.limits.request_timeout_s, float)
    assert isinstance(plan.limits.cell_timeout_s, float)
    assert isinstance(plan.limits.max_failed_fraction, float)
    assert plan.preflight == PreflightSpec(False, ("gpu", "nvidia.driver"), 4096)
    assert plan.hardware == HardwareSpec(gpus=(3, 1))
    assert plan.slo == SLO(ttft_ms=200.0, tpot_ms=12.5)
    assert isinstance(plan.slo.ttft_ms, float)
    assert plan.workload == WorkloadSpec(
        kind="shared_prefix", input_len=10, output_len=5, range_ratio=1.0, num_prompts=3,
        seed=7, ignore_eos=False, api="chat", warmup=0, request_rate=2.0,
        prompts_per_concurrency=1, burstiness=1.0, turns=1, groups=2, prompts_per_group=3,
        system_prompt_len=4, trace_slowdown=2.0, trace_block_size=1,
    )  # fmt: skip
    for key in ("range_ratio", "request_rate", "burstiness", "trace_slowdown"):
        assert isinstance(getattr(plan.workload, key), float), key
    limited = parse_plan(_table("limits", "max_failed_fraction = 0.5\nrequest_timeout_s = 1"))
    assert limited.limits.max_failed_fraction == 0.5 and limited.limits.request_timeout_s == 1.0
    short = parse_plan(_table("limits", "cell_timeout_s = 0.5")).limits  # a second is no floor
    assert short.cell_timeout_s == 0.5
    assert parse_plan(_table("hardware", "gpus = 4")).hardware == HardwareSpec(count=4)
    assert parse_plan(_table("hardware", "gpus = [0]")).hardware == HardwareSpec(gpus=(0,))
    assert parse_plan(_table("workload", "range_ratio = 0.5")).workload.range_ratio == 0.5


def test_a_dataset_path_follows_the_plan_file(tmp_path: Path) -> None:
    text = _table("workload", 'kind = "jsonl"\ndataset_path = "data/p.jsonl"')
    assert parse_plan(text, base_dir=tmp_path).workload.dataset_path == str(
        tmp_path.resolve() / "data" / "p.jsonl"
    )
    assert parse_plan(text).workload.dataset_path == "data/p.jsonl"
    other = parse_plan(text, base_dir=PurePosixPath("/r/plans"))
    assert other.workload.dataset_path == "/r/plans/data/p.jsonl"
    absolute = text.replace("data/p.jsonl", "/d/p.jsonl")
    assert parse_plan(absolute, base_dir=tmp_path).workload.dataset_path == "/d/p.jsonl"


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ("bogus = 1", "plan.toml:1: bogus: unknown key (allowed: axes, configs, engine, hardware, limits, model, name, preflight, repeats, search, slo, workload)"),
        ("name = 5", "plan.toml:1: name: expected a string, got 5"),
        ("repeats = 0", "plan.toml:1: repeats: must be at least 1, got 0"),
        ("repeats = -2", "plan.toml:1: repeats: must be at least 1, got -2"),
        ('repeats = "2"', "plan.toml:1: repeats: expected an integer, got '2'"),
        ("model = 5", "plan.toml:1: model: expected a table, got int"),
        ("limits = [1]", "plan.toml:1: limits: expected a table, got list"),
        ("preflight = true", "plan.toml:1: preflight: expected a table, got bool"),
        ("hardware = 4", "plan.toml:1: hardware: expected a table, got int"),
        ("workload = 4", "plan.toml:1: workload: expected a table, got int"),
        ("slo = 4", "plan.toml:1: slo: expected a table, got int"),
        ("search = 4", "plan.toml:1: search: expected a table, got int"),
        ("axes = 4", "plan.toml:1: axes: expected a table, got int"),
    ],
)  # fmt: skip
def test_a_bad_top_level_key_is_named_on_its_line(top: str, message: str) -> None:
    text = top + "\n" + HEAD if not top.startswith("model") else top + '\n[engine]\nname = "vllm"\n'
    assert _error(text) == message


def test_a_missing_table_names_the_file_without_a_line() -> None:
    assert _error('[engine]\nname = "vllm"\n') == "plan.toml: model: missing table"
    assert _error('[model]\npath = "/m"\n', "p/x.toml") == "p/x.toml: engine: missing table"


def test_a_plan_read_without_a_file_name_is_plan_toml() -> None:
    from gpudoctor.bench.plan.parser import parse

    assert parse(HEAD).source == "plan.toml" and parse(HEAD).name == "plan"
    with pytest.raises(PlanError, match=r"^plan\.toml:1: name: expected a string, got 1$"):
        parse("name = 1\n" + HEAD)


def test_one_gpu_and_an_engine_that_rejects_ignore_eos() -> None:
    assert parse_plan(_table("hardware", "gpus = 1")).hardware == HardwareSpec(count=1)
    transformers = parse_plan(HEAD.replace('"vllm"', '"transformers"')).workload
    assert transformers.ignore_eos is False  # the engine's own default, not unset


_RANGE = 'expected "LOW-HIGH" with 1024 <= LOW <= HIGH <= 65535 (e.g. "30000-30100"), got '
_STARTS = "says how to start a server; with engine.server_url gpudoctor starts none (remove one of the two)"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("port_range = 5", "plan.toml:5: engine.port_range: expected a string, got 5"),
        ('port_range = "30000"', f"plan.toml:5: engine.port_range: {_RANGE}'30000'"),
        ('port_range = "1023-2000"', f"plan.toml:5: engine.port_range: {_RANGE}'1023-2000'"),
        ('port_range = "2000-1999"', f"plan.toml:5: engine.port_range: {_RANGE}'2000-1999'"),
        ('port_range = "30000-65536"', f"plan.toml:5: engine.port_range: {_RANGE}'30000-65536'"),
        ("server_url = 5", "plan.toml:5: engine.server_url: expected a string, got 5"),
        ('server_url = "ftp://h:1"', """plan.toml:5: engine.server_url: expected "http://HOST:PORT" (a running server), got 'ftp://h:1'"""),
        ('server_url = "http://"', """plan.toml:5: engine.server_url: expected "http://HOST:PORT" (a running server), got 'http://'"""),
        ('server_url = "http://h:1/v1"', """plan.toml:5: engine.server_url: expected "http://HOST:PORT" (a running server), got 'http://h:1/v1'"""),
        ('server_url = "http://h:1"\nargs = { dtype = "x" }', f"plan.toml:6: engine.args: {_STARTS}"),
        ('server_url = "http://h:1"\nenv = { A = "1" }', f"plan.toml:6: engine.env: {_STARTS}"),
        ('server_url = "http://h:1"\npython = "/usr/bin/python3"', f"plan.toml:6: engine.python: {_STARTS}"),
        ('server_url = "http://h:1"\nport_range = "30000-30100"', f"plan.toml:6: engine.port_range: {_STARTS}"),
    ],
)  # fmt: skip
def test_a_running_server_or_a_port_range_refused_on_its_line(body: str, message: str) -> None:
    assert _error(HEAD + body + "\n") == message


def test_a_port_range_and_a_running_server_as_given() -> None:
    def engine(body: str) -> EngineSpec:
        return parse_plan(HEAD + body + "\n").engine

    assert engine('port_range = " 30000 - 30100 "').port_range == (30000, 30100)
    assert engine('port_range = "1024-1024"').port_range == (1024, 1024)
    assert engine('port_range = "65535-65535"').port_range == (65535, 65535)
    assert engine("").port_range is None and engine("").server_url is None
    assert engine('server_url = "http://127.0.0.1:30000/"').server_url == "http://127.0.0.1:30000"
    assert engine('server_url = "https://h"').server_url == "https://h"
    running = '[model]\npath = "/m"\n[engine]\nname = "command"\nserver_url = "http://h:1"\n'
    assert parse_plan(running).engine.command == ()  # no command needed: nothing is started
    two = running + '[[configs]]\nname = "a"\n[[configs]]\nname = "b"\nenv = { A = "1" }\n'
    assert _error(two).endswith(  # the line: _find does not match a [[configs]] header alone
        " configs: with engine.server_url the plan measures the one running server: give one"
        " configuration without args, env or sweep (its name labels the cells)"
    )
    sweep = running + '[[configs]]\nname = "a"\nsweep = { dtype = ["x"] }\n'
    assert _error(sweep).startswith("plan.toml: configs: with engine.server_url")


@pytest.mark.parametrize(
    ("ready_path", "message"),
    [
        ('"health"', """plan.toml:5: engine.ready_path: a path such as "/health" (starting with /), got 'health'"""),
        ('"/he alth"', """plan.toml:5: engine.ready_path: a path such as "/health" (starting with /), got '/he alth'"""),
        ('""', """plan.toml:5: engine.ready_path: a path such as "/health" (starting with /), got ''"""),
    ],
)  # fmt: skip
def test_a_ready_path_that_is_no_url_path_is_a_plan_error(ready_path: str, message: str) -> None:
    """Issue 47: `ready_path = "health"` failed at the server's start as "InvalidURL ...;
    this is a gpudoctor bug"; it is the plan's mistake, told when the plan is read."""
    assert _error(HEAD + f"ready_path = {ready_path}\n") == message
    assert parse_plan(HEAD + 'ready_path = "/v1/models"\n').engine.ready_path == "/v1/models"


def test_a_plan_with_a_bom_or_a_byte_that_is_not_utf8_names_the_file_and_the_fix(
    tmp_path: Path,
) -> None:
    """Issue 47: a BOM gave "Invalid statement (at line 1, column 1)", a Latin-1 byte a raw
    codec error without the file name."""
    from gpudoctor.bench.plan import decode_plan, load_plan

    plan = tmp_path / "plan.toml"
    plan.write_bytes(b"\xef\xbb\xbf" + HEAD.encode())
    with pytest.raises(PlanError) as info:
        load_plan(plan)
    assert str(info.value) == (
        f"{plan}: starts with a UTF-8 byte order mark (BOM), which TOML does not allow; save it"
        f" as UTF-8 without a BOM (sed -i '1s/^\\xEF\\xBB\\xBF//' {plan})"
    )
    plan.write_bytes(HEAD.encode() + b'version = "caf\xe9"\n')
    with pytest.raises(PlanError) as info:
        load_plan(plan)
    assert str(info.value) == (
        f"{plan}: not UTF-8: byte 0xe9 at line 5, column 15; save the plan as UTF-8"
        " (iconv -f LATIN1 -t UTF-8)"
    )
    with pytest.raises(PlanError, match=r"^p: not UTF-8: byte 0xff at line 1, column 1;"):
        decode_plan(b"\xff", "p")
    with pytest.raises(PlanError, match=r"^p: not UTF-8: byte 0xfe at line 3, column 2;"):
        decode_plan(b"a\n\nb\xfe", "p")
    assert decode_plan('x = "é"\n'.encode(), "p") == 'x = "é"\n'
    assert decode_plan(b"x\xef\xbb\xbf", "p") == "x\ufeff"  # only a leading BOM is refused
