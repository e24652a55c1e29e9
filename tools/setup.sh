#!/usr/bin/env bash
# Installs what tpuc needs on Debian bookworm (run as root): the LLVM 22 / MLIR development
# packages for melior, and a Python venv in .venv with torch and the XLA CPU PJRT plugin.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

apt_packages=(libmlir-22-dev mlir-22-tools llvm-22-dev libpolly-22-dev libzstd-dev libclang-dev)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$python" -m venv .venv
fi
# The versions the project is tested with; see shared facts.
if ! .venv/bin/python -c "import torch, numpy, fastatomstruct_xla_cpu, pytest" 2>/dev/null; then
  log "installing Python packages into .venv (torch is large: a few minutes on a first run)"
  .venv/bin/pip install -q --upgrade pip 'setuptools>=77.0.3'
  .venv/bin/pip install -q 'torch==2.15.*' 'fastatomstruct-xla-cpu==2026.6.23' numpy pytest
fi
log "ready"
