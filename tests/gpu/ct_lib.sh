# Sourced by the tests/gpu scripts that build GPU test CTs (run_incident.sh, hook_ct.sh,
# driver_libs.sh): a minimal rootfs of the CT's own and the config lines every such CT
# starts with (as Proxmox writes a GPU CT with raw lxc.* keys).

ct_rootfs() {  # ct_rootfs ROOTFS [FILE...]: the dirs, usr-merged links and the FILEs of /etc
  local rootfs=$1
  shift
  mkdir -p "$rootfs"/{dev,proc,sys,tmp,root,etc,usr,opt,run,var/tmp}
  for d in bin sbin lib lib64; do ln -s usr/$d "$rootfs/$d"; done
  cp "$@" "$rootfs/etc/"
}

ct_config_head() {  # ct_config_head NAME ROOTFS: print the config lines every test CT has
  cat <<CONF
lxc.uts.name = $1
lxc.rootfs.path = dir:$2
lxc.net.0.type = empty
lxc.apparmor.profile = unconfined
lxc.autodev = 1
lxc.mount.auto = proc:mixed sys:mixed cgroup:mixed
lxc.console.path = none
lxc.tty.max = 0
lxc.pty.max = 0
lxc.init.cmd = /bin/sleep infinity
lxc.cgroup2.devices.deny = a
lxc.cgroup2.devices.allow = c 1:* rwm
lxc.cgroup2.devices.allow = c 5:* rwm
lxc.cgroup2.devices.allow = c 136:* rwm
lxc.cgroup2.devices.allow = c 195:* rwm
CONF
}

ct_nvidia_mounts() {  # ct_nvidia_mounts: print the bind mounts of the NVIDIA nodes (as the seed's CTs)
  cat <<'CONF'
lxc.mount.entry = /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry = /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry = /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry = /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
lxc.mount.entry = /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir
CONF
}

gpu_ct_env() {  # gpu_ct_env: (from the repo root) the carried wheels into /tmp/site, Debian's
  # LXC debs unpacked into /opt/lxcroot, lxc-* wrappers on PATH; exports PYTHONPATH and PATH
  if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/site/.installed ]; then  # run_campaign.sh may have
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.installed
  fi
  export PYTHONPATH="$REPO:/tmp/site"
  mkdir -p /opt/lxcroot
  for f in .deb/*.deb; do dpkg -x "$f" /opt/lxcroot; done
  LXC_LIBS=/opt/lxcroot/usr/lib/x86_64-linux-gnu:/opt/lxcroot/lib/x86_64-linux-gnu
  export PATH="/opt/lxcroot/usr/bin:/opt/lxcroot/usr/sbin:$PATH"
  mkdir -p /usr/lib/x86_64-linux-gnu/lxc/rootfs "$LXCPATH" /run/lock/lxc
  [ -e /usr/share/lxc ] || ln -s /opt/lxcroot/usr/share/lxc /usr/share/lxc
  # LXC's tools find their libraries through this wrapper dir, so that gpudoctor (which runs
  # lxc-start/lxc-attach/lxc-stop itself) needs no special environment.
  mkdir -p /tmp/lxcbin
  for tool in lxc-start lxc-stop lxc-attach lxc-info lxc-ls lxc-execute lxc-wait; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec /opt/lxcroot/usr/bin/%s "$@"\n' "$LXC_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tool" > /tmp/lxcbin/$tool
    chmod +x /tmp/lxcbin/$tool
  done
  export PATH="/tmp/lxcbin:$PATH"
}
