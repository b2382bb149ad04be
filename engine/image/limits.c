/* The limits every decoder enforces (image.h, image_internal.h): below
 * decode.c, decode_png.c and decode_webp.c, so none calls back into
 * another. */
#include "image/image.h"
#include "image/image_internal.h"

void ml_image_limits_default(ml_image_limits *lim)
{
    lim->max_pixels = ML_IMAGE_DEFAULT_MAX_PIXELS;
    lim->max_scans = ML_IMAGE_DEFAULT_MAX_SCANS;
}

ml_status ml_image_check_size(uint32_t width, uint32_t height, const ml_image_limits *lim,
                              char *err, size_t errlen)
{
    if ((uint64_t)width * height > lim->max_pixels)
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE,
                       "image is %ux%u, above the limit of %llu pixels", width, height,
                       (unsigned long long)lim->max_pixels);
    if (width > ML_IMAGE_MAX_SIDE || height > ML_IMAGE_MAX_SIDE)
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE,
                       "image is %ux%u; sides above %u pixels are not supported", width, height,
                       ML_IMAGE_MAX_SIDE);
    return ML_OK;
}
