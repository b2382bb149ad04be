#include "image/prepare.h"

#include <stdlib.h>

ml_status ml_image_prepare(const uint8_t *data, size_t len, const ml_image_params *p,
                           float **slot, ml_image_layout *layout, char *err, size_t errlen)
{
    *slot = NULL;
    ml_image_rgb img = {0};
    ml_status st = ml_image_decode(data, len, &p->limits, &img, err, errlen);
    if (st != ML_OK)
        return st;
    st = ml_image_plan(img.width, img.height, p, layout, err, errlen);
    if (st != ML_OK)
        goto out;
    /* The slot holds all max_tiles tiles; preprocessing writes the first
     * n_tiles and pack_slot zeroes the rest. */
    size_t tile_floats = ml_image_pixels_count(layout) / layout->n_tiles;
    size_t slot_floats = tile_floats * layout->max_tiles;
    size_t ws_bytes = ml_image_workspace_size(layout);
    float *out = malloc(slot_floats * sizeof *out);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    if (!out || !ws) {
        free(out);
        free(ws);
        st = ml_fail(err, errlen, ML_ERR_NOMEM, "image: out of memory (%ux%u)", img.width,
                     img.height);
        goto out;
    }
    st = ml_image_preprocess(&img, p, layout, ws, ws_bytes, out, ml_image_pixels_count(layout),
                             err, errlen);
    free(ws);
    if (st != ML_OK) {
        free(out);
        goto out;
    }
    ml_image_pack_slot(layout, out);
    *slot = out;
out:
    ml_image_rgb_deinit(&img);
    return st;
}
