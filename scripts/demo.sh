#!/usr/bin/env bash
# The main job on the embedded default: a store node and local slaves in a
# temporary directory; extra arguments go to `master demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p master -p slave
exec "${CARGO_TARGET_DIR:-target}/release/master" demo "$@"
