#!/usr/bin/env bash
# The main job, end to end: set up, build tpuc, export a small Llama-style model with
# torch.export (and torch eager's output for a seeded input), compile it to StableHLO, run the
# compiled module on the XLA CPU plugin and compare its output with torch's.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
echo "[demo] building tpuc (release; the first build takes a few minutes)" >&2
cargo build --release -q -p tpuc-cli
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"   # XLA's own logging
mkdir -p out
.venv/bin/python tools/gen_bench_model.py out/llama2.pt2 2 >&2
./target/release/tpuc compile out/llama2.pt2 -o out/llama2.mlir --stats
echo "[demo] wrote out/llama2.mlir; the start of its main function:" >&2
# (awk stops by itself: `sed | head` under pipefail fails when head closes the pipe early)
awk '/^module/ { shown = 1 } shown { print substr($0, 1, 200); if (++lines == 6) exit }' out/llama2.mlir
echo "[demo] running the compiled module on the XLA CPU plugin, against torch eager's output:" >&2
./target/release/tpuc run out/llama2.mlir --weights out/llama2.pt2 \
    --input out/llama2.inputs.npz --out out/llama2-outputs --expect out/llama2.expected.npz
