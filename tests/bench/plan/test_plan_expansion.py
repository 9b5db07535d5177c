"""How a plan's configurations become the servers and cells a campaign runs, as the
author relies on: the axes as defaults a configuration may override, a sweep's points
named from their values, arguments and environment layered engine < configuration <
sweep point, concurrencies sorted per tp, and every refusal naming the configuration's
own line (``plan.toml:12: configs[1].tp: ...``), not the first configuration's."""

from __future__ import annotations

import math

import pytest

from gpudoctor.bench.plan import PlanError, config_key, parse_plan

# configs[0] ("a") on lines 8-9, configs[1] ("b") on lines 10-11, its extra keys from 12
PLAN = """\
[model]
path = "/models/m"
[engine]
name = "vllm"
[axes]
tp = [1, 2]
concurrency = [4, 1]
[[configs]]
name = "a"
[[configs]]
name = "b"
{extra}
"""


def _error(text: str) -> str:
    with pytest.raises(PlanError) as info:
        parse_plan(text, "plan.toml")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("bogus = 1", "plan.toml:12: configs[1].bogus: unknown key (allowed: args, concurrency, env, name, request_rate, sweep, tp)"),
        ("args = 5", "plan.toml:12: configs[1].args: expected a table of server arguments (flag = value)"),
        ("args = { port = 1 }", "plan.toml:12: configs[1].args.port: --port is set by gpudoctor (it passes the model path, host, port and tp itself); remove port from the plan"),
        ("env = { A = true }", "plan.toml:12: configs[1].env.A: environment values must be strings or numbers"),
        ("env = 1", "plan.toml:12: configs[1].env: expected a table of environment variables"),
        ("tp = [0]", "plan.toml:12: configs[1].tp: expected a non-empty list of positive integers, got [0]"),
        ("tp = []", "plan.toml:12: configs[1].tp: expected a non-empty list of positive integers, got []"),
        ("tp = [true]", "plan.toml:12: configs[1].tp: expected a non-empty list of positive integers, got [True]"),
        ("tp = 1.0", "plan.toml:12: configs[1].tp: expected a non-empty list of positive integers, got 1.0"),
        ("tp = [2, 1, 2]", "plan.toml:12: configs[1].tp: duplicate values in [2, 1, 2]"),
        ("tp = [512]", "plan.toml:12: configs[1].tp: must be at most 256, got 512"),
        ("sweep = 5", "plan.toml:12: configs[1].sweep: expected a table flag = [values]"),
        ("sweep = { max-num-seqs = 8 }", "plan.toml:12: configs[1].sweep.max-num-seqs: expected a non-empty list of values"),
        ("sweep = { max-num-seqs = [] }", "plan.toml:12: configs[1].sweep.max-num-seqs: expected a non-empty list of values"),
        ("sweep = { --max-num-seqs = [8] }", "plan.toml:12: configs[1].sweep.--max-num-seqs: write flag names without leading dashes (tp-size = 4)"),
        ("sweep = { port = [1, 2] }", "plan.toml:12: configs[1].sweep.port: --port is set by gpudoctor (it passes the model path, host, port and tp itself); remove port from the plan"),
        ("concurrency = [0]", "plan.toml:12: configs[1].concurrency: expected a non-empty list of positive integers, got [0]"),
        ("concurrency = [2, 2]", "plan.toml:12: configs[1].concurrency: duplicate values in [2, 2]"),
        ("args = { seed = 1 }\nconcurrency = { 1 = [1] }", "plan.toml:13: configs[1].concurrency: no concurrency list for tp = 2 (keys: 1)"),
        ("args = { seed = 1 }\nconcurrency = { 1 = [1], 4 = [2] }", "plan.toml:13: configs[1].concurrency: no concurrency list for tp = 2 (keys: 1, 4)"),
        ("args = { seed = 1 }\nconcurrency = { 1 = [1], 2 = [0] }", "plan.toml:13: configs[1].concurrency.2: expected a non-empty list of positive integers, got [0]"),
        ("args = { seed = 1 }\nconcurrency = { 1 = [1], 2 = [70000] }", "plan.toml:13: configs[1].concurrency.2: must be at most 65536, got 70000"),
        ("request_rate = [0]", 'plan.toml:12: configs[1].request_rate: expected a non-empty list of positive numbers or "inf", got [0]'),
        ("request_rate = []", 'plan.toml:12: configs[1].request_rate: expected a non-empty list of positive numbers or "inf", got []'),
        ("request_rate = [true]", 'plan.toml:12: configs[1].request_rate: expected a non-empty list of positive numbers or "inf", got [True]'),
        ('request_rate = ["fast"]', 'plan.toml:12: configs[1].request_rate: expected a non-empty list of positive numbers or "inf", got [\'fast\']'),
        ("request_rate = -1", 'plan.toml:12: configs[1].request_rate: expected a non-empty list of positive numbers or "inf", got [-1]'),
        ("request_rate = [1, 1.0]", "plan.toml:12: configs[1].request_rate: duplicate values in [1, 1.0]"),
        ('request_rate = ["inf", "inf"]', "plan.toml:12: configs[1].request_rate: duplicate values in ['inf', 'inf']"),
        ('args = { served-model-name = "x" }\nname = "a"', None),  # TOML: a key defined twice
    ],
)  # fmt: skip
def test_a_bad_configuration_is_named_on_its_own_line(extra: str, message: str | None) -> None:
    error = _error(PLAN.format(extra=extra))
    if message is not None:
        assert error == message
    else:
        assert error.startswith("plan.toml: not valid TOML: ")


@pytest.mark.parametrize(
    ("b", "message"),
    [
        ("tp = [1]", "plan.toml:10: configs[1].name: missing: every configuration needs a name"),
        ('name = ""', "plan.toml:11: configs[1].name: missing: every configuration needs a name"),
        ("name = 5", "plan.toml:11: configs[1].name: expected a string, got 5"),
        ('name = "a"', "plan.toml:11: configs[1].name: configuration a@tp1 appears twice"),
        ('name = "a"\ntp = [2]', "plan.toml:11: configs[1].name: configuration a@tp2 appears twice"),
        ('name = "b"\nenv = {}', "plan.toml:11: configs[1].name: b@tp1 is the same server configuration as a@tp1"),
        ('name = "b"\ntp = [2]\nconcurrency = [8]', "plan.toml:11: configs[1].name: b@tp2 is the same server configuration as a@tp2"),
        ('name = "b-{dtype}"\nsweep = { dtype = ["half", "half"] }', "plan.toml:11: configs[1].name: configuration b-half@tp1 appears twice"),
    ],
)  # fmt: skip
def test_two_configurations_one_server_are_refused(b: str, message: str) -> None:
    text = PLAN.replace('name = "b"\n{extra}', b)
    assert _error(text) == message


@pytest.mark.parametrize(
    ("axes", "message"),
    [
        ("bogus = 1", "plan.toml:6: axes.bogus: unknown key (allowed: concurrency, request_rate, tp)"),
        ("tp = [0]", "plan.toml:6: axes.tp: expected a non-empty list of positive integers, got [0]"),
        ('concurrency = "many"', "plan.toml:6: axes.concurrency: expected a non-empty list of positive integers, got 'many'"),
        ("concurrency = { 2 = [1] }", "plan.toml:6: axes.concurrency: no concurrency list for tp = 1 (keys: 2)"),
        ("request_rate = 0", 'plan.toml:6: axes.request_rate: expected a non-empty list of positive numbers or "inf", got [0]'),
        ("request_rate = [2, 2]", "plan.toml:6: axes.request_rate: duplicate values in [2, 2]"),
    ],
)  # fmt: skip
def test_a_bad_axis_is_named_on_its_line(axes: str, message: str) -> None:
    assert _error(f'[model]\npath = "/m"\n[engine]\nname = "vllm"\n[axes]\n{axes}\n') == message


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ("configs = 5", "plan.toml:1: configs: expected one or more [[configs]] tables"),
        ("configs = []", "plan.toml:1: configs: expected one or more [[configs]] tables"),
        ('configs = [{ name = "a" }, 1]', "plan.toml:1: configs: expected one or more [[configs]] tables"),
        ('configs = [{ name = "" }]', "plan.toml:1: configs[0].name: missing: every configuration needs a name"),
        ('configs = [\n  { name = "a" },\n  { name = "b", tp = [0] },\n]', "plan.toml:3: configs[1].tp: expected a non-empty list of positive integers, got [0]"),
    ],
)  # fmt: skip
def test_configs_written_inline_are_refused_on_their_line(configs: str, message: str) -> None:
    assert _error(f'{configs}\n[model]\npath = "/m"\n[engine]\nname = "vllm"\n') == message


def test_a_key_that_looks_like_an_index_does_not_move_the_location() -> None:
    extra = 'bogus = 1\nenv = { "[1]" = "x" }'
    assert _error(PLAN.format(extra=extra)).startswith("plan.toml:12: configs[1].bogus: ")


def test_the_transformers_engine_runs_tp_1_only() -> None:
    text = PLAN.format(extra="args = { seed = 1 }").replace('"vllm"', '"transformers"')
    assert _error(text) == "plan.toml:8: configs[0].tp: the transformers engine runs tp = 1 only"
    single = text.replace("tp = [1, 2]", "tp = [1]")
    assert [c.label for c in parse_plan(single).configs] == ["a@tp1", "b@tp1"]


def test_configurations_expand_over_sweeps_and_tp_in_plan_order() -> None:
    text = """\
[model]
path = "/models/m"
[engine]
name = "vllm"
args = { dtype = "bf16", max-model-len = 100 }
env = { A = "1", B = "2" }
[axes]
tp = [1, 2]
concurrency = { 1 = [8, 1, 4], 2 = [16, 2] }
request_rate = [2, "inf"]
[[configs]]
name = "base"
[[configs]]
name = "seqs{max-num-seqs}-{kv-cache-dtype}"
args = { max-model-len = 200, kv-cache-dtype = "auto" }
env = { B = "3", C = 4 }
sweep = { max-num-seqs = [8, 16], kv-cache-dtype = ["fp8"] }
tp = 2
concurrency = [32, 1]
request_rate = 5
[[configs]]
name = "grid"
sweep = { block-size = [16, 32], swap-space = [1, 2.5] }
tp = [1]
"""
    plan = parse_plan(text)
    assert [c.label for c in plan.configs] == [
        "base@tp1", "base@tp2", "seqs8-fp8@tp2", "seqs16-fp8@tp2",
        "grid-16-1@tp1", "grid-16-2.5@tp1", "grid-32-1@tp1", "grid-32-2.5@tp1",
    ]  # fmt: skip
    by = {c.label: c for c in plan.configs}
    assert by["base@tp1"].concurrencies == (1, 4, 8)
    assert by["base@tp2"].concurrencies == (2, 16)
    assert by["seqs8-fp8@tp2"].concurrencies == (1, 32)
    assert by["base@tp1"].request_rates == (2.0, math.inf)
    assert by["seqs16-fp8@tp2"].request_rates == (5.0,)
    assert all(isinstance(r, float) for r in by["base@tp1"].request_rates)
    assert by["base@tp1"].args == (("dtype", "bf16"), ("max-model-len", 100))
    assert by["base@tp1"].env == (("A", "1"), ("B", "2"))
    assert by["seqs16-fp8@tp2"].args == (
        ("dtype", "bf16"), ("max-model-len", 200), ("kv-cache-dtype", "fp8"), ("max-num-seqs", 16),
    )  # fmt: skip
    assert by["seqs16-fp8@tp2"].env == (("A", "1"), ("B", "3"), ("C", "4"))
    assert by["grid-32-2.5@tp1"].args == (("dtype", "bf16"), ("max-model-len", 100),
                                          ("block-size", 32), ("swap-space", 2.5))  # fmt: skip
    for config in plan.configs:
        assert config.key == config_key("vllm", plan.model, config.tp, config.args, config.env)
    assert len({c.key for c in plan.configs}) == len(plan.configs)
    # base: 3 + 2 concurrencies x 2 rates; seqs: 2 points x 2 x 1 rate; grid: 4 x 3 x 2
    assert len(plan.cells()) == (3 + 2) * 2 + 2 * 2 + 4 * 3 * 2


def test_a_sweep_point_is_named_by_its_placeholders_or_its_values() -> None:
    extra = "sweep = { max-num-seqs = [8, 16], block-size = [32] }\ntp = [1]"
    one = PLAN.format(extra=extra).replace('name = "b"', 'name = "b-{max-num-seqs}"')
    assert [c.name for c in parse_plan(one).configs][2:] == ["b-8", "b-16"]
    both = PLAN.format(extra=extra.replace("[32]", "[32, 64]")).replace(
        'name = "b"', 'name = "b{max-num-seqs}x{block-size}"'
    )
    assert [c.name for c in parse_plan(both).configs][2:] == ["b8x32", "b8x64", "b16x32", "b16x64"]
    appended = PLAN.format(extra=extra)
    assert [c.name for c in parse_plan(appended).configs][2:] == ["b-8-32", "b-16-32"]
    unknown = PLAN.format(extra=extra).replace('name = "b"', 'name = "b-{dtype}"')
    assert [c.name for c in parse_plan(unknown).configs][2:] == [
        "b-{dtype}-8-32",
        "b-{dtype}-16-32",
    ]
