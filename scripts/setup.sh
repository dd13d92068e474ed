#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian machine, once: Debian's
# RocksDB (linked instead of compiled: 22 s instead of 23 min), OpenBLAS
# (BLAS + LAPACK), protoc, libclang for bindgen, iproute2 (`ip`, `tc`,
# `bridge`: the network-namespace tests and ftbag-hosts), Chromium and
# chromedriver (the dashboard's browser test, master/tests/dashboard.rs),
# Ceph (ceph-mon, ceph-osd, ceph-mgr: the throwaway clusters of
# scripts/ceph-cluster.sh; librados-dev: the `rados` feature, issue 48),
# OpenMPI and ScaLAPACK (`bench bsp`'s MPI side, `bench ooc --engine
# scalapack`'s pdgemm, issue 49). Skips what is there.
set -euo pipefail
need=()
for pkg in librocksdb-dev libopenblas-dev protobuf-compiler libclang-dev pkg-config build-essential iproute2 chromium chromium-driver ceph-mon ceph-osd ceph-mgr librados-dev openmpi-bin libopenmpi-dev libscalapack-openmpi-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "setup: cargo is missing; install Rust (https://rustup.rs) and rerun" >&2
  exit 1
fi
# The test command checks formatting and lints: a rustup toolchain's
# minimal profile lacks both.
if command -v rustup >/dev/null && ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || echo "setup: could not add rustfmt/clippy" >&2
fi
# Fuzzing (scripts/fuzz.sh sets FUZZ=1): the nightly toolchain and
# cargo-fuzz. The ordinary suite needs neither: it replays the corpus.
if [[ "${FUZZ:-}" == "1" ]]; then
  if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "setup: installing the nightly toolchain for fuzzing" >&2
    rustup toolchain install nightly --profile minimal
  fi
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "setup: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
  fi
fi
