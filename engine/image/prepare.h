/* From image bytes to the vision tower's input in one call: decode, plan,
 * preprocess and pack into a (max_tiles, 3, S, S) slot. What the CLI and the
 * service do for every inline image.
 * @locality: thread-safe (no shared state). */
#ifndef ML_IMAGE_PREPARE_H
#define ML_IMAGE_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "image/image.h"

/* On ML_OK *slot is a new malloc'd float32 (max_tiles, 3, S, S) tensor
 * (owned by the caller, free()) with exact zeros in the unused tile slots,
 * and *layout describes the image. Errors: those of ml_image_decode
 * (ML_ERR_FORMAT, ML_ERR_TOO_LARGE, ML_ERR_UNSUPPORTED), ml_image_plan,
 * ML_ERR_NOMEM; *slot is NULL then. */
ml_status ml_image_prepare(const uint8_t *data, size_t len, const ml_image_params *p,
                           float **slot, ml_image_layout *layout, char *err, size_t errlen);

#endif
