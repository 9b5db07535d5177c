#!/usr/bin/env bash
# The incident of DESIGN.md, reproduced, diagnosed and fixed on a real GPU (issue 6).
#
# Runs on the lent H200 machine (root, pure cgroup v2, Ubuntu 24.04) from the repo root, with
# Debian 12's LXC debs carried in .deb/ and missing wheels in .whl/ (tests/gpu/README.md):
#   1. `gpudoctor check --json` on the bare GPU machine: every NVIDIA check PASSes.
#   2. a real LXC container whose cgroup v2 device rules allow 195 and nvidia-caps but NOT
#      nvidia-uvm's major (read from /proc/devices), NVIDIA nodes bind-mounted; `gpudoctor
#      check` INSIDE it: FAIL device.open (EPERM, the uvm major) and cuda.init attributed to it.
#   3. `gpudoctor fix --host local --ct gpuct --flavor lxc --yes`: adds the rule, restarts the CT.
#   4. `gpudoctor check` inside again: all PASS, and a real CUDA kernel (torch) runs inside.
#   7. a CT whose autodev hook mknods the uvm nodes with an old major (tests/gpu/hook_ct.sh).
# Everything it prints is also saved under $OUT (JSON reports, logs).
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpudoctor-gpu}
mkdir -p "$OUT"
cd "$REPO"
CT=gpuct
LXCPATH=/var/lib/lxc
step() { printf '\n========== %s ==========\n' "$*"; }

step "0. environment"
date -u; uname -r; nvidia-smi -L; python3 --version
. "$REPO/tests/gpu/ct_lib.sh"
gpu_ct_env  # wheels into /tmp/site, the LXC debs unpacked, lxc-* wrappers on PATH
lxc-start --version
grep -E 'nvidia' /proc/devices
ls -l /dev/nvidia* /dev/nvidia-caps 2>/dev/null
mount | grep -E ' /sys/fs/cgroup ' || true

step_2c() {
  step "2c. a container without its own /proc (proc:rw missing): cuInit 304"
  cat > /tmp/noproc.conf <<CONF
lxc.uts.name = noproc
lxc.net.0.type = empty
lxc.apparmor.profile = unconfined
lxc.autodev = 0
lxc.console.path = none
lxc.tty.max = 0
lxc.pty.max = 0
lxc.cgroup2.devices.deny = a
lxc.cgroup2.devices.allow = c 1:* rwm
lxc.cgroup2.devices.allow = c 195:* rwm
lxc.cgroup2.devices.allow = c $UVM:* rwm
lxc.cgroup2.devices.allow = c $CAPS:* rwm
CONF
  mkdir -p $LXCPATH/noproc
  # LXC clears the environment of what it runs: a bare `python3` inside is then found on the
  # default PATH (/usr/bin/python3, the system's, without click: "No module named 'click'").
  # Run the very interpreter used here, by its absolute path, with this PATH/PYTHONPATH and the
  # driver's LD_LIBRARY_PATH.
  PY=$(command -v python3)
  lxc-execute -n noproc -P $LXCPATH -f /tmp/noproc.conf -- /usr/bin/env PATH="$PATH" \
    PYTHONPATH="$PYTHONPATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" HOME=/root \
    "$PY" -m gpudoctor check --only proc,cuda.init 2>&1 | tee "$OUT/2c-noproc.txt"
  echo "exit=${PIPESTATUS[0]}"
}

UVM=$(awk '$2=="nvidia-uvm"{print $1}' /proc/devices)
CAPS=$(awk '$2=="nvidia-caps"{print $1}' /proc/devices)
if [ "${ONLY_2C:-0}" = 1 ]; then  # tests/gpu/run_campaign.sh, when the lease is short
  step_2c
  exit 0
fi
. "$REPO/tests/gpu/hook_ct.sh"
if [ "${ONLY_HOOK:-0}" = 1 ]; then  # the forum-guide hook CT alone (issue 21)
  mkdir -p /tmp/site
  hook_ct
  exit 0
fi

step "1. gpudoctor check on the bare GPU machine"
python3 -m gpudoctor check --verbose
echo "exit=$?"
python3 -m gpudoctor check --json > "$OUT/1-host-check.json"
echo "json exit=$?"
python3 -I -S gpudoctor/probes/gpu_probe.py > "$OUT/probe-raw.jsonl"; cat "$OUT/probe-raw.jsonl"

step "2. a Proxmox-like GPU container whose rules omit nvidia-uvm's major"
echo "nvidia-uvm is major $UVM, nvidia-caps is major $CAPS"
lxc-stop -n $CT -P $LXCPATH -k >/dev/null 2>&1
rm -rf "${LXCPATH:?}/$CT"
ROOTFS="$LXCPATH/$CT/rootfs"
# A minimal rootfs of its own (as a Proxmox CT has), with /dev made by LXC (autodev), the
# NVIDIA nodes bind-mounted in by lxc.mount.entry, and the host's user space (python, torch,
# the driver's libraries under /usr/local/nvidia) bind-mounted read-only.
ct_rootfs "$ROOTFS" /etc/ld.so.cache /etc/passwd /etc/group /etc/hosts
{ echo "# GPU container as Proxmox writes it for NVIDIA passthrough (raw lxc.* keys)"
  ct_config_head "$CT" "$ROOTFS"; } > "$LXCPATH/$CT/config"
cat >> "$LXCPATH/$CT/config" <<CONF
lxc.cgroup2.devices.allow = c $CAPS:* rwm
lxc.mount.entry = /usr usr none rbind,ro 0 0
lxc.mount.entry = /opt opt none rbind,ro 0 0
lxc.mount.entry = $REPO ${REPO#/} none bind,ro,create=dir 0 0
lxc.mount.entry = /tmp/site tmp/site none bind,ro,create=dir 0 0
lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,size=8g,create=dir 0 0
$(ct_nvidia_mounts)
CONF
mkdir -p /tmp/site
cat "$LXCPATH/$CT/config"
lxc-start -n $CT -P $LXCPATH -l DEBUG -o "$OUT/lxc-start.log" || { tail -60 "$OUT/lxc-start.log"; }
lxc-info -n $CT -P $LXCPATH
grep -i -m3 -e "pure cgroup2" -e "legacy cgroup" "$OUT/lxc-start.log" || true
inside() { lxc-attach -n $CT -P $LXCPATH --clear-env -v PATH="$PATH" -v PYTHONPATH="$PYTHONPATH" -v LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" -v HOME=/root -- "$@"; }
inside ls -l /dev/ /dev/nvidia-caps
inside python3 -c "import os; fd=os.open('/dev/nvidia-uvm', os.O_RDWR)" ; echo "open(/dev/nvidia-uvm) exit=$?"
inside python3 -m gpudoctor check
echo "exit=$?"
inside python3 -m gpudoctor check --json > "$OUT/2-ct-denied.json"
step "2b. the same CT checked from its host: gpudoctor check --host local --ct $CT --flavor lxc"
python3 -m gpudoctor check --host local --ct $CT --flavor lxc --only device,cuda.init,ct
echo "exit=$?"

step_2c

step "3. gpudoctor fix --host local --ct $CT --flavor lxc --yes"
python3 -m gpudoctor fix --host local --ct $CT --flavor lxc --dry-run
echo "dry-run exit=$?"
time python3 -m gpudoctor fix --host local --ct $CT --flavor lxc --yes
echo "fix exit=$?"
cat "$LXCPATH/$CT/config"
python3 -m gpudoctor fix --host local --ct $CT --flavor lxc --yes
echo "second fix exit=$? (expect: nothing to change)"

step "4. gpudoctor check inside again, and a real CUDA kernel inside"
inside python3 -m gpudoctor check
echo "exit=$?"
python3 -m gpudoctor check --host local --ct $CT --flavor lxc --only device,cuda.init,ct
echo "check from the host: exit=$?"
inside python3 -m gpudoctor check --json > "$OUT/4-ct-fixed.json"
inside python3 -c "
import torch
x = torch.randn(4096, 4096, device='cuda')
y = (x @ x).sum().item()
torch.cuda.synchronize()
print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0), 'matmul sum', y)
"
echo "torch exit=$?"

step "4b. bench telemetry: NVML sampled while a real CUDA load runs (GpuSampler)"
python3 - <<'PY'
import json, time
import torch
from gpudoctor.bench.load.telemetry import GpuSampler
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
with GpuSampler(interval_s=0.1) as sampler:
    end = time.time() + 3
    while time.time() < end:
        y = x @ x
    torch.cuda.synchronize()
print(json.dumps(sampler.summary(), indent=1, sort_keys=True))
PY

step "5. check latency on the GPU (benchmarks/check_latency.py)"
python3 benchmarks/check_latency.py --runs 15 --json "$OUT/latency.json"

step "6. multi-GPU checks (single GPU: SKIP paths)"
[ -x tests/gpu/multigpu.sh ] && bash tests/gpu/multigpu.sh

hook_ct

step "cleanup"
lxc-stop -n $CT -P $LXCPATH -k; rm -rf "$LXCPATH/$CT"
