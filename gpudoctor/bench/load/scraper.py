"""Scrape the engine's Prometheus ``/metrics`` during a cell; summarize the signals.

``with MetricsScraper(url) as s: ...`` GETs ``url`` every ``interval_s`` in a daemon
thread (``curl -s URL`` in a loop), parses the text with ``prometheus_client``'s own
parser and keeps only the samples the signals read (:mod:`signal_names`). ``summary()``
turns them into one entry per signal: ``{"available": True, ...}`` with its figures, or
``{"available": False, "why": ...}``: a signal the server does not export is never 0.

A gauge (running, waiting, KV usage) is a measurement of the cell only from the scrapes
taken while its requests were in flight (``summary(busy=...)``): a cell shorter than the
scrape interval may see an idle server at every scrape, and then the gauge says so
instead of a 0. The first scrapes come quicker (:data:`RAMP_S`) so that a short cell is
still seen under load.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpudoctor.bench.load.signal_names import DIALECTS, SIGNALS, dialect_of_text, wanted_names

MAX_BODY = 8 << 20  # bytes of one /metrics reply read at most (vLLM's is ~100 KiB)
SERIES_POINTS = 120  # samples kept per gauge's series in the record (evenly thinned)
# gauges that are fractions or means: averaged over label sets (engines, DP ranks); the
# other gauges (request counts) are summed
_AVERAGED = {"kv_cache_usage", "prefix_cache_hit_rate", "spec_accept_length"}

# the waits before the first scrapes after the first (then ``interval_s``): a cell shorter
# than the interval is still scraped while under load
RAMP_S = (0.1, 0.2, 0.4)

Sample = tuple[float, dict[str, Any]]  # (seconds after start, name -> value | {pos: value})


def parse_samples(
    text: str, keep: frozenset[str] | None = None
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Return ``name -> [(labels, value), ...]`` of a Prometheus text exposition (only
    ``keep``'s names when given); raise ValueError on text that is not one."""
    from prometheus_client.parser import text_string_to_metric_families

    if keep is not None:  # only the wanted samples' lines reach the parser: ~20x less CPU
        prefixes = tuple(keep)
        text = "".join(line + "\n" for line in text.splitlines() if line.startswith(prefixes))
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if keep is None or sample.name in keep:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def reduce_samples(
    parsed: dict[str, list[tuple[dict[str, str], float]]], dialect: str
) -> dict[str, Any]:
    """Return one value per wanted name: label sets summed (counters, request counts) or
    averaged (fractions); a per-position counter becomes ``{position: value}``."""
    averaged = {DIALECTS[dialect][s].name for s in _AVERAGED if s in DIALECTS[dialect]}
    out: dict[str, Any] = {}
    for name, rows in parsed.items():
        if any("position" in labels for labels, _ in rows):
            per: dict[str, float] = {}
            for labels, value in rows:
                pos = labels.get("position", "?")
                per[pos] = per.get(pos, 0.0) + value
            out[name] = per
        elif name in averaged:
            out[name] = statistics.fmean(v for _, v in rows)
        else:
            out[name] = sum(v for _, v in rows)
    return out


class Fetcher:
    """GETs one URL over a kept-alive connection (stdlib ``http.client``: a scrape costs
    a fraction of a millisecond of CPU, where a full HTTP client costs several); the
    reply is read up to :data:`MAX_BODY` bytes. ``with Fetcher(url, timeout) as f:
    f.get()`` (``curl -s URL``)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        self.url, self.timeout_s = url, timeout_s
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._conn: Any = None

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()

    def get(self) -> bytes:
        """Return the body of ``GET url``; raise RuntimeError on a status other than 200
        or a body over the cap, OSError/HTTPException on a broken connection (closed, so
        the next call opens a new one)."""
        import http.client

        if self._conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = kind(self.host, self.port, timeout=self.timeout_s)
        try:
            self._conn.request("GET", self.path, headers={"Accept": "text/plain"})
            reply = self._conn.getresponse()
            body = reply.read(MAX_BODY + 1)
            if reply.will_close:
                self._conn.close()
                self._conn = None
        except (OSError, http.client.HTTPException):
            self._conn.close()
            self._conn = None
            raise
        if reply.status != 200:
            raise RuntimeError(f"GET {self.url}: HTTP {reply.status}")
        if len(body) > MAX_BODY:
            self._conn = self._conn and self._conn.close()
            raise RuntimeError(f"GET {self.url}: reply over {MAX_BODY} bytes")
        return body


class MetricsScraper:
    """Scrapes ``url`` every ``interval_s`` seconds while in use; thread CPU time is
    counted in ``cpu_s`` (what the scrape costs the client)."""

    def __init__(self, url: str | None, interval_s: float = 1.0, why_none: str = "") -> None:
        self.url = url
        self.interval_s = interval_s
        self.why_none = why_none or "the engine serves no /metrics"
        self.samples: list[Sample] = []
        self.answered: list[float] = []  # per sample: when its reply had been read (s after t0)
        self.dialect: str | None = None
        self.scrapes = 0
        self.failures: list[str] = []
        self.cpu_s = 0.0
        self._keep: frozenset[str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = time.perf_counter()  # the origin of the samples' times

    def __enter__(self) -> MetricsScraper:
        if self.url:
            import http.client  # noqa: F401 - imported once here, not inside a timed scrape

            import prometheus_client.parser  # noqa: F401

            self.t0 = time.perf_counter()
            self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10)

    def waits(self) -> list[float]:
        """Return the waits (seconds) between the first scrapes: :data:`RAMP_S` below the
        interval, then the interval itself (repeated from there on)."""
        return [w for w in RAMP_S if w < self.interval_s] + [self.interval_s]

    def _loop(self) -> None:
        waits = self.waits()
        with Fetcher(self.url or "", max(self.interval_s, 2.0)) as fetcher:
            for step in itertools.count():
                self.scrape_once(fetcher, time.perf_counter() - self.t0)
                if self._stop.wait(waits[min(step, len(waits) - 1)]):
                    break
            self.scrape_once(fetcher, time.perf_counter() - self.t0)  # the last counters

    def scrape_once(self, fetcher: Fetcher, t: float) -> None:
        """GET the URL once and keep its wanted samples at time ``t`` (seconds); a failure
        is counted with its reason, never raised."""
        cpu0 = time.thread_time()
        try:
            self._scrape(fetcher, t)
        except Exception as exc:  # a hostile or broken server: say so, go on
            self.failures.append(f"{type(exc).__name__}: {exc}"[:200])
        finally:
            self.scrapes += 1
            self.cpu_s += time.thread_time() - cpu0

    def _scrape(self, fetcher: Fetcher, t: float) -> None:
        body = fetcher.get()
        text = body.decode("utf-8", "replace")
        if self.dialect is None:
            self.dialect = dialect_of_text(text)
            if self.dialect is None:
                raise RuntimeError(f"{self.url} serves neither vllm: nor sglang: metrics")
            self._keep = wanted_names(self.dialect)
        parsed = parse_samples(text, self._keep)
        self.samples.append((t, reduce_samples(parsed, self.dialect)))
        self.answered.append(time.perf_counter() - self.t0)

    def summary(self, busy: Sequence[tuple[float, float]] | None = None) -> dict[str, Any]:
        """Return ``{"url", "dialect", "interval_s", "scrapes", "failed", "first_error",
        "cpu_s", "signals": {signal: {...}}}`` (see :func:`summarize`).

        ``busy``: the ``(start, end)`` ``time.perf_counter()`` seconds of each request;
        gauges are then stated only from the scrapes asked and answered while requests
        were in flight (from the GET's start to the reply's end)."""
        why = self._why_unavailable()
        samples = self.samples[: len(self.answered)]  # a thread given up on may be mid-append
        loaded = None
        if busy is not None:
            spans = _union([(a - self.t0, b - self.t0) for a, b in busy])
            loaded = [
                _within(t, end, spans)
                for (t, _), end in zip(samples, self.answered[: len(samples)], strict=True)
            ]
        return {
            "url": self.url,
            "dialect": self.dialect,
            "interval_s": self.interval_s,
            "scrapes": self.scrapes,
            "failed": len(self.failures),
            "first_error": self.failures[0] if self.failures else None,
            "cpu_s": round(self.cpu_s, 6),
            "signals": summarize(samples, self.dialect, why, loaded),
        }

    def _why_unavailable(self) -> str | None:
        if not self.url:
            return self.why_none
        if not self.samples:
            return self.failures[0] if self.failures else "no scrape finished during the cell"
        return None


def summarize(
    samples: Sequence[Sample],
    dialect: str | None,
    why: str | None,
    loaded: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """Return one entry per signal of :data:`SIGNALS`: ``{"available": False, "why"}``
    when the server did not export it, else ``{"available": True, "value", ...}``
    (gauges add ``mean``/``max``/``series`` [[s, value], ...]; a histogram ``{position:
    fraction}``). ``loaded``: per sample, whether it was scraped while requests were in
    flight; a gauge's figures then come from those samples only (its series keeps every
    sample), and a gauge that no such sample saw is not available: the cell was shorter
    than the scrape interval. None: every sample counts."""
    out: dict[str, Any] = {}
    for signal in SIGNALS:
        if why is not None or dialect is None:
            out[signal] = {"available": False, "why": why or "no dialect recognised"}
            continue
        source = DIALECTS[dialect].get(signal)
        if source is None:
            out[signal] = {"available": False, "why": f"{dialect} exports no such metric"}
            continue
        out[signal] = _one(samples, source, loaded)
    return out


def busy_spans(
    records: Sequence[Any], duration_s: float, end: float | None = None
) -> list[tuple[float, float]]:
    """Return each request's ``(send, over)`` in ``time.perf_counter()`` seconds, for
    :meth:`MetricsScraper.summary`: ``records`` (RequestRecords: ``send_s`` after the
    load's start, ``wall_s`` after the send) of a load that took ``duration_s`` and ended
    at ``end`` (perf_counter, default now). A request never sent (no ``wall_s``) is left out."""
    start = (time.perf_counter() if end is None else end) - duration_s
    return [(start + r.send_s, start + r.send_s + r.wall_s) for r in records
            if r.wall_s is not None]  # fmt: skip


def _union(spans: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Return the union of ``spans`` as sorted, disjoint (starts, ends)."""
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted(spans):
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def _within(start: float, end: float, spans: tuple[list[float], list[float]]) -> bool:
    """Return True when ``[start, end]`` lies inside one of the disjoint ``spans``."""
    starts, ends = spans
    i = bisect.bisect_right(starts, start) - 1
    return i >= 0 and end <= ends[i]


def _finite(value: Any) -> bool:
    """Return True for a finite number (a label set the signal does not expect, such as a
    ``position`` on a plain counter, gives a dict; NaN or Inf is no figure)."""
    return isinstance(value, float | int) and not isinstance(value, bool) and math.isfinite(value)


def _fits(value: Any, per_position: bool) -> bool:
    if per_position:
        return isinstance(value, dict) and all(_finite(v) for v in value.values())
    return _finite(value)


def _one(samples: Sequence[Sample], source: Any, loaded: Sequence[bool] | None) -> dict[str, Any]:
    # each value type-checked: a sample the signal cannot read is dropped, never a crash
    per_position = source.kind == "per_position"
    flags = [True] * len(samples) if loaded is None else loaded
    rows = [
        (t, v[source.name], f)
        for (t, v), f in zip(samples, flags, strict=True)
        if _fits(v.get(source.name), per_position)
    ]
    if not rows:
        served = any(source.name in v for _, v in samples)
        why = "served with no finite value of its kind" if served else "not served"
        return {"available": False, "why": f"{source.name} {why}"}
    if source.kind == "gauge":
        values = [v for _, v, under_load in rows if under_load]
        step = max(1, len(rows) // SERIES_POINTS)
        series = [[round(t, 3), v] for t, v, _ in rows[::step]]
        if not values:  # the series stays: what the server said, for the trace's timeline
            return {"available": False, "why": f"cell shorter than the scrape interval: none of"
                    f" the {len(rows)} scrapes fell while requests were in flight",
                    "series": series}  # fmt: skip
        entry = {"available": True, "value": statistics.fmean(values), "mean": statistics.fmean(values),
                 "max": max(values), "last": values[-1], "series": series, "source": source.name}  # fmt: skip
        if loaded is not None:
            entry["loaded_scrapes"] = len(values)
        return entry
    first, last = rows[0][1], rows[-1][1]
    if source.kind == "counter_delta":
        return {"available": True, "value": last - first, "source": source.name}
    dens = [(t, v[source.denominator]) for t, v in samples if _finite(v.get(source.denominator))]
    if not dens:
        return {"available": False, "why": f"{source.denominator} not served"}
    den = dens[-1][1] - dens[0][1]
    if den <= 0:
        what = "drafts" if "spec" in source.name else "queries"
        return {"available": False, "why": f"no {what} during the cell ({source.denominator})"}
    if source.kind == "ratio_delta":
        return {"available": True, "value": (last - first) / den, "source": source.name}
    if source.kind == "accept_len":
        return {"available": True, "value": 1 + (last - first) / den, "source": source.name}
    per = {p: (last.get(p, 0.0) - first.get(p, 0.0)) / den for p in sorted(last, key=_pos_key)}
    return {"available": True, "value": per, "source": source.name}


def _pos_key(position: str) -> tuple[int, str]:
    return (int(position), "") if position.isdigit() else (1 << 30, position)
