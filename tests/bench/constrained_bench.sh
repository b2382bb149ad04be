#!/usr/bin/env bash
# Constrained decoding against free decoding, per step (issue 22's goal: a
# batch of 16 constrained decodes at most 5% slower per step than 16 free
# ones): builds bench_constrained and runs it (its header says what is
# measured), printing the load average before and after.
#
#   tests/bench/constrained_bench.sh [--preset small|tiny] [--build DIR]
#       [--repeats N] [--batch N] [--threads N] [--schema FILE] [--no-build]
#
#   --schema  a JSON Schema file: the constrained side decodes under it
#             (default: JSON mode)
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults small 0
repeats=5
batch=16
threads=$BENCH_THREADS
schema=""
BENCH_OPTIONS="batch threads schema"
bench_parse_args "$@"
[ "$no_build" = 1 ] || bench_build "$build" bench_constrained
echo "before: $(bench_load)"
[ -z "$schema" ] || export ML_BENCH_SCHEMA="$(realpath "$schema")"
ML_BENCH=1 ML_BENCH_PRESET="$preset" ML_BENCH_REPS="$repeats" ML_BENCH_BATCH="$batch" \
    ML_BENCH_THREADS="$threads" "$build/tests/bench_constrained"
echo "after: $(bench_load)"
