#!/usr/bin/env bash
# Installs every Debian 12 package that the build, the demo and the tests need.
# Idempotent: installs only what is missing, and touches nothing when all is
# present. Nothing is downloaded from outside the Debian archive. Run as root
# (or with sudo available).
set -euo pipefail

packages=(
  build-essential cmake pkg-config   # compiler and build
  libcjson-dev                       # JSON: config.json, tokenizer.json, protocol
  libjpeg-dev                        # JPEG decode (the libjpeg API)
  libpng-dev                         # PNG decode
  libwebp-dev                        # WebP decode
  libgif-dev                         # GIF decode (giflib)
  libtiff-dev                        # TIFF decode (scanned documents)
  librdkafka-dev kcat                # Kafka client; kcat as the independent test client
  libhiredis-dev redis-server        # Redis client; a local server for demos and tests
  libevent-dev                       # the gateway's HTTP server (evhttp) and event loop
  libcurl4-openssl-dev openssl       # the gateway's image URL fetches; test certificates
  clang libclang-rt-dev              # libFuzzer targets in CI
  chromium chromium-driver python3-venv  # the gateway's page and client tests (tests/gateway)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (missing: ${missing[*]})" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# redis-server's package starts a system instance; tests and demos run their own.
