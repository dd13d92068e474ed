#!/usr/bin/env bash
# Runs every test, crash tests with real processes included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1
# Formatting is part of passing (rustfmt.toml); skipped, saying so, where
# the toolchain has no rustfmt.
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "test: rustfmt is not installed; formatting not checked" >&2
fi
# Lints are part of passing too, warnings included; skipped, saying so,
# where the toolchain has no clippy.
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets -- -D warnings
  # The Ceph backend's crate and `bench rados`, librados linked (issue 48).
  cargo clippy -p ftbag-rados -p bench -p master -p slave --all-targets --features ftbag-rados/rados,ftbag-rados/cli,bench/rados,master/rados,slave/rados -- -D warnings
else
  echo "test: clippy is not installed; lints not checked" >&2
fi
cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/ftbag-test.log
# The Ceph tier (issue 48): librados linked (`rados` feature), each test
# binary starting one throwaway cluster (scripts/ceph-cluster.sh; root and
# the Ceph packages, else its tests print `skipped:`).
cargo test -p ftbag-rados --features rados --no-fail-fast 2>&1 | tee -a /tmp/ftbag-test.log
# The store node and slaves on that backend (`master serve --blocks rados`,
# `slave --ceph-conf`): apps with slave kills, a store killed mid-job, an
# OSD killed mid-job, bad cluster settings. The slave binary the tests run
# must link librados too.
cargo build -p master -p slave --features master/rados,slave/rados
cargo test -p master --features rados --test rados --no-fail-fast 2>&1 | tee -a /tmp/ftbag-test.log
# Every fuzz target for a few seconds from its seed corpus (issue 52):
# libFuzzer through cargo-fuzz on the nightly toolchain (scripts/fuzz.sh
# has scripts/setup.sh install both). A finding fails the run.
# FUZZ_SECONDS=0 leaves fuzzing out, saying so.
if [[ "${FUZZ_SECONDS:-3}" != 0 ]]; then
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-3}"
else
  echo "test: fuzz targets not run (FUZZ_SECONDS=0)" >&2
fi
# A test that cannot run its scenario here (no root for namespaces or a
# tmpfs, no Chromium) passes with a line `skipped: <why>` on its output.
# Every such line is reported; in CI, where root and Chromium are there,
# a skip is a failure unless its reason is listed in CI_MAY_SKIP (a
# regular expression per line; none so far).
CI_MAY_SKIP=()
# At a line's start, or after libtest's "test NAME ... " that it interrupted.
mapfile -t skips < <(grep -oE '(^|\.\.\. )skipped: .*' /tmp/ftbag-test.log | sed 's/^\.\.\. //' | sort | uniq -c | sed 's/^ *//')
if ((${#skips[@]} > 0)); then
  echo "test: skipped tests (lines seen, reason; a test prints its line on stdout and stderr):" >&2
  printf '  %s\n' "${skips[@]}" >&2
else
  echo "test: no test skipped" >&2
fi
if [[ "${CI:-}" == "true" ]]; then
  failed=0
  for line in "${skips[@]}"; do
    allowed=0
    for pattern in "${CI_MAY_SKIP[@]}"; do
      [[ "$line" =~ $pattern ]] && allowed=1
    done
    if ((allowed == 0)); then
      echo "test: skipped in CI, where it must run: $line" >&2
      failed=1
    fi
  done
  if ((failed)); then
    exit 1
  fi
fi
