"""Context clamping: a cell's workload fitted to the server's real context length."""

from __future__ import annotations

import pytest

from gpudoctor.bench.cell_spec import WorkloadSpec
from gpudoctor.bench.launch.steps import clamp_workload
from gpudoctor.bench.plan import Limits


@pytest.mark.parametrize(
    ("input_len", "output_len", "max_ctx", "expect_input", "clamped"),
    [(1000, 100, 2048, 1000, False), (3000, 100, 2048, 1916, True), (30000, 512, 30720, 30000, False),
     (32000, 512, 30720, 30176, True), (100, 2030, 2048, None, False), (100, 10, None, 100, False),
     # exact fits: input + output + overhead == context is not clamped; a budget of exactly
     # the minimum input is still usable
     (1916, 100, 2048, 1916, False), (1917, 100, 2048, 1916, True), (100, 2000, 2048, 16, True),
     (100, 2001, 2048, None, False)],
)  # fmt: skip
def test_clamp(input_len: int, output_len: int, max_ctx, expect_input, clamped: bool) -> None:
    w = WorkloadSpec(input_len=input_len, output_len=output_len)
    fitted, facts = clamp_workload(w, max_ctx, Limits(template_overhead=32, min_input_len=16))
    if expect_input is None:
        assert fitted is None and "leaves" in facts["note"]
        return
    assert fitted.input_len == expect_input and facts["clamped"] is clamped
    assert facts["requested_input_len"] == input_len
    if max_ctx:
        assert fitted.input_len + output_len + 32 <= max_ctx
