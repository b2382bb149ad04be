/* WebP -> RGB with libwebp, reproducing what transformers 4.47's
 * MllamaImageProcessor makes of PIL.Image.open(webp) with Pillow 13:
 * WebPImagePlugin decodes through libwebp into RGBA, mode "RGBA" when the
 * file has alpha and "RGB" otherwise, and convert_to_rgb composites an
 * "RGBA" image over opaque white (alpha.c). Lossy (VP8, its YUV upsampled
 * with libwebp's default "fancy" filter, as Pillow leaves it), lossless
 * (VP8L) and alpha (ALPH) bitstreams all decode through WebPDecode.
 * libwebp's output is the same bytes from 1.2.4 (Debian 12) to 1.6.0
 * (Pillow 13's wheels): the golden fixtures hold both kinds, with and
 * without alpha, made by the latter.
 *
 * Animated files are refused (ML_ERR_UNSUPPORTED): Pillow shows their
 * first frame composited onto the animation's canvas, which needs the
 * demuxer and the blend rules; OpenAI's API takes no animation either.
 *
 * Hostile input: the size comes from the header (WebPGetFeatures) and is
 * checked against the limits before any pixel memory exists. The decode
 * writes into one RGBA buffer of 4 bytes a pixel, which is then compacted
 * in place into the RGB output; a lossless bitstream also needs libwebp's
 * own ARGB image (4 bytes a pixel), so a decode peaks at about 8 bytes a
 * pixel, what a progressive JPEG's coefficients take (image.h). */
#include "image/image_internal.h"

#include <stdlib.h>
#include <string.h>

#include <webp/decode.h>

#define RIFF_TAG_BYTES 4
#define RIFF_SIZE_BYTES 4
#define SIGNATURE_BYTES (RIFF_TAG_BYTES + RIFF_SIZE_BYTES + RIFF_TAG_BYTES)

int ml_image_webp_signature(const uint8_t *data, size_t len)
{
    return len >= SIGNATURE_BYTES && !memcmp(data, "RIFF", RIFF_TAG_BYTES) &&
           !memcmp(data + RIFF_TAG_BYTES + RIFF_SIZE_BYTES, "WEBP", RIFF_TAG_BYTES);
}

/* libwebp's statuses as ours: data that ends early is a truncated file. */
static ml_status status_of(VP8StatusCode s, const char *what, char *err, size_t errlen)
{
    switch (s) {
    case VP8_STATUS_OK: return ML_OK;
    case VP8_STATUS_OUT_OF_MEMORY:
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the WebP %s", what);
    case VP8_STATUS_NOT_ENOUGH_DATA:
        return ml_fail(err, errlen, ML_ERR_FORMAT, "truncated WebP %s", what);
    case VP8_STATUS_UNSUPPORTED_FEATURE:
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "WebP %s uses a feature libwebp %d.%d "
                       "does not support", what, WebPGetDecoderVersion() >> 16,
                       WebPGetDecoderVersion() >> 8 & 0xff);
    default: return ml_fail(err, errlen, ML_ERR_FORMAT, "invalid WebP %s (libwebp status %d)",
                            what, (int)s);
    }
}

/* The header's features, checked: still, non-empty, within the limits. */
static ml_status read_features(const uint8_t *data, size_t len, const ml_image_limits *lim,
                               WebPBitstreamFeatures *f, char *err, size_t errlen)
{
    ml_status st = status_of(WebPGetFeatures(data, len, f), "header", err, errlen);
    if (st != ML_OK)
        return st;
    if (f->has_animation)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "animated WebP images are not supported (a still image only)");
    if (f->width <= 0 || f->height <= 0)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "WebP has a zero dimension");
    return ml_image_check_size((uint32_t)f->width, (uint32_t)f->height, lim, err, errlen);
}

ml_status ml_image_webp_probe(const uint8_t *data, size_t len, const ml_image_limits *lim,
                              ml_image_info *info, char *err, size_t errlen)
{
    WebPBitstreamFeatures f;
    ml_status st = read_features(data, len, lim, &f, err, errlen);
    if (st == ML_OK)
        *info = (ml_image_info){.width = (uint32_t)f.width, .height = (uint32_t)f.height,
                                .n_scans = 1};
    return st;
}

ml_status ml_image_webp_decode(const uint8_t *data, size_t len, const ml_image_limits *lim,
                               ml_image_rgb *out, char *err, size_t errlen)
{
    WebPDecoderConfig config;
    if (!WebPInitDecoderConfig(&config))
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "libwebp %d.%d: decoder ABI mismatch",
                       WebPGetDecoderVersion() >> 16, WebPGetDecoderVersion() >> 8 & 0xff);
    ml_status st = read_features(data, len, lim, &config.input, err, errlen);
    if (st != ML_OK)
        return st;
    const uint32_t w = (uint32_t)config.input.width, h = (uint32_t)config.input.height;
    const size_t pixels = (size_t)w * h;
    uint8_t *buf = malloc(pixels * ML_IMAGE_RGBA_BYTES);
    if (!buf)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory for the decoded image");
    config.output.colorspace = MODE_RGBA;
    config.output.is_external_memory = 1;
    config.output.u.RGBA.rgba = buf;
    config.output.u.RGBA.stride = (int)(w * ML_IMAGE_RGBA_BYTES);
    config.output.u.RGBA.size = pixels * ML_IMAGE_RGBA_BYTES;
    st = status_of(WebPDecode(data, len, &config), "data", err, errlen);
    WebPFreeDecBuffer(&config.output); /* external memory: frees only libwebp's own */
    if (st != ML_OK) {
        free(buf);
        return st;
    }
    ml_image_rgba_over_white(buf, (uint32_t)pixels, buf, ML_IMAGE_CHANNELS);
    uint8_t *rgb = realloc(buf, pixels * ML_IMAGE_CHANNELS);
    *out = (ml_image_rgb){.pixels = rgb ? rgb : buf, .width = w, .height = h};
    return ML_OK;
}
