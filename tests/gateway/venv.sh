#!/usr/bin/env bash
# Creates (or reuses) the Python environment of the gateway tests in the build
# tree: DIR/bin/python with tests/gateway/requirements.txt installed from PyPI.
# Reused as long as requirements.txt is unchanged (a stamp holds its hash).
# Exit 77 (ctest: skipped) when PyPI cannot be reached, saying so on stderr.
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

# Seconds to wait for PyPI before calling it unreachable.
pypi_timeout_s=10
if ! python3 -c 'import sys, urllib.request
urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=float(sys.argv[1]))' \
     "$pypi_timeout_s" 2>/dev/null; then
  echo "SKIPPED: PyPI (https://pypi.org) is unreachable; the gateway tests need" \
       "the packages of $req" >&2
  exit 77
fi
rm -rf "$dir"
python3 -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
echo "venv: $dir ($(grep -v '^#' "$req" | paste -sd' '))"
