#!/usr/bin/env bash
# torch.compile benchmark: eager vs inductor vs tpuc (first call and steady state, one and two
# threads) on a tiny graph, a Llama block and ResNet-18. Builds tpuc's Python extension in
# release mode first. Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
PATH="$PWD/.venv/bin:$PATH" VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop -q --release -m crates/tpuc-python/Cargo.toml >&2
touch .venv/.tpuc-python-built
.venv/bin/python tools/bench_backend.py "$@"
