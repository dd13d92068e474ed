#!/usr/bin/env bash
# Runs every test, crash tests with real processes included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OPENBLAS_NUM_THREADS=1
cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast 2>&1 | tee /tmp/ftbag-test.log
