/* SHA-256 as specified in FIPS 180-4 §6.2; names follow the standard. */
#include "sha256.h"

#include <string.h>

#define SHA256_BLOCK 64
#define SHA256_LENGTH_FIELD 8 /* bytes of the big-endian bit count ending the padding */

/* First 32 bits of the fractional parts of the cube roots of the first 64
 * primes (FIPS 180-4 §4.2.2). */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

/* Initial hash value: fractional parts of the square roots of the first 8
 * primes (FIPS 180-4 §5.3.3). */
static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static inline uint32_t rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static void compress(uint32_t state[8], const uint8_t block[SHA256_BLOCK])
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
               (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
}

void ml_sha256_init(ml_sha256_ctx *ctx)
{
    memcpy(ctx->state, H0, sizeof H0);
    ctx->n_bytes = 0;
    ctx->n_block = 0;
}

void ml_sha256_update(ml_sha256_ctx *ctx, const void *data, size_t len)
{
    if (len == 0)
        return;
    const uint8_t *p = data;
    ctx->n_bytes += len;
    if (ctx->n_block) {
        size_t take = SHA256_BLOCK - ctx->n_block;
        if (take > len)
            take = len;
        memcpy(ctx->block + ctx->n_block, p, take);
        ctx->n_block += take;
        p += take;
        len -= take;
        if (ctx->n_block < SHA256_BLOCK)
            return;
        compress(ctx->state, ctx->block);
        ctx->n_block = 0;
    }
    for (; len >= SHA256_BLOCK; p += SHA256_BLOCK, len -= SHA256_BLOCK)
        compress(ctx->state, p);
    if (len) {
        memcpy(ctx->block, p, len);
        ctx->n_block = len;
    }
}

void ml_sha256_final(ml_sha256_ctx *ctx, uint8_t digest[ML_SHA256_DIGEST_SIZE])
{
    uint64_t n_bits = ctx->n_bytes * 8;
    /* Padding (FIPS 180-4 §5.1.1): a 1 bit, zeros, then the 64-bit length,
     * spilling into a second block when the length does not fit. */
    ctx->block[ctx->n_block++] = 0x80;
    if (ctx->n_block > SHA256_BLOCK - SHA256_LENGTH_FIELD) {
        memset(ctx->block + ctx->n_block, 0, SHA256_BLOCK - ctx->n_block);
        compress(ctx->state, ctx->block);
        ctx->n_block = 0;
    }
    memset(ctx->block + ctx->n_block, 0, SHA256_BLOCK - SHA256_LENGTH_FIELD - ctx->n_block);
    for (int i = 0; i < SHA256_LENGTH_FIELD; i++)
        ctx->block[SHA256_BLOCK - 1 - i] = (uint8_t)(n_bits >> (8 * i));
    compress(ctx->state, ctx->block);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(ctx->state[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(ctx->state[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(ctx->state[i] >> 8);
        digest[4 * i + 3] = (uint8_t)ctx->state[i];
    }
}

void ml_sha256(const void *data, size_t len, uint8_t digest[ML_SHA256_DIGEST_SIZE])
{
    ml_sha256_ctx ctx;
    ml_sha256_init(&ctx);
    ml_sha256_update(&ctx, data, len);
    ml_sha256_final(&ctx, digest);
}

void ml_sha256_hex(const uint8_t digest[ML_SHA256_DIGEST_SIZE], char hex[ML_SHA256_HEX_SIZE])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < ML_SHA256_DIGEST_SIZE; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 0xf];
    }
    hex[2 * ML_SHA256_DIGEST_SIZE] = '\0';
}

int ml_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}
