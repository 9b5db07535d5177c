# Sourced by tests/gpu/run_incident.sh (step 7; ONLY_HOOK=1 runs only this after step 0):
# a container built the way forum guides build it (issue 21). Its lxc.hook.autodev script
# mknods /dev/nvidia-uvm and /dev/nvidia-uvm-tools with a hard-coded major from an earlier
# boot (OLD_UVM, not today's $UVM) and the config allows only that old major. Shows:
#   7a. the nodes as the CT sees them BEFORE gpudoctor runs (ls -l), and ModifyDeviceFiles;
#   7b. `gpudoctor check` inside: the node facts read before any CUDA/NVML call, and the
#       before/after comparison naming what the driver library (as root) changed;
#   7c. `gpudoctor check --host local --ct hookct --flavor lxc`: names the hook, its line and
#       the stale major;
#   7d. `gpudoctor fix` (dry run, then --yes): comments the hook line out (the hook file is
#       never edited), binds the host's nodes, allows today's major, restarts, re-checks;
#   7e. check inside again and a real CUDA kernel (torch) inside.
# Needs from run_incident.sh: $LXCPATH, $REPO, $OUT, $UVM, $CAPS, PATH with the LXC tools,
# and tests/gpu/ct_lib.sh sourced.
hook_ct() {
  local HCT=hookct OLD_UVM=511
  [ "$UVM" = "$OLD_UVM" ] && OLD_UVM=510
  step "7. a forum-guide CT: an autodev hook mknods nvidia-uvm with the old major $OLD_UVM (today: $UVM)"
  lxc-stop -n $HCT -P $LXCPATH -k >/dev/null 2>&1
  rm -rf "${LXCPATH:?}/$HCT"
  local ROOTFS="$LXCPATH/$HCT/rootfs"
  ct_rootfs "$ROOTFS" /etc/ld.so.cache /etc/passwd /etc/group /etc/hosts
  cat > "$LXCPATH/$HCT/nvidia-nodes.sh" <<HOOK
#!/bin/sh
# from a forum guide: make the uvm nodes (major from the boot this was written on)
mknod -m 666 \${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm c $OLD_UVM 0
mknod -m 666 \${LXC_ROOTFS_MOUNT}/dev/nvidia-uvm-tools c $OLD_UVM 1
HOOK
  chmod 755 "$LXCPATH/$HCT/nvidia-nodes.sh"
  ct_config_head "$HCT" "$ROOTFS" > "$LXCPATH/$HCT/config"
  cat >> "$LXCPATH/$HCT/config" <<CONF
lxc.cgroup2.devices.allow = c $OLD_UVM:* rwm
lxc.hook.autodev = $LXCPATH/$HCT/nvidia-nodes.sh
lxc.mount.entry = /usr usr none rbind,ro 0 0
lxc.mount.entry = /opt opt none rbind,ro 0 0
lxc.mount.entry = $REPO ${REPO#/} none bind,ro,create=dir 0 0
lxc.mount.entry = /tmp/site tmp/site none bind,ro,create=dir 0 0
lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,size=1g,create=dir 0 0
lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry = /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
CONF
  lxc-start -n $HCT -P $LXCPATH -l DEBUG -o "$OUT/7-lxc-start.log" || tail -40 "$OUT/7-lxc-start.log"
  hin() { lxc-attach -n $HCT -P $LXCPATH --clear-env -v PATH="$PATH" -v PYTHONPATH="$PYTHONPATH" -v LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" -v HOME=/root -- "$@"; }

  step "7a. the nodes before gpudoctor runs"
  hin ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia0 /dev/nvidiactl
  grep -i ModifyDeviceFiles /proc/driver/nvidia/params

  step "7b. gpudoctor check inside (as root): facts first, then the probe, then the comparison"
  hin python3 -m gpudoctor check --verbose
  echo "exit=$?"
  hin ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools 2>&1
  echo "(the nodes after the check: what the driver library left)"
  lxc-stop -n $HCT -P $LXCPATH -k; lxc-start -n $HCT -P $LXCPATH   # the hook's nodes again
  hin python3 -m gpudoctor check --json > "$OUT/7b-hook-ct-check.json"
  echo "json exit=$?"
  hin python3 -m gpudoctor check --only device.nodes
  echo "device.nodes alone (no CUDA): exit=$?"

  step "7c. checked from its host: the hook named"
  python3 -m gpudoctor check --host local --ct $HCT --flavor lxc --only device,ct
  echo "exit=$?"

  step "7d. fix: plan, then apply (restart, re-check)"
  python3 -m gpudoctor fix --host local --ct $HCT --flavor lxc --dry-run
  echo "dry-run exit=$?"
  time python3 -m gpudoctor fix --host local --ct $HCT --flavor lxc --yes --json > "$OUT/7d-fix.json"
  echo "fix exit=$?"; cat "$OUT/7d-fix.json" | head -80
  cat "$LXCPATH/$HCT/config"; cat "$LXCPATH/$HCT/nvidia-nodes.sh"

  step "7e. check inside after the fix, and a real CUDA kernel"
  hin ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools
  hin python3 -m gpudoctor check
  echo "exit=$?"
  hin python3 -c "
import torch
x = torch.randn(2048, 2048, device='cuda')
print('torch matmul in the hook CT:', (x @ x).sum().item())
"
  echo "torch exit=$?"
  lxc-stop -n $HCT -P $LXCPATH -k; rm -rf "${LXCPATH:?}/$HCT"
}
