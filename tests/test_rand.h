/* Deterministic random inputs for tests and benches: one xorshift64 stream
 * per translation unit (a test binary), seeded with ML_TEST_RNG_SEED unless the test calls
 * rand_seed (to pick its own sequence, or to replay one: every call after
 * rand_seed(s) sees the same values for the same s). Not thread-safe: draw
 * from one thread. Also xmalloc, the allocation that exits on failure.
 * Header-only, test code only.
 *
 *     rand_seed(ML_TEST_RNG_SEED);
 *     fill(x, n, -1, 1);        // n floats uniform in [-1, 1)
 *     int i = irand(n);         // 0 .. n-1
 */
#ifndef ML_TEST_RAND_H
#define ML_TEST_RAND_H

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dtype.h"

/* Any nonzero value starts a sequence; zero is xorshift's fixed point. */
#define ML_TEST_RNG_SEED 0x9e3779b97f4a7c15ull

static uint64_t ml_test_rng = ML_TEST_RNG_SEED;

/* Restart the stream at seed (nonzero). */
static inline void rand_seed(uint64_t seed)
{
    assert(seed != 0);
    ml_test_rng = seed;
}

/* Uniform in [0, 1), with 53 random bits (Marsaglia's xorshift64, 13/7/17). */
static inline double urand(void)
{
    ml_test_rng ^= ml_test_rng << 13;
    ml_test_rng ^= ml_test_rng >> 7;
    ml_test_rng ^= ml_test_rng << 17;
    return (double)(ml_test_rng >> 11) / 9007199254740992.0; /* 2^53 */
}

/* Uniform in [lo, hi), computed in double and rounded once to float. */
static inline float frand(float lo, float hi)
{
    return (float)(lo + (hi - lo) * urand());
}

/* Uniform in 0 .. n-1 (n > 0). */
static inline int irand(int n)
{
    return (int)(urand() * n);
}

/* x[0 .. n-1] = frand(lo, hi), in order. */
static inline void fill(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand(lo, hi);
}

/* w[0 .. n-1] = frand(lo, hi) rounded to bf16, in order. */
static inline void fill_bf16(uint16_t *w, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        w[i] = ml_f32_to_bf16(frand(lo, hi));
}

/* malloc that never returns NULL: out of memory prints the size and exits
 * the test with 1. 0 bytes gives a unique pointer. Owned: free it. */
static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

#endif
