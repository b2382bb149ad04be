/* Mllama tile preprocessing: transformers 4.47 MllamaImageProcessor.preprocess
 * for one image (engine/model/README.md §2), and the batch packing helpers. */
#include "image/image.h"

#include <math.h>
#include <string.h>

#define MAX_TILE_SIZE 65535u
#define WORKSPACE_ALIGN 64
#define U8_VALUES 256

/* ---- canvas choice ------------------------------------------------------ */

/* get_all_supported_aspect_ratios: (h, w) grids with h * w <= max_tiles, h
 * outer. Returns how many were written (at most ML_IMAGE_MAX_TILES_CAP^2). */
static int supported_grids(uint32_t max_tiles, uint32_t grids[][2])
{
    int n = 0;
    for (uint32_t h = 1; h <= max_tiles; h++)
        for (uint32_t w = 1; w <= max_tiles; w++)
            if (h * w <= max_tiles) {
                grids[n][0] = h;
                grids[n][1] = w;
                n++;
            }
    return n;
}

/* get_optimal_tiled_canvas: the grid needing the least upscaling, or the
 * least downscaling when none fits; ties (exact float equality) go to the
 * smallest canvas, then to the first grid. Returns the grid's index. */
static int choose_grid(uint32_t width, uint32_t height, uint32_t tile, uint32_t grids[][2],
                       int n_grids)
{
    double scales[ML_IMAGE_MAX_TILES_CAP * ML_IMAGE_MAX_TILES_CAP];
    int any_up = 0;
    for (int i = 0; i < n_grids; i++) {
        double sh = (double)(grids[i][0] * tile) / height;
        double sw = (double)(grids[i][1] * tile) / width;
        scales[i] = sw > sh ? sh : sw;
        any_up |= scales[i] >= 1.0;
    }
    double selected = 0.0;
    int have = 0;
    for (int i = 0; i < n_grids; i++) {
        if (any_up ? scales[i] < 1.0 : scales[i] >= 1.0)
            continue;
        if (!have || (any_up ? scales[i] < selected : scales[i] > selected))
            selected = scales[i];
        have = 1;
    }
    int best = -1;
    uint64_t best_area = 0;
    for (int i = 0; i < n_grids; i++) {
        if (scales[i] != selected)
            continue;
        uint64_t area = (uint64_t)grids[i][0] * tile * grids[i][1] * tile;
        if (best < 0 || area < best_area) {
            best = i;
            best_area = area;
        }
    }
    return best;
}

ml_status ml_image_plan(uint32_t width, uint32_t height, const ml_image_params *p,
                        ml_image_layout *layout, char *err, size_t errlen)
{
    if (width == 0 || height == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "image is %ux%u", width, height);
    if (p->tile_size == 0 || p->tile_size > MAX_TILE_SIZE)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tile size %u out of range 1..%u",
                       p->tile_size, MAX_TILE_SIZE);
    if (p->max_tiles == 0 || p->max_tiles > ML_IMAGE_MAX_TILES_CAP)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "max tiles %u out of range 1..%u",
                       p->max_tiles, ML_IMAGE_MAX_TILES_CAP);

    uint32_t grids[ML_IMAGE_MAX_TILES_CAP * ML_IMAGE_MAX_TILES_CAP][2];
    int n_grids = supported_grids(p->max_tiles, grids);
    int g = choose_grid(width, height, p->tile_size, grids, n_grids);
    uint32_t tile = p->tile_size;
    uint64_t canvas_h = (uint64_t)grids[g][0] * tile, canvas_w = (uint64_t)grids[g][1] * tile;

    /* get_image_size_fit_to_canvas: upscale small images until one side
     * reaches a tile, never shrink an image that already fits, keep the
     * aspect ratio with floor() on the derived side. */
    uint64_t target_w = width < tile ? tile : width > canvas_w ? canvas_w : width;
    uint64_t target_h = height < tile ? tile : height > canvas_h ? canvas_h : height;
    double scale_h = (double)target_h / height;
    double scale_w = (double)target_w / width;
    uint64_t new_w, new_h;
    if (scale_w < scale_h) {
        new_w = target_w;
        new_h = (uint64_t)floor(height * scale_w);
        if (new_h > target_h)
            new_h = target_h;
    } else {
        new_h = target_h;
        new_w = (uint64_t)floor(width * scale_h);
        if (new_w > target_w)
            new_w = target_w;
    }
    if (new_w == 0 || new_h == 0)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "image %ux%u has too extreme an aspect ratio (resizes to %llux%llu)",
                       width, height, (unsigned long long)new_w, (unsigned long long)new_h);

    memset(layout, 0, sizeof *layout);
    layout->width = width;
    layout->height = height;
    layout->resized_width = (uint32_t)new_w;
    layout->resized_height = (uint32_t)new_h;
    layout->tile_size = tile;
    layout->max_tiles = p->max_tiles;
    layout->tiles_h = grids[g][0];
    layout->tiles_w = grids[g][1];
    layout->n_tiles = layout->tiles_h * layout->tiles_w;
    layout->aspect_ratio_id = (uint32_t)g + 1;
    for (uint32_t t = 0; t < p->max_tiles; t++)
        layout->aspect_ratio_mask[t] = t < layout->n_tiles;
    return ML_OK;
}

/* ---- preprocessing ------------------------------------------------------ */

static int needs_resize(const ml_image_layout *l)
{
    return l->resized_width != l->width || l->resized_height != l->height;
}

size_t ml_image_pixels_count(const ml_image_layout *layout)
{
    return (size_t)layout->n_tiles * ML_IMAGE_CHANNELS * layout->tile_size * layout->tile_size;
}

/* Workspace: the resized uint8 image, then the resampler's scratch. */
static size_t resized_bytes(const ml_image_layout *l)
{
    size_t n = (size_t)l->resized_width * l->resized_height * ML_IMAGE_CHANNELS;
    return WORKSPACE_ALIGN + (n + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
}

size_t ml_image_workspace_size(const ml_image_layout *layout)
{
    if (!needs_resize(layout))
        return 0;
    return resized_bytes(layout) +
           ml_image_resize_workspace_size(layout->width, layout->height, layout->resized_width,
                                          layout->resized_height);
}

/* Every uint8 value maps to one float per channel, so rescale + normalize is
 * a table computed with exactly transformers' operations:
 * IT.rescale: float32(float64(v) * factor); IT.normalize: (x - mean) / std in
 * float32. */
static void build_value_table(const ml_image_params *p, float table[ML_IMAGE_CHANNELS][U8_VALUES])
{
    for (int c = 0; c < ML_IMAGE_CHANNELS; c++)
        for (int v = 0; v < U8_VALUES; v++) {
            float x = p->do_rescale ? (float)((double)v * p->rescale_factor) : (float)v;
            if (p->do_normalize)
                x = (x - p->mean[c]) / p->std[c];
            table[c][v] = x;
        }
}

ml_status ml_image_preprocess(const ml_image_rgb *img, const ml_image_params *p,
                              const ml_image_layout *layout, void *workspace,
                              size_t workspace_size, float *pixels, size_t pixels_count,
                              char *err, size_t errlen)
{
    if (!img->pixels || img->width != layout->width || img->height != layout->height)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "image %ux%u does not match its plan %ux%u",
                       img->width, img->height, layout->width, layout->height);
    if (p->tile_size != layout->tile_size)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tile size %u differs from the plan's %u",
                       p->tile_size, layout->tile_size);
    if (pixels_count < ml_image_pixels_count(layout))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "pixel buffer holds %zu floats, need %zu",
                       pixels_count, ml_image_pixels_count(layout));
    size_t need = ml_image_workspace_size(layout);
    if (workspace_size < need)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "workspace is %zu bytes, need %zu",
                       workspace_size, need);

    /* (resized_height, resized_width, 3) uint8 */
    const uint8_t *resized = img->pixels;
    if (needs_resize(layout)) {
        uint8_t *base = workspace;
        uint8_t *buf = base + (WORKSPACE_ALIGN - (uintptr_t)base % WORKSPACE_ALIGN) % WORKSPACE_ALIGN;
        ml_status st = ml_image_resize(img->pixels, layout->width, layout->height, buf,
                                       layout->resized_width, layout->resized_height,
                                       base + resized_bytes(layout),
                                       workspace_size - resized_bytes(layout));
        if (st != ML_OK)
            return ml_fail(err, errlen, st, "resize %ux%u -> %ux%u failed", layout->width,
                           layout->height, layout->resized_width, layout->resized_height);
        resized = buf;
    }

    float table[ML_IMAGE_CHANNELS][U8_VALUES];
    build_value_table(p, table);

    /* pad (zeros at the bottom and right, in uint8) + split_to_tiles:
     * pixels is (n_tiles, 3, S, S); tile t = row * tiles_w + col covers
     * canvas rows [row*S, row*S+S) and columns [col*S, col*S+S). */
    size_t S = layout->tile_size;
    size_t rw = layout->resized_width, rh = layout->resized_height;
    for (size_t row = 0; row < layout->tiles_h; row++)
        for (size_t col = 0; col < layout->tiles_w; col++) {
            float *tile = pixels + (row * layout->tiles_w + col) * ML_IMAGE_CHANNELS * S * S;
            size_t x0 = col * S;
            size_t n_x = x0 >= rw ? 0 : rw - x0 < S ? rw - x0 : S; /* columns of image */
            for (int c = 0; c < ML_IMAGE_CHANNELS; c++) {
                const float *lut = table[c];
                float pad = lut[0];
                for (size_t y = 0; y < S; y++) {
                    float *out = tile + ((size_t)c * S + y) * S;
                    size_t sy = row * S + y;
                    size_t x = 0;
                    if (sy < rh) {
                        const uint8_t *in = resized + (sy * rw + x0) * ML_IMAGE_CHANNELS + c;
                        for (; x < n_x; x++)
                            out[x] = lut[in[x * ML_IMAGE_CHANNELS]];
                    }
                    for (; x < S; x++)
                        out[x] = pad;
                }
            }
        }
    return ML_OK;
}

/* ---- batch packing ------------------------------------------------------ */

void ml_image_pack_slot(const ml_image_layout *layout, float *slot)
{
    size_t tile_floats = (size_t)ML_IMAGE_CHANNELS * layout->tile_size * layout->tile_size;
    memset(slot + layout->n_tiles * tile_floats, 0,
           (layout->max_tiles - layout->n_tiles) * tile_floats * sizeof(float));
}

void ml_image_pack_aspect(const ml_image_layout *layouts, size_t n_images, size_t n_slots,
                          uint32_t max_tiles, int32_t *ids, int32_t *mask)
{
    for (size_t i = 0; i < n_slots; i++) {
        const ml_image_layout *l = i < n_images ? &layouts[i] : NULL;
        ids[i] = l ? (int32_t)l->aspect_ratio_id : 0;
        for (uint32_t t = 0; t < max_tiles; t++)
            mask[i * max_tiles + t] = t == 0 || (l && t < l->n_tiles);
    }
}
