#!/usr/bin/env bash
# The whole test suite: set up, then formatting, the Python lint (ruff.toml) and clippy (warnings
# are errors), unit tests (the IR, the lowering families, the passes), the file tests (FX graphs
# in text with CHECK lines) and golden modules, the PJRT binding layout tests, the runtime's tests
# on the XLA CPU plugin, the driver's tests (every golden case executed against torch's outputs),
# the `tpuc` command's, and the Python package's tests. `cargo test --tests` builds test binaries
# only for targets that have tests (`--lib` would link MLIR into empty ones).
#
# Each stage's wall time is printed when it ends, and all of them at the end (also when a stage
# fails), with pytest's 20 slowest tests, so that the next slow test is seen the day it arrives.
set -euo pipefail
cd "$(dirname "$0")/.."

stage_times=()
suite_start=$SECONDS
report_times() {
  local rc=$?
  printf '\n[test] wall time per stage:\n' >&2
  local line
  for line in "${stage_times[@]}"; do printf '[test]   %s\n' "$line" >&2; done
  printf '[test]   %-8s %5ds%s\n' total $((SECONDS - suite_start)) \
    "$([ "$rc" -eq 0 ] || echo " (failed, exit $rc)")" >&2
}
trap report_times EXIT
# stage NAME COMMAND...: runs the command and records its wall time under NAME.
stage() {
  local name=$1 start=$SECONDS
  shift
  printf '[test] %s: %s\n' "$name" "$*" >&2
  "$@"
  stage_times+=("$(printf '%-8s %5ds' "$name" $((SECONDS - start)))")
  printf '[test] %s took %ds\n' "$name" $((SECONDS - start)) >&2
}

stage setup tools/setup.sh
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"   # XLA's own logging
stage fmt cargo fmt --all -- --check
stage ruff .venv/bin/ruff check --quiet .
stage clippy cargo clippy --workspace --all-targets --quiet -- -D warnings
stage cargo cargo test --workspace --tests
# The torch.compile backend, the model zoo (torch.compile and export -> tpuc compile -> tpuc run,
# using the tpuc binary the step above built) and training against eager torch: on two worker
# processes (pytest-xdist; tests sharing an expensive fixture are one group, run by one worker).
# Tests marked `sweep` (minutes each) are left to tools/sweep.sh; those marked `alone` (TorchTitan
# under torchrun: ranks that need the cores to themselves) run next, one at a time.
stage pytest .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=20 -m "not sweep and not alone" \
  crates/tpuc-python/tests
stage alone .venv/bin/python -m pytest -q -n 0 --durations=10 -m alone crates/tpuc-python/tests
# The tpuc device with two devices: a process of its own, as the CPU plugin's devices are chosen
# when the device starts.
stage devices env TPUC_DEVICES=2 .venv/bin/python -m pytest -q --durations=5 crates/tpuc-python/tests/devices
