#!/usr/bin/env bash
# No false green on the lent H200 (issue 31): `transformers serve` on CUDA (the tiny Llama),
# one configuration the engine rejects and one good one, in one run directory:
#
#   1. plan check: `[engine] name = "transformers"` with `ignore_eos = true` is refused before
#      any server starts (exit 1, the field and the fix named);
#   2. launch 1, the rejected configuration: the same server through the `command` engine
#      (whose request fields are unknown, so the warmup decides): `transformers serve`
#      answers HTTP 422 "Unexpected fields in the request: {'ignore_eos'}", every cell is
#      FAILED at once with that message, `bench run` exits 3;
#   3. launch 2, the good configuration (`ignore_eos = false`), into the same directory
#      (--resume): ok cells with numbers; the failed cells are kept once (exit 3 again, the
#      run still holds them); `bench status` counts them; the report says which is which.
#
# Usage (repo root, on the GPU machine): bash tests/gpu/failed_cells.sh  (OUT=dir for results)
# Needs transformers with its serving extra: carry .whl (tests/gpu/prepare.sh); installed
# here into /tmp/site when present. Output of a run: docs/gpu/failed-cells/.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/gpudoctor-failed-out}
WORK=${WORK:-/var/tmp/gpudoctor-failed}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$REPO:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false COLUMNS=200
export GPUDOCTOR_BENCH_QUIRKS="$WORK/local-quirks.toml"
exec > >(tee -a "$OUT/failed-cells.log") 2>&1
step() { printf '\n========== %s (%s) ==========\n' "$*" "$(date -u +%H:%M:%S)"; }
fail() { echo "FAILED-CELLS FAIL: $*"; exit 1; }
gd() { "$PY" -m gpudoctor "$@"; }

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.installed ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.installed
fi
step "machine"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv || true
"$PY" -c "import transformers; print('transformers', transformers.__version__)"
"$PY" -c "from tests.support.tiny_llm import make_tiny_model; print(make_tiny_model('$WORK/tiny-llm'))"
TRANSFORMERS=$("$PY" -c "import shutil,sys; print(shutil.which('transformers') or '')")
[ -n "$TRANSFORMERS" ] || TRANSFORMERS=""
RUN=$WORK/run
rm -rf "$RUN"

common() {  # common NAME ENGINE-TABLE IGNORE_EOS CONFIG-NAME
  cat <<TOML
name = "$1"
[model]
path = "$WORK/tiny-llm"
$2
startup_timeout_s = 300
stop_timeout_s = 20
[axes]
tp = [1]
concurrency = [1, 4]
[[configs]]
name = "$4"
[workload]
input_len = 64
output_len = 32
num_prompts = 16
warmup = 1
ignore_eos = $3
[preflight]
enabled = false
TOML
}
SERVE="[\"$PY\", \"-m\", \"transformers.cli.transformers\", \"serve\", \"{model}\", \"--host\", \"{host}\", \"--port\", \"{port}\", \"--device\", \"$DEVICE\"]"
common refused "[engine]
name = \"transformers\"
args = { device = \"$DEVICE\" }" true strict > "$WORK/refused.toml"
common rejected "[engine]
name = \"command\"
command = $SERVE
version = \"transformers-serve\"
env = { HF_HUB_OFFLINE = \"1\" }" true strict-ignore-eos > "$WORK/rejected.toml"
common good "[engine]
name = \"transformers\"
args = { device = \"$DEVICE\" }" false good > "$WORK/good.toml"

step "1. the plan check refuses ignore_eos for transformers (no server starts)"
gd bench run "$WORK/refused.toml" --out "$WORK/refused-run" 2> "$OUT/refused.err"; rc=$?
cat "$OUT/refused.err"; echo "exit=$rc"
[ "$rc" = 1 ] || fail "plan check: exit $rc, expected 1"
grep -q "rejects the request field 'ignore_eos'" "$OUT/refused.err" || fail "plan check: no field named"
[ ! -d "$WORK/refused-run/logs" ] || fail "a server started"

step "2. launch 1: the rejected configuration (HTTP 422 at the warmup)"
gd bench run "$WORK/rejected.toml" --out "$RUN" > "$OUT/launch1.out" 2> "$OUT/launch1.err"; rc=$?
cat "$OUT/launch1.out" "$OUT/launch1.err"; echo "exit=$rc"
[ "$rc" = 3 ] || fail "launch 1: exit $rc, expected 3"
grep -q "FAILED (the server rejected the warmup request (HTTP 422" "$OUT/launch1.err" || fail "no FAILED line with the 422"
gd bench status "$RUN" | tee "$OUT/status.txt"
grep -q "0 done, 2 failed" "$OUT/status.txt" || fail "status does not count the failed cells"

step "3. launch 2: the good configuration, same run directory"
gd bench run "$WORK/good.toml" --out "$RUN" --resume > "$OUT/launch2.out" 2> "$OUT/launch2.err"; rc=$?
cat "$OUT/launch2.out" "$OUT/launch2.err"; echo "exit=$rc"
[ "$rc" = 3 ] || fail "launch 2: exit $rc, expected 3 (the run holds the failed cells)"
"$PY" - "$RUN" <<'PY' | tee "$OUT/cells.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1] + "/results.jsonl")]
for r in rows:
    m = r.get("measurement") or {}
    met = m.get("metrics") or {}
    print(r["label"], "c=%s" % r["concurrency"], r["status"], "| out tok/s", round(met.get("output_throughput") or 0, 1),
          "| TTFT p50 ms", met.get("median_ttft_ms") and round(met["median_ttft_ms"], 2),
          "| audit", json.dumps((m.get("client") or {}).get("audit")), "|", r.get("reason") or "")
bad = [r for r in rows if r["label"].startswith("strict") and r["status"] != "failed"]
good = [r for r in rows if r["label"].startswith("good") and (r["status"] != "ok" or not r["measurement"]["metrics"]["output_throughput"])]
assert len(rows) == 4 and not bad and not good, "unexpected verdicts"
PY
[ "${PIPESTATUS[0]}" = 0 ] || fail "verdicts"
gd bench report "$RUN" --out "$OUT/report" || fail "report"
cp "$RUN/results.jsonl" "$OUT/results.jsonl"
grep -n "Needs attention" -A6 "$OUT/report/report.md"
echo "FAILED-CELLS OK"
