/* SHA-256 (FIPS 180-4), streaming and one-shot.
 *
 * The runtime keys images and their cross-attention states by the sha256 of
 * the image bytes (engine/model/README.md §12); tests use it to compare large tensors with
 * the digests recorded in golden fixtures.
 * @locality: any thread; a context is used by one thread at a time. */
#ifndef ML_SHA256_H
#define ML_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define ML_SHA256_DIGEST_SIZE 32
#define ML_SHA256_HEX_SIZE (2 * ML_SHA256_DIGEST_SIZE + 1) /* lower-case hex + NUL */

/* A running hash. Embed it anywhere; no heap memory, nothing to deinit. */
typedef struct ml_sha256_ctx {
    uint32_t state[8];
    uint64_t n_bytes;  /* message length so far */
    uint8_t block[64]; /* pending partial block */
    size_t n_block;    /* bytes pending in `block` */
} ml_sha256_ctx;

/* Start a new message. */
void ml_sha256_init(ml_sha256_ctx *ctx);

/* Append `len` bytes (data may be NULL when len is 0). */
void ml_sha256_update(ml_sha256_ctx *ctx, const void *data, size_t len);

/* Finish the message and write its digest. The context must be initialised
 * again before reuse. */
void ml_sha256_final(ml_sha256_ctx *ctx, uint8_t digest[ML_SHA256_DIGEST_SIZE]);

/* Digest of one buffer. */
void ml_sha256(const void *data, size_t len, uint8_t digest[ML_SHA256_DIGEST_SIZE]);

/* Lower-case hex spelling of a digest, NUL-terminated. */
void ml_sha256_hex(const uint8_t digest[ML_SHA256_DIGEST_SIZE], char hex[ML_SHA256_HEX_SIZE]);

/* The value of hex digit c (0-9, a-f, A-F), -1 for any other byte. */
int ml_hex_digit(int c);

#endif
