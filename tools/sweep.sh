#!/usr/bin/env bash
# The tests too slow for the suite (pytest's `sweep` marker: minutes each), with the slowest
# listed at the end; none is marked now (the last, the float32 incomplete gamma functions,
# became loops that compile in seconds), which this says rather than failing. Extra arguments go to pytest (e.g. `-k gamma`). The full OpInfo sweep is
# tools/conformance.py; fuzzing, tools/fuzz.sh; soaks, tools/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
status=0
.venv/bin/python -m pytest -q -m sweep --durations=0 crates/tpuc-python/tests "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "sweep: no test is marked sweep" >&2
  exit 0
fi
exit "$status"
