#include "dtype.h"

#include <math.h>

size_t ml_dtype_size(ml_dtype t)
{
    switch (t) {
    case ML_DTYPE_BF16:
    case ML_DTYPE_F16: return 2;
    case ML_DTYPE_F32:
    case ML_DTYPE_I32: return 4;
    case ML_DTYPE_I64: return 8;
    case ML_DTYPE_U8:
    case ML_DTYPE_F8_E4M3: return 1;
    }
    return 0;
}

const char *ml_dtype_name(ml_dtype t)
{
    switch (t) {
    case ML_DTYPE_BF16: return "BF16";
    case ML_DTYPE_F16: return "F16";
    case ML_DTYPE_F32: return "F32";
    case ML_DTYPE_I32: return "I32";
    case ML_DTYPE_I64: return "I64";
    case ML_DTYPE_U8: return "U8";
    case ML_DTYPE_F8_E4M3: return "F8_E4M3";
    }
    return "?";
}

int ml_dtype_from_name(const char *name, ml_dtype *out)
{
    static const ml_dtype all[] = {ML_DTYPE_BF16, ML_DTYPE_F16, ML_DTYPE_F32,     ML_DTYPE_I32,
                                   ML_DTYPE_I64,  ML_DTYPE_U8,  ML_DTYPE_F8_E4M3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (!strcmp(name, ml_dtype_name(all[i]))) {
            *out = all[i];
            return 1;
        }
    }
    return 0;
}

float ml_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        u = sign;
    } else { /* subnormal: renormalise */
        exp = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            exp--;
        }
        u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* e4m3fn: exponent bias 7, 3 mantissa bits; below 2^-6 the codes are the
 * subnormals mant * 2^-9. */
#define F8E4M3_MIN_NORMAL 0x1p-6f
#define F8E4M3_SUBNORMAL_STEPS 0x1p9f
#define F8E4M3_CODE_MAX 0x7eu
#define F8E4M3_CODE_NAN 0x7fu

uint8_t ml_f32_to_f8e4m3(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return sign | F8E4M3_CODE_NAN;
    float a;
    memcpy(&a, &u, sizeof a);
    if (a >= ML_F8E4M3_MAX)
        return sign | F8E4M3_CODE_MAX;
    if (a < F8E4M3_MIN_NORMAL) /* 0..8 steps of 2^-9; 8 is the code of 2^-6 */
        return sign | (uint8_t)nearbyintf(a * F8E4M3_SUBNORMAL_STEPS);
    /* Round the 23-bit mantissa to 3 bits, ties to even; a carry moves into
     * the exponent, and below 448 it cannot reach the NaN code (the
     * midpoint to the next binade step, 464, is past the saturation). */
    u += 0x7ffffu + ((u >> 20) & 1u);
    const uint32_t exp = (u >> 23) - 120u, mant = (u >> 20) & 0x7u;
    return sign | (uint8_t)(exp << 3 | mant);
}
