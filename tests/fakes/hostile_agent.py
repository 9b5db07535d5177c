"""A hostile stand-in for the gpudoctor agent: a REAL process that speaks the start of the
protocol, then misbehaves as a compromised container's agent could.

Run as ``python hostile_agent.py MODE``. It says hello (with its pid), then answers every
request line that carries an ``id`` according to MODE:

* ``endless-line``: writes ``x`` forever, never a newline;
* ``huge-reply``: one well-formed reply of 40 MiB;
* ``flood``: endless 64 KiB lines of valid JSON for ids nobody asked about;
* ``silent``: never answers (sleeps);
* ``extra-key``, ``missing-key``, ``wrong-type``: a stat reply with an unknown key, without
  ``mode``, or with ``mode`` as a string;
* ``endless-hello``: instead of the hello line, an endless line.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

STAT = {
    "path": "/dev/null",
    "kind": "char",
    "mode": 0o666,
    "major": 1,
    "minor": 3,
    "uid": 0,
    "gid": 0,
    "size": 0,
    "mtime": 0.0,
}


def endless(out) -> None:
    block = b"x" * 65536
    while True:
        out.write(block)


def answer(mode: str, req_id: int, out) -> None:
    if mode == "endless-line":
        endless(out)
    if mode == "huge-reply":
        reply = {"id": req_id, "ok": True, "result": "y" * (40 << 20)}
    elif mode == "flood":
        line = (json.dumps({"id": -1, "ok": True, "result": "z" * 65000}) + "\n").encode()
        while True:
            out.write(line)
    elif mode == "silent":
        time.sleep(3600)
        return
    elif mode == "extra-key":
        reply = {"id": req_id, "ok": True, "result": {**STAT, "evil": 1}}
    elif mode == "missing-key":
        reply = {"id": req_id, "ok": True, "result": {k: v for k, v in STAT.items() if k != "mode"}}
    elif mode == "wrong-type":
        reply = {"id": req_id, "ok": True, "result": {**STAT, "mode": "0666"}}
    else:
        raise SystemExit(f"unknown mode {mode}")
    out.write((json.dumps(reply) + "\n").encode())
    out.flush()


def main() -> None:
    mode = sys.argv[1]
    out = sys.stdout.buffer
    if mode == "endless-hello":
        endless(out)
    out.write(
        (json.dumps({"hello": "gpudoctor-agent", "version": 1, "pid": os.getpid()}) + "\n").encode()
    )
    out.flush()
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
        except ValueError:
            continue  # the agent source the client sends first
        if isinstance(request, dict) and "id" in request:
            answer(mode, request["id"], out)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
