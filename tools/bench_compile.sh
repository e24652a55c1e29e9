#!/usr/bin/env bash
# Compile benchmark: exports a 24-layer Llama-style model (core ATen) and measures
# .pt2 -> StableHLO text with criterion (read / lower / emit / total, nodes per second).
# Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
mkdir -p target/bench
model=target/bench/llama24.pt2
[ -f "$model" ] || .venv/bin/python tools/gen_bench_model.py "$model" 24
TPUC_BENCH_MODEL="$PWD/$model" cargo bench -p tpuc-cli --bench compile "$@"
