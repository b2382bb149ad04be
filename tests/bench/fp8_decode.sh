#!/usr/bin/env bash
# FP8 against bf16 decode on the CPU engine, on each preset of --presets in
# one run: the preset's random-weight checkpoint and the same weights
# written as a compressed-tensors FP8 checkpoint (`mllama mkmodel --fp8`:
# the text decoder's Linears F8_E4M3, lm_head, projector and vision tower
# bf16), decoded alternating bf16 and fp8 processes --repeats times. The
# machine is shared, so each pair is timed back to back and the report is
# the median and spread of ms/token and of the pairs' ratios, and each
# one's bytes per token (at its median ms/token) over the highest read
# bandwidth measured between the runs (bench_read_bw.c). --fp8-lm-head 1:
# the fp8 runs quantize lm_head to FP8 at load too (mllama run
# --fp8-lm-head, the worker's model.fp8_lm_head), and their bytes count it
# so. --cpu-activations f32|bf16: both kinds of run with mllama run's
# --cpu-activations (f32, the exact default; bf16: their Linears on AVX-512
# BF16's dot, FP8 ones too where the CPU has AVX512_VBMI). --cpu-kv-cache
# f32|bf16: both kinds with mllama run's --cpu-kv-cache (f32, the default;
# bf16, any CPU: K/V caches and image states stored bf16, their bytes
# counted at 2 per element). --concurrent "8 16": each run also decodes B
# concurrent text requests (continuous batching) for each B, and the report
# adds their ms per token and median decode step of B rows, bf16 against
# FP8, paired as the single requests are.
#
#   tests/bench/fp8_decode.sh [--presets "small 1b"] [--fp8-lm-head 0|1]
#       [--cpu-activations f32|bf16] [--cpu-kv-cache f32|bf16]
#       [--concurrent "B ..."] [--build DIR] [--work DIR] [--max-tokens N]
#       [--repeats N] [--no-build]
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults small 33
repeats=5
presets="small 1b"
fp8_lm_head=0
cpu_activations=f32
cpu_kv_cache=f32
concurrent=""
BENCH_OPTIONS="presets fp8_lm_head cpu_activations cpu_kv_cache concurrent"
bench_parse_args "$@"
bench_check_cpu_options
head_run=() head_report=()
case "$fp8_lm_head" in
0) ;;
1) head_run=(--fp8-lm-head) head_report=(--fp8-lm-head) ;;
*) bench_die "--fp8-lm-head: expected 0 or 1, got '$fp8_lm_head'" ;;
esac
for preset in $presets; do
    bench_setup fp8 bench_read_bw
    no_build=1 # built for the first preset
    fp8_model="$work/${preset}_fp8"
    bench_model "$mllama" "$preset" "$fp8_model" --fp8
    "$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" \
        --prompt "$BENCH_PROMPT" --sequence - "$image" >"$run/batch.jsonl"
    for b in $concurrent; do
        "$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" \
            --prompt "$BENCH_THROUGHPUT_PROMPT" --concurrent "$b" >"$run/c$b.jsonl"
    done

    echo "== fp8 decode: preset $preset, $max_tokens tokens per request, $BENCH_THREADS threads," \
        "FP8 lm_head: $fp8_lm_head, $cpu_activations activations, $cpu_kv_cache K/V cache"
    echo "before: $(bench_load)"
    bws=()
    for r in $(seq 1 "$repeats"); do
        bws+=("$(bench_read_gbs)")
        for kind in bf16 fp8; do
            m="$model" extra=()
            [ "$kind" = fp8 ] && m="$fp8_model" extra=("${head_run[@]}")
            opts=(--model "$m" --threads "$BENCH_THREADS" --cpu-activations "$cpu_activations"
                --cpu-kv-cache "$cpu_kv_cache" ${extra[*]:+"${extra[@]}"})
            bench_time_run "$run/${kind}_$r.jsonl" "$run/${kind}_$r.wall" \
                "$mllama" run --batch "$run/batch.jsonl" "${opts[@]}"
            $report ours "$run/${kind}_$r.jsonl" >"$run/${kind}_$r.kv"
            for b in $concurrent; do
                "$mllama" run --batch "$run/c$b.jsonl" "${opts[@]}" \
                    >"$run/c${b}_${kind}_$r.jsonl" || bench_die "$kind: batch of $b failed"
            done
        done
    done
    bws+=("$(bench_read_gbs)")
    $report ours --median "$run"/bf16_*.jsonl >"$run/bf16.kv"
    $report ours --median "$run"/fp8_*.jsonl >"$run/fp8.kv"
    echo "after: $(bench_load)"
    read_gbs=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
    [ -n "$read_gbs" ] || bench_die "bench_read_bw failed"
    echo "read bandwidth ($BENCH_THREADS threads) around the runs: ${bws[*]} GB/s"
    echo
    bf16_kvs=() fp8_kvs=() conc=()
    for r in $(seq 1 "$repeats"); do
        bf16_kvs+=("$run/bf16_$r.kv")
        fp8_kvs+=("$run/fp8_$r.kv")
    done
    for b in $concurrent; do
        for kind in bf16 fp8; do
            runs=()
            for r in $(seq 1 "$repeats"); do runs+=("$run/c${b}_${kind}_$r.jsonl"); done
            conc+=("--$kind-concurrent" "$b=$(IFS=,; echo "${runs[*]}")")
        done
    done
    $report fp8 --bf16 "${bf16_kvs[@]}" --fp8 "${fp8_kvs[@]}" ${conc[*]:+"${conc[@]}"}
    echo
    image_tiles=$(bench_image_tiles)
    echo "bf16 (median run):"
    $report bandwidth --model "$model" --ours "$run/bf16.kv" --read-gbs "$read_gbs" \
        --kv-bytes "$(bench_kv_bytes)" --image-tiles "$image_tiles"
    echo
    echo "fp8 (median run):"
    $report bandwidth --model "$fp8_model" --ours "$run/fp8.kv" --read-gbs "$read_gbs" --goal 70 \
        --kv-bytes "$(bench_kv_bytes)" --image-tiles "$image_tiles" "${head_report[@]}"
    echo
done
