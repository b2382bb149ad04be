#!/usr/bin/env bash
# Creates (or reuses) the Python environment of the gateway tests in the build
# tree: DIR/bin/python with tests/gateway/requirements.txt installed from PyPI.
# Reused as long as requirements.txt is unchanged (a stamp holds its hash).
# Exit 77 (ctest: skipped) when the package index (PyPI, or the mirror pip is
# configured with) cannot be reached, saying so on stderr.
#   venv.sh DIR
set -euo pipefail
dir=$1
here=$(cd "$(dirname "$0")" && pwd)
req=$here/requirements.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
stamp=$dir/.requirements.sha256
if [ -x "$dir/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi

rm -rf "$dir"
python3 -m venv "$dir"
pip=("$dir/bin/python" -m pip --disable-pip-version-check)
if ! "${pip[@]}" install --quiet -r "$req"; then
  # Unreachable (no network, no mirror): skipped. Reachable: a real failure
  # (a pin that does not resolve), which must fail the test.
  if ! "${pip[@]}" index versions pip >/dev/null 2>&1; then
    echo "SKIPPED: the Python package index is unreachable; the gateway tests need" \
         "the packages of $req" >&2
    exit 77
  fi
  exit 1
fi
echo "$want" > "$stamp"
echo "venv: $dir ($(grep -v '^#' "$req" | paste -sd' '))"
