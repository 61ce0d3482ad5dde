#!/usr/bin/env bash
# Fuzzes every target of fuzz/ with libFuzzer (clang, AddressSanitizer and
# UBSan), starting from its checked-in corpus.
#
#   tools/fuzz.sh                     each target for 60 s
#   tools/fuzz.sh --seconds 600       each target for 10 minutes
#   tools/fuzz.sh --runs 1000000      each target for a million executions
#   tools/fuzz.sh codec_fuzzer ...    only the named targets
#
# Builds with `bazel build --config=fuzz` (its own output directory), fuzzes a
# scratch copy of each corpus (the repository stays as it is), runs as many
# targets at once as there are cores, prints each target's executions, and
# stops after the first batch with a crash, leak or sanitizer report: exit 1,
# the input that caused it under out/fuzz/<target>/. To
# keep such an input as a regression test, copy it into fuzz/corpus/<corpus>/:
# `bazel test //fuzz:all` replays every corpus file.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
runs=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --runs) runs="$2"; shift 2 ;;
    --runs=*) runs="${1#*=}"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*_fuzzer.cc; do targets+=("$(basename "$f" .cc)"); done
fi
for t in "${targets[@]}"; do
  if [ ! -f "fuzz/$t.cc" ]; then
    echo "fuzz.sh: no fuzz target '$t' (fuzz/$t.cc)" >&2
    exit 2
  fi
done
if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang is missing; run tools/setup.sh" >&2
  exit 1
fi

labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done
bazel build --config=fuzz "${labels[@]}"
bin="$(bazel info --config=fuzz bazel-bin 2>/dev/null)"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
limit=(-max_total_time="$seconds")
budget="$seconds s"
if [ -n "$runs" ]; then limit=(-runs="$runs"); budget="$runs runs"; fi

# fuzz_one TARGET: one target's run, its output in $scratch/TARGET.log; exit
# status 0 iff libFuzzer found nothing.
fuzz_one() {
  local t="$1" corpus="$scratch/$1"
  mkdir -p "$corpus" "out/fuzz/$t"
  cp "fuzz/corpus/${t%_fuzzer}"/* "$corpus/"  # fuzz/BUILD: corpus/<target less _fuzzer>
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$bin/fuzz/$t" "${limit[@]}" -print_final_stats=1 -rss_limit_mb=4096 \
    -artifact_prefix="out/fuzz/$t/" "$corpus" >"$scratch/$t.log" 2>&1
}

# The targets run side by side, one per core (each libFuzzer run is one
# thread), and are reported in their order once a batch ends.
parallel="$(nproc 2>/dev/null || echo 1)"
status=0
for ((i = 0; i < ${#targets[@]}; i += parallel)); do
  batch=("${targets[@]:i:parallel}")
  pids=()
  for t in "${batch[@]}"; do
    echo "fuzz.sh: $t (corpus fuzz/corpus/${t%_fuzzer}, $budget)"
    fuzz_one "$t" & pids+=("$!")
  done
  for j in "${!batch[@]}"; do
    t="${batch[$j]}"
    if wait "${pids[$j]}"; then
      execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$t.log")"
      echo "fuzz.sh: $t: ${execs:-?} executions, no crash, leak or sanitizer report"
    else
      tail -40 "$scratch/$t.log"
      echo "fuzz.sh: $t FAILED; the input is under out/fuzz/$t/" >&2
      status=1
    fi
  done
  [ "$status" = 0 ] || break
done
exit "$status"
