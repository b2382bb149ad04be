#include "dtype.h"

size_t ml_dtype_size(ml_dtype t)
{
    switch (t) {
    case ML_DTYPE_BF16:
    case ML_DTYPE_F16: return 2;
    case ML_DTYPE_F32:
    case ML_DTYPE_I32: return 4;
    case ML_DTYPE_I64: return 8;
    case ML_DTYPE_U8: return 1;
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
    }
    return "?";
}

int ml_dtype_from_name(const char *name, ml_dtype *out)
{
    static const ml_dtype all[] = {ML_DTYPE_BF16, ML_DTYPE_F16, ML_DTYPE_F32,
                                   ML_DTYPE_I32,  ML_DTYPE_I64, ML_DTYPE_U8};
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
