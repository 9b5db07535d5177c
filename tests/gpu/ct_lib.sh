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
