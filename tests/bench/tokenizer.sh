#!/usr/bin/env bash
# Tokenizer benchmark: our encoder (bench_tokenizer) against HF `tokenizers`
# on the same ~1 MiB mixed-language text, single thread, in one run.
#
#   tests/bench/tokenizer.sh [BUILD_DIR] [PYTHON]
#
# BUILD_DIR defaults to ./build (it must contain tests/bench_tokenizer);
# PYTHON defaults to /opt/refvenv/bin/python (needs `tokenizers`).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$repo/build}"
python="${2:-/opt/refvenv/bin/python}"
bench="$build/tests/bench_tokenizer"
[ -x "$bench" ] || { echo "tokenizer.sh: $bench not built (cmake --build $build --target bench_tokenizer)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

ML_BENCH=1 "$bench" --write-text "$work/bench.txt" > "$work/ours.txt"
TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 \
    "$python" "$repo/tests/bench/tokenizer_hf.py" "$repo" "$work/bench.txt" > "$work/hf.txt"

val() { awk -v k="$1" '$1 == k { print $2 }' "$work/ours.txt" "$work/hf.txt"; }

echo "text: $(val text_bytes) bytes; HF tokenizers $(val hf_version)"
printf '%-28s %12s %12s\n' "" "ours" "HF"
printf '%-28s %12s %12s\n' "load (s)" "$(val load_seconds)" "$(val hf_load_seconds)"
printf '%-28s %12s %12s\n' "whole text tokens" "$(val whole_tokens)" "$(val hf_whole_tokens)"
printf '%-28s %12s %12s\n' "whole text tokens/s" "$(val whole_tokens_per_s)" "$(val hf_whole_tokens_per_s)"
printf '%-28s %12s %12s\n' "line by line tokens/s" "$(val lines_tokens_per_s)" "$(val hf_lines_tokens_per_s)"
printf '%-28s %12s %12s\n' "lines, HF encode_batch" "" "$(val hf_batch_tokens_per_s)"

status=0
if [ "$(val whole_tokens)" != "$(val hf_whole_tokens)" ] || [ "$(val lines_tokens)" != "$(val hf_lines_tokens)" ]; then
    echo "token counts differ from HF" >&2
    status=1
fi
awk -v a="$(val whole_tokens_per_s)" -v b="$(val hf_whole_tokens_per_s)" \
    -v c="$(val lines_tokens_per_s)" -v d="$(val hf_lines_tokens_per_s)" \
    -v e="$(val hf_batch_tokens_per_s)" \
    'BEGIN { printf "ratio ours/HF: whole %.2fx, line by line %.2fx (vs encode_batch %.2fx)\n", a / b, c / d, c / e }'
exit $status
