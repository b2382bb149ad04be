#!/usr/bin/env bash
# Creates the reference Python environment that tests/bench and
# tests/golden/gen_fixtures.py run transformers from (default /opt/refvenv).
#
#   bash tests/bench/make_refvenv.sh [--prefix DIR] [--python PY] [--dry-run]
#       [--requirements FILE] [--also-import MODULE]
#
#   --prefix DIR  where the venv goes (default: $REFVENV, else /opt/refvenv);
#                 it must lie outside the repository.
#   --python PY   the interpreter the venv is made from (default python3);
#                 needs >= 3.11 (numpy 2.4 requires it).
#   --dry-run     resolve the pinned set with `pip install --dry-run` and
#                 print what would be installed; creates nothing.
#   --requirements FILE  another pinned set (default tests/golden/requirements.txt);
#                 make_peervenv.sh passes tests/bench/peers-requirements.txt,
#                 which includes the golden set with `-r`.
#   --also-import MODULE  a module to import after the install besides the
#                 golden set's (e.g. mistralrs).
#
# The versions are those of tests/golden/requirements.txt, the environment
# that produced the committed fixtures; this script adds none of its own, so
# the benchmarks and the fixtures cannot drift apart.
#
# Idempotent: a venv whose stamp matches the requirements' sha256 (the file
# and those its `-r` lines include) is left alone; otherwise pip brings the
# existing venv to the pinned set.
#
# Size: only PyPI is reachable, and PyPI's torch 2.5.1 for Linux x86_64 is
# the CUDA 12.4 build (the one the fixtures were made with, run on the CPU).
# pip pulls its nvidia-*-cu12 and triton wheels with it: about 3.0 GB of
# downloads (torch 0.91 GB, cudnn 0.66 GB, cublas 0.36 GB, the rest under
# 0.21 GB each) and several GB more once unpacked. Nothing of it needs a GPU.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
reqs="$repo/tests/golden/requirements.txt"
prefix="${REFVENV:-/opt/refvenv}"
python=python3
dry_run=0
also_import=""

die() {
    echo "make_refvenv.sh: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; prefix="$2"; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs a value"; python="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --requirements) [ $# -ge 2 ] || die "--requirements needs a value"; reqs="$2"; shift 2 ;;
    --also-import) [ $# -ge 2 ] || die "--also-import needs a value"; also_import="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/{/^set -e/!p}' "$0"; exit 0 ;;
    *) die "unknown option $1 (see the header of $0)" ;;
    esac
done

[ -f "$reqs" ] || die "missing $reqs"
command -v "$python" >/dev/null || die "no interpreter '$python' (--python)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$python is $("$python" -V 2>&1); the pinned numpy needs Python >= 3.11"

# A venv inside the tree would be picked up by git status and by the device
# runner's copy of the working tree.
abs_prefix="$(realpath -m "$prefix")"
case "$abs_prefix/" in
"$repo"/*) die "$abs_prefix is inside the repository; choose a path outside it" ;;
esac

# The requirements file and the files its `-r` lines include (relative to it).
req_files() {
    echo "$1"
    sed -n 's/^-r  *//p' "$1" | while read -r inc; do echo "$(dirname "$1")/$inc"; done
}
want="$(req_files "$reqs" | xargs cat | sha256sum | cut -d' ' -f1)"
stamp="$abs_prefix/.mllama-requirements.sha256"

if [ "$dry_run" = 1 ]; then
    # Resolves against PyPI and downloads metadata (and, for packages without
    # separate metadata, the wheel) into pip's cache; installs nothing.
    echo "would create $abs_prefix from $("$python" -V 2>&1) with:"
    "$python" -m pip install --dry-run --ignore-installed --quiet \
        --report - -r "$reqs" |
        "$python" -c 'import json, sys
for i in json.load(sys.stdin)["install"]:
    print("  %s==%s" % (i["metadata"]["name"], i["metadata"]["version"]))'
    exit 0
fi

if [ -x "$abs_prefix/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$abs_prefix is up to date with $reqs"
    exit 0
fi

[ -x "$abs_prefix/bin/python" ] || "$python" -m venv "$abs_prefix"
"$abs_prefix/bin/python" -m pip install --quiet --upgrade pip
"$abs_prefix/bin/python" -m pip install -r "$reqs"
# The imports the benchmarks and the generator make; a broken wheel fails here
# rather than in the middle of a benchmark.
"$abs_prefix/bin/python" -c 'import torch, transformers, tokenizers, PIL, numpy, peft, safetensors, skimage
print("torch", torch.__version__, "transformers", transformers.__version__)'
[ -z "$also_import" ] || "$abs_prefix/bin/python" -c "import $also_import"
echo "$want" >"$stamp"
echo "created $abs_prefix"
