#!/usr/bin/env bash
# Runs every loom model in loom_tests/ against the real code (through src/sync.rs).
# Extra arguments go to the test binaries, e.g. `./loom.sh vma_lock`.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTFLAGS="--cfg aspace_loom --cfg crossbeam_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export LOOM_MAX_BRANCHES="${LOOM_MAX_BRANCHES:-200000}"
# Every model is explored to the end at this bound (set LOOM_MAX_DURATION
# to stop each after that many seconds instead).
[ -n "${LOOM_MAX_DURATION:-}" ] || unset LOOM_MAX_DURATION
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
tests=$(sed -n 's/^name = "\(loom_[a-z_]*\)"$/\1/p' Cargo.toml)
args=()
for t in $tests; do args+=(--test "$t"); done
# The vm-memory feature: the device-pin model needs it.
exec cargo test --release --features vm-memory "${args[@]}" -- --test-threads=2 "$@"
