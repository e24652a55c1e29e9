#!/usr/bin/env bash
# The tests too slow for the suite (pytest's `sweep` marker: minutes each, such as the float32
# incomplete gamma functions, whose unrolled loops XLA:CPU compiles slowly), with the slowest
# listed at the end. Extra arguments go to pytest (e.g. `-k gamma`). The full OpInfo sweep is
# tools/conformance.py; fuzzing, tools/fuzz.sh; soaks, tools/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
exec .venv/bin/python -m pytest -q -m sweep --durations=0 crates/tpuc-python/tests "$@"
