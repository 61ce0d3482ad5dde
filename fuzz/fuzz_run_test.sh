#!/usr/bin/env bash
# A bounded libFuzzer run as a test: fuzz_run_test.sh FUZZER CORPUS SECONDS
# fuzzes a scratch copy of the checked-in corpus for SECONDS and passes iff
# libFuzzer found no crash, leak or sanitizer report. Built and run only under
# --config=asan (the //:asan suite); an input that failed is kept under the
# test's outputs (bazel-testlogs/fuzz/<target>/test.outputs/).
set -euo pipefail
fuzzer="$1" corpus="$2" seconds="$3"
scratch="${TEST_TMPDIR:-$(mktemp -d)}/corpus"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-${TEST_TMPDIR:-/tmp}}/"
mkdir -p "$scratch"
cp "$corpus"/* "$scratch/"
log="${TEST_TMPDIR:-/tmp}/fuzz.log"
if "$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=4096 \
    -artifact_prefix="$artifacts" "$scratch" >"$log" 2>&1; then
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
  echo "$(basename "$fuzzer"): ${execs:-?} executions in $seconds s, no crash, leak or sanitizer report"
else
  tail -60 "$log"
  echo "$(basename "$fuzzer") FAILED; the input is under $artifacts" >&2
  exit 1
fi
