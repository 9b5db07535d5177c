#!/usr/bin/env bash
# Issue 38 on the lent H200: one `transformers serve` campaign (CUDA) with the request
# timeline (RUN/trace/<cell>.json) and the server signals scraped from /metrics during
# each cell. transformers serve 5.24.0 serves no /metrics, so every signal must read
# "not available" with the server's own answer (HTTP 404) as the reason, never 0.
#
# Usage (repo root, on the device): bash tests/gpu/signals_campaign.sh
# Carry: .whl/ (transformers 5.24 + serving deps and prometheus_client: tests/gpu/prepare.sh). Locally on a CPU: WHEELS=0 DEVICE=cpu PY=.venv/bin/python bash ...
# Output in $OUT: signals-h200.tar.gz (results, traces, report.md/html), table.txt, report.md.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/gpudoctor-signals-out}
WORK=${WORK:-/var/tmp/gpudoctor-signals}
PRESET=${PRESET:-tiny}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
MODEL_ID=gpudoctor/${PRESET}-random
MIRROR=$WORK/mirror
MODEL_DIR=/dev/shm/${PRESET}-random-signals
RUN=$WORK/run
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$REPO:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false COLUMNS=200
gd() { "$PY" -m gpudoctor "$@"; }
if [ "${WHEELS:-1}" = 1 ] && [ ! -e /tmp/site/.signals ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.signals
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$WORK/machine.txt"
if [ ! -f "$MIRROR/$MODEL_ID/.gpudoctor-manifest.json" ]; then
  "$PY" tests/gpu/make_model.py "$MIRROR" --repo "$MODEL_ID" --preset "$PRESET" --device "$DEVICE"
fi
gd weights ensure "$MODEL_ID" --to "$MODEL_DIR" --mirror "$MIRROR" || exit 1
cat > "$WORK/plan.toml" <<TOML
# Written by tests/gpu/signals_campaign.sh (issue 38).
name = "h200-signals"
[model]
repo = "$MODEL_ID"
dir = "$MODEL_DIR"
mirror = "$MIRROR"
[engine]
name = "transformers"
args = { device = "$DEVICE", dtype = "bfloat16", log-level = "info" }
startup_timeout_s = 300
stop_timeout_s = 20
[axes]
concurrency = [1, 8, 32]
[[configs]]
name = "cb"
args = { continuous-batching = true, attn-implementation = "sdpa" }
[workload]
input_len = 256
output_len = 64
num_prompts = 96
warmup = 1
ignore_eos = false
[preflight]
enabled = false
TOML
rm -rf "$RUN"
timeout 300 "$PY" -m gpudoctor bench "$WORK/plan.toml" --out "$RUN" 2>&1 | tail -25 | tee "$WORK/table.txt"
gd bench report "$RUN" | tail -5
gd bench compare "$RUN" "$RUN" > "$WORK/compare.txt" 2>&1
"$PY" - "$RUN" <<'PY' | tee "$WORK/signals.txt"
import json, sys, pathlib
run = pathlib.Path(sys.argv[1])
for line in (run / "results.jsonl").read_text().splitlines():
    r = json.loads(line)
    m = r.get("measurement") or {}
    s = m.get("server_signals") or {}
    print(r.get("config"), r.get("concurrency"), r.get("status"), "scrapes", s.get("scrapes"),
          "failed", s.get("failed"), "first_error", s.get("first_error"), "scraper_cpu_s", s.get("cpu_s"),
          "client_cpu_s", (m.get("client") or {}).get("cpu_s"))
    for name, e in (s.get("signals") or {}).items():
        print("   ", name, e)
for t in sorted((run / "trace").glob("*.json")):
    d = json.loads(t.read_text())
    print(t.name, t.stat().st_size, "bytes", d["metadata"], "events", len(d["traceEvents"]),
          "request ids", sorted({e["args"].get("request_id") for e in d["traceEvents"]
                                 if e.get("cat") == "request"})[:3])
PY
cp "$WORK/table.txt" "$WORK/signals.txt" "$RUN/report.md" "$OUT/" 2>/dev/null
tar -czf "$OUT/signals-h200.tar.gz" -C "$WORK" run/results.jsonl run/trace run/report.md run/report.html \
  plan.toml table.txt signals.txt compare.txt machine.txt 2>/dev/null
ls -la "$OUT"
