#!/usr/bin/env bash
# Eager benchmark: torch CPU eager, the tpuc device (strict, fused), tpuc's compile backend and
# Google's TorchTPU (strict, fused) on the same XLA CPU plugin. TorchTPU lives in its own venv,
# .venv-torchtpu, which reuses .venv's torch (a .pth file) and installs torch-tpu beside it
# without its TPU runtime (the CPU plugin stands in for libtpu). Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
if ! .venv-torchtpu/bin/python -m pip show -q torch-tpu >/dev/null 2>&1; then
    python3 -m venv .venv-torchtpu
    .venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
        > "$(.venv-torchtpu/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/tpuc-venv.pth"
    .venv-torchtpu/bin/python -m pip install -q --no-deps torch-tpu==0.2.0 absl-py portpicker frozendict \
        immutabledict pyzmq
fi
.venv/bin/python tools/bench_eager.py "$@"
