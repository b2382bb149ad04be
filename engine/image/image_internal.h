/* Private to engine/image: the PNG half of ml_image_decode and
 * ml_image_probe (decode_png.c), and the checks both formats share
 * (limits.c).
 * @locality: thread-safe; no global state. */
#ifndef ML_IMAGE_INTERNAL_H
#define ML_IMAGE_INTERNAL_H

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

/* ml_image_probe for data that starts with the PNG signature: the IHDR,
 * which the PNG specification puts first. Same contract. */
ml_status ml_image_png_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                             ml_image_info *info, char *err, size_t errlen);

/* The size checks of both decoders (limits.c): ML_ERR_TOO_LARGE with the
 * numbers in err when width*height is above lim->max_pixels or a side above
 * ML_IMAGE_MAX_SIDE, else ML_OK. */
ml_status ml_image_check_size(uint32_t width, uint32_t height, const ml_image_limits *lim,
                              char *err, size_t errlen);

#endif
