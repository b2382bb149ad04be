#!/bin/sh
# Prints, one per line, the installed packages that own the shared libraries
# BINARY links: what a runtime image built from the same distribution release
# must install. Libraries owned by no package (the CUDA driver, anything under
# a symlinked /usr/local/cuda) are left out; the image checks with ldd that
# everything resolves.
#
#   sh ops/runtime-packages.sh build/service/mllama
set -eu
[ $# -eq 1 ] || { echo "usage: $0 BINARY" >&2; exit 2; }
# dpkg records a library under /lib or /usr/lib depending on the package,
# while ldd prints whichever the loader found first (merged /usr): ask for both.
ldd "$1" | awk '$3 ~ "^/" { print $3 }' | while read -r lib; do
  dpkg -S "${lib#/usr}" "/usr${lib#/usr}" 2>/dev/null || true
done | cut -d: -f1 | sort -u
