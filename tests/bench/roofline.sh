#!/usr/bin/env bash
# The decode roofline of the CPU engine: for B sequences decoding together
# in one `mllama run --batch` (same prompt length, so they prefill together
# and decode in lockstep; with an image, the same image for all, encoded
# once, outside the decode steps), the time of a step that decoded all B
# (the runtime's decode_steps) against the larger of two bounds measured in
# the same run: bytes read / read bandwidth (bench_read_bw) and FLOPs / f32
# FMA peak (bench_fma_peak, the ISA the engine picks; with --cpu-activations
# bf16, the Linears' FLOPs / the peak of their bf16 products, AMX's or the
# bf16 dot's, plus the attention's FLOPs / f32 FMA peak). Goal (issue 27): the bound is >= 85% of the measured step at
# every B, text only and with an image. The bytes and FLOPs are
# bench_report.py roofline's (README.md here). Each process also reads its
# own packed weights once its batch is done (mllama run --weights-read), and
# the report adds the bound with that rate as the process's bandwidth.
#
#   tests/bench/roofline.sh [--preset 1b|small|tiny] [--concurrency "1 2 4 8 16 32"]
#       [--images 0|1|both] [--repeats N] [--max-tokens N] [--prompt-repeats N]
#       [--build DIR] [--work DIR] [--cpu-activations f32|bf16]
#       [--cpu-kv-cache f32|bf16] [--cold] [--python PY] [--no-build]
#
# --images 0: text-only requests, 1: each with the sample image, both (the
# default): both kinds. --repeats N (default 3) processes per kind and B,
# interleaved (every kind and B once, then again), the median of their
# per-process medians reported with the spread. The read bandwidth and the
# FMA peak (and with bf16 activations the bf16 products' peak) are measured before
# every process and after the last, the highest of each kept. --max-tokens
# (default 33) per request: the steps counted are those after the first
# token.
# --prompt-repeats N (default 1): each request's prompt is the bench prompt
#   N times over, about 6·N tokens, so that the steps read a long K/V cache:
#   at 150, a 940-token prompt, where a 16-sequence step of `small` spends a
#   third of its time in attention. The bytes and FLOPs count the cache at
#   the run's mean context (the table's column).
# --cpu-activations f32|bf16: ours with mllama run's --cpu-activations (f32,
#   the default, is the reference numerics; bf16 needs AVX-512 BF16: its
#   bf16 Linears run on AMX where the CPU has it, else on the bf16 dot
#   product; the decode attention stays f32 FMA).
# --cpu-kv-cache f32|bf16: ours with mllama run's --cpu-kv-cache (f32, the
#   default; bf16, any CPU: the K/V caches and image states stored bf16, so
#   the bytes bound counts 2 bytes per cached element; the attention's FLOPs
#   stay f32 FMA).
# By default each process first runs B warm-up requests of the same kind and
#   length, then the B measured ones on the K/V pool pages they touched
#   (make_batch.py --warm-up: the batch's aggregate leaves the warm-up out;
#   mllama run --no-prefix-cache, so that finished requests free their blocks
#   for reuse): the step of a worker that has served a while. Before f90a2f7
#   the CPU backend faulted its K/V pool in lazily, and a fresh process took a
#   page fault every few tokens of every sequence (at B = 32 on `small` 128
#   faults a step, ~4% of it); it now faults its pools in at load, and what the
#   warm-up still gives the measured requests is the blocks and caches a
#   served worker's have. --cold: the B requests alone in a fresh process
#   (this script's method before 2026-12-05).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults 1b 33
concurrency="1 2 4 8 16 32"
images=both
cpu_activations=f32
cpu_kv_cache=f32
prompt_repeats=1
cold=0
BENCH_OPTIONS="concurrency images cpu_activations cpu_kv_cache prompt_repeats"
BENCH_FLAGS="cold"
bench_parse_args "$@"
if [ "$cold" = 0 ]; then
    warm_up=(--warm-up)
    pool="after B warm-up requests in each process"
else
    warm_up=()
    pool="a fresh K/V pool (--cold)"
fi
[[ "$prompt_repeats" =~ ^[1-9][0-9]*$ ]] ||
    bench_die "--prompt-repeats: expected a positive integer, got '$prompt_repeats'"
prompt="$BENCH_PROMPT"
for _ in $(seq 2 "$prompt_repeats"); do
    prompt+=" $BENCH_PROMPT"
done
case "$images" in
0) kinds=text ;;
1) kinds=image ;;
both) kinds="text image" ;;
*) bench_die "--images: expected 0, 1 or both, got '$images'" ;;
esac
bench_check_cpu_options
bench_setup roofline bench_read_bw bench_fma_peak

for kind in $kinds; do
    for b in $concurrency; do
        image_arg=()
        [ "$kind" = text ] || image_arg=(--image "$image")
        "$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" \
            --prompt "$prompt" --concurrent "$b" --same-length --ignore-eos \
            "${warm_up[@]}" "${image_arg[@]}" >"$run/${kind}_b$b.jsonl"
    done
done

echo "roofline: preset $preset, B in {$concurrency}, $max_tokens tokens per request," \
    "the prompt $prompt_repeats time(s), $BENCH_THREADS threads, $repeats processes each," \
    "$cpu_activations activations, $cpu_kv_cache K/V cache, $pool"
cpu_model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
load_before=$(bench_load)
echo "machine: $cpu_model"
echo "before: $load_before"
bws=()
fmas=()
dots=()
dot_kind=
measure() {
    local fma isa dot kind
    bws+=("$(bench_read_gbs)")
    read -r fma isa dot kind <<<"$(bench_peaks)"
    [ -n "$fma" ] && fmas+=("$fma $isa")
    if [ "$cpu_activations" = bf16 ]; then
        [ -n "$dot" ] ||
            bench_die "bench_fma_peak measured no bf16 dot peak (--cpu-activations bf16 needs AVX-512 BF16)"
        dots+=("$dot")
        dot_kind=$kind
    fi
}
for r in $(seq 1 "$repeats"); do
    for kind in $kinds; do
        for b in $concurrency; do
            measure
            "$mllama" run --model "$model" --batch "$run/${kind}_b$b.jsonl" \
                --threads "$BENCH_THREADS" --cpu-activations "$cpu_activations" \
                --cpu-kv-cache "$cpu_kv_cache" ${warm_up[*]:+--no-prefix-cache} --weights-read \
                >"$run/${kind}_b${b}_$r.out" ||
                bench_die "$kind batch of $b failed"
        done
    done
done
measure
load_after=$(bench_load)
echo "after: $load_after"
read_gbs=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
[ -n "$read_gbs" ] || bench_die "bench_read_bw failed"
fma=$(printf '%s\n' "${fmas[@]}" | sort -g | tail -1)
[ -n "$fma" ] || bench_die "bench_fma_peak failed"
dot_arg=()
if [ "$cpu_activations" = bf16 ]; then
    dot_arg=(--dot-gflops "$(printf '%s\n' "${dots[@]}" | sort -g | tail -1)")
fi
echo "read bandwidth ($BENCH_THREADS threads, 1 GiB, 64-byte loads) around the runs:" \
    "${bws[*]} GB/s"
echo "f32 FMA peak ($BENCH_THREADS threads, isa ${fma#* }: the engine's pick) around the runs:" \
    "$(printf '%s\n' "${fmas[@]}" | cut -d' ' -f1 | tr '\n' ' ')GFLOP/s"
[ "$cpu_activations" = f32 ] ||
    echo "bf16 peak ($BENCH_THREADS threads, $dot_kind: the bf16 Linears') around the runs:" \
        "${dots[*]} GFLOP/s"
echo

specs=()
for kind in $kinds; do
    for b in $concurrency; do
        outs=()
        for r in $(seq 1 "$repeats"); do
            outs+=("$run/${kind}_b${b}_$r.out")
        done
        specs+=("$kind:$b=$(IFS=,; echo "${outs[*]}")")
    done
done
median_gbs=$(printf '%s\n' "${bws[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
$report roofline --model "$model" --preset "$preset" --read-gbs "$read_gbs" \
    --median-read-gbs "$median_gbs" --image-tiles "$(bench_image_tiles)" \
    --fma-gflops "${fma%% *}" "${dot_arg[@]}" --kv-bytes "$(bench_kv_bytes)" "${specs[@]}" \
    --machine "$cpu_model, isa ${fma#* }, $BENCH_THREADS threads; before: $load_before; after: $load_after"
