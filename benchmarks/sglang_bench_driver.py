"""Run SGLang's own ``bench_serving.py`` (unmodified file from the sglang wheel) for the
agreement benchmark. Runs in a separate venv that has bench_serving's imports (aiohttp,
pybase64, requests, datasets); see benchmarks/metrics_agreement.py.

Two modes:

  run BENCH_SERVING_PY -- ARGS...   run the file as ``__main__`` with ARGS. One shim:
      request bodies lose the keys named in $SGLANG_DRIVER_DROP_KEYS (default
      ``ignore_eos``): ``transformers serve`` answers 422 to any non-OpenAI field, and
      bench_serving always sends ``ignore_eos``. Timing code is untouched.
  metrics BENCH_SERVING_PY RAW_JSONL DURATION_S TOKENIZER_DIR
      feed gpudoctor's raw request records to bench_serving's own
      ``calculate_metrics`` and print its metrics as JSON (definitions check on
      identical data).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os
import runpy
import sys
import types


def _stub_datasets_if_missing() -> None:
    """bench_serving imports ``datasets`` at the top but needs it only for Hub datasets.

    The agreement run reads a local ShareGPT file, so where ``datasets`` (and pyarrow) are
    not installed a stub that refuses every call stands in for it.
    """
    try:
        import datasets  # noqa: F401
    except ImportError:
        stub = types.ModuleType("datasets")

        def load_dataset(*args: object, **kwargs: object) -> None:
            raise RuntimeError("datasets is not installed (stub from sglang_bench_driver)")

        stub.load_dataset = load_dataset  # type: ignore[attr-defined]
        sys.modules["datasets"] = stub


def _install_body_shim() -> None:
    import aiohttp

    drop = set(filter(None, os.environ.get("SGLANG_DRIVER_DROP_KEYS", "ignore_eos").split(",")))
    original = aiohttp.ClientSession._request

    async def _request(self, method, url, **kwargs):  # type: ignore[no-untyped-def]
        body = kwargs.get("json")
        if isinstance(body, dict):
            kwargs["json"] = {k: v for k, v in body.items() if k not in drop}
        return await original(self, method, url, **kwargs)

    aiohttp.ClientSession._request = _request  # type: ignore[method-assign]


def _load(path: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_serving", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(path: str, raw_path: str, duration_s: float, tokenizer_dir: str) -> None:
    bench = _load(path)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with open(raw_path) as raw:
        rows = [json.loads(line) for line in raw]
    inputs, outputs = [], []
    for r in sorted(rows, key=lambda r: r["index"]):
        times = r["chunk_times_s"]
        inputs.append(bench.DatasetRow(prompt="", prompt_len=r["prompt_len"],
                                       output_len=r["max_tokens"]))  # fmt: skip
        outputs.append(
            bench.RequestFuncOutput(
                generated_text="".join(r["text_chunks"]),
                success=r["ok"],
                latency=r["e2e_s"] or 0.0,
                ttft=r["ttft_s"] or 0.0,
                itl=[b - a for a, b in itertools.pairwise(times)],
                text_chunks=r["text_chunks"][1:],
                prompt_len=r["prompt_len"],
                output_len=r["output_tokens"],
            )
        )
    metrics, _ = bench.calculate_metrics(inputs, outputs, duration_s, tokenizer, "vllm", None)
    print(json.dumps({k: float(v) for k, v in dataclasses.asdict(metrics).items()}))


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    _stub_datasets_if_missing()
    if mode == "run":
        _install_body_shim()
        sys.argv = [path, *sys.argv[4:]]  # argv[3] is "--"
        runpy.run_path(path, run_name="__main__")
    elif mode == "metrics":
        _metrics(path, sys.argv[3], float(sys.argv[4]), sys.argv[5])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
