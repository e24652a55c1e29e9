#!/usr/bin/env bash
# Runtime benchmark on the XLA CPU plugin (criterion): execute latency through tpuc-pjrt
# against the plugin's C API called directly, and host<->device copy throughput with and
# without zero-copy. Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
cargo bench -p tpuc-pjrt --bench runtime -- "$@"
