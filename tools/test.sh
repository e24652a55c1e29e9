#!/usr/bin/env bash
# The whole test suite: set up, then formatting and clippy (warnings are errors), unit tests (the
# IR, the lowering families, the passes), the PJRT binding layout tests, the runtime's tests on
# the XLA CPU plugin, golden lowering tests, the compile pipeline's end-to-end tests, every golden
# case executed against torch's outputs, and the Python package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"   # XLA's own logging
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace --lib --bins --tests
# The torch.compile backend, the model zoo (torch.compile and export -> tpuc compile -> tpuc run,
# using the tpuc binary the step above built) and training against eager torch.
.venv/bin/python -m pytest -q crates/tpuc-python/tests
