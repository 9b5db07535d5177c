#!/usr/bin/env bash
# Issue 32 on the real H200: fix finishes what check finds.
#   R1. the autostart race: a CT whose config is right (today's uvm and caps majors allowed,
#       the `bind,optional,create=file` mounts) starts while the host has no /dev/nvidia-uvm
#       (removed here, as after a reboot before the first CUDA use), then the host's nodes
#       come back (mknod, the same numbers). The CT holds empty placeholder files.
#   R2. `gpudoctor check --host local --ct racect --flavor lxc` names it (device.nodes FAIL).
#   R3. `gpudoctor fix --dry-run`: no config line changes, the plan is a restart with its
#       reason (exit 4); then ONE `fix --yes` restarts it and re-checks inside.
#   R4. check inside again and a real CUDA kernel (torch) inside.
#   R5. the forum-guide hook CT (tests/gpu/hook_ct.sh) checked INSIDE as root: the probe drops
#       to nobody, so its stale uvm nodes are still there after the check (issue 32 item 7).
# Runs from the repo root on the lent machine (root, pure cgroup v2), Debian 12's LXC debs in
# .deb/ and wheels in .whl/ (tests/gpu/prepare.sh). Output: stdout and $OUT.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpudoctor-gpu}
mkdir -p "$OUT" /tmp/site
cd "$REPO"
CT=racect
LXCPATH=/var/lib/lxc
step() { printf '\n========== %s ==========\n' "$*"; }
. "$REPO/tests/gpu/ct_lib.sh"
. "$REPO/tests/gpu/hook_ct.sh"

step "0. environment"
date -u; nvidia-smi -L
gpu_ct_env
nvidia-modprobe -u -c=0 || true  # nvidia-uvm loaded, so that it has a major to allow
UVM=$(awk '$2=="nvidia-uvm"{print $1}' /proc/devices)
CAPS=$(awk '$2=="nvidia-caps"{print $1}' /proc/devices)
echo "nvidia-uvm is major $UVM, nvidia-caps is major $CAPS"
ls -l /dev/nvidia*
restore_uvm() {  # the host's uvm nodes as the driver made them (same numbers, mode 0666)
  [ -e /dev/nvidia-uvm ] || mknod -m 666 /dev/nvidia-uvm c "$UVM" 0
  [ -e /dev/nvidia-uvm-tools ] || mknod -m 666 /dev/nvidia-uvm-tools c "$UVM" 1
}
trap restore_uvm EXIT

step "R1. a CT with the right config starts while the host has no /dev/nvidia-uvm"
lxc-stop -n $CT -P $LXCPATH -k >/dev/null 2>&1
rm -rf "${LXCPATH:?}/$CT"
ROOTFS="$LXCPATH/$CT/rootfs"
ct_rootfs "$ROOTFS" /etc/ld.so.cache /etc/passwd /etc/group /etc/hosts
ct_config_head "$CT" "$ROOTFS" > "$LXCPATH/$CT/config"
cat >> "$LXCPATH/$CT/config" <<CONF
lxc.cgroup2.devices.allow = c $UVM:* rwm
lxc.cgroup2.devices.allow = c $CAPS:* rwm
lxc.mount.entry = /usr usr none rbind,ro 0 0
lxc.mount.entry = /opt opt none rbind,ro 0 0
lxc.mount.entry = $REPO ${REPO#/} none bind,ro,create=dir 0 0
lxc.mount.entry = /tmp/site tmp/site none bind,ro,create=dir 0 0
lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,size=8g,create=dir 0 0
$(ct_nvidia_mounts)
CONF
cat "$LXCPATH/$CT/config"
rm -f /dev/nvidia-uvm /dev/nvidia-uvm-tools  # as after a reboot, before the first CUDA use
lxc-start -n $CT -P $LXCPATH -l DEBUG -o "$OUT/race-lxc-start.log" || tail -40 "$OUT/race-lxc-start.log"
restore_uvm  # the host's nodes are back (the first CUDA use on the host would do this)
ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools
rin() { lxc-attach -n $CT -P $LXCPATH --clear-env -v PATH="$PATH" -v PYTHONPATH="$PYTHONPATH" -v LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" -v HOME=/root -- "$@"; }
rin ls -l /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools

step "R2. check from the host names it"
python3 -m gpudoctor check --host local --ct $CT --flavor lxc --only device,cuda.init,ct
echo "check exit=$?"
python3 -m gpudoctor check --host local --ct $CT --flavor lxc --json > "$OUT/R2-check.json"
echo "json exit=$?"

step "R3. fix: the plan is a restart (no config line changes), then one fix --yes"
python3 -m gpudoctor fix --host local --ct $CT --flavor lxc --dry-run
echo "dry-run exit=$? (expect 4: a restart is pending)"
cp "$LXCPATH/$CT/config" "$OUT/R3-config-before"
time python3 -m gpudoctor fix --host local --ct $CT --flavor lxc --yes --json > "$OUT/R3-fix.json"
echo "fix exit=$?"; head -c 6000 "$OUT/R3-fix.json"; echo
cmp "$LXCPATH/$CT/config" "$OUT/R3-config-before" && echo "config unchanged (byte for byte)"
python3 -m gpudoctor fix --host local --ct $CT --flavor lxc --dry-run
echo "second dry-run exit=$? (expect 0: nothing to change)"

step "R4. check inside after the fix, and a real CUDA kernel"
rin ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools
python3 -m gpudoctor check --host local --ct $CT --flavor lxc --only device,cuda.init,nvml.init,ct
echo "check exit=$?"
rin python3 -c "
import torch
x = torch.randn(4096, 4096, device='cuda')
y = (x @ x).sum().item()
torch.cuda.synchronize()
print('torch', torch.__version__, 'in the race CT on', torch.cuda.get_device_name(0), 'matmul sum', y)
"
echo "torch exit=$?"
lxc-stop -n $CT -P $LXCPATH -k; rm -rf "${LXCPATH:?}/$CT"

step "R5. the hook CT checked inside as root keeps its nodes (the probe drops to nobody)"
hook_ct
