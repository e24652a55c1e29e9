#!/usr/bin/env bash
# Builds tpuc's wheel into dist/: Linux x86-64, abi3 (CPython 3.11 and later), holding the
# `tpuc` package (the torch.compile backend and the tpuc device), the extension with LLVM/MLIR
# linked in statically, and the `tpuc` command. Installs with `pip install dist/tpuc-*.whl` into
# any venv that has torch, on a machine without the LLVM/MLIR packages: this script checks that
# the extension loads nothing beyond the C and C++ runtimes (ldd).
# Usage: tools/build_wheel.sh [--out DIR]   (setup, as tools/setup.sh, included)
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist
if [ "${1:-}" = "--out" ]; then out=$2; fi

tools/setup.sh
log() { printf '[wheel] %s\n' "$*" >&2; }
mkdir -p "$out"
rm -f "$out"/tpuc-*.whl
log "building (release; a first build takes minutes)"
.venv/bin/maturin build --release -q -m crates/tpuc-python/Cargo.toml --out "$out" >&2
wheel=$(ls "$out"/tpuc-*.whl)

# What the extension loads at run time: only the system's C and C++ runtimes.
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
.venv/bin/python -m zipfile -e "$wheel" "$unpacked"
extension=$(ls "$unpacked"/tpuc/_tpuc*.so)
foreign=$(ldd "$extension" | awk '{print $1}' \
  | grep -Ev '^(linux-vdso\.so\.1|/lib64/ld-linux-x86-64\.so\.2|lib(c|m|dl|rt|pthread|gcc_s|stdc\+\+)\.so\.[0-9]+)$' || true)
if [ -n "$foreign" ]; then
  echo "tools/build_wheel.sh: the extension loads libraries a fresh machine may lack:" >&2
  echo "$foreign" >&2
  exit 1
fi
log "wrote $wheel"
echo "$wheel"
