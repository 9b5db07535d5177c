"""The engine's own last error line, from log tails in the engines' real shapes (issue 45.8).

The transformers tail carries transformers 5.24.0's own message (``modeling_utils.py``,
``_flash_attn_availability_check``). The vLLM tail is what Python and the real pydantic print for vLLM 0.32.0's max_model_len
check (``vllm/config/model.py``), as ``tests/bench/stream_server.py --refuse-max-model-len``
produces it; the vLLM v1 engine-core lines carry its ``(EngineCore_DP0 pid=N)`` prefix and
its logger's ``ERROR MM-DD HH:MM:SS [file:line]`` head on every line of one record."""

from __future__ import annotations

import pytest

from gpudoctor.bench.launch.engine_error import MAX_CHARS, engine_error, with_engine_error

VLLM_MAX_MODEL_LEN = """\
(APIServer pid=77) INFO 12-07 05:00:00 [utils.py:253] non-default args: {'max_model_len': 4096}
Traceback (most recent call last):
  File "/venv/bin/vllm", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/venv/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 121, in __init__
    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, User-specified max_model_len (4096) is greater than the derived max_model_len (max_position_embeddings=2048 or model_max_length=None in model's config.json). [type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.13/v/value_error
"""

ENGINE_CORE = """\
(EngineCore_DP0 pid=81) ERROR 12-07 05:00:01 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=81) ERROR 12-07 05:00:01 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=81) ERROR 12-07 05:00:01 [core.py:708]   File "/venv/vllm/v1/engine/core.py", line 699, in run_engine_core
(EngineCore_DP0 pid=81) ERROR 12-07 05:00:01 [core.py:708]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_DP0 pid=81) ERROR 12-07 05:00:01 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
(APIServer pid=77) Traceback (most recent call last):
(APIServer pid=77)   File "/venv/bin/vllm", line 8, in <module>
(APIServer pid=77)     sys.exit(main())
(APIServer pid=77) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""

TRANSFORMERS_FA2 = """\
INFO:     Started server process [12]
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 1558, in _flash_attn_availability_check
    raise ImportError(
ImportError: FlashAttention2 has been toggled on, but it cannot be used due to the following error: the package for FlashAttention2 doesn't seem to be installed.
"""


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (VLLM_MAX_MODEL_LEN, "ValidationError: 1 validation error for ModelConfig: Value error, "
         "User-specified max_model_len (4096) is greater than the derived max_model_len "
         "(max_position_embeddings=2048 or model_max_length=None in model's config.json)."),
        (ENGINE_CORE, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        (TRANSFORMERS_FA2, "ImportError: FlashAttention2 has been toggled on, but it cannot be used"
         " due to the following error: the package for FlashAttention2 doesn't seem to be installed."),
        ("start\n\x1b[31mERROR 12-07 05:00:00 [api_server.py:1] Address already in use\x1b[0m\nbye",
         "Address already in use"),
        ("2026-12-07 05:00:00,123 - sglang - CRITICAL - Scheduler hit an exception\n",
         "Scheduler hit an exception"),
        ("[2026-12-07 05:00:00] ERROR bad thing\n", "bad thing"),
        ("stream_server: fatal: --fail-start given, refusing to start\n",
         "stream_server: fatal: --fail-start given, refusing to start"),
        ("loading\nerror: weights not found\nINFO shutting down\n", "error: weights not found"),
        ("OSError: [Errno 98] Address already in use\n", "OSError: [Errno 98] Address already in use"),
        ("x torch.cuda.OutOfMemoryError: CUDA out of memory\n", "x torch.cuda.OutOfMemoryError: CUDA out of memory"),
        ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyboardInterrupt\n",
         "KeyboardInterrupt"),
    ],
)  # fmt: skip
def test_the_engines_own_line_is_found(tail: str, expected: str) -> None:
    assert engine_error(tail.splitlines()) == expected


@pytest.mark.parametrize(
    "tail",
    [
        "",
        "INFO: Uvicorn running on http://127.0.0.1:8000\nINFO: shutting down\n",
        "NO_ERRORS_HERE=1\nerror_rate is 0\nterror: none\nOSError:none\nvalueError: x\n",
        # a traceback cut by the tail's end names no exception; no level line either
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n',
        'Traceback (most recent call last):\n  File "x.py", line 1\nDuring handling of the above\n',
    ],
)
def test_nothing_is_made_up_when_the_log_names_no_error(tail: str) -> None:
    assert engine_error(tail.splitlines()) is None
    assert with_engine_error("server exited with code 1", tail.splitlines()) == (
        "server exited with code 1"
    )


def test_the_last_traceback_wins_unless_it_points_above() -> None:
    first = 'Traceback (most recent call last):\n  File "a", line 1, in f\nValueError: first\n'
    second = 'Traceback (most recent call last):\n  File "b", line 2, in g\nOSError: second\n'
    assert engine_error((first + second).splitlines()) == "OSError: second"
    pointer = 'Traceback (most recent call last):\n  File "c", line 3\nRuntimeError: see the root cause above\n'
    assert engine_error((first + pointer).splitlines()) == "ValueError: first"
    assert engine_error(pointer.splitlines()) == "RuntimeError: see the root cause above"
    from gpudoctor.bench.launch.engine_error import _from_tracebacks

    # a pointer alone is kept by the traceback reader itself (nothing above to point at)
    assert _from_tracebacks(pointer.splitlines()) == "RuntimeError: see the root cause above"
    # a traceback beats a later level line; the first traceback's closing line counts
    assert engine_error((first + "ERROR later\n").splitlines()) == "ValueError: first"


def test_a_traceback_with_a_head_on_every_line_is_read_through_it() -> None:
    head = "ERROR 12-07 05:00:01 [core.py:708] "
    tail = [head + "Traceback (most recent call last):", head + '  File "c.py", line 3, in f',
            head + "    f()", head + "KeyError: 'q'", "INFO later"]  # fmt: skip
    assert engine_error(tail) == "KeyError: 'q'"
    plain = ["Traceback (most recent call last):", '  File "c.py", line 3', "ZeroDivisionError"]
    assert engine_error(plain) == "ZeroDivisionError"


def test_a_pydantic_count_without_detail_stays_alone() -> None:
    tail = ["Traceback (most recent call last):", '  File "x", line 1', "a.b.ValidationError: 2 validation errors for X"]  # fmt: skip
    assert engine_error(tail) == "ValidationError: 2 validation errors for X"
    detailed = [*tail, "", "  bad value [type=value_error, input_value=1]", "  more"]
    assert engine_error(detailed) == "ValidationError: 2 validation errors for X: bad value"


def test_one_line_of_bounded_length() -> None:
    long = 'Traceback (most recent call last):\n  File "x", line 1\nValueError: ' + "x  y\t" * 200
    found = engine_error(long.splitlines())
    assert found is not None and len(found) == MAX_CHARS and found.endswith("...")
    assert found.startswith("ValueError: x y x y") and "\t" not in found and "  " not in found
    assert engine_error(["ERROR " + "z" * MAX_CHARS]) == "z" * MAX_CHARS  # the head is cut
    assert engine_error(["ERROR " + "z" * (MAX_CHARS + 1)]) == "z" * (MAX_CHARS - 3) + "..."


def test_the_reason_carries_the_line() -> None:
    assert with_engine_error(
        "server exited with code 1 during startup", TRANSFORMERS_FA2.splitlines()
    ).startswith(
        "server exited with code 1 during startup: ImportError: FlashAttention2 has been toggled on"
    )
