"""The engine interface: how to start one server, know it is ready, and ask it things.

An adapter turns a resolved :class:`~gpudoctor.bench.plan.ServerConfig` into an argv and
an environment, says which endpoint answers when the server is ready, how to learn
the server's real maximum context length, which endpoint flushes its cache, which
version is installed, and which flags its ``--help`` accepts. Adapters hold no state
about running servers (that is :mod:`gpudoctor.bench.launch.server`).
"""

from __future__ import annotations

import abc
import difflib
import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from gpudoctor import fsio

if TYPE_CHECKING:
    from gpudoctor.bench.plan_model import ArgValue, EngineSpec, ModelSpec, ServerConfig

_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")
# argparse's ``--flag {a,b,c}`` (choices): in the usage line and in the option's own line
_CHOICES = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)[ =]\{([^{}\s]+)\}")


class EngineError(RuntimeError):
    """The engine cannot be used as asked (not installed, bad flag, ...): one-line message."""


class EngineNotInstalled(EngineError):
    """The engine's program or package is not there (a dry run notes it, a run stops)."""


@dataclass(frozen=True)
class FlagProblem:
    """A flag the plan uses that the installed engine does not accept.

    Attributes:
        flag: the flag as it would be passed (``--speculative-ddtree-budgt``).
        configs: labels of the configurations that use it.
        suggestion: the closest accepted flag (or value), or empty.
        reserved: a flag gpudoctor sets itself (host, port, model, tp): remove it.
        value: a value outside the flag's choices (the flag itself is known), or empty.
    """

    flag: str
    configs: tuple[str, ...]
    suggestion: str = ""
    reserved: bool = False
    value: str = ""

    def message(self) -> str:
        """Return the problem as one line (``unknown flag --x (did you mean --y?) in a@tp1``;
        ``--port is set by gpudoctor; remove it, used by a@tp1`` for a reserved flag;
        ``--dtype does not accept 'flaot32' (did you mean 'float32'?), used by a@tp1``)."""
        if self.reserved:
            return f"{self.flag} is set by gpudoctor; remove it, used by {', '.join(self.configs)}"
        if self.value:
            hint = f" (did you mean {self.suggestion!r}?)" if self.suggestion else ""
            return f"{self.flag} does not accept {self.value!r}{hint}, used by {', '.join(self.configs)}"
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"unknown flag {self.flag}{hint}, used by {', '.join(self.configs)}"


def flags_in_help(help_text: str) -> frozenset[str]:
    """Return every ``--flag`` that a ``--help`` output mentions."""
    return frozenset(_FLAG.findall(help_text))


def choices_in_help(help_text: str) -> dict[str, frozenset[str]]:
    """Return ``--flag -> its accepted values`` for every flag a ``--help`` output shows
    with argparse choices (``--dtype {auto,float16,float32}``)."""
    out: dict[str, frozenset[str]] = {}
    for flag, values in _CHOICES.findall(help_text):
        out[flag] = out.get(flag, frozenset()) | frozenset(values.split(","))
    return out


def _values_of(value: ArgValue) -> list[str]:
    """Return the words a plan value passes after its flag (none for a bare flag)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, tuple):
        return [str(v) for v in value]
    return [str(value)]


def render_args(args: tuple[tuple[str, ArgValue], ...] | list[tuple[str, ArgValue]]) -> list[str]:
    """Return argv words for ``(flag, value)`` pairs: True -> bare flag, False -> nothing,
    a list -> the flag followed by each value."""
    argv: list[str] = []
    for flag, value in args:
        if value is False:
            continue
        argv.append(f"--{flag}")
        if value is True:
            continue
        if isinstance(value, tuple):
            argv.extend(str(v) for v in value)
        else:
            argv.append(str(value))
    return argv


class Engine(abc.ABC):
    """One inference engine. Subclasses fill in the class attributes and the argv parts."""

    name: str = ""
    package: str = ""  # the distribution whose version is reported
    reserved: tuple[str, ...] = ("host", "port")  # flags gpudoctor sets itself
    ready_path: str = "/health"
    flush_cache_path: str | None = None
    # where the server's Prometheus metrics are (the cell's server signals); None: none
    metrics_path: str | None = "/metrics"
    log_ready_pattern: str = r"Uvicorn running on|Application startup complete"

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec

    def metrics_url(self, base_url: str) -> tuple[str | None, str]:
        """Return (the URL of the server's ``/metrics``, or None; why there is none)."""
        if self.metrics_path is None:
            return None, f"the {self.name} engine serves no /metrics"
        return base_url.rstrip("/") + self.metrics_path, ""

    # ---- the command
    @property
    def python(self) -> str:
        """Return the interpreter of the engine's environment (plan's ``engine.python``)."""
        return self.spec.python or sys.executable

    def script(self, name: str) -> str | None:
        """Return the console script ``name`` beside the engine's interpreter, if it exists."""
        path = Path(self.python).parent / name
        return str(path) if path.exists() else None

    @abc.abstractmethod
    def launcher(self) -> list[str]:
        """Return the argv prefix that starts a server (``python -m sglang.launch_server``)."""

    @abc.abstractmethod
    def model_args(self, model: ModelSpec, config: ServerConfig) -> list[str]:
        """Return the argv words that name the model and the tensor parallel size."""

    def served_model(self, model: ModelSpec) -> str:
        """Return the ``model`` field requests must send."""
        return model.served_name or model.local_dir

    def command(
        self, config: ServerConfig, model: ModelSpec, port: int, host: str = "127.0.0.1"
    ) -> list[str]:
        """Return the full argv of the server for ``config`` listening on ``host:port``."""
        return [
            *self.launcher(),
            *self.model_args(model, config),
            "--host", host, "--port", str(port),
            *render_args(config.args),
        ]  # fmt: skip

    def environment(self, config: ServerConfig) -> dict[str, str]:
        """Return the environment additions for the server (engine defaults + plan's env)."""
        env = {"HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1"}
        env.update(dict(config.env))
        return env

    def help_argv(self) -> list[str]:
        """Return the argv that prints the server's ``--help``."""
        return [*self.launcher(), "--help"]

    # ---- talking to a running server
    def is_ready(self, client: httpx.Client, base_url: str) -> bool:
        """Return True when the server answers its readiness endpoint with 200."""
        try:
            return client.get(base_url + self.ready_path, timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def max_context(self, client: httpx.Client, base_url: str, model: ModelSpec) -> int | None:
        """Return the server's real maximum context length in tokens (None when unknown).

        Default: ``max_model_len`` of the first model in ``GET /v1/models``."""
        try:
            data = client.get(base_url + "/v1/models", timeout=10.0).json()
            value = (data.get("data") or [{}])[0].get("max_model_len")
            return int(value) if value else None
        except (httpx.HTTPError, ValueError, AttributeError, IndexError, TypeError):
            return None

    # ---- facts about the installed engine
    def _run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, COLUMNS="250", TERM="dumb", NO_COLOR="1", PYTHONWARNINGS="ignore")
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        except FileNotFoundError as exc:
            hint = f" (is {self.package} installed?)" if self.package else ""
            raise EngineNotInstalled(f"{self.name}: {argv[0]} not found{hint}") from exc
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"{self.name}: `{' '.join(argv)}` took over {timeout:.0f} s") from exc

    def version(self) -> str | None:
        """Return the installed engine's version (``pip show PACKAGE``), None if not installed."""
        code = f"import importlib.metadata as m; print(m.version({self.package!r}))"
        proc = self._run([self.python, "-c", code], timeout=60)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def help_text(self, cache_dir: Path | None = None, refresh: bool = False) -> str:
        """Return the server's ``--help`` output (cached per engine version and interpreter;
        ``refresh`` ignores the cache, e.g. for a branch installed over the same version)."""
        version = self.version()
        if version is None:
            raise EngineNotInstalled(
                f"{self.name} is not installed for {self.python} (pip install {self.package})"
            )
        cache = None
        if cache_dir is not None:
            tag = hashlib.sha256(
                f"{self.python}|{version}|{self.help_argv()}".encode()
            ).hexdigest()[:12]
            cache = cache_dir / f"{self.name}-{version}-{tag}.help.txt"
            if cache.is_file() and not refresh:
                return cache.read_text(encoding="utf-8")
        proc = self._run(self.help_argv(), timeout=300)
        text = proc.stdout + proc.stderr
        shown = " ".join(self.help_argv())
        tail = " | ".join(text.strip().splitlines()[-3:])
        if proc.returncode != 0:
            raise EngineError(f"{self.name}: `{shown}` failed: {tail}")
        if not flags_in_help(text):
            raise EngineError(
                f"{self.name}: `{shown}` printed no --flag, and the plan's args are checked"
                f" against the flags a --help lists ({tail or 'no output'}); put those flags in"
                " the command itself, or start a program whose --help lists them"
            )
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            fsio.atomic_replace(
                cache, text, keep_mode=False, refuse_non_regular=False, follow_dir_link=True
            )
        return text

    def check_flags(
        self, configs: tuple[ServerConfig, ...] | list[ServerConfig], help_text: str
    ) -> list[FlagProblem]:
        """Return the flags the configs use that ``help_text`` does not list (empty = all good).

        Flags gpudoctor sets itself (host, port, model, tp) are reported when a plan sets them."""
        known = flags_in_help(help_text)
        choices = choices_in_help(help_text)
        users: dict[str, list[str]] = {}
        bad_values: dict[tuple[str, str], list[str]] = {}
        for config in configs:
            for flag, value in config.args:
                users.setdefault(flag, []).append(config.label)
                allowed = choices.get(f"--{flag}")
                for word in _values_of(value) if allowed else ():
                    if word not in allowed:
                        bad_values.setdefault((flag, word), []).append(config.label)
        problems = []
        for flag, labels in users.items():
            dashed = f"--{flag}"
            if flag in self.reserved:
                problems.append(FlagProblem(dashed, tuple(labels), reserved=True))
            elif dashed not in known:
                close = difflib.get_close_matches(dashed, sorted(known), n=1, cutoff=0.75)
                problems.append(FlagProblem(dashed, tuple(labels), close[0] if close else ""))
        for (flag, word), labels in bad_values.items():
            close = difflib.get_close_matches(word, sorted(choices[f"--{flag}"]), n=1, cutoff=0.6)
            problems.append(
                FlagProblem(f"--{flag}", tuple(labels), close[0] if close else "", value=word)
            )
        return problems
