#!/usr/bin/env bash
# FP8 against bf16 decode on the CPU engine: the preset's random-weight
# checkpoint and the same weights written as a compressed-tensors FP8
# checkpoint (`mllama mkmodel --fp8`: the text decoder's Linears F8_E4M3,
# lm_head, projector and vision tower bf16), decoded in one run, alternating
# bf16 and fp8 processes, best ms/token of each over --repeats; the ratio,
# and each one's bytes per token over the read bandwidth measured between
# the runs (bench_read_bw.c).
#
#   tests/bench/fp8_decode.sh [--preset 1b|small] [--build DIR] [--work DIR]
#       [--max-tokens N] [--repeats N] [--no-build]
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults 1b 33
bench_parse_args "$@"
bench_setup fp8 bench_read_bw
fp8_model="$work/${preset}_fp8"
if [ ! -f "$fp8_model/config.json" ]; then
    "$mllama" mkmodel --preset "$preset" --out "$fp8_model" --fp8 >/dev/null 2>&1 ||
        bench_die "mkmodel --preset $preset --fp8 failed"
fi
"$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" --prompt "$BENCH_PROMPT" \
    --sequence - "$image" >"$run/batch.jsonl"

echo "fp8 decode: preset $preset, $max_tokens tokens per request, $BENCH_THREADS threads"
echo "before: $(bench_load)"
bws=()
for r in $(seq 1 "$repeats"); do
    bws+=("$(bench_read_gbs)")
    bench_time_run "$run/bf16_$r.jsonl" "$run/bf16_$r.wall" \
        "$mllama" run --model "$model" --batch "$run/batch.jsonl" --threads "$BENCH_THREADS"
    bench_time_run "$run/fp8_$r.jsonl" "$run/fp8_$r.wall" \
        "$mllama" run --model "$fp8_model" --batch "$run/batch.jsonl" --threads "$BENCH_THREADS"
done
bws+=("$(bench_read_gbs)")
$report ours "$run"/bf16_*.jsonl >"$run/bf16.kv"
$report ours "$run"/fp8_*.jsonl >"$run/fp8.kv"
echo "after: $(bench_load)"
read_gbs=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
[ -n "$read_gbs" ] || bench_die "bench_read_bw failed"
echo "read bandwidth ($BENCH_THREADS threads) around the runs: ${bws[*]} GB/s"
echo
$report fp8 --bf16 "$run/bf16.kv" --fp8 "$run/fp8.kv"
echo
echo "bf16:"
$report bandwidth --model "$model" --ours "$run/bf16.kv" --read-gbs "$read_gbs"
echo
echo "fp8:"
$report bandwidth --model "$fp8_model" --ours "$run/fp8.kv" --read-gbs "$read_gbs" --goal 70
