#!/usr/bin/env bash
# Runs the loom models in loom_tests/ against the real code (through src/sync.rs).
#
#   ./loom.sh                          every model: builds every loom_* test target
#   ./loom.sh FILTER                   the models whose test name contains FILTER; builds
#                                      only the targets that define one
#   ./loom.sh --test loom_fault [FILTER]
#                                      one target (repeat --test for more), all its models
#                                      or those FILTER picks
#
# Other arguments go to the test binaries (libtest's options, e.g. `--exact`,
# `--nocapture`, `--skip NAME`).
set -euo pipefail
cd "$(dirname "$0")"
export RUSTFLAGS="--cfg aspace_loom --cfg crossbeam_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export LOOM_MAX_BRANCHES="${LOOM_MAX_BRANCHES:-200000}"
# Every model is explored to the end at this bound (set LOOM_MAX_DURATION
# to stop each after that many seconds instead).
[ -n "${LOOM_MAX_DURATION:-}" ] || unset LOOM_MAX_DURATION
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"

# "loom_name path" for every loom test target in Cargo.toml.
targets_and_paths=$(awk '
    /^name = "loom_[a-z_]*"$/ { split($0, q, "\""); name = q[2]; next }
    name != "" && /^path = / { split($0, q, "\""); print name, q[2]; name = "" }
' Cargo.toml)
all=$(cut -d' ' -f1 <<<"$targets_and_paths")

# The #[test] functions of one test file, one name a line.
test_names() {
    sed -n '/^#\[test\]$/{n;s/^fn \([a-z0-9_]*\)(.*/\1/p}' "$1"
}

picked=()
pass=()
filters=()
exact=false
while [ $# -gt 0 ]; do
    case "$1" in
        --test)
            [ $# -ge 2 ] || { echo "loom.sh: --test needs a target name" >&2; exit 2; }
            if ! grep -qx -- "$2" <<<"$all"; then
                echo "loom.sh: no loom test target '$2'; the targets:" $all >&2
                exit 2
            fi
            picked+=("$2")
            shift 2
            ;;
        --skip | --test-threads | --format | --color | --logfile | --shuffle-seed | -Z)
            # libtest options that take a value: neither is a filter.
            pass+=("$1")
            [ $# -ge 2 ] && pass+=("$2") && shift
            shift
            ;;
        --exact)
            exact=true
            pass+=("$1")
            shift
            ;;
        -*)
            pass+=("$1")
            shift
            ;;
        *)
            filters+=("$1")
            pass+=("$1")
            shift
            ;;
    esac
done

# No --test: the targets holding a model that a filter picks (libtest
# matches a filter as a substring of the test name, or whole with
# --exact), or every target without a filter.
if [ ${#picked[@]} -eq 0 ]; then
    while read -r target path; do
        if [ ${#filters[@]} -eq 0 ]; then
            picked+=("$target")
            continue
        fi
        for name in $(test_names "$path"); do
            hit=false
            for f in "${filters[@]}"; do
                if $exact; then [ "$name" = "$f" ] && hit=true; else [[ "$name" == *"$f"* ]] && hit=true; fi
            done
            if $hit; then
                picked+=("$target")
                break
            fi
        done
    done <<<"$targets_and_paths"
    if [ ${#picked[@]} -eq 0 ]; then
        if $exact; then how="is"; else how="contains"; fi
        echo "loom.sh: no loom model's name $how any of: ${filters[*]}" >&2
        exit 2
    fi
fi

args=()
for t in "${picked[@]}"; do args+=(--test "$t"); done
echo "loom.sh: building and running ${picked[*]}" >&2
# The vm-memory feature: the device-pin model needs it.
exec cargo test --release --features vm-memory "${args[@]}" -- --test-threads=2 ${pass[@]+"${pass[@]}"}
