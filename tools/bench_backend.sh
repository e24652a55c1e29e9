#!/usr/bin/env bash
# torch.compile benchmark: eager vs inductor vs tpuc (first call and steady state, one and two
# threads) on a tiny graph, a Llama block and ResNet-18 (setup builds tpuc's Python extension in
# release mode). Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
.venv/bin/python tools/bench_backend.py "$@"
