/* Pillow's Image.alpha_composite over opaque white, which transformers'
 * convert_to_rgb applies to every image mode but "RGB": shared by the PNG
 * and WebP decoders (image_internal.h). */
#include "image/image_internal.h"

/* Pillow's AlphaComposite.c carries 7 fractional bits through the blend. */
#define COMPOSITE_BITS 7

/* One channel (c, a) over white, with AlphaComposite.c's integer
 * arithmetic: the destination's weight 255 - a, COMPOSITE_BITS fractional
 * bits, and ((t >> 8) + t) >> 8 as a rounded division by 255. It gives c
 * for a == 255 and 255 for a == 0, as Pillow's shortcut for a fully
 * transparent source does. */
static inline uint8_t over_white(unsigned c, unsigned a)
{
    uint32_t t = (a * c + 255u * (255u - a)) << COMPOSITE_BITS;
    t += 0x80u << COMPOSITE_BITS;
    return (uint8_t)((((t >> 8) + t) >> 8) >> COMPOSITE_BITS);
}

void ml_image_rgba_over_white(const uint8_t *rgba, uint32_t n, uint8_t *dst, size_t step)
{
    for (uint32_t x = 0; x < n; x++, rgba += ML_IMAGE_RGBA_BYTES, dst += step) {
        /* every byte of the pixel read before any is written: dst may be rgba */
        const uint8_t r = rgba[0], g = rgba[1], b = rgba[2], a = rgba[3];
        dst[0] = over_white(r, a);
        dst[1] = over_white(g, a);
        dst[2] = over_white(b, a);
    }
}
