/* Element types of checkpoint tensors and scalar conversions between them.
 *
 * bf16 is the storage type of every weight (engine/model/README.md §9); f32 is the
 * activation and accumulation type of the CPU backend. Conversions round to
 * nearest even, as torch's `.to(torch.bfloat16)` does. The integer types
 * occur only in reference files (token ids, aspect ratio ids and masks of
 * the golden fixtures), never in weights.
 *
 * F8_E4M3 is torch's float8_e4m3fn (the OCP FP8 E4M3 of FP8 checkpoints):
 * 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no infinities, NaN only
 * as S.1111.111, largest finite ±448. Every value is exact in f32 (and in
 * bf16), so widening loses nothing. */
#ifndef ML_DTYPE_H
#define ML_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum ml_dtype {
    ML_DTYPE_BF16,
    ML_DTYPE_F16,
    ML_DTYPE_F32,
    ML_DTYPE_I32,
    ML_DTYPE_I64,
    ML_DTYPE_U8,
    ML_DTYPE_F8_E4M3,
} ml_dtype;

/* Bytes per element. */
size_t ml_dtype_size(ml_dtype t);
/* Safetensors spelling ("BF16", "F16", "F32", "I32", "I64", "U8", "F8_E4M3"). */
const char *ml_dtype_name(ml_dtype t);
/* The dtype whose safetensors spelling is `name` (exact, case-sensitive).
 * Returns 1 and sets *out, or 0 (and leaves *out unchanged) for any other
 * string, including the safetensors types this build does not handle. */
int ml_dtype_from_name(const char *name, ml_dtype *out);

static inline float ml_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t ml_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n values widened (exact) and n values rounded (RNE), as above. */
static inline void ml_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ml_bf16_to_f32(src[i]);
}

static inline void ml_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ml_f32_to_bf16(src[i]);
}

/* Round an f32 through bf16 and back: the value torch would hold in bf16. */
static inline float ml_round_bf16(float f)
{
    return ml_bf16_to_f32(ml_f32_to_bf16(f));
}

float ml_f16_to_f32(uint16_t h);

/* Largest finite float8_e4m3fn magnitude (torch.finfo(float8_e4m3fn).max). */
#define ML_F8E4M3_MAX 448.0f

/* The exact f32 value of an e4m3fn code; the NaN codes give a quiet NaN of
 * the same sign. */
static inline float ml_f8e4m3_to_f32(uint8_t c)
{
    const uint32_t sign = (uint32_t)(c & 0x80u) << 24;
    const uint32_t exp = (c >> 3) & 0xfu, mant = c & 0x7u;
    uint32_t u;
    if (exp == 0xfu && mant == 0x7u) {
        u = sign | 0x7fc00000u;
    } else if (exp != 0) { /* rebias 7 -> 127, mantissa to the top of f32's */
        u = sign | ((exp + 120u) << 23) | (mant << 20);
    } else { /* subnormal: mant * 2^-9, exact in f32 */
        float f = (float)mant * 0x1p-9f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f32 to the nearest e4m3fn code, ties to even; magnitudes past
 * ML_F8E4M3_MAX saturate to ±448 (compressed-tensors clamps to the finfo
 * range before its cast, so its codes are the same), NaN stays NaN. */
uint8_t ml_f32_to_f8e4m3(float f);

#endif
