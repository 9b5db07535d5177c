#!/usr/bin/env bash
# The seed's flow on a real GPU inference engine, end to end (issue 16.1), on the lent H200:
#
#   setup     install the carried wheels (.whl/: transformers 5.24 + its serving extra) into
#             /tmp/site; record the machine (GPU, driver, python, torch, transformers)
#   check     preflight: `gpudoctor check` (text + JSON); its latency against a bare cuInit
#             process (benchmarks/check_latency.py -> latency.json)
#   model     generate a Qwen3-architecture model with random bf16 weights, >= 10 GB, and a
#             real-format tokenizer (tests/gpu/make_model.py) into a disk mirror
#   weights   `gpudoctor weights ensure` mirror -> /dev/shm, cold (after drop_caches), then
#             warm (tmpfs copy deleted, page cache kept) and the no-op; then the side-by-side
#             benchmark benchmarks/weights_restore.py (figures beside their limits)
#   matrix    run A of the plan (transformers serve on CUDA: 3 configurations + one that dies
#             at start, concurrency 1..64, input 1024 / output 256): the launcher is SIGKILLed
#             after $KILL_AFTER records, orphans are looked for (nvidia-smi), then it resumes
#             to the end; every cell must be recorded exactly once
#   rerun     run B: the cb-sdpa configuration again (same cell keys) for `bench compare`
#   report    `gpudoctor bench report` of both runs and `bench compare A B`
#   incident  tests/gpu/run_incident.sh (the LXC incident, incl. step 2c: cuInit 304)
#
# Usage (repo root): bash tests/gpu/run_campaign.sh PHASE... (all = setup check model weights
# incident2c matrix wbench rerun report, in one call; or, as run 4 did on one warm machine,
# first = setup check model weights incident2c matrix wbench, then second = what the first
# left + rerun report incident; or prep / matrix / finish). DEADLINE=<epoch s> makes the later phases
# shrink or skip themselves so that the call ends in time (the lease is short). Every phase is idempotent and re-creates what it
# needs when the machine is fresh (model, wheels). Results go to $WORK/results; `pack` tars
# them into $OUT/<name>.tar.gz (the device tool brings back at most 8 files a call).
# Locally, on a CPU (a quick rehearsal of the same code paths):
#   WHEELS=0 DROP_CACHES=0 PY=.venv/bin/python PRESET=tiny DEVICE=cpu CONC="1, 2" IN_LEN=64 OUT_LEN=8 \
#   WEIGHTS_BENCH_ARGS="--total-gb 0.05 --trials 1" bash tests/gpu/run_campaign.sh setup model weights matrix rerun report
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/gpudoctor-campaign-out}
WORK=${WORK:-/var/tmp/gpudoctor-campaign}
PRESET=${PRESET:-qwen3-5b}
DEVICE=${DEVICE:-cuda}
CONC=${CONC:-"1, 4, 16, 64"}
IN_LEN=${IN_LEN:-1024}
OUT_LEN=${OUT_LEN:-256}
KILL_AFTER=${KILL_AFTER:-1}
MATRIX_BUDGET_S=${MATRIX_BUDGET_S:-480}
DROP_CACHES=${DROP_CACHES:-1}             # 0 on a shared dev box
MODEL_ID=gpudoctor/${PRESET}-random
MIRROR=$WORK/mirror
MODEL_DIR=${MODEL_DIR:-/dev/shm/${PRESET}-random}
RES=$WORK/results
RUN_A=$RES/run-a
RUN_B=$RES/run-b
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
# A fresh machine (the last one was given back): carry the results of the previous call back
# in build/gdc-prev/ (an ignored path named in the device call's carry) to resume from them.
if [ ! -d "$RES" ] && [ -d "$REPO/build/gdc-prev/results" ]; then
  cp -a "$REPO/build/gdc-prev/results" "$RES" && echo "restored $RES from build/gdc-prev"
fi
mkdir -p "$RES"
export PYTHONPATH="$REPO:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false COLUMNS=200
export GPUDOCTOR_BENCH_QUIRKS="$RES/local-quirks.toml"
exec > >(tee -a "$RES/campaign.log") 2>&1
step() { printf '\n========== %s (%s) ==========\n' "$*" "$(date -u +%H:%M:%S)"; }
gd() { "$PY" -m gpudoctor "$@"; }
drop_caches() { sync; [ "$DROP_CACHES" = 1 ] && echo 3 > /proc/sys/vm/drop_caches; }
left() { if [ -n "${DEADLINE:-}" ]; then echo $((DEADLINE - $(date +%s))); else echo 100000; fi; }

phase_setup() {
  step "setup"
  if [ "${WHEELS:-1}" = 1 ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.installed ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && touch /tmp/site/.installed
  fi
  {
    date -u; uname -r; nproc; free -g | head -2
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
    "$PY" -c "import sys, transformers; print(sys.version.split()[0], 'transformers', transformers.__version__, transformers.__file__)"
    df -h / /dev/shm | cat
  } | tee "$RES/machine.txt"
}

phase_check() {
  step "check: preflight on the GPU"
  gd check --verbose | tee "$RES/check.txt"
  echo "exit=${PIPESTATUS[0]}"
  gd check --json > "$RES/check.json"
  echo "json exit=$?"
  step "check latency (benchmarks/check_latency.py)"
  "$PY" benchmarks/check_latency.py --runs "${LAT_RUNS:-15}" --json "$RES/latency.json"
}

ensure_model() {
  if [ ! -f "$MIRROR/$MODEL_ID/.gpudoctor-manifest.json" ]; then
    step "model: generate $MODEL_ID ($PRESET) into the mirror $MIRROR"
    rm -rf "${MIRROR:?}/$MODEL_ID"
    "$PY" tests/gpu/make_model.py "$MIRROR" --repo "$MODEL_ID" --preset "$PRESET" \
      --device "$DEVICE" | tee "$RES/model.json"
    du -sh "$MIRROR/$MODEL_ID"; ls -la "$MIRROR/$MODEL_ID"
  fi
}

phase_model() { ensure_model; }

ensure_json() {  # ensure_json LABEL: one `weights ensure` into $MODEL_DIR, its JSON appended
  local started ended
  started=$(date +%s.%N)
  gd weights ensure "$MODEL_ID" --to "$MODEL_DIR" --mirror "$MIRROR" --json > "$RES/ensure-$1.json"
  local rc=$?
  ended=$(date +%s.%N)
  "$PY" - "$1" "$rc" "$started" "$ended" "$RES/ensure-$1.json" <<'PY' | tee -a "$RES/weights.jsonl"
import json, sys
label, rc, t0, t1, path = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
try:
    out = json.load(open(path))
except ValueError:
    out = {}
wall = t1 - t0
size = out.get("bytes_fetched") or out.get("bytes_total")
print(json.dumps({"label": label, "exit": rc, "wall_s": round(wall, 3), "ensure": out,
                  "gb_per_s": round(size / wall / 1e9, 3) if size else None}))
PY
}

phase_weights() {
  ensure_model
  step "weights: gpudoctor weights ensure $MODEL_ID --to $MODEL_DIR --mirror $MIRROR"
  rm -rf "$MODEL_DIR" "$MODEL_DIR.partial"
  drop_caches
  ensure_json cold
  ensure_json noop
  rm -rf "$MODEL_DIR"
  ensure_json warm
  gd weights status "$MODEL_DIR" | tee -a "$RES/weights.txt"
}

phase_wbench() {  # at most min($WEIGHTS_BENCH_S, time left - 70 s); skipped under 100 s
  [ -s "$RES/weights_restore.json" ] && { echo "weights_restore.py: done in an earlier call"; return; }
  ensure_model
  local cap=${WEIGHTS_BENCH_S:-300}
  [ $(($(left) - 70)) -lt "$cap" ] && cap=$(($(left) - 70))
  [ "$cap" -lt 30 ] && { echo "weights_restore.py: skipped, $(left) s left"; return; }
  step "weights: benchmarks/weights_restore.py (side by side, with the limits; cap $cap s)"
  local args
  if grep -q -- "--model-dir" benchmarks/weights_restore.py; then  # reuse the generated model
    args="--model-dir $MIRROR/$MODEL_ID --trials ${WEIGHTS_TRIALS:-1} --json $RES/weights_restore.json"
  else
    args="--total-gb 10 --trials 1 --json"
  fi
  # shellcheck disable=SC2086
  timeout "$cap" "$PY" benchmarks/weights_restore.py ${WEIGHTS_BENCH_ARGS:-$args} \
    > "$RES/weights_restore.txt" 2>&1
  echo "weights_restore exit=$?"; tail -40 "$RES/weights_restore.txt"
}

phase_incident() {  # skipped when less than 150 s are left before $DEADLINE (epoch s), if set
  if [ -n "${DEADLINE:-}" ] && [ $((DEADLINE - $(date +%s))) -lt 150 ]; then
    echo "incident: skipped, $((DEADLINE - $(date +%s))) s left in this call"; return
  fi
  step "incident (tests/gpu/run_incident.sh)"
  local cap=${INCIDENT_S:-240}
  [ -n "${DEADLINE:-}" ] && [ $((DEADLINE - $(date +%s) - 15)) -lt "$cap" ] && cap=$((DEADLINE - $(date +%s) - 15))
  OUT="$RES/incident" timeout "$cap" bash tests/gpu/run_incident.sh > "$RES/incident.log" 2>&1
  echo "incident exit=$?"; grep -A12 "2c\." "$RES/incident.log" | head -30
}

phase_incident2c() {  # step 2c alone (cuInit 304 in a CT without its own /proc): ~10 s
  step "incident step 2c only (tests/gpu/run_incident.sh, ONLY_2C=1)"
  ONLY_2C=1 OUT="$RES/incident" timeout 60 bash tests/gpu/run_incident.sh > "$RES/incident-2c.log" 2>&1
  echo "exit=$?"; tail -25 "$RES/incident-2c.log"
}

write_plan() {  # write_plan FILE NAME CONFIGS_TOML
  cat > "$1" <<TOML
# Written by tests/gpu/run_campaign.sh: transformers serve on one GPU (TP1).
name = "$2"

[model]
repo = "$MODEL_ID"
dir = "$MODEL_DIR"
mirror = "$MIRROR"

[engine]
name = "transformers"
args = { device = "$DEVICE", dtype = "bfloat16", log-level = "info" }
startup_timeout_s = 600
stop_timeout_s = 20

[axes]
tp = [1]
concurrency = [$CONC]

$3

[workload]
input_len = $IN_LEN
output_len = $OUT_LEN
num_prompts = 64
prompts_per_concurrency = 1           # one wave per cell: c requests at concurrency c
warmup = 1
ignore_eos = false                    # transformers serve refuses non-OpenAI fields; the model never emits EOS

[slo]
ttft_ms = 2000
tpot_ms = 100

[preflight]
only = [$PREFLIGHT_ONLY]
expect_gpus = 1
TOML
}

# The crashing configuration comes second: it costs seconds, and a matrix cut short by the
# lease still shows it.
CONFIGS_A='[[configs]]
name = "sdpa"                         # no continuous batching: requests one after another
args = { attn-implementation = "sdpa" }
concurrency = [1]

[[configs]]
name = "fa2-crash"                    # flash-attn is not installed: the server dies at start
args = { attn-implementation = "flash_attention_2" }
concurrency = [1]

[[configs]]
name = "cb-sdpa"                      # continuous batching (paged attention), SDPA kernels
args = { continuous-batching = true, attn-implementation = "sdpa" }'

CONFIGS_B='[[configs]]
name = "cb-sdpa"                      # the same configuration as run A: the same cell keys
args = { continuous-batching = true, attn-implementation = "sdpa" }
concurrency = ['"${RERUN_CONC:-1, 64}"']'

if [ "$DEVICE" = cpu ]; then PREFLIGHT_ONLY='"proc", "shm", "model"'; else PREFLIGHT_ONLY=''; fi

gpu_pids() { nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' | grep -v '^$'; }

phase_matrix() {  # at most $MATRIX_BUDGET_S s (and time left - $MATRIX_RESERVE_S); resumable
  local phase_started
  phase_started=$(date +%s)
  [ $(($(left) - ${MATRIX_RESERVE_S:-145})) -lt "$MATRIX_BUDGET_S" ] && MATRIX_BUDGET_S=$(($(left) - ${MATRIX_RESERVE_S:-145}))
  ensure_model
  mkdir -p "$RUN_A"
  write_plan "$RES/plan-a.toml" h200-transformers "$CONFIGS_A"
  gd bench "$RES/plan-a.toml" --dry-run | tail -30
  local done_before
  done_before=$(cat "$RUN_A/results.jsonl" 2>/dev/null | wc -l)
  if [ "$done_before" -lt "$KILL_AFTER" ]; then
    step "matrix run A: launch, SIGKILL after $KILL_AFTER records"
    setsid "$PY" -m gpudoctor bench "$RES/plan-a.toml" --out "$RUN_A" > "$RES/launch-1.log" 2>&1 &
    local launcher=$! waited=0
    while kill -0 $launcher 2>/dev/null; do
      [ "$(cat "$RUN_A/results.jsonl" 2>/dev/null | wc -l)" -ge "$KILL_AFTER" ] && break
      sleep 1; waited=$((waited + 1))
      [ $waited -ge "$MATRIX_BUDGET_S" ] && break
    done
    echo "records before the kill: $(wc -l < "$RUN_A/results.jsonl")"
    ps -o pid,pgid,cmd --ppid $launcher 2>/dev/null | cut -c1-160
    echo "GPU processes before the kill: $(gpu_pids | tr '\n' ' ')"
    kill -9 $launcher && echo "SIGKILLed the launcher (pid $launcher) at $(date -u +%H:%M:%S)"
    # the guardian (python -m gpudoctor.bench.launch.server --guard) kills the server when the
    # launcher's pipe closes: wait until no GPU process and no server of this run is left
    local orphans="" servers="" t
    for t in $(seq 1 60); do
      orphans=$(gpu_pids); servers=$(pgrep -f "serve $MODEL_DIR|bench.launch.server --guard" | tr '\n' ' ')
      [ -z "$orphans" ] && [ -z "$servers" ] && break
      sleep 0.5
    done
    echo "after the SIGKILL (~$((t / 2)) s): GPU processes: ${orphans:-none}; server/guard processes: ${servers:-none}" | tee "$RES/orphans.txt"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>&1 | tee -a "$RES/orphans.txt"
    tail -5 "$RES/launch-1.log"
  fi
  step "matrix run A: resume to the end"
  local remain=$((MATRIX_BUDGET_S - ($(date +%s) - phase_started)))
  [ $remain -lt 20 ] && remain=20
  timeout "$remain" "$PY" -m gpudoctor bench "$RES/plan-a.toml" --out "$RUN_A" >> "$RES/launch-2.log" 2>&1
  echo "resume exit=$?"; tail -30 "$RES/launch-2.log"
  echo "GPU processes after the run: $(gpu_pids | tr '\n' ' ')" | tee -a "$RES/orphans.txt"
  verify_once "$RUN_A" "$RES/plan-a.toml"
}

verify_once() {  # every cell of the plan recorded exactly once
  "$PY" - "$1" "$2" <<'PY' | tee -a "$RES/verify.txt"
import collections, json, sys
from gpudoctor.bench.plan import load_plan
run, plan = sys.argv[1], load_plan(sys.argv[2])
keys = [json.loads(line)["key"] for line in open(f"{run}/results.jsonl") if line.strip()]
want = {c.key for c in plan.cells()}
dups = [k for k, n in collections.Counter(keys).items() if n > 1]
status = collections.Counter(json.loads(line)["status"] for line in open(f"{run}/results.jsonl") if line.strip())
print(json.dumps({"run": run, "cells": len(want), "records": len(keys), "duplicates": dups,
                  "missing": sorted(want - set(keys)), "status": status}))
PY
}

phase_rerun() {  # skipped under 75 s left
  ensure_model
  [ "$(left)" -lt 75 ] && { echo "run B: skipped, $(left) s left"; return; }
  local cap=${RERUN_BUDGET_S:-300}
  [ $(($(left) - 30)) -lt "$cap" ] && cap=$(($(left) - 30))
  step "run B: cb-sdpa again (the same cells) for bench compare"
  write_plan "$RES/plan-b.toml" h200-transformers-rerun "$CONFIGS_B"
  timeout "$cap" "$PY" -m gpudoctor bench "$RES/plan-b.toml" --out "$RUN_B" > "$RES/launch-b.log" 2>&1
  echo "run B exit=$?"; tail -20 "$RES/launch-b.log"
  verify_once "$RUN_B" "$RES/plan-b.toml"
}

phase_report() {
  step "report and compare"
  for run in "$RUN_A" "$RUN_B"; do
    [ -f "$run/results.jsonl" ] && gd bench report "$run"
  done
  [ -f "$RUN_B/results.jsonl" ] && gd bench compare "$RUN_A" "$RUN_B" | tee "$RES/compare.txt"
  [ -f "$RUN_B/results.jsonl" ] && gd bench compare --json "$RUN_A" "$RUN_B" > "$RES/compare.json"
  "$PY" - "$RUN_A" <<'PY'
import json, sys
for line in open(f"{sys.argv[1]}/results.jsonl"):
    r = json.loads(line)
    m = (r.get("measurement") or {}).get("metrics") or {}
    t = (r.get("measurement") or {}).get("telemetry") or {}
    print(r["config"], r["concurrency"], r["status"], m.get("output_throughput"),
          "telemetry:", sorted(t)[:8])
PY
}

pack() {  # pack NAME: $RES -> $OUT/NAME.tar.gz (raw per-request files included, compressed)
  step "pack $1"
  tar -C "$WORK" -czf "$OUT/$1.tar.gz" results && ls -la "$OUT"
}

for phase in "$@"; do
  case $phase in
    all) for p in setup check model weights incident2c matrix wbench rerun report; do "phase_$p"; done ;;
    # two calls on one warm machine: `first`, then `second` (which also finishes what the
    # first left, and starts over on a fresh machine)
    first) for p in setup check model weights incident2c matrix wbench; do "phase_$p"; done ;;
    second)
      phase_setup  # a fresh machine (the first call's lost): check and weights again
      if [ ! -s "$RES/latency.json" ]; then phase_check; phase_weights; fi
      phase_matrix; phase_wbench; phase_rerun; phase_report; phase_incident ;;
    prep) for p in setup check model weights wbench; do "phase_$p"; done ;;
    finish) phase_rerun; phase_report; phase_incident ;;
    pack:*) pack "${phase#pack:}" ;;
    setup | check | model | weights | wbench | incident | incident2c | matrix | rerun | report) "phase_$phase" ;;
    *) echo "unknown phase $phase" >&2; exit 2 ;;
  esac
done
