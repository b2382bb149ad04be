#!/usr/bin/env bash
# Creates the Python environment of tests/bench/peers.sh (default
# /opt/peervenv): transformers and mistral.rs side by side, from
# tests/bench/peers-requirements.txt (the golden fixtures' pinned set, included,
# plus mistralrs).
#
#   bash tests/bench/make_peervenv.sh [--prefix DIR] [--python PY] [--dry-run]
#
#   --prefix DIR  where the venv goes (default: $PEERVENV, else /opt/peervenv);
#                 outside the repository.
#   --python PY, --dry-run  as in make_refvenv.sh, which does the work (and
#                 leaves a venv whose stamp matches the requirements alone).
#
# Size: PyPI's torch 2.5.1 is the CUDA build (about 3 GB with its nvidia-*
# wheels, run on the CPU; make_refvenv.sh's header); the mistralrs wheel is
# PyPI's CPU build (26 MB; mistralrs-cuda, -mkl, -metal and -accelerate are
# other builds under other names).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
-h | --help) sed -n '2,/^set -e/{/^set -e/!p}' "$0"; exit 0 ;;
esac
# A --prefix among "$@" comes later and wins.
exec bash "$here/make_refvenv.sh" --requirements "$here/peers-requirements.txt" \
    --also-import mistralrs --prefix "${PEERVENV:-/opt/peervenv}" "$@"
