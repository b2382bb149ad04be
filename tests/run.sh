#!/usr/bin/env bash
# The whole test suite, as CI runs it (README.md "Build and test"):
#   1. the release build with every test except benchmarks (gpu tests skip
#      themselves without a device; the CUDA backend is compiled when nvcc exists),
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer, but
#      the `conformance` ones (the gateway driven by the openai Python client,
#      curl and headless Chromium: the wire format, the same in every build;
#      the gateway's C tests run its code under the sanitizers),
#   3. the CUDA backend executed on the host (MLLAMA_CUDA=HOST, kernels/README.md):
#      the op tests in release under three schedule orders, then every cuda_host
#      test (the whole-model ones too) under ASan + UBSan,
#   4. every libFuzzer target for a short run (clang).
# Build trees go to build-test*/ at the repository root. Exits non-zero on the
# first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
fuzz_seconds=${MLLAMA_FUZZ_SECONDS:-15}

bash ops/install-deps.sh

stage() { printf '\n==== %s ====\n' "$*"; }

stage "release build"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DMLLAMA_CUDA=AUTO >/dev/null
cmake --build build-test -j"$jobs"
stage "release tests"
ctest --test-dir build-test -LE bench -j"$jobs" --output-on-failure --timeout 900

stage "sanitizer build (ASan + UBSan)"
# -O2 with debug info: the sanitizers find the same bugs, and the worker
# tests (several processes running the model) stay within their timeouts.
# The sanitizer builds (here, the host one and the fuzz one) keep line tables
# only (CMakeLists.txt): reports name the same frames and lines, and the
# builds compile 15-40% faster per file.
cmake -S . -B build-test-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLLAMA_CUDA=OFF \
  -DMLLAMA_SANITIZE=ON >/dev/null
cmake --build build-test-asan -j"$jobs"
stage "sanitizer tests"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-test-asan -LE "bench|gpu|conformance" -j"$jobs" --output-on-failure \
  --timeout 1800

# Only the targets of the tests a label selection picks (the host builds need
# nothing else).
label_targets() { # build dir, ctest label options
  local dir=$1
  shift
  ctest --test-dir "$dir" -N "$@" | sed -n 's/.*Test *#[0-9]*: //p' | tr '\n' ' '
}

stage "host CUDA build (MLLAMA_CUDA=HOST)"
cmake -S . -B build-test-host -DCMAKE_BUILD_TYPE=Release -DMLLAMA_CUDA=HOST >/dev/null
# The op tests and the emulator's own; the whole-model tests (label
# cuda_model) run once, in the sanitizer stage below, where they check the
# same numerics.
cmake --build build-test-host -j"$jobs" \
  --target $(label_targets build-test-host -L cuda_host -LE cuda_model)
stage "host CUDA tests (each op test under three schedule orders)"
ctest --test-dir build-test-host -L cuda_host -LE cuda_model -j"$jobs" --output-on-failure \
  --timeout 900

stage "host CUDA build under ASan + UBSan"
cmake -S . -B build-test-host-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLLAMA_CUDA=HOST \
  -DMLLAMA_SANITIZE=ON >/dev/null
cmake --build build-test-host-asan -j"$jobs" --target $(label_targets build-test-host-asan -L cuda_host)
# One schedule order (the release stage compared them). What keeps this, the
# longest stage, short without leaving anything out:
# - ctest starts the longest tests first (COST in tests/CMakeLists.txt, their
#   seconds here), so the two cores finish together instead of one running
#   test_cuda_constrained alone at the end;
# - the op tests leave out their cases at the real model's sizes under ASan
#   (test_cuda_ops_invariance, test_cuda_ops_matmul): those take no path the
#   smaller cases do not, and their time is the emulated GEMM's arithmetic,
#   which the stage above ran under three schedule orders.
# - the emulated GEMM's tile product (kernels/host/cublaslt_host_sums.cpp)
#   is compiled without ASan's checks: it reads only the tiles its caller
#   sized, whose gathers from the kernels' memory stay checked, and the
#   checks made it the largest cost of the whole-model tests here.
stage "host CUDA tests under ASan + UBSan (ops, goldens, runtime, decode graphs, worker)"
MLK_HOST_SCHEDULE=shuffle:1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-test-host-asan -L cuda_host \
  -j"$jobs" --output-on-failure --timeout 1800

stage "fuzz (libFuzzer, ${fuzz_seconds}s per target)"
CC=clang cmake -S . -B build-test-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLLAMA_CUDA=OFF \
  -DMLLAMA_SANITIZE=ON -DMLLAMA_FUZZ=ON -DMLLAMA_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
cmake --build build-test-fuzz -j"$jobs" --target $(label_targets build-test-fuzz -L fuzz)
# Each target runs for its seconds whatever else runs: one per core.
ctest --test-dir build-test-fuzz -L fuzz -j"$jobs" --output-on-failure

stage "all stages passed"
