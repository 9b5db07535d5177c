#!/usr/bin/env bash
# The multi-GPU checks (issue 8) on a real machine with 2+ GPUs (nvidia-h200-x2/-x4/-x8),
# run from the repo root. Also runs on a 1-GPU machine: then gpu.count PASSes with 1 GPU and
# nccl.p2p / nccl.allreduce SKIP with their reason (that path is worth recording too).
#
#   1. the environment: GPUs, `nvidia-smi topo -m` and `topo -p2p rw` (the driver's own view),
#      torch and its NCCL;
#   2. the raw P2P probe (every ordered GPU pair: peer access, a verified 32 MiB copy, GB/s);
#   3. the raw all-reduce probe (one torch process per GPU, NCCL, multicast OFF);
#   4. `gpudoctor check --only gpu.count,nccl.p2p,nccl.allreduce --deep --json`;
#   5. the same check with NCCL_P2P_DISABLE=1 exported (the workaround path must pass too).
#
# Needs only python3 with torch (the lent image's); gpudoctor's own imports there are click and
# rich. NVLink multicast stays OFF everywhere (the lent machines' rule; the probe forces it
# for its ranks as well). Everything printed is also saved under $OUT: the raw *.jsonl files
# are in the probes' own format, ready to be added to tests/data/multigpu/.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpudoctor-gpu}
mkdir -p "$OUT"
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { printf '\n========== %s ==========\n' "$*"; }

step "1. environment"
date -u; uname -r; python3 --version
nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
echo "GPUs: $NGPU"
nvidia-smi topo -m 2>&1 | tee "$OUT/nvidia-smi-topo-m.txt"
nvidia-smi topo -p2p rw 2>&1 | tee "$OUT/nvidia-smi-topo-p2p-rw.txt"
nvidia-smi nvlink -s 2>&1 | head -40 | tee "$OUT/nvidia-smi-nvlink-s.txt"
python3 - <<'EOF' 2>&1 | tee "$OUT/torch.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())
print("nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
EOF
df -h /dev/shm; grep -i -E 'iommu|acs' /proc/cmdline || echo "(no iommu/acs on the kernel command line)"
env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM|CUDA_VISIBLE)' | sort

step "2. raw P2P probe (python3 -I -S gpudoctor/probes/p2p_probe.py)"
START=$(date +%s%N)
timeout 120 python3 -I -S gpudoctor/probes/p2p_probe.py --size-mib 32 --reps 5 \
  > "$OUT/p2p-raw.jsonl" 2> "$OUT/p2p-raw.stderr"
echo "exit=$? wall=$(( ($(date +%s%N) - START) / 1000000 )) ms"
cat "$OUT/p2p-raw.jsonl"; cat "$OUT/p2p-raw.stderr"

step "3. raw all-reduce probe (python3 gpudoctor/probes/allreduce_probe.py launch)"
if [ "$NGPU" -ge 2 ]; then
  START=$(date +%s%N)
  timeout 200 python3 gpudoctor/probes/allreduce_probe.py launch --world-size "$NGPU" --timeout 180 \
    > "$OUT/allreduce-raw.jsonl" 2> "$OUT/allreduce-raw.stderr"
  echo "exit=$? wall=$(( ($(date +%s%N) - START) / 1000000 )) ms"
  cat "$OUT/allreduce-raw.jsonl"; tail -20 "$OUT/allreduce-raw.stderr"
else
  echo "skipped: $NGPU GPU"
fi

step "4. gpudoctor check --only gpu.count,nccl.p2p,nccl.allreduce --deep --json"
START=$(date +%s%N)
python3 -m gpudoctor check --only gpu.count,nccl.p2p,nccl.allreduce --deep --json \
  --timeout 60 --expect-gpus "$NGPU" > "$OUT/check-deep.json" 2> "$OUT/check-deep.stderr"
echo "exit=$? wall=$(( ($(date +%s%N) - START) / 1000000 )) ms"
cat "$OUT/check-deep.json"; tail -20 "$OUT/check-deep.stderr"
python3 -m gpudoctor check --only gpu.count,nccl.p2p,nccl.allreduce --deep --timeout 60 \
  --expect-gpus "$NGPU" --verbose 2>/dev/null | tee "$OUT/check-deep.txt"

step "5. the same with NCCL_P2P_DISABLE=1 (the workaround nccl.allreduce suggests)"
NCCL_P2P_DISABLE=1 python3 -m gpudoctor check --only nccl.allreduce --deep --json --timeout 60 \
  > "$OUT/check-deep-p2p-disabled.json" 2>/dev/null
echo "exit=$?"
cat "$OUT/check-deep-p2p-disabled.json"
ls /dev/shm | grep -c '^nccl' | sed 's/^/leftover \/dev\/shm\/nccl-* files: /'
