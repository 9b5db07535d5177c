#!/usr/bin/env bash
# Issue 23 on the real GPU: `fix --driver-libs bind` gives a CT the host's driver.
#
# Runs on the lent H200 (root, Ubuntu 24.04, driver 580.159.04 under /usr/local/nvidia, pure
# cgroup v2) from the repo root, with the same .deb/ and .whl/ carry as run_incident.sh:
#   1. a CT whose view of /usr holds NO NVIDIA user-space file (/usr/local/nvidia masked by an
#      empty tmpfs, no libcuda in its ld.so.cache): cuda.init FAILs (libcuda cannot be loaded);
#      `gpudoctor fix --host local --ct drvct --flavor lxc --driver-libs bind --yes` binds the
#      host's driver files (the list read from the host), restarts, runs ldconfig inside; then
#      check PASSes (driver.userspace_match, cuda.init) and torch runs a CUDA kernel inside.
#   2. a CT holding a stand-in copy of libcuda.so.1 / libnvidia-ml.so.1 that claims another
#      version (a real ELF: the host's library under the name libcuda.so.575.51.03, so the
#      version in its path differs): driver.userspace_match FAILs (mismatch), driver.libs_mode
#      WARNs (copy mode); the same fix cures it (the bound dir sorts first for ldconfig).
# Output: stdout and $OUT (JSON reports, the diffs). The coordinator runs it.
set -u
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gpudoctor-gpu}
mkdir -p "$OUT"
cd "$REPO"
LXCPATH=/var/lib/lxc
step() { printf '\n========== %s ==========\n' "$*"; }
. "$REPO/tests/gpu/ct_lib.sh"

step "0. environment"
date -u; uname -r; nvidia-smi -L; cat /proc/driver/nvidia/version
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed
fi
mkdir -p /tmp/site
export PYTHONPATH="$REPO:/tmp/site"
mkdir -p /opt/lxcroot
for f in .deb/*.deb; do dpkg -x "$f" /opt/lxcroot; done
LXC_LIBS=/opt/lxcroot/usr/lib/x86_64-linux-gnu:/opt/lxcroot/lib/x86_64-linux-gnu
mkdir -p /usr/lib/x86_64-linux-gnu/lxc/rootfs "$LXCPATH" /run/lock/lxc /tmp/lxcbin
[ -e /usr/share/lxc ] || ln -s /opt/lxcroot/usr/share/lxc /usr/share/lxc
for tool in lxc-start lxc-stop lxc-attach lxc-info lxc-ls lxc-execute lxc-wait; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec /opt/lxcroot/usr/bin/%s "$@"\n' "$LXC_LIBS" "$tool" > /tmp/lxcbin/$tool
  chmod +x /tmp/lxcbin/$tool
done
export PATH="/tmp/lxcbin:/opt/lxcroot/usr/bin:/opt/lxcroot/usr/sbin:$PATH"
UVM=$(awk '$2=="nvidia-uvm"{print $1}' /proc/devices)
CAPS=$(awk '$2=="nvidia-caps"{print $1}' /proc/devices)
echo "the host's driver files, as gpudoctor reads them:"
python3 -c "
from gpudoctor.facts.driver_files import read_driver_files
from gpudoctor.hosts.local import LocalHost
f = read_driver_files(LocalHost())
print(f.version, f.source, f.error)
for x in f.files: print(' ', x.kind, x.path, '->', x.stable or '(versioned)')"
ldd /usr/local/nvidia/lib64/libcuda.so.1 2>/dev/null || ldd "$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')"
# The CT's /usr is the host's, read-only: the mount point of the bound directory must exist.
mkdir -p /usr/lib/gpudoctor-driver

make_ct() {  # make_ct NAME: a CT that sees no NVIDIA user-space file
  local ct=$1 rootfs="$LXCPATH/$1/rootfs"
  lxc-stop -n "$ct" -P $LXCPATH -k >/dev/null 2>&1; rm -rf "${LXCPATH:?}/$ct"
  ct_rootfs "$rootfs" /etc/passwd /etc/group /etc/hosts
  mkdir -p "$rootfs"/{etc/ld.so.conf.d,stand-in}
  printf 'include /etc/ld.so.conf.d/*.conf\n' > "$rootfs/etc/ld.so.conf"
  printf '/usr/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/stand-in\n' > "$rootfs/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
  ct_config_head "$ct" "$rootfs" > "$LXCPATH/$ct/config"
  cat >> "$LXCPATH/$ct/config" <<CONF
lxc.cgroup2.devices.allow = c $UVM:* rwm
lxc.cgroup2.devices.allow = c $CAPS:* rwm
lxc.mount.entry = /usr usr none rbind,ro 0 0
lxc.mount.entry = tmpfs usr/local/nvidia tmpfs ro,size=1m 0 0
lxc.mount.entry = tmpfs usr/lib/gpudoctor-driver tmpfs rw,mode=755 0 0
lxc.mount.entry = /opt opt none rbind,ro 0 0
lxc.mount.entry = $REPO ${REPO#/} none bind,ro,create=dir 0 0
lxc.mount.entry = /tmp/site tmp/site none bind,ro,create=dir 0 0
lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,size=1g,create=dir 0 0
$(ct_nvidia_mounts)
CONF
  lxc-start -n "$ct" -P $LXCPATH -l DEBUG -o "$OUT/lxc-start-$ct.log" || tail -40 "$OUT/lxc-start-$ct.log"
}
# The interpreter with torch (the H200 image's venv under /opt, bound into the CT), first
# on the CT's PATH; the bound driver directory too (nvidia-smi).
PYBIN=$(dirname "$(command -v python3)")
inside() { local ct=$1; shift; lxc-attach -n "$ct" -P $LXCPATH --clear-env -v PATH="$PYBIN:/usr/lib/gpudoctor-driver:/usr/bin:/bin:/usr/sbin:/sbin" -v PYTHONPATH="$PYTHONPATH" -v HOME=/root -- "$@"; }
torch_kernel() {
  inside "$1" python3 - <<'PY'
import torch
x = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0), "sum", float((x @ x).sum()))
PY
  echo "torch exit=$?"
}

step "1a. CT drvct: no NVIDIA user-space file inside"
make_ct drvct
inside drvct sh -c 'ldconfig; ldconfig -p | grep -c -e libcuda -e libnvidia-ml; ls /usr/local/nvidia; command -v nvidia-smi' || true
inside drvct python3 -m gpudoctor check --json > "$OUT/drvct-before.json"; echo "check exit=$?"
python3 -c "import json;[print(f['check'],f['status'],f['message'][:160]) for f in json.load(open('$OUT/drvct-before.json'))['findings'] if f['check'] in ('cuda.init','driver.userspace_match','nvml.init')]"
step "1b. fix --driver-libs bind (plan, then apply)"
python3 -m gpudoctor fix --host local --ct drvct --flavor lxc --lxcpath $LXCPATH --driver-libs bind --dry-run | tee "$OUT/drvct-plan.txt"
time python3 -m gpudoctor fix --host local --ct drvct --flavor lxc --lxcpath $LXCPATH --driver-libs bind --yes --json > "$OUT/drvct-fix.json"; echo "fix exit=$?"
python3 -c "import json;d=json.load(open('$OUT/drvct-fix.json'));print(d['status'],d['message'])"
step "1c. check inside again, nvidia-smi, torch"
inside drvct python3 -m gpudoctor check; echo "check exit=$?"
inside drvct sh -c 'ls /usr/lib/gpudoctor-driver | head -40; ldconfig -p | grep -e libcuda -e libnvidia-ml'
inside drvct sh -c 'command -v nvidia-smi; nvidia-smi --query-gpu=name,driver_version --format=csv'
torch_kernel drvct
python3 -m gpudoctor check --host local --ct drvct --flavor lxc --only driver.libs_mode; echo "libs_mode exit=$?"

step "2a. CT cpyct: a stand-in copy of the driver claiming 575.51.03"
make_ct cpyct
ROOT2="$LXCPATH/cpyct/rootfs"
HOSTLIB=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')")")
for lib in libcuda libnvidia-ml; do
  cp "$HOSTLIB/$lib.so.$(awk '{for(i=1;i<=NF;i++) if ($i ~ /^[0-9]+\.[0-9]+\.[0-9]+$/) {print $i; exit}}' /proc/driver/nvidia/version)" "$ROOT2/stand-in/$lib.so.575.51.03"
  ln -sf "$lib.so.575.51.03" "$ROOT2/stand-in/$lib.so.1"
done
inside cpyct ldconfig
inside cpyct python3 -m gpudoctor check --json > "$OUT/cpyct-before.json"; echo "check exit=$?"
python3 -c "import json;[print(f['check'],f['status'],f['message'][:200]) for f in json.load(open('$OUT/cpyct-before.json'))['findings'] if f['check'] in ('cuda.init','driver.userspace_match')]"
python3 -m gpudoctor check --host local --ct cpyct --flavor lxc --only driver.libs_mode,cuda.init; echo "libs_mode exit=$?"
step "2b. the same fix cures it"
time python3 -m gpudoctor fix --host local --ct cpyct --flavor lxc --lxcpath $LXCPATH --driver-libs bind --yes --json > "$OUT/cpyct-fix.json"; echo "fix exit=$?"
inside cpyct python3 -m gpudoctor check; echo "check exit=$?"
torch_kernel cpyct

step "3. time to usable after a driver change: one CT restart (bind mode)"
start=$(date +%s.%N); lxc-stop -n drvct -P $LXCPATH -t 10; lxc-start -n drvct -P $LXCPATH
until inside drvct python3 -c "import ctypes;assert ctypes.CDLL('libcuda.so.1').cuInit(0)==0" 2>/dev/null; do sleep 0.1; done
echo "restart -> cuInit ok: $(python3 -c "import time;print(round(time.time()-$start,2))") s"

step "cleanup"
for ct in drvct cpyct; do lxc-stop -n $ct -P $LXCPATH -k; rm -rf "${LXCPATH:?}/$ct"; done
rmdir /usr/lib/gpudoctor-driver 2>/dev/null || true
