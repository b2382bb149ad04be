# Shared steps of the engine benchmarks (engine_vs_transformers.sh,
# decode_bandwidth.sh, runtime_bench.sh, roofline.sh, ...): sourced, not run.
#
# Expects $repo (the repository root); defines the BENCH_* constants and the
# bench_* functions. The benchmarks run by hand (README.md here); none is a
# ctest.

BENCH_PYTHON_DEFAULT=/opt/refvenv/bin/python
BENCH_THREADS=2
BENCH_PROMPT="Describe this image in detail."
# The text of the concurrent requests of the throughput benchmarks, "(request
# i)" appended (make_batch.py --concurrent); peers.sh gives every engine the
# same (peers_mistralrs.py).
BENCH_THROUGHPUT_PROMPT="Write a short story"
BENCH_IMAGE_REL=config/samples/astronaut.jpg

bench_die() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}

# bench_check_cpu_options: the script's --cpu-activations and --cpu-kv-cache,
# checked before any work (mllama run would refuse them only at its first run).
bench_check_cpu_options() {
    local option value
    for option in cpu-activations cpu-kv-cache; do
        value="${option//-/_}"
        value="${!value}"
        case "$value" in
        f32 | bf16) ;;
        *) bench_die "--$option: expected f32 or bf16, got '$value'" ;;
        esac
    done
}

# bench_kv_bytes: the bytes of one cached K or V element under $cpu_kv_cache
# (bench_report.py --kv-bytes).
bench_kv_bytes() {
    if [ "$cpu_kv_cache" = bf16 ]; then echo 2; else echo 4; fi
}

# bench_defaults PRESET MAX_TOKENS: the shared options' defaults (the build
# in build-bench, 3 repeats, the reference venv's Python), set before the
# script's own and bench_parse_args.
bench_defaults() {
    preset="$1"
    max_tokens="$2"
    build="$repo/build-bench"
    work=""
    repeats=3
    python="$BENCH_PYTHON_DEFAULT"
    no_build=0
    image=""
}

# bench_parse_args "$@": options shared by the scripts (--preset, --build,
# --work, --max-tokens, --repeats, --python, --no-build) and the script's own
# listed in $BENCH_OPTIONS (e.g. "dtypes" for --dtypes) and, taking no value,
# in $BENCH_FLAGS (e.g. "cold" for --cold, which sets $cold to 1); `--max-tokens
# N` sets $max_tokens. Called after bench_defaults and the script's own
# defaults.
bench_parse_args() {
    local name
    while [ $# -gt 0 ]; do
        name="${1#--}"
        name="${name//-/_}"
        case " no_build ${BENCH_FLAGS:-} " in
        *" $name "*)
            printf -v "$name" 1
            shift
            continue
            ;;
        esac
        case " preset build work max_tokens repeats python ${BENCH_OPTIONS:-} " in
        *" $name "*) ;;
        *) bench_die "unknown option $1 (see the header of $0)" ;;
        esac
        [ $# -ge 2 ] || bench_die "$1 needs a value (see the header of $0)"
        printf -v "$name" '%s' "$2"
        shift 2
    done
}

# bench_build BUILD_DIR TARGET...: configure BUILD_DIR as a Release CPU build
# when it has no cache yet, then build the targets (incremental).
bench_build() {
    local build="$1" log
    shift
    mkdir -p "$build"
    log="$build/bench-build.log"
    if [ ! -f "$build/CMakeCache.txt" ]; then
        cmake -S "$repo" -B "$build" -DMLLAMA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$log" 2>&1 ||
            bench_die "cmake configure of $build failed (see $log)"
    fi
    cmake --build "$build" -j2 --target "$@" >"$log" 2>&1 ||
        bench_die "build of $* in $build failed (see $log)"
}

# bench_model MLLAMA PRESET DIR [--fp8]: a random-weight checkpoint of PRESET
# in DIR (with --fp8 as a compressed-tensors FP8 checkpoint), written by
# `mllama mkmodel` unless DIR already holds one.
bench_model() {
    local mllama="$1" preset="$2" dir="$3"
    shift 3
    [ -x "$mllama" ] || bench_die "$mllama is not built"
    if [ ! -f "$dir/config.json" ]; then
        "$mllama" mkmodel --preset "$preset" --out "$dir" "$@" >/dev/null 2>&1 ||
            bench_die "mkmodel --preset $preset $* failed"
    fi
}

# bench_setup NAME [TARGET...]: the common start of a benchmark, after
# bench_parse_args: sets $work (default under the build), $mllama, $report,
# builds mllama and the TARGETs (unless --no-build: then checks they are
# built, since a missing one would fail in a pipe without a word), writes the preset's
# checkpoint to $model, sets $image (the sample image, unless a script's
# --image gave another) and makes $run, a fresh directory $work/NAME_$preset.
bench_setup() {
    local name="$1"
    shift
    work="${work:-$build/bench-work}"
    mkdir -p "$work"
    mllama="$build/service/mllama"
    report="$python $repo/tests/bench/bench_report.py"
    [ "$no_build" = 1 ] || bench_build "$build" mllama "$@"
    local target
    for target in service/mllama "${@/#/tests/}"; do
        [ -x "$build/$target" ] ||
            bench_die "$build/$target is not built (run without --no-build, or build it)"
    done
    model="$work/$preset"
    bench_model "$mllama" "$preset" "$model"
    image="${image:-$repo/$BENCH_IMAGE_REL}"
    run="$work/${name}_$preset"
    rm -rf "$run"
    mkdir -p "$run"
}

# bench_mirror PYTHON SRC DST: SRC flipped left-right, same size, hence the
# same tile layout and cost, but another image (a cache miss).
bench_mirror() {
    [ -f "$3" ] || "$1" -c 'import sys; from PIL import Image, ImageOps
ImageOps.mirror(Image.open(sys.argv[1])).save(sys.argv[2], quality=95)' "$2" "$3" ||
        bench_die "cannot write $3 (needs Pillow in $1)"
}

# bench_image_tiles: the real tiles of the sample image ($image) under
# $model's preprocessing, the tiles whose cross K/V a decode step reads
# (bench_report.py's --image-tiles).
bench_image_tiles() {
    "$mllama" preprocess --model "$model" --image "$image" --out /dev/null |
        sed -n 's/.*"tiles": \([0-9]*\).*/\1/p'
}

# bench_read_gbs: the read bandwidth (GB/s) bench_read_bw measures now with
# $BENCH_THREADS threads, the ceiling of a memory-bound decode. Measure it
# around every decode run and keep the highest: on a VM it moves with the
# neighbours (20-36 GB/s within minutes on the development machine).
bench_read_gbs() {
    ML_BENCH=1 ML_BENCH_THREADS=$BENCH_THREADS "$build/tests/bench_read_bw" 2>/dev/null |
        awk -v t="$BENCH_THREADS" '$3 == t"" { for (i = 4; i <= NF; i++) if ($i == "GB/s") print $(i - 1) }'
}

# bench_peaks: "GFLOPS ISA [BF16 KIND]" from one run of bench_fma_peak with
# $BENCH_THREADS threads: the f32 FMA peak on the ISA the CPU backend picks
# (the ceiling of a compute-bound step) and that ISA's name, then, on a CPU
# with AVX-512 BF16, the peak of the products --cpu-activations bf16 runs
# and its kind: AMX's TDPBF16PS where the backend picks it ("amx-bf16"),
# else the bf16 dot (4 FLOPs a VDPBF16PS lane, "avx512-bf16"). Measured
# around every run, the highest of each kept, as bench_read_gbs.
bench_peaks() {
    ML_BENCH=1 ML_BENCH_THREADS=$BENCH_THREADS "$build/tests/bench_fma_peak" 2>/dev/null |
        awk -v t="$BENCH_THREADS" '
            function gflops(i) { for (i = 7; i <= NF; i++) if ($i == "GFLOP/s") return $(i - 1) }
            $4 == t"" && $1 == "f32" { isa = $6; sub(",", "", isa); fma = gflops() }
            $4 == t"" && $1 == "bf16" { dot = gflops(); kind = "avx512-bf16" }
            $4 == t"" && $1 == "amx" { dot = gflops(); kind = "amx-bf16" }
            END { if (fma != "") print fma, isa, dot, kind }'
}

# bench_load: the machine load, to be printed with every result.
bench_load() {
    echo "load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
}

# bench_time_run OUT_FILE WALL_FILE CMD...: run CMD with stdout to OUT_FILE
# and its wall-clock seconds written to WALL_FILE.
bench_time_run() {
    local out="$1" wall="$2" t0 t1
    shift 2
    t0=$(date +%s.%N)
    "$@" >"$out" || bench_die "failed: $*"
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }' >"$wall"
}
