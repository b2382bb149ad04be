#!/usr/bin/env bash
# Decode bandwidth of the CPU engine: bytes read per greedy decode step
# (bf16 text-decoder weights + lm_head, the cross layers' q/o/MLP when an
# image is attended, and the f32 K/V read) over the time per token, against
# the memory read bandwidth measured in the same run (bench_read_bw.c).
#
#   tests/bench/decode_bandwidth.sh [--preset 1b|small] [--build DIR]
#       [--work DIR] [--max-tokens N] [--repeats N] [--no-build]
#
# Runs `mllama run --batch` with a text-only request and then an image
# request ("after": one at a time), --repeats processes, best ms/token each.
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults 1b 33
bench_parse_args "$@"
bench_setup bw bench_read_bw
"$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" --prompt "$BENCH_PROMPT" \
    --sequence - "$image" >"$run/batch.jsonl"

echo "decode bandwidth: preset $preset, $max_tokens tokens per request, $BENCH_THREADS threads"
echo "before: $(bench_load)"
bws=()
for r in $(seq 1 "$repeats"); do
    bws+=("$(bench_read_gbs)")
    bench_time_run "$run/ours_$r.jsonl" "$run/ours_$r.wall" \
        "$mllama" run --model "$model" --batch "$run/batch.jsonl" --threads "$BENCH_THREADS"
done
bws+=("$(bench_read_gbs)")
$report ours "$run"/ours_*.jsonl >"$run/ours.kv"
echo "after: $(bench_load)"
read_gbs=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
[ -n "$read_gbs" ] || bench_die "bench_read_bw failed"
echo "read bandwidth ($BENCH_THREADS threads, 1 GiB, 64-byte loads) around the runs: ${bws[*]} GB/s"
echo
$report bandwidth --model "$model" --ours "$run/ours.kv" --read-gbs "$read_gbs" \
    --image-tiles "$(bench_image_tiles)"
