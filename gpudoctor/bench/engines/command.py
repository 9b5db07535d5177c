"""Any OpenAI-compatible server started by a command line the plan gives.

For servers without an adapter (llama.cpp's ``llama-server``, a custom build, a
proxy): ``[engine] name = "command"`` with ``command = ["llama-server", "-m", "{model}",
"--host", "{host}", "--port", "{port}"]``. Placeholders: ``{model}`` (the model
directory), ``{host}``, ``{port}``, ``{tp}``. The plan's args are appended as flags and
validated against ``COMMAND --help`` (the command without placeholder words).
Readiness: ``ready_path`` (default ``/health``); context length: ``max_model_len`` in
``/v1/models``, else the model directory's config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from gpudoctor.bench.engines.base import Engine, render_args
from gpudoctor.bench.engines.transformers import context_from_model_dir

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import ModelSpec, ServerConfig


class CommandServer(Engine):
    """A server started from the plan's ``engine.command`` template."""

    name = "command"
    package = ""

    def launcher(self) -> list[str]:
        """Return the command's words before its first option or placeholder (the program)."""
        words = list(self.spec.command)
        for i, word in enumerate(words):
            if "{" in word or word.startswith("-"):
                return words[:i]
        return words

    def model_args(self, model: ModelSpec, config: ServerConfig) -> list[str]:
        """Not used: :meth:`command` fills the whole template."""
        return []

    def command(
        self, config: ServerConfig, model: ModelSpec, port: int, host: str = "127.0.0.1"
    ) -> list[str]:
        """Return the template with placeholders filled, then the plan's args as flags."""
        values = {"model": model.local_dir, "host": host, "port": str(port), "tp": str(config.tp)}
        return [word.format(**values) for word in self.spec.command] + render_args(config.args)

    def metrics_url(self, base_url: str) -> tuple[str | None, str]:
        """Return the plan's ``[engine] metrics_path`` under ``base_url``, or None and why."""
        if not self.spec.metrics_path:
            return None, 'the plan sets no [engine] metrics_path (e.g. "/metrics")'
        return base_url.rstrip("/") + self.spec.metrics_path, ""

    def help_argv(self) -> list[str]:
        """Return the program (:meth:`launcher`) plus ``--help``."""
        return [*self.launcher(), "--help"]

    def version(self) -> str | None:
        """Return the plan's ``engine.version`` (a command has no package to ask)."""
        return self.spec.version or "unknown"

    def is_ready(self, client: httpx.Client, base_url: str) -> bool:
        """Return True when ``ready_path`` answers 200."""
        self.ready_path = self.spec.ready_path or "/health"
        return super().is_ready(client, base_url)

    def max_context(self, client: httpx.Client, base_url: str, model: ModelSpec) -> int | None:
        """Return ``max_model_len`` of ``/v1/models``, else the model directory's config."""
        return super().max_context(client, base_url, model) or context_from_model_dir(
            model.local_dir
        )
