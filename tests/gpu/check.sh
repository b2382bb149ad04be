#!/usr/bin/env bash
# The one script a lent GPU machine runs (an H200, 16 cores, no network):
# build the CUDA backend for sm_90, run the gpu-labelled tests, then the
# decode/vision benchmark (with the cost of runtime.batch_invariant: the
# 11B decode and the vision encode again with it on), and write a summary
# (JSON + text).
#
#   bash tests/gpu/check.sh            # from the repository root
#
# Build: the project's CMake build (MLLAMA_CUDA=ON, Release, sm_90 only)
# when its dependencies are present, the machine's or those tests/gpu/deps.sh
# gathered into .gpu-deps; it never installs anything and never touches the
# network (a lent machine is offline). Without them it
# falls back to compiling directly only what the GPU checks need: the
# kernels, engine/*.c and engine/cpu/*.c, test_cuda_device, the
# test_cuda_ops_* tests and bench_cuda (the model tests, test_cuda_golden,
# _decode_graph and _runtime, need cJSON for the model loader and are then
# reported as not built).
#
# CHECK_NCU=1 also profiles the decode attention with Nsight Compute
# (ncu.txt; below).
#
# Output: $OUT/gpu-summary.json, gpu-summary.txt and the logs when OUT is
# set (the device tool's return folder), else build-gpu/. Expected runtime
# on an H200: ~2 min build, ~1 min tests, <1 min benchmark; every phase has
# a timeout so the whole stays under 8 minutes.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUILD=${CHECK_BUILD_DIR:-$ROOT/build-gpu}
DEST=${OUT:-$BUILD}
JOBS=${JOBS:-16}
TEST_TIMEOUT=300   # seconds per test
BENCH_TIMEOUT=240
# The CMake build asks ctest for the gpu label's tests and builds and runs
# those; the direct build knows these lists.
# The ops against the CPU backend, one executable per file (tests/gpu/test_cuda_ops_*.c).
CUDA_OPS_TESTS=(test_cuda_ops_backend test_cuda_ops_matmul test_cuda_ops_norms
                test_cuda_ops_elementwise test_cuda_ops_sample test_cuda_ops_attn
                test_cuda_ops_graphs test_cuda_ops_invariance)
# The model end to end on CUDA backends (CMake build only: they need cJSON),
# reported as not built by the direct build; test_worker_cuda skips itself
# where redis-server or kcat is missing.
CUDA_MODEL_TESTS=(test_cuda_golden test_cuda_decode_graph test_cuda_runtime
                  test_cuda_constrained test_cuda_choices test_cuda_batch_invariance
                  test_worker_cuda)
GPU_TESTS=()
mkdir -p "$BUILD" "$DEST"
LOG=$DEST/check.log
: >"$LOG"
START=$(date +%s)

say() { echo "check.sh: $*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }

[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}
if ! command -v nvcc >/dev/null; then
    say "no nvcc on this machine: nothing to build"
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$LOG" 2>&1 || true

# ---- NCCL: the toolkit's, a system one, or the nvidia-nccl wheel's ---------------------
NCCL_ROOT=""
for d in "$CUDA_HOME" /usr /usr/local; do
    if [ -f "$d/include/nccl.h" ]; then NCCL_ROOT=$d; break; fi
done
if [ -z "$NCCL_ROOT" ] && command -v python3 >/dev/null; then
    NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
    [ -n "$NCCL_ROOT" ] && [ ! -f "$NCCL_ROOT/include/nccl.h" ] && NCCL_ROOT=""
fi
say "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), NCCL ${NCCL_ROOT:-not found}"

# ---- dependencies of the full CMake build -------------------------------------------------
# tests/gpu/deps.sh, run before the machine was asked for, leaves Debian's
# packages of them in .gpu-deps: its pkg-config, redis-server and kcat come
# first on the PATH, the compilers see its headers, and the tests are linked
# with an RPATH (not RUNPATH: it also serves librdkafka's own needs) to its
# libraries, which nothing else on the machine loads.
DEPS=$ROOT/.gpu-deps
DEPS_LDFLAGS=""
if [ -x "$DEPS/bin/pkg-config" ]; then
    export PATH=$DEPS/bin:$PATH
    export CPATH=$DEPS/root/usr/include:$DEPS/root/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
    DEPS_LDFLAGS="-Wl,--disable-new-dtags"
    # -L as well: Debian's hiredis.pc names libdir /usr/lib, which pkg-config
    # drops as a system directory, leaving a bare -lhiredis.
    for d in "$DEPS/root/usr/lib/x86_64-linux-gnu" "$DEPS/root/lib/x86_64-linux-gnu"; do
        DEPS_LDFLAGS+=" -L$d -Wl,-rpath,$d"
    done
    say "dependencies from $DEPS"
fi
deps_ok() {
    command -v cmake >/dev/null && command -v pkg-config >/dev/null || return 1
    for p in libcjson libjpeg libpng rdkafka hiredis libevent; do
        pkg-config --exists "$p" || return 1
    done
}
# Nothing is installed: a lent machine is offline, and this script never
# touches the network. Without the dependencies the direct build below runs.
deps_ok || say "build dependencies of the full build missing: not installing (offline)"

# ---- build ---------------------------------------------------------------------------------
MODE=cmake
BIN=$BUILD/tests
build_cmake() {
    local extra=()
    [ -n "$NCCL_ROOT" ] && extra+=(-DNCCL_ROOT="$NCCL_ROOT")
    [ -n "$DEPS_LDFLAGS" ] && extra+=(-DCMAKE_EXE_LINKER_FLAGS="$DEPS_LDFLAGS")
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    # An existing build dir keeps its generator.
    [ -f "$BUILD/CMakeCache.txt" ] && gen=()
    cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DMLLAMA_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 "${extra[@]}" >>"$LOG" 2>&1 || return 1
    # Every test of the gpu label (a test's executable bears its name).
    mapfile -t GPU_TESTS < <(ctest --test-dir "$BUILD" -N -L gpu | sed -n 's/.*Test *#[0-9]*: //p')
    [ ${#GPU_TESTS[@]} -gt 0 ] || return 1
    # Keep going past a target that fails: every test that built still runs,
    # and one whose executable is missing is reported failed below.
    local keep=(-k)
    grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$BUILD/CMakeCache.txt" && keep=(-k 0)
    cmake --build "$BUILD" -j"$JOBS" --target mlk_cuda bench_cuda "${GPU_TESTS[@]}" \
        -- "${keep[@]}" >>"$LOG" 2>&1 || say "CMake build: some targets failed (see check.log)"
}

# Direct compilation of what the GPU checks need, for machines without the
# service's libraries (librdkafka, hiredis, cJSON, libjpeg).
build_direct() {
    local obj=$BUILD/direct
    mkdir -p "$obj"
    local nccl_c=() nccl_l=()
    if [ -n "$NCCL_ROOT" ]; then
        local lib
        lib=$(ls "$NCCL_ROOT"/lib/libnccl.so* "$NCCL_ROOT"/lib64/libnccl.so* 2>/dev/null | head -1)
        if [ -n "$lib" ]; then
            nccl_c=(-DMLK_HAVE_NCCL=1 -I"$NCCL_ROOT/include")
            nccl_l=("$lib" -Wl,-rpath,"$(dirname "$lib")")
        fi
    fi
    local cflags=(-std=gnu11 -O3 -I"$ROOT/engine" -I"$ROOT/kernels" -I"$ROOT/tests"
                  -DML_SOURCE_DIR="\"$ROOT\"" -DML_BINARY_DIR="\"$BUILD\"")
    local failed=0 f
    # At most JOBS compilers at once.
    spawn() {
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || failed=1; done
        "$@" >>"$LOG" 2>&1 &
    }
    for f in "$ROOT"/kernels/*.cu; do
        spawn nvcc -std=c++17 -O3 -arch=sm_90 -Xcompiler -fPIC -I"$ROOT/kernels" \
            -I"$ROOT/engine" "${nccl_c[@]}" -c "$f" -o "$obj/$(basename "$f").o"
    done
    for f in "$ROOT"/engine/*.c "$ROOT"/engine/cpu/*.c; do
        # The engine's front door needs the model loader (cJSON) and the tokenizer.
        [ "$(basename "$f")" = engine.c ] && continue
        local isa=()
        case "$f" in
        *_avx512.c) isa=(-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma) ;;
        *_avx2.c) isa=(-mavx2 -mfma -mf16c) ;;
        esac
        spawn cc "${cflags[@]}" "${isa[@]}" -c "$f" -o "$obj/$(basename "$f").o"
    done
    while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
    [ $failed = 0 ] || return 1
    mkdir -p "$BIN"
    local libs=("$obj"/*.o -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -lcudart_static -lcublasLt
                "${nccl_l[@]}" -Wl,-rpath,"$CUDA_HOME/lib64" -lstdc++ -lpthread -ldl -lrt -lm)
    for t in test_cuda_device "${CUDA_OPS_TESTS[@]}" bench_cuda; do
        cc "${cflags[@]}" "$ROOT/tests/gpu/$t.c" "$ROOT/tests/harness.c" "${libs[@]}" -o "$BIN/$t" >>"$LOG" 2>&1 || return 1
    done
}

# CHECK_BUILD=direct forces the fallback (to test it where CMake would work).
build_start=$(date +%s)
if [ "${CHECK_BUILD:-auto}" != direct ] && deps_ok && build_cmake; then
    MODE=cmake
else
    if [ "${CHECK_BUILD:-auto}" = direct ]; then
        say "CHECK_BUILD=direct: direct build of the GPU targets"
    elif deps_ok; then
        say "CMake build failed (see check.log): direct build of the GPU targets"
    else
        say "dependencies of the full build absent: direct build of the GPU targets"
    fi
    MODE=direct
    build_direct || { say "direct build failed (see check.log)"; MODE=failed; }
fi
BUILD_S=$(($(date +%s) - build_start))
say "build ($MODE): ${BUILD_S}s"

# ---- tests ---------------------------------------------------------------------------------
TESTS_JSON=""
run_test() { # name: run tests/<name> from the repository root, as ctest does
    local name=$1 rc t0 t1 status
    if [ ! -x "$BIN/$name" ]; then
        status=not_built
        rc=-1
        t0=0 t1=0
    else
        t0=$(date +%s)
        timeout "$TEST_TIMEOUT" "$BIN/$name" >"$DEST/$name.log" 2>&1
        rc=$?
        t1=$(date +%s)
        case $rc in
        0) status=passed ;;
        77) status=skipped ;;
        124) status=timeout ;;
        *) status=failed ;;
        esac
    fi
    say "test $name: $status (rc $rc, $((t1 - t0))s)"
    [ "$status" = failed ] && tail -30 "$DEST/$name.log" | tee -a "$LOG"
    TESTS_JSON+="${TESTS_JSON:+, }{\"name\": \"$name\", \"status\": \"$status\", \"rc\": $rc, \"seconds\": $((t1 - t0))}"
}
if [ "$MODE" = cmake ]; then
    # The project's own runner over the gpu label, for the record ...
    (cd "$BUILD" && timeout $((3 * TEST_TIMEOUT)) ctest -L gpu --timeout "$TEST_TIMEOUT" \
        --output-on-failure) >"$DEST/ctest.log" 2>&1
    say "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$DEST/ctest.log" | tail -1)"
    # ... whose per-test results feed the summary.
    for t in "${GPU_TESTS[@]}"; do
        line=$(grep -E "Test +#[0-9]+: $t " "$DEST/ctest.log" | tail -1)
        secs=$(echo "$line" | sed -n 's/.* \([0-9.]*\) sec.*/\1/p')
        case "$line" in
        *Passed*) st=passed ;;
        *Skipped*) st=skipped ;;
        *"Not Run"*) st=failed ;; # built above: its executable missing is a failure
        *Timeout*) st=timeout ;;
        "") st=not_run ;;
        *) st=failed ;;
        esac
        say "test $t: $st (${secs:-?}s)"
        TESTS_JSON+="${TESTS_JSON:+, }{\"name\": \"$t\", \"status\": \"$st\", \"seconds\": ${secs:-0}}"
    done
elif [ "$MODE" = direct ]; then
    run_test test_cuda_device
    for t in "${CUDA_OPS_TESTS[@]}"; do
        run_test "$t"
    done
    for t in "${CUDA_MODEL_TESTS[@]}"; do
        TESTS_JSON+=", {\"name\": \"$t\", \"status\": \"not_built\", \"reason\": \"no cJSON on this machine\"}"
    done
fi

# ---- benchmark -----------------------------------------------------------------------------
BENCH_JSON=null
if [ -x "$BIN/bench_cuda" ]; then
    timeout "$BENCH_TIMEOUT" "$BIN/bench_cuda" "$DEST/bench.json" >"$DEST/bench.txt" 2>&1
    brc=$?
    cat "$DEST/bench.txt" >>"$LOG"
    say "bench_cuda: rc $brc"
    [ $brc = 0 ] && [ -s "$DEST/bench.json" ] && BENCH_JSON=$(cat "$DEST/bench.json")
fi

# ---- profile (CHECK_NCU=1) ------------------------------------------------------------------
# Nsight Compute on the decode attention, the part of a step furthest from
# its bound (kernels/README.md): the first launches of attn_simt_kernel in
# bench_cuda (the 1B decoder's), with the sections that say whether it
# waits on memory or on too few warps. Off by default: ncu replays each
# profiled kernel and slows the bench around them.
NCU_TIMEOUT=150
NCU_LAUNCHES=4
if [ "${CHECK_NCU:-0}" = 1 ] && [ -x "$BIN/bench_cuda" ]; then
    if command -v ncu >/dev/null; then
        timeout "$NCU_TIMEOUT" ncu -k regex:attn_simt_kernel --launch-count "$NCU_LAUNCHES" \
            --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats "$BIN/bench_cuda" >"$DEST/ncu.txt" 2>&1
        say "ncu: rc $? (ncu.txt)"
    else
        say "ncu: not on this machine"
    fi
fi

# ---- summary --------------------------------------------------------------------------------
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
cat >"$DEST/gpu-summary.json" <<EOF
{
  "gpu": "${GPU:-unknown}",
  "build": {"mode": "$MODE", "seconds": $BUILD_S, "arch": "sm_90", "nccl": "${NCCL_ROOT:-none}"},
  "tests": [$TESTS_JSON],
  "bench": $BENCH_JSON,
  "total_seconds": $(elapsed)
}
EOF
{
    echo "GPU check on ${GPU:-unknown GPU}: build $MODE in ${BUILD_S}s, total $(elapsed)s"
    grep -E "^check.sh: test " "$LOG" | sed 's/^check.sh: /  /'
    [ -s "$DEST/bench.txt" ] && sed 's/^/  /' "$DEST/bench.txt"
} >"$DEST/gpu-summary.txt"
cat "$DEST/gpu-summary.txt"
# Fail when a test failed, timed out or never reported (ctest cut off), or
# nothing could be built.
! grep -qE '"status": "(failed|timeout|not_run)"' "$DEST/gpu-summary.json" && [ "$MODE" != failed ]
