#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz with libFuzzer, nightly) for
# SECONDS each, from the seed corpus in fuzz/corpus/<target>/ (read only:
# what the run finds new goes to target/fuzz-corpus/<target>/, findings to
# fuzz/artifacts/<target>/). Prints the CPU time each target took.
#   scripts/fuzz.sh SECONDS [TARGET...]
# A finding fails the script; put its input into fuzz/corpus/<target>/ once
# fixed, and the ordinary suite replays it (*/tests/fuzz_replay.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ=1 bash scripts/setup.sh
seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(wire block bsp npy node_call)
fi
export OPENBLAS_NUM_THREADS=1
# Beside the main build where one is set (CI keeps it between runs).
target_dir=()
if [[ -n "${CARGO_TARGET_DIR:-}" ]]; then
  target_dir=(--target-dir "$CARGO_TARGET_DIR/fuzz")
fi
status=0
for t in "${targets[@]}"; do
  work="target/fuzz-corpus/$t"
  mkdir -p "$work"
  (cd fuzz && cargo +nightly fuzz build "${target_dir[@]}" "$t" >/dev/null)
  TIMEFORMAT="%U %S"
  cpu=$( { time (cd fuzz && cargo +nightly fuzz run "${target_dir[@]}" "$t" "../$work" "corpus/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 >"../target/fuzz-$t.log" 2>&1) ; } 2>&1 ) || {
    echo "fuzz: $t FOUND A FAILURE: see target/fuzz-$t.log and fuzz/artifacts/$t/" >&2
    status=1
  }
  read -r user sys <<<"$cpu"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "target/fuzz-$t.log" | awk '{print $2}' | tail -1)
  echo "fuzz: $t ${seconds}s wall, $(awk -v u="$user" -v s="$sys" 'BEGIN{printf "%.1f", u+s}') s CPU, ${execs:-?} runs"
done
exit $status
