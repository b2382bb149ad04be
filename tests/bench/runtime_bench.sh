#!/usr/bin/env bash
# The continuous-batching runtime on the CPU backend:
#  - throughput (completion tokens/s over the batch's wall time) against the
#    number of concurrent text requests, one `mllama run --batch` each, the
#    best of --repeats;
#  - TTFT of an image request on an image-cache miss against a hit: three
#    requests one after the other ("after"): another image of the same size
#    (a miss in a fresh process), the sample image (a warm miss), the sample
#    image again (a hit); --repeats processes, best of each timing.
#
#   tests/bench/runtime_bench.sh [--preset small|tiny] [--build DIR]
#       [--work DIR] [--max-tokens N] [--batches "1 2 4 8 16"] [--repeats N]
#       [--python PY] [--no-build]
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults small 32
batches="1 2 4 8 16"
BENCH_OPTIONS="batches"
bench_parse_args "$@"
bench_setup rt
batch_py="$repo/tests/bench/make_batch.py"
mirror="$work/astronaut_mirror.jpg"
bench_mirror "$python" "$image" "$mirror"

echo "runtime: preset $preset, $max_tokens tokens per request, $BENCH_THREADS threads"
echo "before: $(bench_load)"
runs=()
for b in $batches; do
    "$python" "$batch_py" --max-tokens "$max_tokens" --prompt "$BENCH_THROUGHPUT_PROMPT" \
        --concurrent "$b" >"$run/b$b.jsonl"
    outs=()
    for r in $(seq 1 "$repeats"); do
        "$mllama" run --model "$model" --batch "$run/b$b.jsonl" --threads "$BENCH_THREADS" \
            >"$run/b${b}_$r.out" || bench_die "batch of $b failed"
        outs+=("$run/b${b}_$r.out")
    done
    runs+=("$b=$(IFS=,; echo "${outs[*]}")")
done
echo "after throughput: $(bench_load)"

"$python" "$batch_py" --max-tokens "$max_tokens" --prompt "$BENCH_PROMPT" \
    --sequence "$mirror" "$image" "$image" >"$run/cache.jsonl"
for r in $(seq 1 "$repeats"); do
    bench_time_run "$run/cache_$r.jsonl" "$run/cache_$r.wall" \
        "$mllama" run --model "$model" --batch "$run/cache.jsonl" --threads "$BENCH_THREADS"
done
$report ours "$run"/cache_*.jsonl >"$run/cache.kv"
echo "after cache: $(bench_load)"
echo
$report runtime --cache "$run/cache.kv" "${runs[@]}"
