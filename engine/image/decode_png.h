/* Private to engine/image: the PNG half of ml_image_decode (decode_png.c).
 * @locality: thread-safe; no global state. */
#ifndef ML_IMAGE_DECODE_PNG_H
#define ML_IMAGE_DECODE_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "image/image.h"

/* 1 when data starts with the 8-byte PNG signature (Pillow's
 * PngImagePlugin._accept), else 0. */
int ml_image_png_signature(const uint8_t *data, size_t len);

/* ml_image_decode for data that starts with the PNG signature; same
 * contract (statuses, *out empty on error, data borrowed). */
ml_status ml_image_png_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_rgb *out, char *err, size_t errlen);

#endif
