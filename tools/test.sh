#!/usr/bin/env bash
# The whole test suite: set up, then unit tests, golden lowering tests and the compile
# pipeline's end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
cargo fmt --all -- --check
cargo test --workspace --lib --bins --tests
