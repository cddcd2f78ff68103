#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck over the reduced GPU test set
# (ATTN_TEST_REDUCED=1; ATTN_TEST_STAGES limits the stages).
# Usage: tools/sanitize.sh [build/tests/test_gpu]    (or: cmake --build build --target sanitize)
# Exits non-zero when either tool reports an error; writes nothing but its output.
set -euo pipefail
test_gpu=${1:-build/tests/test_gpu}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
export ATTN_TEST_REDUCED=1
status=0
for tool in memcheck racecheck synccheck; do
  echo "== compute-sanitizer --tool $tool $test_gpu"
  extra=(); [ "$tool" = memcheck ] && extra=(--leak-check full)
  "$sanitizer" --tool "$tool" "${extra[@]}" --error-exitcode 99 "$test_gpu" || status=$?
done
exit $status
