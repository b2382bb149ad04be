/* Helpers shared by test_image.c and test_image_decode.c. */
#ifndef ML_IMAGE_TEST_UTIL_H
#define ML_IMAGE_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "sha256.h"

static inline void digest_hex(const void *data, size_t len, char hex[ML_SHA256_HEX_SIZE])
{
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    ml_sha256(data, len, d);
    ml_sha256_hex(d, hex);
}

#endif
