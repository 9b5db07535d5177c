"""The sane range of a plan's numbers, as the author reads the refusal: the bound that
was crossed (``> 0`` for an exclusive one, ``at least`` for an inclusive one), the value
written as given (integers without ``.0``, huge ones in short form), ``nan`` named."""

from __future__ import annotations

import math

import pytest

from gpudoctor.bench.plan import PlanError, parse_plan
from gpudoctor.bench.plan.bounds import _shown, out_of_bounds


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("concurrency", 0, "must be at least 1, got 0"),
        ("concurrency", 1, None),
        ("concurrency", 65536, None),
        ("concurrency", 65537, "must be at most 65536, got 65537"),
        ("concurrency", 123456789, "must be at most 65536, got 123456789"),
        ("warmup", 0, None),
        ("warmup", -1, "must be at least 0, got -1"),
        ("request_rate", 0, "must be > 0, got 0"),
        ("request_rate", 0.0, "must be > 0, got 0"),
        ("request_rate", 1e-9, None),
        ("request_rate", math.inf, None),  # every request at once
        ("request_timeout_s", math.inf, "must be at most 604800, got inf"),
        ("request_timeout_s", 604800.0, None),
        ("request_timeout_s", 604801.0, "must be at most 604800, got 604801"),
        ("request_timeout_s", 1234567.5, "must be at most 604800, got 1.23457e+06"),
        ("request_timeout_s", 1e16, "must be at most 604800, got 1e+16"),
        ("request_timeout_s", -0.5, "must be > 0, got -0.5"),
        ("request_timeout_s", math.nan, "must be a number between 0 and 604800, got nan"),
        ("stop_timeout_s", math.nan, "must be a number between 0 and 86400, got nan"),
        ("seed", 2**63 - 1, None),
        ("seed", 2**63, "must be at most 9.22e+18, got 9.22e+18"),
        ("tp", 257, "must be at most 256, got 257"),
        ("not_a_bounded_key", 1e300, None),
        ("not_a_bounded_key", math.nan, None),
    ],
)
def test_a_number_out_of_its_range_says_which_bound(
    key: str, value: float, why: str | None
) -> None:
    assert out_of_bounds(key, value) == why


@pytest.mark.parametrize(
    ("number", "shown"),
    [
        (3, "3"),
        (3.0, "3"),
        (-2.0, "-2"),
        (0.5, "0.5"),
        (0.1234567, "0.123457"),
        (1234567.5, "1.23457e+06"),
        (1000, "1000"),
        (123456789, "123456789"),
        (9999999999999998.0, "9999999999999998"),
        (1e16, "1e+16"),
        (1.2345e17, "1.2345e+17"),
        (10**16 - 1, "9999999999999999"),
        (10**16, "1e+16"),
        (-(10**16), "-1e+16"),
        (10**30, "1e+30"),
        (math.inf, "inf"),
    ],
)
def test_numbers_are_shown_as_written(number: float, shown: str) -> None:
    assert _shown(number) == shown


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("concurrency = [1e30]", "expected a non-empty list of positive integers, got [1e+30]"),
        ("concurrency = [100000000000000000000]", None),  # TOML: an integer too large to read
        ("concurrency = [70000]", "plan.toml:4: axes.concurrency: must be at most 65536, got 70000"),
        ("tp = [300]", "plan.toml:4: axes.tp: must be at most 256, got 300"),
        ("concurrency = { 1 = [70000] }", "plan.toml:4: axes.concurrency.1: must be at most 65536, got 70000"),
        ("request_rate = [0.5, nan]", 'plan.toml:4: axes.request_rate: expected a non-empty list of positive numbers or "inf", got [0.5, nan]'),
    ],
)  # fmt: skip
def test_an_axis_out_of_range_names_line_and_key(line: str, message: str | None) -> None:
    text = f'[model]\npath = "/m"\n[axes]\n{line}\n[engine]\nname = "vllm"\n'
    with pytest.raises(PlanError) as info:
        parse_plan(text, "plan.toml")
    if message is not None:
        assert str(info.value).endswith(message)
