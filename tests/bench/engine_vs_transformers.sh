#!/usr/bin/env bash
# The CPU engine against transformers on the same random-weight checkpoint,
# the same prompt ids and the same pixels, in one run, 2 threads each.
#
#   tests/bench/engine_vs_transformers.sh [--preset small|1b] [--build DIR]
#       [--work DIR] [--max-tokens N] [--repeats N] [--dtypes "bf16 f32"]
#       [--cpu-activations f32|bf16] [--cpu-kv-cache f32|bf16] [--python PY]
#       [--no-build]
#
# --cpu-activations f32|bf16: ours with mllama run's --cpu-activations (f32,
#   the default, is the reference numerics; bf16 needs AVX-512 BF16).
# --cpu-kv-cache f32|bf16: ours with mllama run's --cpu-kv-cache (f32, the
#   default; bf16, any CPU: K/V caches and image states stored bf16, as
#   transformers' bf16 model keeps them).
#
# Ours: `mllama run --batch` with three requests run one after the other
# ("after"): an image in a fresh process (cold), the sample image (warm: the
# one compared), a text-only prompt; --repeats processes, best of each
# timing. Ours runs in transformers' cross-attention row-mask mode
# (engine/model/README.md §4.6): the default, Meta's, gives other tokens
# than transformers 4.47 does, and the report compares greedy tokens. Transformers: tests/bench/engine_hf.py once per dtype (bf16 as
# stored, and f32), best of --repeats after a warm-up. Then the vision
# encode of both against its FLOP bound at the peak bench_fma_peak measures
# in the same run. See README.md here for what each figure covers.
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

bench_defaults small 33
dtypes="bf16 f32"
cpu_activations=f32
cpu_kv_cache=f32
BENCH_OPTIONS="dtypes cpu_activations cpu_kv_cache"
bench_parse_args "$@"
bench_check_cpu_options
bench_setup evt bench_fma_peak
mirror="$work/astronaut_mirror.jpg"
bench_mirror "$python" "$image" "$mirror"
"$mllama" preprocess --model "$model" --image "$image" --out "$run/pixels.npy" >"$run/layout.json"
"$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" --prompt "$BENCH_PROMPT" \
    --sequence "$mirror" "$image" - >"$run/batch.jsonl"

echo "engine vs transformers: preset $preset, $max_tokens tokens per request, $BENCH_THREADS threads," \
    "ours in transformers' row-mask mode, $cpu_activations activations, $cpu_kv_cache K/V cache"
echo "before: $(bench_load)"
# The peak the vision encode's products run on, before ours and after the
# peers (the higher kept, as roofline.sh): the f32 FMAs, or the bf16 products
# (AMX's tiles, else the bf16 dot) that --cpu-activations bf16 puts the
# tower's Linears and attention on.
peaks=("$(bench_peaks)")
for r in $(seq 1 "$repeats"); do
    bench_time_run "$run/ours_$r.jsonl" "$run/ours_$r.wall" \
        "$mllama" run --model "$model" --batch "$run/batch.jsonl" --threads "$BENCH_THREADS" \
        --cross-attention-row-mask transformers --cpu-activations "$cpu_activations" \
        --cpu-kv-cache "$cpu_kv_cache"
done
$report ours "$run"/ours_*.jsonl >"$run/ours.kv"
image_ids=$(awk '$1 == "ours_1_prompt_ids" { print $2 }' "$run/ours.kv")
text_ids=$(awk '$1 == "ours_2_prompt_ids" { print $2 }' "$run/ours.kv")
echo "after ours: $(bench_load)"

hf_files=()
for d in $dtypes; do
    OMP_NUM_THREADS=$BENCH_THREADS "$python" "$repo/tests/bench/engine_hf.py" --model "$model" \
        --pixels "$run/pixels.npy" --layout "$run/layout.json" --ids "$image_ids" \
        --text-ids "$text_ids" --max-tokens "$max_tokens" --dtype "$d" \
        --threads "$BENCH_THREADS" --repeats "$repeats" >"$run/hf_$d.kv" 2>"$run/hf_$d.log" ||
        bench_die "transformers $d failed (see $run/hf_$d.log)"
    hf_files+=("$run/hf_$d.kv")
    echo "after transformers $d: $(bench_load)"
done
echo "transformers $(awk '$1 == "hf_version" { print $2 }' "${hf_files[0]}"), torch" \
    "$(awk '$1 == "torch_version" { print $2 }' "${hf_files[0]}")" \
    "(CPU capability $(awk '$1 == "torch_cpu_capability" { print $2 }' "${hf_files[0]}"))"
peaks+=("$(bench_peaks)")
if [ "$cpu_activations" = bf16 ]; then
    peak_field=3
    case "$(printf '%s\n' "${peaks[@]}" | cut -d' ' -f4 | tail -1)" in
        amx-bf16) peak_name="AMX bf16 peak" ;;
        *) peak_name="bf16 dot peak" ;;
    esac
else
    peak_field=1 peak_name="f32 FMA peak"
fi
peak=$(printf '%s\n' "${peaks[@]}" | cut -d' ' -f"$peak_field" | sort -g | tail -1)
[ -n "$peak" ] || bench_die "bench_fma_peak measured no $peak_name"
echo
$report compare "$run/ours.kv" "${hf_files[@]}" --model "$model" --layout "$run/layout.json" \
    --peak-gflops "$peak" --peak-name "$peak_name"
