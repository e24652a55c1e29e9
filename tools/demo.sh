#!/usr/bin/env bash
# The main job, end to end: set up, build tpuc, export a small Llama-style model with
# torch.export, compile it to StableHLO and show the result.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
echo "[demo] building tpuc (release; the first build takes a few minutes)" >&2
cargo build --release -q -p tpuc-cli
mkdir -p out
.venv/bin/python tools/gen_bench_model.py out/llama2.pt2 2 >&2
./target/release/tpuc compile out/llama2.pt2 -o out/llama2.mlir --stats
echo "[demo] wrote out/llama2.mlir; the start of its main function:" >&2
sed -n '/^module/,$p' out/llama2.mlir | head -n 12 | cut -c1-240
