"""TOML -> :class:`~gpudoctor.bench.plan.Plan`: type checks, errors naming line and key,
and the expansion of configurations (sweeps x tp) into server configs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import posixpath
import re
import urllib.parse
from pathlib import Path, PurePath
from typing import Any

from gpudoctor.bench.cell_spec import SLO, WorkloadSpec, rate_from_json
from gpudoctor.bench.engines import ENGINES
from gpudoctor.bench.engines.request_fields import rejected_fields
from gpudoctor.bench.plan.bounds import out_of_bounds
from gpudoctor.bench.plan.search import parse_search
from gpudoctor.bench.plan_model import (
    ArgValue,
    EngineSpec,
    HardwareSpec,
    Limits,
    ModelSpec,
    Plan,
    PlanError,
    PreflightSpec,
    ServerConfig,
    config_key,
    program_identity,
)

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_TOP_KEYS = {
    "name",
    "model",
    "engine",
    "axes",
    "configs",
    "workload",
    "slo",
    "preflight",
    "limits",
    "repeats",
    "search",
    "hardware",
}
WORKLOAD_KINDS = ("random", "jsonl", "sharegpt", "multi_turn", "shared_prefix", "trace")
_DATASET_KINDS = ("jsonl", "sharegpt", "trace")


class _Reader:
    """Type-checked access to the TOML document with errors that name line and key."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.lines = text.splitlines()

    def line_of(self, path: str) -> int | None:
        """Return the best-guess line of a dotted key path (``configs[2].args.tp-size``)."""
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
        line, start = None, 0
        table_count: dict[str, int] = {}
        for i, part in enumerate(parts):
            if part.startswith("["):
                continue
            index = None
            if i + 1 < len(parts) and parts[i + 1].startswith("["):
                index = int(parts[i + 1][1:-1])
            found = self._find(part, start, index, table_count)
            if found is not None:
                line, start = found, found
        return None if line is None else line + 1

    def _find(self, key: str, start: int, index: int | None, counts: dict[str, int]) -> int | None:
        esc = re.escape(key)
        if index is not None:
            hits = [
                n for n, text in enumerate(self.lines) if re.match(rf"\s*\[\[\s*{esc}\s*\]\]", text)
            ]
            if index < len(hits):
                return hits[index]
        pattern = re.compile(
            rf'^\s*(\[\s*([\w.-]+\.)?{esc}\s*\]|"?{esc}"?\s*=)|[{{,]\s*"?{esc}"?\s*='
        )
        for n in range(start, len(self.lines)):
            if pattern.search(self.lines[n]):
                return n
        return None

    def error(self, path: str, message: str) -> PlanError:
        """Return a PlanError for ``path`` located in the file."""
        line = self.line_of(path)
        where = f"{self.source}:{line}" if line else self.source
        return PlanError(f"{where}: {path}: {message}")

    def table(self, data: dict, key: str, path: str, required: bool = False) -> dict:
        value = data.get(key)
        if value is None:
            if required:
                raise self.error(path, "missing table")
            return {}
        if not isinstance(value, dict):
            raise self.error(path, f"expected a table, got {type(value).__name__}")
        return value

    def check_keys(self, data: dict, allowed: set[str], path: str) -> None:
        for key in data:
            if key not in allowed:
                hint = f" (allowed: {', '.join(sorted(allowed))})"
                raise self.error(f"{path}.{key}" if path else key, "unknown key" + hint)

    def typed(self, data: dict, key: str, path: str, kinds: tuple[type, ...], default: Any) -> Any:
        if key not in data:
            return default
        value = data[key]
        if isinstance(value, bool) and bool not in kinds:
            raise self.error(path, f"expected {_kind_names(kinds)}, got a boolean")
        if not isinstance(value, kinds):
            raise self.error(path, f"expected {_kind_names(kinds)}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            why = out_of_bounds(key, value)
            if why:
                raise self.error(path, why)
        return value

    def int_list(self, value: Any, path: str) -> tuple[int, ...]:
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        ):
            raise self.error(path, f"expected a non-empty list of positive integers, got {value!r}")
        key = path.rsplit(".", 1)[-1]
        key = "concurrency" if key.isdigit() else key  # concurrency = { 2 = [...] }
        for item in value:
            why = out_of_bounds(key, item)
            if why:
                raise self.error(path, why)
        if len(set(value)) != len(value):
            raise self.error(path, f"duplicate values in {value!r}")
        return tuple(value)

    def rate_list(self, value: Any, path: str) -> tuple[float, ...]:
        """Return a request-rate axis: positive numbers and ``"inf"`` (req/s)."""
        if not isinstance(value, list):
            value = [value]
        rates = [rate_from_json(v) if not isinstance(v, bool) else None for v in value]
        if not value or any(r is None or not r > 0 for r in rates):  # nan too
            raise self.error(
                path, f'expected a non-empty list of positive numbers or "inf", got {value!r}'
            )
        if len(set(rates)) != len(rates):
            raise self.error(path, f"duplicate values in {value!r}")
        return tuple(float(r) for r in rates if r is not None)

    def args(self, data: Any, path: str) -> tuple[tuple[str, ArgValue], ...]:
        if not isinstance(data, dict):
            raise self.error(path, "expected a table of server arguments (flag = value)")
        out: list[tuple[str, ArgValue]] = []
        for flag, value in data.items():
            where = f"{path}.{flag}"
            if flag.startswith("-") or not _FLAG_NAME.match(flag):
                raise self.error(where, "write flag names without leading dashes (tp-size = 4)")
            if isinstance(value, list):
                if not all(
                    isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value
                ):
                    raise self.error(where, "a list value may hold strings and numbers only")
                value = tuple(value)
            elif isinstance(value, dict):
                value = json.dumps(value, sort_keys=True)  # e.g. --speculative-config '{...}'
            elif not isinstance(value, (str, int, float, bool)):
                raise self.error(where, f"unsupported value {value!r}")
            out.append((flag, value))
        return tuple(out)

    def env(self, data: Any, path: str) -> tuple[tuple[str, str], ...]:
        if not isinstance(data, dict):
            raise self.error(path, "expected a table of environment variables")
        for name, value in data.items():
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise self.error(f"{path}.{name}", "environment values must be strings or numbers")
        return tuple((k, str(v)) for k, v in data.items())


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        list: "a list",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def parse(text: str, source: str = "plan.toml", base_dir: PurePath | None = None) -> Plan:
    """Parse plan ``text`` (relative paths resolve against ``base_dir``); return the Plan."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{source}: not valid TOML: {exc}") from exc
    r = _Reader(text, source)
    r.check_keys(data, _TOP_KEYS, "")
    name = r.typed(data, "name", "name", (str,), Path(source).stem)
    model = _parse_model(r, r.table(data, "model", "model", required=True), base_dir)
    engine = _parse_engine(r, r.table(data, "engine", "engine", required=True), base_dir)
    workload_table = r.table(data, "workload", "workload")
    workload = _parse_workload(r, workload_table, base_dir)
    slo_table = r.table(data, "slo", "slo")
    r.check_keys(slo_table, {"ttft_ms", "tpot_ms", "e2el_ms"}, "slo")
    slo = None
    if slo_table:
        slo = SLO(
            **{k: float(r.typed(slo_table, k, f"slo.{k}", (int, float), None)) for k in slo_table}
        )
    limits = _parse_limits(r, r.table(data, "limits", "limits"))
    preflight = _parse_preflight(r, r.table(data, "preflight", "preflight"))
    configs = _expand_configs(r, data, engine, model)
    if engine.server_url and (len(configs) != 1 or configs[0].args or configs[0].env):
        raise r.error(
            "configs",
            "with engine.server_url the plan measures the one running server: give one"
            " configuration without args, env or sweep (its name labels the cells)",
        )
    repeats = r.typed(data, "repeats", "repeats", (int,), 1)
    if repeats < 1:
        raise r.error("repeats", f"must be at least 1, got {repeats}")
    search = parse_search(r, r.table(data, "search", "search"), slo, configs)
    hardware = _parse_hardware(r, r.table(data, "hardware", "hardware"))
    if "ignore_eos" not in workload_table and rejected_fields(engine.name, workload):
        workload = dataclasses.replace(workload, ignore_eos=False)  # the engine's own default
    for problem in rejected_fields(engine.name, workload):  # set in the plan: refused now
        raise r.error(problem.key, problem.message())
    return Plan(name, source, text, model, engine, workload, slo, limits, preflight, configs,
                repeats, search, hardware)  # fmt: skip


def _parse_hardware(r: _Reader, t: dict) -> HardwareSpec:
    """``[hardware] gpus = [0, 1, 2, 3]`` (these indices) or ``gpus = 4`` (at most 4)."""
    r.check_keys(t, {"gpus"}, "hardware")
    value = t.get("gpus")
    if value is None:
        return HardwareSpec()
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise r.error("hardware.gpus", f"must be >= 1, got {value}")
        return HardwareSpec(count=value)
    if (
        isinstance(value, list)
        and value
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
    ):
        if len(set(value)) != len(value):
            raise r.error("hardware.gpus", "lists a GPU index twice")
        return HardwareSpec(gpus=tuple(value))
    raise r.error("hardware.gpus", "expected a GPU count (4) or a list of GPU indices ([0, 1])")


def _parse_model(r: _Reader, t: dict, base_dir: PurePath | None) -> ModelSpec:
    keys = {"path", "repo", "revision", "dir", "mirror", "served_name", "tokenizer"}
    r.check_keys(t, keys, "model")
    vals = {k: r.typed(t, k, f"model.{k}", (str,), None) for k in keys}
    if bool(vals["path"]) == bool(vals["repo"]):
        raise r.error("model", "give exactly one of path (a local directory) or repo (a Hub repo)")
    if vals["repo"] and not vals["dir"]:
        raise r.error("model.dir", "missing: where the repo's weights live (/dev/shm/NAME)")
    for key in ("path", "dir", "mirror", "tokenizer"):
        if vals[key] and base_dir is not None and not Path(vals[key]).is_absolute():
            vals[key] = _joined(base_dir, vals[key])
    return ModelSpec(**vals)


def _joined(base_dir: PurePath, relative: str) -> str:
    """Return ``relative`` resolved against ``base_dir``: links followed (``realpath``) for a
    concrete Path; for a PurePosixPath (a plan read inside another root, ``service install
    --root``, whose links mean nothing here) joined and normalised without touching the
    file system (``realpath -m`` as the other system would, ``..`` taken lexically)."""
    joined = base_dir / relative
    if isinstance(joined, Path):
        return str(joined.resolve())
    return posixpath.normpath(str(joined))


def _interpreter(python: str | None, base_dir: PurePath | None) -> str | None:
    """Return ``engine.python`` as the server will be started with it: a relative path
    (``.venv/bin/python``) joined to the plan's directory as ``[model] path`` is, WITHOUT
    following links (a venv's python is a link to the base interpreter, and following it
    would leave the venv); a bare name (``python3``) stays a ``PATH`` lookup."""
    if not python or base_dir is None or "/" not in python or PurePath(python).is_absolute():
        return python
    joined = base_dir / python
    return os.path.abspath(joined) if isinstance(joined, Path) else posixpath.normpath(str(joined))


def _parse_engine(r: _Reader, t: dict, base_dir: PurePath | None) -> EngineSpec:
    keys = {
        "name",
        "python",
        "args",
        "env",
        "startup_timeout_s",
        "stop_timeout_s",
        "command",
        "ready_path",
        "version",
        "metrics_path",
        "port_range",
        "server_url",
    }
    r.check_keys(t, keys, "engine")
    name = r.typed(t, "name", "engine.name", (str,), None)
    if name not in ENGINES:
        raise r.error("engine.name", f"expected one of {', '.join(ENGINES)}, got {name!r}")
    command = r.typed(t, "command", "engine.command", (list,), [])
    if not all(isinstance(w, str) for w in command):
        raise r.error("engine.command", "expected a list of strings (argv)")
    if (name == "command") != bool(command) and "server_url" not in t:
        raise r.error("engine.command", 'needed with name = "command" (and only then)')
    if command and not any("{port}" in w for w in command):
        raise r.error("engine.command", "must contain {port} (gpudoctor picks a free port)")
    args = r.args(t.get("args", {}), "engine.args")
    _refuse_reserved(r, name, args, "engine.args")
    metrics_path = r.typed(t, "metrics_path", "engine.metrics_path", (str,), None)
    if metrics_path is not None and (name != "command" or not metrics_path.startswith("/")):
        raise r.error(
            "engine.metrics_path",
            'a path such as "/metrics", for name = "command" only (sglang and vllm: built in)',
        )
    return EngineSpec(
        name=name,
        python=_interpreter(r.typed(t, "python", "engine.python", (str,), None), base_dir),
        args=args,
        env=r.env(t.get("env", {}), "engine.env"),
        startup_timeout_s=float(
            r.typed(t, "startup_timeout_s", "engine.startup_timeout_s", (int, float), 900)
        ),
        stop_timeout_s=float(
            r.typed(t, "stop_timeout_s", "engine.stop_timeout_s", (int, float), 30)
        ),
        command=tuple(command),
        ready_path=_ready_path(r, t),
        version=r.typed(t, "version", "engine.version", (str,), None),
        metrics_path=metrics_path,
        port_range=_port_range(r, t),
        server_url=_server_url(r, t),
    )


def _ready_path(r: _Reader, t: dict) -> str | None:
    """Return ``engine.ready_path``: a URL path (``/health``), never a bare name that would
    fail as an invalid URL at the server's start (issue 47)."""
    path = r.typed(t, "ready_path", "engine.ready_path", (str,), None)
    if path is not None and (not path.startswith("/") or any(c.isspace() for c in path)):
        raise r.error(
            "engine.ready_path", f'a path such as "/health" (starting with /), got {path!r}'
        )
    return path


_STARTS_A_SERVER = ("python", "args", "env", "command", "port_range")


def _server_url(r: _Reader, t: dict) -> str | None:
    """Return ``engine.server_url`` (a running server's base URL, no trailing ``/``)."""
    url = r.typed(t, "server_url", "engine.server_url", (str,), None)
    if url is None:
        return None
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path.strip("/"):
        raise r.error(
            "engine.server_url", f'expected "http://HOST:PORT" (a running server), got {url!r}'
        )
    for key in _STARTS_A_SERVER:
        if key in t:
            raise r.error(
                f"engine.{key}",
                "says how to start a server; with engine.server_url gpudoctor starts none"
                " (remove one of the two)",
            )
    return url.rstrip("/")


_PORT_RANGE = re.compile(r"^\s*(\d{1,5})\s*-\s*(\d{1,5})\s*$")


def _port_range(r: _Reader, t: dict) -> tuple[int, int] | None:
    """Return ``engine.port_range`` ("30000-30100") as (low, high), or None when absent."""
    text = r.typed(t, "port_range", "engine.port_range", (str,), None)
    if text is None:
        return None
    match = _PORT_RANGE.match(text)
    low, high = (int(match[1]), int(match[2])) if match else (0, 0)
    if not match or not 1024 <= low <= high <= 65535:
        raise r.error(
            "engine.port_range",
            f'expected "LOW-HIGH" with 1024 <= LOW <= HIGH <= 65535 (e.g. "30000-30100"),'
            f" got {text!r}",
        )
    return low, high


def _parse_workload(r: _Reader, t: dict, base_dir: PurePath | None) -> WorkloadSpec:
    fields = {f.name: f for f in dataclasses.fields(WorkloadSpec)}
    r.check_keys(t, set(fields), "workload")
    floats = ("range_ratio", "request_rate", "burstiness", "trace_slowdown")
    kinds: dict[str, tuple[type, ...]] = {
        "kind": (str,), "api": (str,), "dataset_path": (str,), "ignore_eos": (bool,),
        **{k: (int, float) for k in floats},
    }  # fmt: skip
    values: dict[str, Any] = {}
    for key in t:
        values[key] = r.typed(t, key, f"workload.{key}", kinds.get(key, (int,)), None)
    for key in ("input_len", "output_len", "num_prompts", "prompts_per_concurrency", "turns",
                "groups", "prompts_per_group", "system_prompt_len", "trace_block_size"):  # fmt: skip
        if key in values and values[key] < 1:
            raise r.error(f"workload.{key}", f"must be at least 1, got {values[key]}")
    for key in ("burstiness", "trace_slowdown", "request_rate"):
        if key in values and not values[key] > 0:  # nan too
            raise r.error(f"workload.{key}", f"must be > 0, got {values[key]}")
    kind = values.get("kind", "random")
    if kind not in WORKLOAD_KINDS:
        raise r.error("workload.kind", f"expected one of {', '.join(WORKLOAD_KINDS)}, got {kind!r}")
    if values.get("api", "completions") not in ("completions", "chat"):
        raise r.error("workload.api", f"expected completions or chat, got {values['api']!r}")
    if kind in _DATASET_KINDS and not values.get("dataset_path"):
        raise r.error("workload.dataset_path", f"missing: kind = {kind} needs a dataset_path")
    rr = values.get("range_ratio")
    if rr is not None and not 0 < rr <= 1:
        raise r.error("workload.range_ratio", f"must be in (0, 1], got {rr}")
    ds = values.get("dataset_path")
    if ds and base_dir is not None and not Path(ds).is_absolute():
        values["dataset_path"] = _joined(base_dir, ds)
    for key in floats:
        if values.get(key) is not None:
            values[key] = float(values[key])
    return WorkloadSpec(**values)


def _parse_limits(r: _Reader, t: dict) -> Limits:
    keys = {"template_overhead", "min_input_len", "request_timeout_s", "cell_timeout_s",
            "keep_text", "max_failed_fraction"}  # fmt: skip
    r.check_keys(t, keys, "limits")
    limits = Limits(
        template_overhead=r.typed(t, "template_overhead", "limits.template_overhead", (int,), 32),
        min_input_len=r.typed(t, "min_input_len", "limits.min_input_len", (int,), 16),
        request_timeout_s=float(
            r.typed(t, "request_timeout_s", "limits.request_timeout_s", (int, float), 600)
        ),
        cell_timeout_s=float(
            r.typed(t, "cell_timeout_s", "limits.cell_timeout_s", (int, float), 3600)
        ),
        keep_text=r.typed(t, "keep_text", "limits.keep_text", (bool,), None),
        max_failed_fraction=float(
            r.typed(t, "max_failed_fraction", "limits.max_failed_fraction", (int, float), 0.01)
        ),
    )
    if not 0 <= limits.max_failed_fraction < 1:
        raise r.error("limits.max_failed_fraction",
                      f"must be in [0, 1), got {limits.max_failed_fraction:g}")  # fmt: skip
    for key in ("request_timeout_s", "cell_timeout_s"):
        if getattr(limits, key) <= 0:
            raise r.error(f"limits.{key}", f"must be > 0 seconds, got {getattr(limits, key):g}")
    return limits


def _parse_preflight(r: _Reader, t: dict) -> PreflightSpec:
    r.check_keys(t, {"enabled", "only", "expect_gpus"}, "preflight")
    only = r.typed(t, "only", "preflight.only", (list,), [])
    if not all(isinstance(x, str) for x in only):
        raise r.error("preflight.only", "expected a list of check ids or families")
    return PreflightSpec(
        enabled=r.typed(t, "enabled", "preflight.enabled", (bool,), True),
        only=tuple(only),
        expect_gpus=r.typed(t, "expect_gpus", "preflight.expect_gpus", (int,), None),
    )


def _refuse_reserved(
    r: _Reader, engine: str, args: tuple[tuple[str, ArgValue], ...], path: str
) -> None:
    """Raise PlanError for a flag gpudoctor sets itself (the engine's ``reserved``: model
    path, host, port, tp), in both ``--dry-run`` modes: no engine ``--help`` is needed."""
    # every engine: gpudoctor passes the model itself (sglang's --model aliases --model-path)
    reserved = {*ENGINES[engine].reserved, "host", "port", "model"}
    for flag, _ in args:
        if flag in reserved:
            raise r.error(
                f"{path}.{flag}",
                f"--{flag} is set by gpudoctor (it passes the model path, host, port and tp"
                f" itself); remove {flag} from the plan",
            )


def _concurrency_for(r: _Reader, value: Any, path: str, tp: int) -> tuple[int, ...]:
    """Return the concurrency list for ``tp`` from a list or a ``{tp = [...]}`` table."""
    if isinstance(value, dict):
        if str(tp) not in value:
            raise r.error(path, f"no concurrency list for tp = {tp} (keys: {', '.join(value)})")
        return r.int_list(value[str(tp)], f"{path}.{tp}")
    return r.int_list(value, path)


def _expand_configs(
    r: _Reader, data: dict, engine: EngineSpec, model: ModelSpec
) -> tuple[ServerConfig, ...]:
    axes = r.table(data, "axes", "axes")
    r.check_keys(axes, {"tp", "concurrency", "request_rate"}, "axes")
    axis_tp = r.int_list(axes.get("tp", [1]), "axes.tp")
    axis_conc = axes.get("concurrency", [1])
    axis_rates: tuple[float | None, ...] = (
        r.rate_list(axes["request_rate"], "axes.request_rate")
        if "request_rate" in axes
        else (None,)
    )
    raw = data.get("configs", [{"name": "default"}])
    if not isinstance(raw, list) or not raw or not all(isinstance(c, dict) for c in raw):
        raise r.error("configs", "expected one or more [[configs]] tables")
    out: list[ServerConfig] = []
    seen: dict[tuple[str, int], str] = {}
    program = program_identity(engine)
    for i, cfg in enumerate(raw):
        path = f"configs[{i}]"
        r.check_keys(cfg, {"name", "args", "env", "tp", "concurrency", "request_rate", "sweep"},
                     path)  # fmt: skip
        rates = (
            r.rate_list(cfg["request_rate"], f"{path}.request_rate")
            if "request_rate" in cfg else axis_rates
        )  # fmt: skip
        name = r.typed(cfg, "name", f"{path}.name", (str,), None)
        if not name:
            raise r.error(f"{path}.name", "missing: every configuration needs a name")
        args = r.args(cfg.get("args", {}), f"{path}.args")
        env = r.env(cfg.get("env", {}), f"{path}.env")
        tps = r.int_list(cfg["tp"], f"{path}.tp") if "tp" in cfg else axis_tp
        sweep = cfg.get("sweep", {})
        if not isinstance(sweep, dict):
            raise r.error(f"{path}.sweep", "expected a table flag = [values]")
        sweep_args = r.args(sweep, f"{path}.sweep")
        _refuse_reserved(r, engine.name, args, f"{path}.args")
        _refuse_reserved(r, engine.name, sweep_args, f"{path}.sweep")
        for flag, values in sweep_args:
            if not isinstance(values, tuple) or not values:
                raise r.error(f"{path}.sweep.{flag}", "expected a non-empty list of values")
        points = list(itertools.product(*[v for _, v in sweep_args])) if sweep_args else [()]
        for point in points:
            chosen = tuple(zip([f for f, _ in sweep_args], point, strict=False))
            merged = dict(engine.args)
            merged.update(dict(args))
            merged.update(dict(chosen))
            resolved_args = tuple(merged.items())
            resolved_env = tuple({**dict(engine.env), **dict(env)}.items())
            cname = _point_name(name, chosen)
            for tp in tps:
                if engine.name == "transformers" and tp != 1:
                    raise r.error(f"{path}.tp", "the transformers engine runs tp = 1 only")
                conc_src = cfg.get("concurrency", axis_conc)
                conc_path = f"{path}.concurrency" if "concurrency" in cfg else "axes.concurrency"
                concs = tuple(sorted(_concurrency_for(r, conc_src, conc_path, tp)))
                key = config_key(engine.name, model, tp, resolved_args, resolved_env, program)
                legacy = (config_key(engine.name, model, tp, resolved_args, resolved_env)
                          if program else "")  # fmt: skip
                if (cname, tp) in seen:
                    raise r.error(f"{path}.name", f"configuration {cname}@tp{tp} appears twice")
                twin = next((f"{n}@tp{t}" for (n, t), k in seen.items() if k == key), None)
                if twin:
                    raise r.error(
                        f"{path}.name", f"{cname}@tp{tp} is the same server configuration as {twin}"
                    )
                seen[(cname, tp)] = key
                out.append(ServerConfig(cname, tp, resolved_args, resolved_env, concs, key, rates,
                                        legacy))  # fmt: skip
    return tuple(out)


def _point_name(template: str, chosen: tuple[tuple[str, ArgValue], ...]) -> str:
    """Return a sweep point's name: ``{flag}`` placeholders filled, else values appended."""
    name = template
    used = False
    for flag, value in chosen:
        token = "{" + flag + "}"
        if token in name:
            name = name.replace(token, str(value))
            used = True
    if chosen and not used:
        name = name + "-" + "-".join(str(v) for _, v in chosen)
    return name
