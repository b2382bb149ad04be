/* bf16 <-> f32 for the host emulations of kernels/host/: bf16 is the upper
 * half of an f32, so widening is exact; narrowing rounds to nearest even
 * and keeps a NaN a (quiet) NaN, as __float2bfloat16_rn does. */
#ifndef MLK_HOST_BF16_H
#define MLK_HOST_BF16_H

#include <cstdint>
#include <cstring>

static inline float mlk_host_bf16_to_f32(uint16_t h)
{
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t mlk_host_f32_to_bf16(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: set the quiet bit, keep the sign */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
