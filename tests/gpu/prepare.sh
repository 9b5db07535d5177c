#!/usr/bin/env bash
# Prepare, on the CPU machine (it reaches the package registries; the lent GPU machine
# reaches nothing), what the tests/gpu scripts carry to the H200:
#   .deb/  Debian 12's LXC debs (unpacked there with dpkg -x; run_incident.sh)
#   .whl/  the Python wheels the GPU image lacks (cp312, manylinux): gpudoctor's SSH/Proxmox
#          dependencies and transformers 5.24 with its serving extra (run_campaign.sh)
# Both folders are git-ignored and named in the device call's `carry`. Idempotent.
#   bash tests/gpu/prepare.sh            # then: du -sh .deb .whl (must stay < 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
mkdir -p .deb .whl
# libapparmor1: lxc-start/lxc-attach link it, and the H200 image does not have it.
for pkg in lxc liblxc1 liblxc-common libapparmor1; do
  ls .deb/"${pkg}"_*.deb >/dev/null 2>&1 || (cd .deb && apt-get download "$pkg")
done
# Versions: the ones this project's own CPU test environment resolves (tests/run.sh), so the
# GPU run uses what CI tested. One version of each (two stop the install there).
wheels=(
  transformers==5.24.0 tokenizers==0.23.3 regex==2026.11.19 typer==0.29.2
  openai==3.60.0 jiter==0.19.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 annotated-doc==0.0.7
  anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 distro
  paramiko==5.1.0 bcrypt==5.0.0 PyNaCl==1.6.2 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  proxmoxer==2.3.0 prometheus_client==0.26.0
  opentelemetry-api==1.45.2 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
)
for spec in "${wheels[@]}"; do
  name=${spec%%==*}
  norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
  if ls .whl/ 2>/dev/null | tr 'A-Z-' 'a-z_' | grep -q "^${norm}-"; then continue; fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$spec"
done
du -sh .deb .whl
