"""SGLang: ``python -m sglang.launch_server`` (flags per sglang 0.5.23's ServerArgs).

Readiness is ``GET /health_generate`` (answers 200 only after a real one-token
generation, so a server whose CUDA graphs crash on the first batch is not "ready");
the real context length is ``max_model_len`` in ``GET /v1/models`` (the model config's
``context_len`` after ``--context-length``), else ``context_length`` in ``/server_info``
(newer SGLang) or ``/get_server_info`` (older). Every flag and endpoint used here is
checked against SGLang's source in tests/bench/data/sglang-api-contract.toml.
``POST /flush_cache`` empties the radix cache between cells. DDTree flags
(``--speculative-ddtree-budget``) exist only in SGLang branches carrying DDTree (PR
#27509); plans pass them as ordinary args and validation checks them against the
installed build's ``--help``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from gpudoctor.bench.engines.base import Engine
from gpudoctor.bench.load.accept_length import SERVER_INFO_PATHS

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import ModelSpec, ServerConfig


class SGLang(Engine):
    """The SGLang server."""

    name = "sglang"
    package = "sglang"
    reserved = ("host", "port", "model-path", "tp-size", "tensor-parallel-size")
    ready_path = "/health_generate"
    flush_cache_path = "/flush_cache"

    def launcher(self) -> list[str]:
        """Return ``[python, -m, sglang.launch_server]``."""
        return [self.python, "-m", "sglang.launch_server"]

    def command(
        self, config: ServerConfig, model: ModelSpec, port: int, host: str = "127.0.0.1"
    ) -> list[str]:
        """Return the server's argv with ``--enable-metrics`` (SGLang serves ``/metrics``
        only with it: the cell's server signals), unless the plan sets it false."""
        argv = super().command(config, model, port, host)
        declared = dict(self.spec.args) | dict(config.args)
        if "--enable-metrics" in argv or declared.get("enable-metrics") is False:
            return argv
        return [*argv, "--enable-metrics"]

    def model_args(self, model: ModelSpec, config: ServerConfig) -> list[str]:
        """Return ``--model-path DIR --tp-size N`` (+ ``--served-model-name`` when set)."""
        argv = ["--model-path", model.local_dir, "--tp-size", str(config.tp)]
        if model.served_name:
            argv += ["--served-model-name", model.served_name]
        return argv

    def max_context(self, client: httpx.Client, base_url: str, model: ModelSpec) -> int | None:
        """Return ``max_model_len`` of ``/v1/models``, else ``context_length`` of
        ``/server_info`` (or ``/get_server_info``)."""
        found = super().max_context(client, base_url, model)
        if found:
            return found
        for path in SERVER_INFO_PATHS:
            try:
                response = client.get(base_url + path, timeout=10.0)
                if response.status_code != 200:
                    continue
                info = response.json()
                value = info.get("context_length") or info.get("context_len")
                return int(value) if value else None
            except (httpx.HTTPError, ValueError, AttributeError, TypeError):
                return None
        return None
