#!/usr/bin/env bash
# The JSON Schema benchmark: ours (`mllama grammar`) against llguidance and
# xgrammar on the MaskBench sample (corpus.jsonl.gz, README.md here), same
# tokenizer, same instances, one thread each; prints the table of
# tests/bench/README.md and writes our failures grouped by reason.
#
#   tests/bench/grammar/run.sh [--engines "ours llg xgr"] [--build DIR] [--work DIR]
#                              [--venv DIR] [--timeout S] [--no-build]
#
#   --engines  which engines to (re)run; the report takes every engine whose
#              results are in the work folder (default: all three)
#   --build    the Release CPU build holding `mllama` (default build-bench)
#   --work     results and logs (default BUILD/grammar-bench)
#   --venv     the Python environment of the peers (default
#              $GRAMMAR_BENCH_VENV, else /opt/grammar-bench-venv), created
#              from requirements.txt here when missing or stale; outside the
#              repository. xgrammar pulls torch (PyPI's CUDA build, ~5 GB
#              installed), which it imports though nothing here uses a GPU.
#   --timeout  seconds one schema (compile and all its instances) may take
#              before it counts as a timeout (default 60; MaskBench gave 900)
#   --no-build use the mllama already built
#
# The tokenizer is config/tokenizer (Llama 3.1's, Mllama's vocabulary).
# Runs by hand, not under ctest: the peers need the venv and PyPI.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
here="$repo/tests/bench/grammar"
# shellcheck source=../lib.sh
. "$repo/tests/bench/lib.sh"

engines="ours llg xgr"
build="$repo/build-bench"
work=""
venv="${GRAMMAR_BENCH_VENV:-/opt/grammar-bench-venv}"
timeout=60
no_build=0
while [ $# -gt 0 ]; do
    case "$1" in
    --engines | --build | --work | --venv | --timeout)
        [ $# -ge 2 ] || bench_die "$1 needs a value"
        printf -v "${1#--}" '%s' "$2"
        shift 2
        ;;
    --no-build) no_build=1; shift ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    *) bench_die "unknown option $1 (see the header of $0)" ;;
    esac
done
work="${work:-$build/grammar-bench}"
tokenizer="$repo/config/tokenizer"
mkdir -p "$work"

case "$(realpath -m "$venv")/" in
"$repo"/*) bench_die "$venv is inside the repository; choose a path outside it" ;;
esac
want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$venv/.grammar-bench.sha256" 2>/dev/null)" != "$want" ]; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt" ||
        bench_die "pip install into $venv failed"
    echo "$want" >"$venv/.grammar-bench.sha256"
fi
py="$venv/bin/python"

if [ "$no_build" = 0 ]; then
    bench_build "$build" mllama
fi
mllama="$build/service/mllama"
[ -x "$mllama" ] || bench_die "$mllama is not built"

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average at start:$(cut -d' ' -f1-3 /proc/loadavg | sed 's/^/ /')"
"$py" -c 'from importlib.metadata import version as v
print("llguidance", v("llguidance"), "| xgrammar", v("xgrammar"), "| tokenizers", v("tokenizers"))'

"$py" "$here/grammar_bench.py" inputs "$here/corpus.jsonl.gz" "$work/inputs.jsonl"
# One thread each: rayon (llguidance), OpenMP and xgrammar's own pool
# (max_threads=1 in peers.py).
export RAYON_NUM_THREADS=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
for e in $engines; do
    case "$e" in
    ours) cmd=("$mllama" grammar --tokenizer "$tokenizer") ;;
    llg | xgr) cmd=("$py" "$here/peers.py" --engine "$e" --tokenizer "$tokenizer") ;;
    *) bench_die "unknown engine $e (ours, llg, xgr)" ;;
    esac
    echo "running $e ..."
    "$py" "$here/grammar_bench.py" drive --timeout "$timeout" --out "$work/$e.jsonl" \
        "$work/inputs.jsonl" -- "${cmd[@]}" 2>"$work/$e.log" ||
        bench_die "$e failed (see $work/$e.log)"
done
echo "load average at the end:$(cut -d' ' -f1-3 /proc/loadavg | sed 's/^/ /')"

# The first engine present is the one the ratios and the failure list are about.
report=()
for e in ours:mllama llg:llguidance xgr:xgrammar; do
    [ -f "$work/${e%%:*}.jsonl" ] && report+=("${e#*:}=$work/${e%%:*}.jsonl")
done
[ ${#report[@]} -gt 0 ] || bench_die "no results in $work"
first="${report[0]%%=*}"
"$py" "$here/grammar_bench.py" report "$here/corpus.jsonl.gz" "$tokenizer" "${report[@]}" \
    --failures "$work/failures-$first.md"
