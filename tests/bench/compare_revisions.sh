#!/usr/bin/env bash
# The engine of this tree against the engine of another revision, same
# checkpoint, same inputs, in one run: vision, prefill, TTFT and decode
# ms/token of a text and an image request (one at a time), and completion
# tokens/s of B concurrent text requests (decode steps of B rows). Printed
# as this tree's time over the base's (below 1.00x: this tree is faster).
# What it is for: the cost of a change to the engine's arithmetic, e.g.
# batch invariance (tests/bench/results-log.md).
#
#   tests/bench/compare_revisions.sh --base REV [--preset small|1b|tiny]
#       [--build DIR] [--work DIR] [--max-tokens N] [--concurrent "4 16"]
#       [--fp8 0|1|head] [--image FILE] [--repeats N] [--python PY] [--no-build]
#
# --fp8 1: both on the preset's FP8 checkpoint (`mllama mkmodel --fp8`, as
# fp8_decode.sh writes it); head: and with its lm_head quantized at load
# (`mllama run --fp8-lm-head`). --image: the image request's image instead of
# the sample (which fills 2 of its 4 tiles).
#
# REV is built from `git archive` into WORK/base-REV (Release CPU build,
# kept between runs). The two builds alternate, --repeats processes each:
# each timing's median and spread, and the same of the ratios of the runs
# paired by the alternation, which shared the host's minute (on a VM whose
# speed moves by 20-30% from one minute to the next, the best of each side
# compared two different minutes). The concurrent batches also give their
# median decode step of B rows (tokens/s includes their prefill).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults small 33
concurrent="4 16"
base=""
fp8=0
BENCH_OPTIONS="base concurrent fp8 image"
bench_parse_args "$@"
[ -n "$base" ] || bench_die "--base REV is required"
rev=$(git -C "$repo" rev-parse --short "$base^{commit}") || bench_die "no revision $base"
run_args=()
case "$fp8" in
0 | 1) ;;
head) run_args=(--fp8-lm-head) ;;
*) bench_die "--fp8: expected 0, 1 or head, got '$fp8'" ;;
esac
bench_setup revs
if [ "$fp8" != 0 ]; then
    model="$work/${preset}_fp8"
    bench_model "$mllama" "$preset" "$model" --fp8
fi
base_src="$work/base-$rev"
if [ ! -x "$base_src/build/service/mllama" ]; then
    rm -rf "$base_src"
    mkdir -p "$base_src"
    git -C "$repo" archive "$rev" | tar -x -C "$base_src"
    (repo="$base_src" bench_build "$base_src/build" mllama)
fi
base_mllama="$base_src/build/service/mllama"
batch_py="$repo/tests/bench/make_batch.py"
"$python" "$batch_py" --max-tokens "$max_tokens" --prompt "$BENCH_PROMPT" \
    --sequence - "$image" >"$run/seq.jsonl"
for b in $concurrent; do
    "$python" "$batch_py" --max-tokens "$max_tokens" --prompt "$BENCH_THROUGHPUT_PROMPT" \
        --concurrent "$b" >"$run/c$b.jsonl"
done

echo "revisions: this tree against $rev, preset $preset (FP8: $fp8), $max_tokens tokens per" \
    "request, $BENCH_THREADS threads"
echo "before: $(bench_load)"
for r in $(seq 1 "$repeats"); do
    for side in base tree; do
        bin="$mllama"
        [ "$side" = base ] && bin="$base_mllama"
        bench_time_run "$run/${side}_seq_$r.jsonl" "$run/${side}_seq_$r.wall" \
            "$bin" run --model "$model" --batch "$run/seq.jsonl" --threads "$BENCH_THREADS" \
            ${run_args[*]:+"${run_args[@]}"}
        for b in $concurrent; do
            "$bin" run --model "$model" --batch "$run/c$b.jsonl" --threads "$BENCH_THREADS" \
                ${run_args[*]:+"${run_args[@]}"} >"$run/${side}_c${b}_$r.jsonl" ||
                bench_die "$side: batch of $b failed"
        done
    done
done
echo "after: $(bench_load)"
echo
args=()
for side in base tree; do
    args+=("--$side-seq")
    for r in $(seq 1 "$repeats"); do
        $report ours "$run/${side}_seq_$r.jsonl" >"$run/${side}_$r.kv"
        args+=("$run/${side}_$r.kv")
    done
    for b in $concurrent; do
        runs=()
        for r in $(seq 1 "$repeats"); do runs+=("$run/${side}_c${b}_$r.jsonl"); done
        args+=("--$side-concurrent" "$b=$(IFS=,; echo "${runs[*]}")")
    done
done
$report revisions --base-rev "$rev" "${args[@]}"
