#!/usr/bin/env bash
# The packing scheduler with a real engine on the lent one-GPU H200 (issue 24.4): one slot.
#
#   1. the tiny Llama (tests/support/tiny_llm.py) served by `transformers serve` on CUDA,
#      three configurations x concurrency 1,2,4: `bench run --dry-run` shows the schedule
#      (every configuration on GPU 0, one wave each);
#   2. the launcher runs them through the GPU pool: each server gets
#      CUDA_VISIBLE_DEVICES=<the H200's UUID> (checked in /proc/<pid>/environ while it runs),
#      its slot's telemetry is sampled for that GPU only (records: measurement.telemetry
#      gpus == 1, per_gpu index), `bench status` shows the slot live;
#   3. SIGKILL of the launcher with the server up: no process of the run is left
#      (`nvidia-smi --query-compute-apps` empty of our pids), then the resume runs only the
#      missing cells and every cell is recorded exactly once.
#
# Usage (repo root, on the GPU machine): bash tests/gpu/slot.sh   (OUT=dir for the results)
# Needs transformers with its serving extra: carry .whl (tests/gpu/prepare.sh) and first run
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
# and PY (default python3) able to import gpudoctor. Output of a run: docs/gpu/run-7.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/gpudoctor-slot-out}
WORK=${WORK:-/var/tmp/gpudoctor-slot}
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$REPO:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COLUMNS=200
export GPUDOCTOR_BENCH_QUIRKS="$WORK/local-quirks.toml"
exec > >(tee -a "$OUT/slot.log") 2>&1
step() { printf '\n========== %s (%s) ==========\n' "$*" "$(date -u +%H:%M:%S)"; }
fail() { echo "SLOT FAIL: $*"; exit 1; }
gd() { "$PY" -m gpudoctor "$@"; }

step "machine"
nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv
nvidia-smi topo -m || true
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)

step "model"
"$PY" -c "from tests.support.tiny_llm import make_tiny_model; print(make_tiny_model('$WORK/tiny-llm'))"

PLAN=$WORK/slot.toml
RUN=$WORK/run
rm -rf "$RUN"
cat > "$PLAN" <<TOML
name = "slot"
[model]
path = "$WORK/tiny-llm"
[engine]
name = "transformers"
args = { device = "cuda", log-level = "info" }
startup_timeout_s = 300
stop_timeout_s = 20
[axes]
tp = [1]
concurrency = [1, 2, 4]
[[configs]]
name = "sdpa"
args = { attn-implementation = "sdpa" }
[[configs]]
name = "eager"
args = { attn-implementation = "eager" }
[[configs]]
name = "cb"
args = { continuous-batching = true }
[workload]
input_len = 64
output_len = 64
num_prompts = 16
prompts_per_concurrency = 4
warmup = 1
ignore_eos = false
[preflight]
only = ["driver", "device", "cuda", "nvml", "gpu"]
expect_gpus = 1
TOML

step "dry run: the schedule"
gd bench run "$PLAN" --out "$RUN" --dry-run | tee "$OUT/dry-run.txt"
grep -q "wave 1" "$OUT/dry-run.txt" || fail "no schedule in the dry run"

step "run, SIGKILL with the server up"
# The interpreter itself in the background (not the gd function: $! would be a subshell,
# and SIGKILL of the subshell leaves the launcher running; seen on the H200).
"$PY" -m gpudoctor bench run "$PLAN" --out "$RUN" > "$OUT/run1.log" 2>&1 &
LAUNCHER=$!
for _ in $(seq 1 600); do
  [ -s "$RUN/results.jsonl" ] && [ "$("$PY" -c "import json;print(len(json.load(open('$RUN/state.json'))['running']))" 2>/dev/null)" = 1 ] && break
  sleep 0.5
done
gd bench status "$RUN" | tee "$OUT/status-live.txt"
gd bench status "$RUN" --json > "$OUT/status-live.json"
SPID=$("$PY" -c "import json;print(json.load(open('$RUN/state.json'))['running'][0]['pid'])")
tr '\0' '\n' < "/proc/$SPID/environ" | grep '^CUDA_VISIBLE_DEVICES=' | tee "$OUT/server-env.txt"
grep -qx "CUDA_VISIBLE_DEVICES=$UUID" "$OUT/server-env.txt" || fail "server $SPID did not get CUDA_VISIBLE_DEVICES=$UUID"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$OUT/apps-before.txt"
kill -9 "$LAUNCHER"; wait "$LAUNCHER" 2>/dev/null
left=""
for _ in $(seq 1 60); do
  left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -w "$SPID" || true)
  [ -z "$left" ] && ! kill -0 "$SPID" 2>/dev/null && break
  sleep 0.5
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee "$OUT/apps-after.txt"
[ -z "$left" ] || fail "server $SPID still holds the GPU after the launcher's SIGKILL"
before=$(wc -l < "$RUN/results.jsonl")

step "resume: only the missing cells"
gd bench run "$PLAN" --out "$RUN" --json > "$OUT/resume.json" 2> "$OUT/run2.log" || fail "resume failed"
cat "$OUT/resume.json"
"$PY" - "$RUN" "$before" "$UUID" "$OUT/resume.json" <<'PY' | tee "$OUT/verdict.txt"
import json, sys
run, before, uuid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
summary = json.load(open(sys.argv[4]))
assert summary["already_done"] == before and summary["ok"] + summary["crashed"] == 9 - before, summary
records = [json.loads(x) for x in open(f"{run}/results.jsonl")]
keys = [r["key"] for r in records]
assert len(keys) == len(set(keys)) == 9, f"{len(keys)} records, {len(set(keys))} keys"
for r in records:
    assert r["gpus"] == [uuid] and r["slot"] >= 1, r.get("gpus")
    tele = (r.get("measurement") or {}).get("telemetry") or {}
    if r["status"] == "ok":
        assert tele.get("gpus") == 1, tele
        print(f"{r['config']:<6} c={r['concurrency']}  slot {r['slot']}  GPU {r['gpus'][0]}  "
              f"util mean {tele.get('util_pct', {}).get('mean', 0):.0f} %  "
              f"mem max {tele.get('mem_used_mib', {}).get('max', 0):.0f} MiB  "
              f"power mean {tele.get('power_w', {}).get('mean', 0):.0f} W")
print(f"SLOT OK: {before} cells before the SIGKILL, {9 - before} after the resume, each once")
PY
gd bench status "$RUN" | tee "$OUT/status-final.txt"
gd bench report "$RUN" > /dev/null && cp "$RUN/report.md" "$OUT/report.md"
