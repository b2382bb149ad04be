#!/usr/bin/env bash
# Gather the full build's C dependencies for a lent GPU machine, which is
# offline and has none of them: Debian 12's packages of cJSON, libjpeg,
# libpng, libwebp, giflib, libtiff, librdkafka, hiredis, libevent and libcurl
# (headers, .pc files, libraries), pkg-config, and the redis-server and kcat
# that test_worker_cuda runs, unpacked into .gpu-deps/ of the repository root
# (ignored by git; the device tool carries it). check.sh finds it there and
# builds with the CMake build (every gpu-labelled test) instead of the direct
# one (the op tests only).
#
#   bash tests/gpu/deps.sh          # on this Debian 12 machine, before `run`
#
# Nothing is unpacked over the system: the packages land in .gpu-deps/root,
# the three programs are reached through wrappers in .gpu-deps/bin that give
# only themselves the unpacked libraries, and check.sh links the tests with
# an RPATH to them, so the lent machine's own tools never load them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=$ROOT/.gpu-deps
# The build's libraries and their run-time needs that a bare CUDA image may
# lack (it has libc, libstdc++ and the compilers).
PACKAGES=(libcjson1 libcjson-dev libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev
          zlib1g zlib1g-dev libwebp7 libwebpdemux2 libwebpmux3 libwebp-dev libgif7 libgif-dev
          libtiff6 libtiff-dev libjbig0 libjbig-dev liblerc4 liblerc-dev libdeflate0 libdeflate-dev
          libzstd-dev liblzma-dev
          librdkafka1 librdkafka++1 librdkafka-dev libhiredis0.14 libhiredis-dev
          libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7
          libevent-pthreads-2.1-7 libevent-dev libsasl2-2 libssl3
          libcurl4 libcurl4-openssl-dev libnghttp2-14 libpsl5 librtmp1 libssh2-1 libbrotli1
          libidn2-0 libunistring2 libldap-2.5-0 libgssapi-krb5-2 libkrb5-3 libk5crypto3
          libkrb5support0 libkeyutils1 libcom-err2 libgnutls30 libhogweed6 libnettle8 libgmp10
          libp11-kit0 libtasn1-6 libffi8
          libzstd1 liblz4-1 liblzma5
          pkgconf pkgconf-bin libpkgconf3
          redis-server redis-tools libjemalloc2 liblzf1 libatomic1 libsystemd0 libcap2 libgcrypt20
          libgpg-error0
          kcat libyajl2)
PROGRAMS=(pkg-config redis-server kcat)

debs=$(mktemp -d)
trap 'rm -rf "$debs"' EXIT
(cd "$debs" && apt-get download "${PACKAGES[@]}" >/dev/null)
rm -rf "$DEST"
mkdir -p "$DEST/root" "$DEST/bin"
for f in "$debs"/*.deb; do
    dpkg-deb -x "$f" "$DEST/root"
done
# Only headers, .pc files, shared libraries and the three programs travel.
# (Debian's redis-server is a link to redis-check-rdb, which stays.)
rm -rf "$DEST/root/usr/share" "$DEST/root/etc" "$DEST/root/lib/systemd" \
    "$DEST"/root/usr/bin/redis-{benchmark,check-aof,cli}
find "$DEST/root" -name '*.a' -delete

LIBS='$d/root/usr/lib/x86_64-linux-gnu:$d/root/lib/x86_64-linux-gnu'
for p in "${PROGRAMS[@]}"; do
    {
        echo '#!/bin/sh'
        echo 'd=$(dirname "$(readlink -f "$0")")/..'
        if [ "$p" = pkg-config ]; then
            # Only the unpacked .pc files, their /usr paths under the unpacked root.
            echo 'export PKG_CONFIG_LIBDIR=$d/root/usr/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_SYSROOT_DIR=$d/root'
        fi
        echo "LD_LIBRARY_PATH=$LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec \"\$d/root/usr/bin/$p\" \"\$@\""
    } >"$DEST/bin/$p"
    chmod +x "$DEST/bin/$p"
done
echo "deps.sh: $(du -sh "$DEST" | cut -f1) in $DEST"
