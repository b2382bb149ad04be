/* Fuzz target: untrusted bytes -> ml_image_probe and ml_image_decode (JPEG,
 * PNG, WebP, GIF or TIFF, by signature) -> plan -> preprocess. A file the decoder
 * accepts must pass the probe with the same size. The seeds in corpus/image/
 * cover every decoder: JPEG variants; PNG colour types, bit depths, Adam7,
 * APNG and hostile files (png_*.png); lossy and lossless WebP with and
 * without alpha, an animation, a truncated file and a huge header
 * (webp_*.webp); GIF frames of each kind and hostile headers and data
 * (gif_*.gif); TIFF layouts, compressions and orientations, refused and
 * hostile files (tiff_*.tif); the last four groups from tests/golden/gen_fixtures.py
 * --only seeds.
 * Limits are small (4 megapixels, 32 scans) so each input stays fast, and
 * the tile size is small so preprocessing runs on every decodable input. */
#include <stdint.h>
#include <stdlib.h>

#include "image/image.h"

#define FUZZ_MAX_PIXELS (4u * 1000 * 1000)
#define FUZZ_MAX_SCANS 32u
#define FUZZ_TILE_SIZE 32u

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_image_params p;
    ml_image_params_default(&p);
    p.limits.max_pixels = FUZZ_MAX_PIXELS;
    p.limits.max_scans = FUZZ_MAX_SCANS;
    p.tile_size = FUZZ_TILE_SIZE;
    /* Vary the grid with the input so every max_tiles value is exercised. */
    p.max_tiles = size ? 1 + data[size - 1] % ML_IMAGE_MAX_TILES_CAP : ML_IMAGE_DEFAULT_MAX_TILES;

    ml_image_info info;
    ml_status probed = ml_image_probe(data, size, &p.limits, &info, NULL, 0);
    ml_image_rgb img;
    if (ml_image_decode(data, size, &p.limits, &img, NULL, 0) != ML_OK)
        return 0;
    if (probed != ML_OK || info.width != img.width || info.height != img.height)
        abort(); /* the probe must never refuse or misjudge what decodes */
    ml_image_layout layout;
    if (ml_image_plan(img.width, img.height, &p, &layout, NULL, 0) == ML_OK) {
        size_t n = ml_image_pixels_count(&layout), ws = ml_image_workspace_size(&layout);
        float *pixels = malloc(n * sizeof *pixels);
        void *work = malloc(ws ? ws : 1);
        if (pixels && work &&
            ml_image_preprocess(&img, &p, &layout, work, ws, pixels, n, NULL, 0) != ML_OK)
            abort(); /* a plan that preprocessing rejects is a bug */
        free(pixels);
        free(work);
    }
    ml_image_rgb_deinit(&img);
    return 0;
}
