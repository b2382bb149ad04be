/* Element types of checkpoint tensors and scalar conversions between them.
 *
 * bf16 is the storage type of every weight (engine/model/README.md §9); f32 is the
 * activation and accumulation type of the CPU backend. Conversions round to
 * nearest even, as torch's `.to(torch.bfloat16)` does. The integer types
 * occur only in reference files (token ids, aspect ratio ids and masks of
 * the golden fixtures), never in weights. */
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
} ml_dtype;

/* Bytes per element. */
size_t ml_dtype_size(ml_dtype t);
/* Safetensors spelling ("BF16", "F16", "F32", "I32", "I64", "U8"). */
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

/* Round an f32 through bf16 and back: the value torch would hold in bf16. */
static inline float ml_round_bf16(float f)
{
    return ml_bf16_to_f32(ml_f32_to_bf16(f));
}

float ml_f16_to_f32(uint16_t h);

#endif
