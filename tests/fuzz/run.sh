#!/usr/bin/env bash
# Runs libFuzzer targets built in build-fuzz/ (make fuzz): each one first
# replays its committed corpus (tests/fuzz/corpus/<name>/), then fuzzes for a
# set time, one after the other. New inputs go to BUILD/fuzz-work/<name>/corpus
# (the committed corpus is left as it is); a crash, leak, timeout or
# out-of-memory input is written to BUILD/fuzz-work/<name>/artifacts/ and the
# script exits 1 after the rest have run. Prints one line per target, then a
# JSON summary line.
#
#   tests/fuzz/run.sh [--seconds N] [--build DIR] [NAME ...]   (default: every target, 60 s)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=60
build="$root/build-fuzz"
names=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
if [[ ${#names[@]} -eq 0 ]]; then
  for d in "$root"/tests/fuzz/corpus/*/; do names+=("$(basename "$d")"); done
fi

failed=0
summary=""
for name in "${names[@]}"; do
  bin="$build/tests/fuzz/${name}_fuzz"
  corpus="$root/tests/fuzz/corpus/$name"
  work="$build/fuzz-work/$name"
  if [[ ! -x "$bin" ]]; then
    echo "fuzz: $bin is missing (make fuzz)" >&2
    exit 2
  fi
  mkdir -p "$work/corpus" "$work/artifacts"
  flags=(-rss_limit_mb=2048 -timeout=20 -max_len=65536 -print_final_stats=1
         "-artifact_prefix=$work/artifacts/")
  [[ -f "$root/tests/fuzz/$name.dict" ]] && flags+=("-dict=$root/tests/fuzz/$name.dict")
  # Leaks are checked at exit of each input by LSan: fast enough for these targets.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  log="$work/last.log"
  touch "$work/.start"
  status=ok
  if ! "$bin" "${flags[@]}" -runs=0 "$corpus" >"$log" 2>&1; then
    status=replay-failed
  elif ! "$bin" "${flags[@]}" -max_total_time="$seconds" "$work/corpus" "$corpus" >>"$log" 2>&1; then
    status=crashed
  fi
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | tail -1 | awk '{print $2}')
  found=$(find "$work/artifacts" -type f -newer "$work/.start" | wc -l)
  printf 'fuzz: %-18s %-13s %12s execs %8s/s  %s artifacts in %s\n' "$name" "$status" \
    "${execs:-0}" "${rate:-0}" "$found" "$work/artifacts"
  if [[ $status != ok ]]; then
    failed=1
    grep -m5 -E 'ERROR|SUMMARY|Test unit written|deadly signal' "$log" >&2 || true
  fi
  summary+="${summary:+,}\"$name\":{\"status\":\"$status\",\"execs\":${execs:-0},\"seconds\":$seconds,\"artifacts\":$found}"
done
echo "{\"fuzz\":{$summary}}"
exit $failed
