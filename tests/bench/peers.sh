#!/usr/bin/env bash
# Our engine side by side with its peers on the CPU, in one run: transformers
# (bf16 and f32) and mistral.rs (the `mistralrs` wheel, mllama as
# MultimodalArchitecture.VLlama, f32 and bf16), the same random-weight
# checkpoint, the same chat prompts and image, 2 threads each. Per engine:
# load time (process start to ready), TTFT with and without the image,
# decode ms/token, completion tokens/s at each concurrency, peak RSS, and how
# many threads did the work; then ours / peer per metric and the issue's
# goals (>= 2x each peer's faster dtype in decode throughput at every
# concurrency and in TTFT with the image).
#
#   tests/bench/peers.sh [--preset small|1b] [--engines "ours hf-bf16 hf-f32 mistralrs-f32
#       mistralrs-bf16"] [--concurrency "1 4 8 16"] [--build DIR] [--work DIR]
#       [--max-tokens N] [--repeats N] [--rounds N] [--cpu-activations f32|bf16]
#       [--cpu-kv-cache f32|bf16] [--python PY] [--no-build]
#
# --engines: which engines run; ours is always among them (its prompt ids and
#   pixels are transformers' inputs, and every ratio is against it).
# --concurrency: the numbers of concurrent text requests of the throughput
#   tables.
# --python: the peers' venv (default $PEERVENV/bin/python, else
#   /opt/peervenv/bin/python; tests/bench/make_peervenv.sh makes it).
# --cpu-activations f32|bf16: ours with mllama run's --cpu-activations (f32,
#   the default, is the reference numerics; bf16 needs AVX-512 BF16).
# --cpu-kv-cache f32|bf16: ours with mllama run's --cpu-kv-cache (f32, the
#   default; bf16, any CPU: K/V caches and image states stored bf16, as
#   transformers' bf16 model keeps them).
# --rounds N: the whole comparison N times, ours then each peer in every
#   round, so that each ratio pairs runs minutes apart (on a shared VM the
#   read bandwidth, which a decode step is bound by, moves within the hour);
#   prints each round's ratios and their median instead of one round's
#   tables (kept in the work dir, round_R/table.md), and holds the goals to
#   the medians. Default 1.
# The rest as in lib.sh. Ours: --repeats processes of each batch, the best of
# each timing. Peers: one process per engine, the best of --repeats in it.
# README.md here ("peers.sh") has the method, what each figure covers and
# each peer's caveats (EOS, batching, what mistralrs cannot run).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=lib.sh
. "$repo/tests/bench/lib.sh"

PEERS_ALL="ours hf-bf16 hf-f32 mistralrs-f32 mistralrs-bf16"

bench_defaults small 33
python="${PEERVENV:-/opt/peervenv}/bin/python"
engines="$PEERS_ALL"
concurrency="1 4 8 16"
cpu_activations=f32
cpu_kv_cache=f32
rounds=1
BENCH_OPTIONS="engines concurrency cpu_activations cpu_kv_cache rounds"
bench_parse_args "$@"
bench_check_cpu_options
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || bench_die "--rounds wants a positive count, not $rounds"
for e in $engines; do
    case " $PEERS_ALL " in
    *" $e "*) ;;
    *) bench_die "unknown engine $e (one of: $PEERS_ALL)" ;;
    esac
done
case " $engines " in
*" ours "*) ;;
*) bench_die "--engines needs ours: its prompt ids and pixels are transformers' inputs" ;;
esac
[ -x "$python" ] || bench_die "no $python (bash tests/bench/make_peervenv.sh, or --python)"
bench_setup peers
peers_py="$python $repo/tests/bench/peers_report.py"
mirror="$work/astronaut_mirror.jpg"
bench_mirror "$python" "$image" "$mirror"
max_b=$(echo "$concurrency" | tr ' ' '\n' | sort -n | tail -1)

isa=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
    grep -E '^(avx2|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile)$' | tr '\n' ' ')
{
    echo "cpu_model $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
    echo "isa ${isa:-none of avx2/avx512/amx}"
    echo "threads $BENCH_THREADS"
    echo "ours_activations $cpu_activations"
    echo "ours_kv_cache $cpu_kv_cache"
} >"$run/machine.kv"

echo "peers: preset $preset, $max_tokens tokens per request, $BENCH_THREADS threads per engine," \
    "engines: $engines, ours with $cpu_activations activations and a $cpu_kv_cache K/V cache"
echo "before: $(bench_load)"

# ours_run DIR NAME BATCH: --repeats processes of `mllama run --batch`, each
# under peers_report.py exec (peak RSS, threads); DIR/NAME_<r>.wall holds the
# process wall time bench_report.py ours reads.
ours_run() {
    local dir="$1" name="$2" batch="$3" r
    for r in $(seq 1 "$repeats"); do
        $peers_py exec "$dir/${name}_$r.rusage" "$mllama" run --model "$model" --batch "$batch" \
            --threads "$BENCH_THREADS" --no-prefix-cache --cpu-activations "$cpu_activations" \
            --cpu-kv-cache "$cpu_kv_cache" >"$dir/${name}_$r.jsonl" ||
            bench_die "ours: batch $batch failed"
        awk '$1 == "wall_s" { print $2 }' "$dir/${name}_$r.rusage" >"$dir/${name}_$r.wall"
    done
}

# Three requests one after the other: an image in a fresh process (cold), the
# sample image (the compared one), text only. Every prompt of ours is the
# checkpoint's chat template rendered (make_batch.py --template), the one
# mistral.rs applies to the same messages.
"$mllama" preprocess --model "$model" --image "$image" --out "$run/pixels.npy" >"$run/layout.json"
"$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" --prompt "$BENCH_PROMPT" \
    --template "$model" --ignore-eos --sequence "$mirror" "$image" - >"$run/seq.jsonl"
for b in $concurrency; do
    "$python" "$repo/tests/bench/make_batch.py" --max-tokens "$max_tokens" \
        --prompt "$BENCH_THROUGHPUT_PROMPT" --template "$model" --ignore-eos --concurrent "$b" \
        >"$run/c$b.jsonl"
done

# one_round DIR: ours, then each peer, into DIR (which exists); prints the tables of the
# round, and with --json OUT keeps their figures for the rounds' summary.
one_round() {
    local dir="$1" b e dtype paths
    shift
    ours_run "$dir" seq "$run/seq.jsonl"
    $report ours "$dir"/seq_*.jsonl >"$dir/ours.kv"
    local concurrent=()
    for b in $concurrency; do
        ours_run "$dir" "c$b" "$run/c$b.jsonl"
        paths=$(printf '%s,' "$dir/c${b}"_*.jsonl)
        concurrent+=(--ours-concurrent "$b=${paths%,}")
    done
    $peers_py ids "$dir/c${max_b}_1.jsonl" >"$dir/throughput_ids.txt"
    echo "after ours: $(bench_load)" >&2

    local peers=()
    for e in $engines; do
        dtype="${e#*-}"
        case "$e" in
        ours) continue ;;
        hf-*)
            OMP_NUM_THREADS=$BENCH_THREADS $peers_py exec "$dir/$e.rusage" \
                "$python" "$repo/tests/bench/engine_hf.py" --model "$model" \
                --pixels "$run/pixels.npy" --layout "$run/layout.json" \
                --ids "$(awk '$1 == "ours_1_prompt_ids" { print $2 }' "$dir/ours.kv")" \
                --text-ids "$(awk '$1 == "ours_2_prompt_ids" { print $2 }' "$dir/ours.kv")" \
                --batch-ids "$dir/throughput_ids.txt" --concurrency "$concurrency" \
                --max-tokens "$max_tokens" --dtype "$dtype" --threads "$BENCH_THREADS" \
                --repeats "$repeats" >"$dir/$e.kv" 2>"$dir/$e.log" ||
                bench_die "transformers $dtype failed (see $dir/$e.log)"
            ;;
        mistralrs-*)
            # candle's CPU kernels run on rayon's pool; OMP for anything else.
            RAYON_NUM_THREADS=$BENCH_THREADS OMP_NUM_THREADS=$BENCH_THREADS $peers_py exec \
                "$dir/$e.rusage" "$python" "$repo/tests/bench/peers_mistralrs.py" \
                --model "$model" --dtype "$dtype" --image "$image" --cold-image "$mirror" \
                --prompt "$BENCH_PROMPT" --throughput-prompt "$BENCH_THROUGHPUT_PROMPT" \
                --max-tokens "$max_tokens" --repeats "$repeats" --concurrency "$concurrency" \
                >"$dir/$e.kv" 2>"$dir/$e.log" ||
                bench_die "mistralrs $dtype failed (see $dir/$e.log)"
            ;;
        esac
        peers+=(--peer "$e=$dir/$e.kv,$dir/$e.rusage")
        echo "after $e: $(bench_load)" >&2
    done

    local versions
    versions=$(cat "$dir"/*.kv | awk '$1 ~ /_version$/ && !seen[$1]++ { printf "%s %s, ", $1, $2 }')
    echo "${versions%, }"
    echo
    $peers_py table --machine "$run/machine.kv" --ours "$dir/ours.kv" \
        --ours-rusage "$dir"/seq_*.rusage "$dir"/c*_*.rusage "${concurrent[@]}" "${peers[@]}" "$@"
}

if [ "$rounds" = 1 ]; then
    one_round "$run" 2>&1
else
    for r in $(seq 1 "$rounds"); do
        echo "round $r of $rounds: $(bench_load)"
        mkdir -p "$run/round_$r"
        one_round "$run/round_$r" --json "$run/round_$r/figures.json" >"$run/round_$r/table.md"
    done
    echo "after the rounds: $(bench_load)"
    echo
    figures=()
    for r in $(seq 1 "$rounds"); do
        figures+=("$run/round_$r/figures.json")
    done
    $peers_py rounds "${figures[@]}"
fi
