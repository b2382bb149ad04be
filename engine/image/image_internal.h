/* Private to engine/image: the PNG, WebP and GIF parts of ml_image_decode
 * and ml_image_probe (decode_png.c, decode_webp.c, decode_gif.c), the checks every format
 * shares (limits.c) and the composite over white (alpha.c).
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

/* 1 when data starts as a WebP file does: "RIFF", a 4-byte size, "WEBP"
 * (Pillow's WebPImagePlugin._accept), else 0. */
int ml_image_webp_signature(const uint8_t *data, size_t len);

/* ml_image_decode for data with the WebP signature; same contract. */
ml_status ml_image_webp_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                               ml_image_rgb *out, char *err, size_t errlen);

/* ml_image_probe for data with the WebP signature: the bitstream's
 * features (size, alpha, animation), which libwebp reads from the first
 * chunks without decoding. Same contract. */
ml_status ml_image_webp_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_info *info, char *err, size_t errlen);

/* 1 when data starts with "GIF87a" or "GIF89a" (Pillow's
 * GifImagePlugin._accept), else 0. */
int ml_image_gif_signature(const uint8_t *data, size_t len);

/* ml_image_decode for data with the GIF signature: its first frame. Same
 * contract. */
ml_status ml_image_gif_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_rgb *out, char *err, size_t errlen);

/* ml_image_probe for data with the GIF signature: the screen and the first
 * frame's descriptor, read without decoding. Same contract. */
ml_status ml_image_gif_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                             ml_image_info *info, char *err, size_t errlen);

/* 1 when data starts "II*\0" or "MM\0*" (Pillow's TiffImagePlugin._accept
 * for classic TIFF), else 0. */
int ml_image_tiff_signature(const uint8_t *data, size_t len);
/* ml_image_decode for data with the TIFF signature: its first page. Same
 * contract. */
ml_status ml_image_tiff_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                               ml_image_rgb *out, char *err, size_t errlen);
/* ml_image_probe for data with the TIFF signature: the first directory's
 * size (oriented) and sample layout, read without decoding. Same contract. */
ml_status ml_image_tiff_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_info *info, char *err, size_t errlen);

#define ML_IMAGE_RGBA_BYTES 4

/* n RGBA pixels composited over opaque white as Image.alpha_composite does
 * (AlphaComposite.c's integer arithmetic), written as RGB pixels step bytes
 * apart from dst: what convert_to_rgb makes of a mode other than "RGB". An
 * opaque pixel comes out unchanged. dst may be rgba itself with step 3
 * (an RGBA buffer compacted into RGB in place). */
void ml_image_rgba_over_white(const uint8_t *rgba, uint32_t n, uint8_t *dst, size_t step);

/* The size checks of every decoder (limits.c): ML_ERR_TOO_LARGE with the
 * numbers in err when width*height is above lim->max_pixels or a side above
 * ML_IMAGE_MAX_SIDE, else ML_OK. */
ml_status ml_image_check_size(uint32_t width, uint32_t height, const ml_image_limits *lim,
                              char *err, size_t errlen);

#endif
