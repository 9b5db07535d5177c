"""Speculative decoding's accept length for one cell (SGLang), never the cumulative gauge.

Two sources, in order of preference:

1. per-request ``meta_info.spec_verify_ct`` when the server streams it: accept length
   = sum(completion tokens) / sum(verify steps) over the cell's successful requests
   (SGLang's own per-request ``spec_accept_length`` is completion_tokens / spec_verify_ct);
2. after a successful ``POST /flush_cache`` before the cell (which resets SGLang's
   ``spec_total_num_accepted_tokens`` / ``spec_total_num_forward_ct``), the server's
   ``GET /server_info`` (or ``/get_server_info``) ``internal_states[0].avg_spec_accept_length``
   after the cell, as ``sglang/bench_serving.py`` reads it.

Without either, None: the gauge read without a flush averages over the server's life.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

from gpudoctor.bench.request_record import RequestRecord

# Newer SGLang serves /server_info and deprecates /get_server_info (a warning per call);
# older releases have only /get_server_info (tests/bench/data/sglang-api-contract.toml).
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
MAX_INFO_BYTES = 4 * 1024 * 1024  # a server_info body is a few KiB


def from_records(records: Sequence[RequestRecord]) -> float | None:
    """Return sum(output tokens) / sum(spec_verify_ct) over successful requests, or None.
    The tokens are the server's own count (``usage``, when it sent one) as its verify steps
    are: SGLang's meta_info ratio; else the tokens that arrived."""
    rows = [r for r in records if r.ok and r.spec_verify_ct]
    steps = sum(r.spec_verify_ct or 0 for r in rows)
    tokens = sum(
        r.usage_completion_tokens if r.usage_completion_tokens is not None else r.output_tokens
        for r in rows
    )
    return tokens / steps if steps else None


def from_server_info(info: dict[str, Any]) -> float | None:
    """Return ``avg_spec_accept_length`` from a ``/get_server_info`` body, or None."""
    if isinstance(info.get("decode"), list) and info["decode"]:  # PD disaggregation
        info = info["decode"][0]
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        return float(value) if isinstance(value, (int, float)) else None
    return None


async def flush_cache(client: httpx.AsyncClient, base_url: str, path: str) -> str | None:
    """POST ``base_url + path``; return None on success, else a one-line error."""
    try:
        response = await client.post(base_url.rstrip("/") + path, timeout=60)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.status_code == 200 else f"HTTP {response.status_code}"


async def query_server_info(client: httpx.AsyncClient, base_url: str) -> float | None:
    """Return the server's ``avg_spec_accept_length`` after the cell, or None."""
    for path in SERVER_INFO_PATHS:
        try:
            async with client.stream("GET", base_url.rstrip("/") + path, timeout=30) as response:
                if response.status_code != 200:
                    continue
                body = b""
                async for data in response.aiter_raw():
                    body += data
                    if len(body) > MAX_INFO_BYTES:  # not a server_info body: give up
                        return None
        except httpx.HTTPError:
            return None
        try:
            info = json.loads(body)
        except ValueError:
            return None
        return from_server_info(info) if isinstance(info, dict) else None
    return None
