"""The data model of a benchmark plan: frozen dataclasses, the matrix of cells, stable keys.

A plan names a model, an engine with the server arguments every cell shares, the axes
(tensor parallel sizes, concurrencies), a list of server configurations (each may sweep
one or more arguments), the workload and the SLOs. Expansion gives one
:class:`ServerConfig` per (configuration, sweep point, tp) and one :class:`Cell` per
(server config, concurrency). Every config and cell has a stable key: a hash of its
resolved contents, so results of different runs can be matched.

It lives beside the plan package, not in it, so that the engines can name these types
without reaching the parser (``plan.parser`` builds these classes and checks engine
names against :data:`gpudoctor.bench.engines.ENGINES`): imports go one way,
plan -> plan.parser -> engines -> plan_model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from gpudoctor.bench.cell_spec import SLO, WorkloadSpec, rate_to_json

ArgValue = str | int | float | bool | tuple[str | int | float, ...]


class PlanError(ValueError):
    """A plan that cannot be used; the message is one line naming file, line and key."""


@dataclass(frozen=True)
class ModelSpec:
    """Which weights the servers load.

    Attributes:
        path: a local model directory (used as is), or None when ``repo`` is set.
        repo: a Hub repository (``org/name``) that ``gpudoctor weights`` ensures into ``dir``.
        revision: branch, tag or commit of ``repo``.
        dir: where ``repo`` lives on this machine (typically tmpfs, ``/dev/shm/NAME``).
        mirror: a persistent mirror root that restores ``dir`` after a reboot.
        served_name: the ``model`` field requests send (default: what the engine serves).
        tokenizer: a local tokenizer directory (default: the model directory).
    """

    path: str | None = None
    repo: str | None = None
    revision: str | None = None
    dir: str | None = None
    mirror: str | None = None
    served_name: str | None = None
    tokenizer: str | None = None

    @property
    def local_dir(self) -> str:
        """Return the directory the server loads (``path``, else ``dir``)."""
        return str(self.path or self.dir)

    @property
    def identity(self) -> str:
        """Return what identifies the weights in keys (``repo@revision`` or the path)."""
        return f"{self.repo}@{self.revision or 'main'}" if self.repo else str(self.path)


@dataclass(frozen=True)
class EngineSpec:
    """The inference engine and what every server of the plan shares.

    Attributes:
        name: ``sglang``, ``vllm`` or ``transformers``.
        python: the interpreter whose environment holds the engine (default: this one).
        args: server arguments shared by all configurations, ``(flag, value)`` pairs,
            flag names without ``--``; ``True`` = bare flag, ``False`` = left out.
        env: environment variables for every server.
        startup_timeout_s: how long a server may take to become ready, in seconds.
        stop_timeout_s: grace between SIGTERM and SIGKILL when stopping a server, seconds.
        command: for ``name = "command"``: the server's argv with ``{model}``, ``{host}``,
            ``{port}``, ``{tp}`` placeholders.
        ready_path: for ``command``: the readiness endpoint (default ``/health``).
        version: for ``command``: the version to record (nothing to ask).
        metrics_path: for ``command``: its Prometheus endpoint (``/metrics``) when it
            serves vLLM's or SGLang's metric names; None = no server signals.
        port_range: ``(low, high)``, inclusive: the loopback ports a server may listen on
            (a firewall's allowed range); None = any free port.
        server_url: a server already running (``http://127.0.0.1:30000``): the launcher
            starts none, checks it answers and measures every cell against it.
    """

    name: str
    python: str | None = None
    args: tuple[tuple[str, ArgValue], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0
    command: tuple[str, ...] = ()
    ready_path: str | None = None
    version: str | None = None
    metrics_path: str | None = None
    port_range: tuple[int, int] | None = None
    server_url: str | None = None


@dataclass(frozen=True)
class Limits:
    """How cells are fitted into the server's context and how long a cell may take.

    Attributes:
        template_overhead: tokens reserved for the chat template / BOS on top of the prompt.
        min_input_len: a cell whose clamped input would be shorter than this is refused.
        request_timeout_s: the longest one request may take (send -> end), seconds.
        cell_timeout_s: the deadline of one cell (warmup + requests), seconds; what is
            not done by then is recorded as ``deadline`` errors.
        keep_text: keep the streamed text in raw records: True / False; None (default)
            = only for speculative configurations (``speculative-*`` args), whose
            multi-token chunks are re-tokenized for the ITL as SGLang's bench_serving.
        max_failed_fraction: a cell with more failed requests than this fraction of its
            requests is recorded ``failed`` (not ``ok``); 0.01 by default.
    """

    template_overhead: int = 32
    min_input_len: int = 16
    request_timeout_s: float = 600.0
    cell_timeout_s: float = 3600.0
    keep_text: bool | None = None
    max_failed_fraction: float = 0.01


@dataclass(frozen=True)
class PreflightSpec:
    """The ``gpudoctor check`` run before the first cell and before each configuration.

    Attributes:
        enabled: run it at all.
        only: check ids or families to run (empty = the whole catalogue).
        expect_gpus: GPUs the campaign needs (default: the largest tp of the plan).
    """

    enabled: bool = True
    only: tuple[str, ...] = ()
    expect_gpus: int | None = None


@dataclass(frozen=True)
class SearchSpec:
    """The ``[search]`` block: find per configuration the highest load that meets the SLO.

    Attributes:
        over: ``request_rate`` (req/s, at the config's largest concurrency) or
            ``concurrency``.
        slo: the SLO a request must meet to be good (default: the plan's ``[slo]``).
        goodput: the fraction of requests that must be good for a load to pass (0..1].
        low, high: the bounds of the bisection.
        tolerance: stop when the passing and failing loads are this close (the axis' units).
    """

    over: str
    slo: SLO | None
    goodput: float
    low: float
    high: float
    tolerance: float


@dataclass(frozen=True)
class HardwareSpec:
    """Which of the host's GPUs the campaign may use (``[hardware]``).

    Attributes:
        gpus: GPU indices (``gpus = [0, 1, 2, 3]``), or None for every GPU.
        count: at most this many GPUs (``gpus = 4``), or None for no cap.
    """

    gpus: tuple[int, ...] | None = None
    count: int | None = None


@dataclass(frozen=True)
class ServerConfig:
    """One server configuration: what one server process runs with.

    Attributes:
        name: the configuration's name (``ddtree-b16``), unique per tp.
        tp: tensor parallel size.
        args: the resolved server arguments (engine args overlaid by the config's).
        env: the resolved environment additions.
        concurrencies: the concurrency sweep run against this server, in order.
        key: stable hash of the resolved configuration (12 hex digits).
        request_rates: the request-rate sweep (req/s, ``inf`` allowed) run at each
            concurrency; ``(None,)`` = no rate axis (the workload's own rate).
        legacy_key: the key as run directories written before issue 45 hold it (without
            the program), "" when it is ``key``.
    """

    name: str
    tp: int
    args: tuple[tuple[str, ArgValue], ...]
    env: tuple[tuple[str, str], ...]
    concurrencies: tuple[int, ...]
    key: str
    request_rates: tuple[float | None, ...] = (None,)
    legacy_key: str = ""  # the key before it named the program (issue 45.2); "" = the same

    @property
    def label(self) -> str:
        """Return ``name@tpN``, the configuration as shown to users."""
        return f"{self.name}@tp{self.tp}"

    def arg(self, flag: str) -> ArgValue | None:
        """Return the value of one resolved argument, or None when not set."""
        return dict(self.args).get(flag)


@dataclass(frozen=True)
class Cell:
    """One measurement: a server configuration at one load (concurrency, request rate).

    Attributes:
        config: the server configuration.
        concurrency: concurrent requests (the cap, in open loop).
        key: stable hash of everything that determines the measurement (16 hex digits).
        request_rate: the cell's request rate from the ``request_rate`` axis or a
            search probe (req/s, ``inf``), None = the workload's own.
        repeat: which run of a repeated cell (0 .. repeats-1).
        group: the key shared by every repeat of the cell (repeat 0's key).
        search: the search this cell is a probe of (``"request_rate"``,
            ``"concurrency"``), None for a matrix cell.
    """

    config: ServerConfig
    concurrency: int
    key: str
    request_rate: float | None = None
    repeat: int = 0
    group: str = ""
    search: str | None = None
    repeated: bool = False  # the plan runs this cell more than once (repeats > 1)


@dataclass(frozen=True)
class Plan:
    """A parsed, validated benchmark plan.

    Attributes:
        name: the campaign's name.
        source: the file it was read from.
        text: the TOML text as given (saved as ``plan.toml`` in the run directory).
        model, engine, workload, slo, limits, preflight: the plan's tables.
        configs: the expanded server configurations, in plan order.
        repeats: how many times each cell runs (``repeats = N``; keys differ per repeat).
        search: the ``[search]`` block (a bisection of the load per configuration) or None.
        hardware: the GPUs the campaign may use (``[hardware]``).
    """

    name: str
    source: str
    text: str
    model: ModelSpec
    engine: EngineSpec
    workload: WorkloadSpec
    slo: SLO | None
    limits: Limits
    preflight: PreflightSpec
    configs: tuple[ServerConfig, ...]
    repeats: int = 1
    search: SearchSpec | None = None
    hardware: HardwareSpec = HardwareSpec()

    def cells(self) -> list[Cell]:
        """Return every cell of the matrix: configs in plan order, concurrencies ascending,
        then request rates in plan order, then repeats (a search's probes are not here:
        :meth:`probe` makes them as the bisection goes)."""
        return [
            self.make_cell(c, n, rate, repeat)
            for c in self.configs
            for n in c.concurrencies
            for rate in c.request_rates
            for repeat in range(self.repeats)
        ]

    def make_cell(
        self, config: ServerConfig, concurrency: int, rate: float | None = None,
        repeat: int = 0, slo: SLO | None = None, search: str | None = None,
    ) -> Cell:  # fmt: skip
        """Return the cell of ``config`` at this load and repeat (``slo``: the SLO that
        goodput is measured against, default the plan's); its key as :func:`cell_key`."""
        slo = slo if slo is not None else self.slo
        group = cell_key(config, concurrency, self.workload, slo, rate)
        key = cell_key(config, concurrency, self.workload, slo, rate, repeat)
        return Cell(config, concurrency, key, rate, repeat, group, search, self.repeats > 1)

    def legacy_cell_key(self, cell: Cell) -> str | None:
        """Return ``cell``'s key as a run directory written before issue 45 holds it (its
        configuration's key without the program), None when it is the same key."""
        if not cell.config.legacy_key:
            return None
        config = dataclasses.replace(cell.config, key=cell.config.legacy_key)
        slo = self.search.slo or self.slo if cell.search and self.search else self.slo
        return cell_key(config, cell.concurrency, self.workload, slo, cell.request_rate,
                        cell.repeat)  # fmt: skip

    def probe(self, config: ServerConfig, value: float) -> Cell:
        """Return the search probe of ``config`` at load ``value`` (a request rate at the
        config's largest concurrency, or a concurrency): an ordinary cell, whose key is
        the matrix cell's at the same load and SLO."""
        assert self.search is not None
        slo = self.search.slo or self.slo
        if self.search.over == "concurrency":
            return self.make_cell(config, int(value), config.request_rates[0], 0, slo,
                                  "concurrency")  # fmt: skip
        return self.make_cell(config, max(config.concurrencies), value, 0, slo, "request_rate")

    @property
    def max_tp(self) -> int:
        """Return the largest tensor parallel size of the plan (GPUs the campaign needs)."""
        return max((c.tp for c in self.configs), default=1)


# ----------------------------------------------------------------------------- keys


def digest(obj: object, length: int) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def config_key(
    engine: str, model: ModelSpec, tp: int, args: tuple[tuple[str, ArgValue], ...], env: tuple,
    program: tuple[str, ...] = (),
) -> str:  # fmt: skip
    """Return the 12-hex-digit key of a resolved server configuration (name-independent).

    ``program``: what the engine runs (:func:`program_identity`); hashed only when set, so
    a plan on the default interpreter keeps the keys (and the runs) it had before."""
    data: dict[str, object] = {
        "engine": engine,
        "model": model.identity,
        "served": model.served_name,
        "tp": tp,
        "args": sorted([k, v] for k, v in args),
        "env": sorted([k, v] for k, v in env),
    }
    if program:
        data["program"] = list(program)
    return digest(data, 12)


def program_identity(engine: EngineSpec) -> tuple[str, ...]:
    """Return what a configuration's server runs, as the plan names it (issue 45.2): the
    ``command`` engine's argv template and declared version, else the plan's
    ``engine.python`` (its interpreter); () for an engine on gpudoctor's own interpreter.
    Two programs never share a configuration key (a crash quirk, ``--resume`` and
    ``compare`` go by it). Host-independent: a shard on another host hashes the same."""
    if engine.command:
        return ("command", *engine.command, f"version={engine.version or ''}")
    if engine.python:
        return ("python", engine.python)
    return ()


# Workload fields added after keys were first recorded: left out of the key while unset,
# so a plan that does not use them keeps the keys (and the resumable runs) it had.
_LATER_WORKLOAD_FIELDS = (
    "prompts_per_concurrency",
    "burstiness",
    "turns",
    "groups",
    "prompts_per_group",
    "system_prompt_len",
    "trace_slowdown",
    "trace_block_size",
)


def workload_identity(workload: WorkloadSpec) -> dict:
    """Return the workload as hashed into cell keys (later fields only when set)."""
    data = dataclasses.asdict(workload)
    for name in _LATER_WORKLOAD_FIELDS:
        if data.get(name) is None:
            data.pop(name, None)
    return data


def cell_key(
    config: ServerConfig, concurrency: int, workload: WorkloadSpec, slo: SLO | None,
    request_rate: float | None = None, repeat: int = 0,
) -> str:  # fmt: skip
    """Return the 16-hex-digit key of a cell: config key + concurrency + workload + SLO
    (+ the request rate of the rate axis and the repeat number, each only when set, so
    a plan without them keeps its keys; repeat 0 is the unrepeated cell's key)."""
    data: dict[str, object] = {
        "config": config.key,
        "concurrency": concurrency,
        "workload": workload_identity(workload),
        "slo": dataclasses.asdict(slo) if slo else None,
    }
    if request_rate is not None:
        data["request_rate"] = rate_to_json(request_rate)
    if repeat:
        data["repeat"] = repeat
    return digest(data, 16)


def load_fields(cell: Cell) -> dict[str, object]:
    """Return what a results.jsonl line adds about a cell's load beyond its concurrency:
    ``request_rate`` (when on the rate axis or a probe), ``repeat`` and ``group`` (when
    repeated), ``search`` (a probe); nothing for a plain matrix cell."""
    out: dict[str, object] = {}
    if cell.request_rate is not None:
        out["request_rate"] = rate_to_json(cell.request_rate)
    if cell.repeated or cell.repeat:
        out["repeat"], out["group"] = cell.repeat, cell.group
    if cell.search:
        out["search"] = cell.search
    return out
