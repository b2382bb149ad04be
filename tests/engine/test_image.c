/* engine/image unit tests: canvas choice, the Pillow resampler,
 * preprocessing layout and value mapping, packing, parameters. Decode
 * (Pillow parity on the fuzz seeds and every error path) is in
 * test_image_decode.c.
 *
 * Expected values come from the reference, not from this code: digests and
 * pixel lists were computed with Pillow 13.0 (Image.open(f).convert("RGB"),
 * Image.resize(..., BILINEAR, reducing_gap=None)) and float bits with numpy
 * following transformers 4.47 IT.rescale / IT.normalize. The seed JPEGs in
 * tests/fuzz/corpus/image/ were written by Pillow (baseline, progressive,
 * grey, CMYK) and by libjpeg's compressor (YCCK, 4:4:0, 4:1:1, arithmetic,
 * restart markers, RGB colour space, two components), and edited by hand
 * (truncated, 60000x60000 header, zero width, a scan repeated 150 times).
 * The png_*.png seeds, valid and hostile, are written by
 * tests/golden/gen_fixtures.py --only seeds, which prints the digest of
 * transformers' convert_to_rgb(Image.open(f)) listed here for each. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "image/image.h"
#include "image_test_util.h"

#define GUARD_BYTES 64
#define GUARD_FILL 0xa5

/* ---- helpers ------------------------------------------------------------ */

/* The test pattern also used to compute the Pillow expectations:
 * value(x, y, c) = (53x + 97y + 31c + 7xy) & 255. */
static uint8_t *pattern(uint32_t w, uint32_t h)
{
    uint8_t *p = malloc((size_t)w * h * 3);
    for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++)
            for (uint32_t c = 0; c < 3; c++)
                p[((size_t)y * w + x) * 3 + c] = (uint8_t)((53 * x + 97 * y + 31 * c + 7 * x * y) & 255);
    return p;
}

static int guard_intact(const uint8_t *p)
{
    for (int i = 0; i < GUARD_BYTES; i++)
        if (p[i] != GUARD_FILL)
            return 0;
    return 1;
}

/* Resize through a workspace of exactly the queried size placed at a given
 * misalignment, with guard bytes after it and after the output. */
static void resize_checked(const uint8_t *src, uint32_t sw, uint32_t sh, uint8_t *dst, uint32_t dw,
                           uint32_t dh, size_t misalign, const char *what)
{
    size_t ws = ml_image_resize_workspace_size(sw, sh, dw, dh);
    uint8_t *buf = malloc(misalign + ws + GUARD_BYTES);
    memset(buf, GUARD_FILL, misalign + ws + GUARD_BYTES);
    size_t out_bytes = (size_t)dw * dh * 3;
    memset(dst + out_bytes, GUARD_FILL, GUARD_BYTES);
    ml_status st = ml_image_resize(src, sw, sh, dst, dw, dh, buf + misalign, ws);
    check(st == ML_OK, "%s: resize status %s", what, ml_status_name(st));
    check(guard_intact(buf + misalign + ws), "%s: wrote past the workspace (misalign %zu)", what,
          misalign);
    check(guard_intact(dst + out_bytes), "%s: wrote past the output", what);
    free(buf);
}

/* ---- canvas choice ------------------------------------------------------ */

static void test_plan_examples(void)
{
    /* engine/model/README.md §2 worked examples, ties (several grids with the same
     * scale: the smallest canvas wins) and edge sizes; values checked
     * against transformers' get_optimal_tiled_canvas and
     * get_image_size_fit_to_canvas. */
    static const struct {
        uint32_t w, h, max_tiles;
        uint32_t tiles_h, tiles_w, id, rw, rh;
    } cases[] = {
        {640, 480, 4, 1, 2, 2, 640, 480},    {1024, 768, 4, 2, 2, 6, 1024, 768},
        {1920, 1080, 4, 2, 2, 6, 1120, 630}, {300, 1200, 4, 3, 1, 7, 300, 1200},
        {4000, 500, 4, 1, 4, 4, 2240, 280},  {224, 220, 4, 1, 1, 1, 560, 550},
        {561, 560, 4, 1, 2, 2, 561, 560},    {800, 800, 4, 2, 2, 6, 800, 800},
        {560, 560, 4, 1, 1, 1, 560, 560},    /* 7 grids tie at scale 1 */
        {1120, 560, 4, 1, 2, 2, 1120, 560},  /* (1,2) (1,3) (1,4) (2,2) tie */
        {100, 100, 4, 1, 1, 1, 560, 560},    /* upscaled to a tile */
        {1, 1, 4, 1, 1, 1, 560, 560},        {2000, 2, 4, 1, 4, 4, 2000, 2},
        {4000, 3000, 4, 2, 2, 6, 1120, 840}, {1119, 1121, 4, 2, 2, 6, 1118, 1120},
        {4000, 3000, 1, 1, 1, 1, 560, 420},  {333, 777, 4, 2, 1, 5, 333, 777},
        {1680, 560, 4, 1, 3, 3, 1680, 560},  {3000, 400, 6, 1, 6, 6, 3000, 400},
    };
    ml_image_params p;
    ml_image_params_default(&p);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.max_tiles = cases[i].max_tiles;
        ml_image_layout l;
        char err[128];
        ml_status st = ml_image_plan(cases[i].w, cases[i].h, &p, &l, err, sizeof err);
        check(st == ML_OK, "%ux%u: %s", cases[i].w, cases[i].h, err);
        check(l.tiles_h == cases[i].tiles_h && l.tiles_w == cases[i].tiles_w && l.aspect_ratio_id == cases[i].id,
              "%ux%u: grid (%u,%u) id %u, want (%u,%u) id %u", cases[i].w, cases[i].h, l.tiles_h,
              l.tiles_w, l.aspect_ratio_id, cases[i].tiles_h, cases[i].tiles_w, cases[i].id);
        check(l.resized_width == cases[i].rw && l.resized_height == cases[i].rh,
              "%ux%u: resized %ux%u, want %ux%u", cases[i].w, cases[i].h, l.resized_width,
              l.resized_height, cases[i].rw, cases[i].rh);
        check(l.n_tiles == l.tiles_h * l.tiles_w && l.width == cases[i].w && l.height == cases[i].h,
              "%ux%u: layout bookkeeping", cases[i].w, cases[i].h);
        for (uint32_t t = 0; t < p.max_tiles; t++)
            check(l.aspect_ratio_mask[t] == (t < l.n_tiles), "%ux%u: mask[%u]", cases[i].w,
                  cases[i].h, t);
    }
}

static void test_plan_errors(void)
{
    ml_image_params p;
    ml_image_params_default(&p);
    ml_image_layout l;
    char err[128];
    check(ml_image_plan(0, 10, &p, &l, err, sizeof err) == ML_ERR_INVALID_ARG, "zero width");
    check(ml_image_plan(10, 0, &p, &l, err, sizeof err) == ML_ERR_INVALID_ARG, "zero height");
    /* transformers raises "height and width must be > 0" here */
    check(ml_image_plan(10000, 1, &p, &l, err, sizeof err) == ML_ERR_UNSUPPORTED,
          "10000x1 resizes to a zero height");
    check(ml_image_plan(1, 5000, &p, &l, err, sizeof err) == ML_ERR_UNSUPPORTED,
          "1x5000 resizes to a zero width");
    p.max_tiles = 0;
    check(ml_image_plan(10, 10, &p, &l, err, sizeof err) == ML_ERR_INVALID_ARG, "max_tiles 0");
    p.max_tiles = ML_IMAGE_MAX_TILES_CAP + 1;
    check(ml_image_plan(10, 10, &p, &l, err, sizeof err) == ML_ERR_INVALID_ARG, "max_tiles cap");
    p.max_tiles = ML_IMAGE_MAX_TILES_CAP;
    check(ml_image_plan(10, 10, &p, &l, err, sizeof err) == ML_OK, "max_tiles at the cap");
    p.tile_size = 0;
    check(ml_image_plan(10, 10, &p, &l, err, sizeof err) == ML_ERR_INVALID_ARG, "tile size 0");
}

/* ---- resampler ---------------------------------------------------------- */

static void test_resize_hand_computed(void)
{
    /* [0, 255] -> 4 wide: centres 0.25, 0.75, 1.25, 1.75; the middle two mix
     * the pixels 3:1 and 1:3, i.e. 63.75 -> 64 and 191.25 -> 191 after the
     * 22-bit fixed point (weights 3145728 and 1048576, plus half). */
    const uint8_t src[] = {0, 0, 0, 255, 255, 255};
    uint8_t dst[4 * 3 + GUARD_BYTES];
    resize_checked(src, 2, 1, dst, 4, 1, 0, "2x1->4x1");
    const uint8_t want[] = {0, 64, 191, 255};
    for (int x = 0; x < 4; x++)
        check(dst[3 * x] == want[x] && dst[3 * x + 1] == want[x] && dst[3 * x + 2] == want[x],
              "2x1->4x1 pixel %d: %u, want %u", x, dst[3 * x], want[x]);

    const uint8_t one[] = {200, 100, 7};
    uint8_t up[3 * 2 * 3 + GUARD_BYTES];
    resize_checked(one, 1, 1, up, 3, 2, 5, "1x1->3x2");
    for (int i = 0; i < 6; i++)
        check(!memcmp(up + 3 * i, one, 3), "1x1->3x2 pixel %d", i);
}

static void test_resize_matches_pillow(void)
{
    static const struct {
        uint32_t sw, sh, dw, dh;
        const char *hex;
    } cases[] = {
        {7, 5, 3, 2, "25b66b6d9c4aafe88db2355d3f79f283f3aece1f6db5eeed20e7b3cfecfd87e8"},
        {7, 5, 16, 11, "fc08c0cade795db9cc562349bf21b8c36599fe9c276def8e8278c9b50a99279e"},
        {7, 5, 7, 9, "53ba984445ff9063f2741100a35a1433ff92269f131af8403d98840faf7029d9"}, /* vertical only */
        {7, 5, 4, 5, "606d8cc183fc6da9634b8fbdd9b31054f8847926620fff71e63d69a73b2979c3"}, /* horizontal only */
        {7, 5, 1, 1, "507f204ce488022792d66f5be83be305d5604bc5b9b1c375759dcf3dec7a1b50"},
        {7, 5, 7, 5, "4bde0efc06c2f3f2fd4d4c1db9082c078ec41274f1feebd2fb6249f89adfcd8b"}, /* copy */
        {7, 5, 2, 30, "313f118e9d8d4d404246c81c12bb505a802c243b845f8a9d30f39a28e044e38b"},
        /* Vertical pass first (Pillow 13): the height shrinks by more than
         * twice the width's shrink. Horizontal-first differs on all three. */
        {7, 5, 40, 3, "09b5af5195e30ad682aebd085dc7b335ffc760a71e321afa98cba7007fc402e8"},
        {30, 100, 14, 47, "bbbda8b2a6d2cb72c94126c6408c3762fc1a99f31439482e6524ba7021ae77da"},
        {30, 100, 15, 47, "b50ddbc7d4c414cdfbb0e4afe89bf17ac574c21731288ec351adcab77cc06706"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *src = pattern(cases[i].sw, cases[i].sh);
        uint8_t *dst = malloc((size_t)cases[i].dw * cases[i].dh * 3 + GUARD_BYTES);
        char what[64], hex[ML_SHA256_HEX_SIZE];
        snprintf(what, sizeof what, "%ux%u->%ux%u", cases[i].sw, cases[i].sh, cases[i].dw,
                 cases[i].dh);
        for (size_t misalign = 0; misalign < 4; misalign++) {
            resize_checked(src, cases[i].sw, cases[i].sh, dst, cases[i].dw, cases[i].dh,
                           misalign * 17, what);
            digest_hex(dst, (size_t)cases[i].dw * cases[i].dh * 3, hex);
            check(!strcmp(hex, cases[i].hex), "%s: digest %s, want %s", what, hex, cases[i].hex);
        }
        free(dst);
        free(src);
    }

    /* Strong antialiasing: 1000 -> 7 columns reads ~286 source pixels each. */
    uint8_t *wide = pattern(1000, 3);
    uint8_t dst[7 * 2 * 3 + GUARD_BYTES];
    resize_checked(wide, 1000, 3, dst, 7, 2, 3, "1000x3->7x2");
    static const uint8_t want[] = {126, 127, 128, 128, 127, 128, 127, 127, 128, 127, 127, 128, 128, 127,
                                   128, 127, 127, 128, 128, 127, 129, 128, 127, 128, 127, 127, 128, 128,
                                   127, 128, 127, 127, 128, 128, 127, 128, 127, 127, 128, 127, 127, 128};
    check(!memcmp(dst, want, sizeof want), "1000x3->7x2 differs from Pillow");
    free(wide);
}

static void test_resize_errors(void)
{
    uint8_t src[3] = {1, 2, 3}, dst[3];
    uint8_t ws[4096];
    check(ml_image_resize(src, 0, 1, dst, 1, 1, ws, sizeof ws) == ML_ERR_INVALID_ARG, "zero source");
    check(ml_image_resize(src, 1, 1, dst, 1, 0, ws, sizeof ws) == ML_ERR_INVALID_ARG, "zero target");
    check(ml_image_resize(src, 70000, 1, dst, 1, 1, ws, sizeof ws) == ML_ERR_INVALID_ARG,
          "side above 65535");
    check(ml_image_resize_workspace_size(0, 1, 1, 1) == 0, "workspace of a bad request is 0");
    size_t need = ml_image_resize_workspace_size(1, 1, 3, 2);
    check(ml_image_resize(src, 1, 1, dst, 3, 2, ws, need - 1) == ML_ERR_INVALID_ARG,
          "workspace one byte short");
}

/* ---- preprocessing ------------------------------------------------------ */

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static void test_value_mapping_matches_numpy(void)
{
    /* A 6x1 image with tile size 6 stays 6x1 (fit-to-canvas never shrinks),
     * so row 0 of the tile holds the six values and rows 1..5 the padding. */
    static const uint8_t values[6] = {0, 1, 127, 128, 254, 255};
    static const uint32_t want[3][6] = {
        {0xbfe568dc, 0xbfe38a7f, 0x3d7ce092, 0x3d9c5620, 0x3ff536e5, 0x3ff71541},
        {0xbfe044b8, 0xbfde58f1, 0x3e1d9531, 0x3e2cf36b, 0x4003d502, 0x4004cae5},
        {0xbfbd77d8, 0xbfbba5e1, 0x3ea6c5e6, 0x3eae0dc4, 0x40086d66, 0x40095660},
    };
    uint8_t px[6 * 3];
    for (int x = 0; x < 6; x++)
        for (int c = 0; c < 3; c++)
            px[3 * x + c] = values[x];
    ml_image_rgb img = {.pixels = px, .width = 6, .height = 1};
    ml_image_params p;
    ml_image_params_default(&p);
    p.tile_size = 6;
    p.max_tiles = 1;
    ml_image_layout l;
    check(ml_image_plan(6, 1, &p, &l, NULL, 0) == ML_OK, "plan 6x1");
    check(l.resized_width == 6 && l.resized_height == 1 && ml_image_workspace_size(&l) == 0,
          "6x1 needs no resize");
    float out[3 * 6 * 6];
    check(ml_image_preprocess(&img, &p, &l, NULL, 0, out, 3 * 36, NULL, 0) == ML_OK, "preprocess 6x1");
    for (int c = 0; c < 3; c++) {
        for (int x = 0; x < 6; x++)
            check(float_bits(out[c * 36 + x]) == want[c][x], "c%d v%u: %08x want %08x", c,
                  values[x], float_bits(out[c * 36 + x]), want[c][x]);
        for (int i = 6; i < 36; i++)
            check(float_bits(out[c * 36 + i]) == want[c][0], "c%d pad %d", c, i);
    }
}

/* The tensor layout against an independent indexing of the padded canvas. */
static void test_tiles_layout(void)
{
    static const struct {
        uint32_t w, h, tile, max_tiles;
    } cases[] = {{13, 5, 8, 4}, {5, 13, 8, 4},  {20, 20, 8, 4}, {30, 7, 8, 6},
                 {8, 8, 8, 4},  {9, 8, 8, 4},   {12, 40, 8, 4}, /* vertical pass first */};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ml_image_params p;
        ml_image_params_default(&p);
        p.tile_size = cases[i].tile;
        p.max_tiles = cases[i].max_tiles;
        p.do_normalize = 0; /* values are then v/255, easy to invert */
        uint8_t *src = pattern(cases[i].w, cases[i].h);
        ml_image_rgb img = {.pixels = src, .width = cases[i].w, .height = cases[i].h};
        ml_image_layout l;
        check(ml_image_plan(img.width, img.height, &p, &l, NULL, 0) == ML_OK, "plan");

        uint8_t *resized = malloc((size_t)l.resized_width * l.resized_height * 3 + GUARD_BYTES);
        resize_checked(src, img.width, img.height, resized, l.resized_width, l.resized_height, 0,
                       "layout resize");
        size_t n = ml_image_pixels_count(&l), ws = ml_image_workspace_size(&l);
        float *out = malloc((n + GUARD_BYTES) * sizeof *out);
        uint8_t *work = malloc(ws + 7 + GUARD_BYTES);
        memset(work, GUARD_FILL, ws + 7 + GUARD_BYTES);
        for (size_t k = 0; k < n + GUARD_BYTES; k++)
            out[k] = -7.0f;
        char err[128];
        ml_status st = ml_image_preprocess(&img, &p, &l, ws ? work + 7 : NULL, ws, out, n, err, sizeof err);
        check(st == ML_OK, "preprocess %ux%u: %s", img.width, img.height, err);
        check(guard_intact(work + 7 + ws), "%ux%u: wrote past the workspace", img.width, img.height);
        int tail_ok = 1;
        for (size_t k = n; k < n + GUARD_BYTES; k++)
            tail_ok &= out[k] == -7.0f;
        check(tail_ok, "%ux%u: wrote past the pixels", img.width, img.height);

        size_t S = l.tile_size, bad = 0;
        for (size_t t = 0; t < l.n_tiles; t++)
            for (size_t c = 0; c < 3; c++)
                for (size_t y = 0; y < S; y++)
                    for (size_t x = 0; x < S; x++) {
                        size_t cy = (t / l.tiles_w) * S + y, cx = (t % l.tiles_w) * S + x;
                        uint8_t v = cy < l.resized_height && cx < l.resized_width
                                        ? resized[(cy * l.resized_width + cx) * 3 + c]
                                        : 0;
                        float want = (float)((double)v * p.rescale_factor);
                        bad += out[((t * 3 + c) * S + y) * S + x] != want;
                    }
        check(bad == 0, "%ux%u (tile %u, max %u): %zu elements misplaced", img.width, img.height,
              cases[i].tile, cases[i].max_tiles, bad);
        free(src);
        free(resized);
        free(out);
        free(work);
    }
}

static void test_preprocess_errors(void)
{
    ml_image_params p;
    ml_image_params_default(&p);
    p.tile_size = 4;
    uint8_t *src = pattern(2, 3); /* upscaled to 2x4 */
    ml_image_rgb img = {.pixels = src, .width = 2, .height = 3};
    ml_image_layout l;
    check(ml_image_plan(2, 3, &p, &l, NULL, 0) == ML_OK, "plan 2x3");
    size_t n = ml_image_pixels_count(&l), ws = ml_image_workspace_size(&l);
    check(ws > 0, "2x3 needs a resize workspace");
    float *out = calloc(n, sizeof *out);
    uint8_t *work = malloc(ws);
    check(ml_image_preprocess(&img, &p, &l, work, ws, out, n - 1, NULL, 0) == ML_ERR_INVALID_ARG,
          "pixel buffer one float short");
    check(ml_image_preprocess(&img, &p, &l, work, ws - 1, out, n, NULL, 0) == ML_ERR_INVALID_ARG,
          "workspace one byte short");
    ml_image_rgb other = {.pixels = src, .width = 3, .height = 2};
    check(ml_image_preprocess(&other, &p, &l, work, ws, out, n, NULL, 0) == ML_ERR_INVALID_ARG,
          "image does not match the plan");
    ml_image_params q = p;
    q.tile_size = 5;
    check(ml_image_preprocess(&img, &q, &l, work, ws, out, n, NULL, 0) == ML_ERR_INVALID_ARG,
          "tile size differs from the plan");
    int untouched = 1;
    for (size_t i = 0; i < n; i++)
        untouched &= out[i] == 0.0f;
    check(untouched, "failed calls wrote pixels");
    free(src);
    free(out);
    free(work);
}

/* ---- packing ------------------------------------------------------------ */

static void test_packing(void)
{
    ml_image_params p;
    ml_image_params_default(&p);
    p.tile_size = 2;
    ml_image_layout l[2];
    check(ml_image_plan(4, 2, &p, &l[0], NULL, 0) == ML_OK, "plan (1,2)");
    check(ml_image_plan(3, 3, &p, &l[1], NULL, 0) == ML_OK, "plan (2,2)");
    check(l[0].aspect_ratio_id == 2 && l[1].aspect_ratio_id == 6, "ids %u %u", l[0].aspect_ratio_id,
          l[1].aspect_ratio_id);

    size_t tile = 3 * 2 * 2;
    float slot[4 * 12];
    for (size_t i = 0; i < 4 * tile; i++)
        slot[i] = 1.0f;
    ml_image_pack_slot(&l[0], slot);
    int ok = 1;
    for (size_t i = 0; i < 4 * tile; i++)
        ok &= slot[i] == (i < 2 * tile ? 1.0f : 0.0f);
    check(ok, "pack_slot keeps 2 tiles and zeroes 2");

    int32_t ids[3], mask[3 * 4];
    ml_image_pack_aspect(l, 2, 3, 4, ids, mask);
    static const int32_t want_ids[3] = {2, 6, 0};
    static const int32_t want_mask[12] = {1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0};
    check(!memcmp(ids, want_ids, sizeof ids), "ids %d %d %d", ids[0], ids[1], ids[2]);
    check(!memcmp(mask, want_mask, sizeof mask), "mask (padding slot keeps tile 0)");
}

/* ---- parameters --------------------------------------------------------- */

static const char PUBLISHED[] =
    "{\"do_convert_rgb\": true, \"do_normalize\": true, \"do_pad\": true, \"do_rescale\": true,"
    " \"do_resize\": true, \"image_mean\": [0.48145466, 0.4578275, 0.40821073],"
    " \"image_processor_type\": \"MllamaImageProcessor\","
    " \"image_std\": [0.26862954, 0.26130258, 0.27577711], \"max_image_tiles\": 4,"
    " \"resample\": 2, \"rescale_factor\": 0.00392156862745098,"
    " \"size\": {\"height\": 560, \"width\": 560}}";

static void test_params(void)
{
    ml_image_params d, p;
    ml_image_params_default(&d);
    /* float32 bits of numpy.array(image_mean / image_std, dtype=float32) */
    static const uint32_t mean_bits[3] = {0x3ef6813a, 0x3eea685e, 0x3ed100ff};
    static const uint32_t std_bits[3] = {0x3e8989d0, 0x3e85c974, 0x3e8d32a8};
    for (int c = 0; c < 3; c++)
        check(float_bits(d.mean[c]) == mean_bits[c] && float_bits(d.std[c]) == std_bits[c],
              "default mean/std channel %d", c);
    check(d.tile_size == 560 && d.max_tiles == 4 && d.do_rescale && d.do_normalize &&
              d.rescale_factor == 0.00392156862745098,
          "defaults");
    check(d.limits.max_pixels == ML_IMAGE_DEFAULT_MAX_PIXELS && d.limits.max_scans == ML_IMAGE_DEFAULT_MAX_SCANS,
          "default limits");

    p = d;
    p.tile_size = 1;
    char err[256];
    check(ml_image_params_parse(PUBLISHED, strlen(PUBLISHED), &p, err, sizeof err) == ML_OK,
          "published config: %s", err);
    check(!memcmp(&p, &d, sizeof p), "the published config equals the defaults");

    const char *custom = "{\"size\": {\"height\": 448, \"width\": 448}, \"max_image_tiles\": 6,"
                         " \"image_mean\": 0.5, \"image_std\": [0.5, 0.25, 1], \"do_rescale\": false}";
    check(ml_image_params_parse(custom, strlen(custom), &p, err, sizeof err) == ML_OK, "custom: %s", err);
    check(p.tile_size == 448 && p.max_tiles == 6 && p.mean[2] == 0.5f && p.std[1] == 0.25f &&
              !p.do_rescale && p.do_normalize,
          "custom values");

    static const struct {
        const char *json;
        ml_status want;
        const char *needle;
    } bad[] = {
        {"{", ML_ERR_FORMAT, "invalid JSON"},
        {"[]", ML_ERR_FORMAT, "object"},
        {"{\"resample\": 3}", ML_ERR_UNSUPPORTED, "resample"},
        {"{\"do_pad\": false}", ML_ERR_UNSUPPORTED, "do_pad"},
        {"{\"do_resize\": 1}", ML_ERR_FORMAT, "do_resize"},
        {"{\"size\": {\"height\": 560, \"width\": 448}}", ML_ERR_FORMAT, "size"},
        {"{\"size\": {\"height\": 0, \"width\": 0}}", ML_ERR_FORMAT, "height"},
        {"{\"max_image_tiles\": 4.5}", ML_ERR_FORMAT, "max_image_tiles"},
        {"{\"max_image_tiles\": 17}", ML_ERR_FORMAT, "max_image_tiles"},
        {"{\"image_mean\": [0.5, 0.5]}", ML_ERR_FORMAT, "image_mean"},
        {"{\"image_std\": [0.5, 0, 0.5]}", ML_ERR_FORMAT, "image_std[1]"},
        {"{\"rescale_factor\": \"x\"}", ML_ERR_FORMAT, "rescale_factor"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = d;
        ml_status st = ml_image_params_parse(bad[i].json, strlen(bad[i].json), &p, err, sizeof err);
        check(st == bad[i].want && strstr(err, bad[i].needle), "%s: %s (%s)", bad[i].json,
              ml_status_name(st), err);
        check(!memcmp(&p, &d, sizeof p), "%s: params changed on error", bad[i].json);
    }

    check(ml_image_params_load(ML_SOURCE_DIR "/no/such/model", &p, err, sizeof err) == ML_OK &&
              !memcmp(&p, &d, sizeof p),
          "a missing preprocessor_config.json means defaults");
    char dir[] = "/tmp/ml_test_image_XXXXXX";
    if (mkdtemp(dir)) {
        char path[256];
        snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
        FILE *f = fopen(path, "w");
        fputs("{\"max_image_tiles\": 2}", f);
        fclose(f);
        check(ml_image_params_load(dir, &p, err, sizeof err) == ML_OK && p.max_tiles == 2,
              "load from a model dir: %s", err);
        f = fopen(path, "w");
        fputs("{\"max_image_tiles\": \"many\"}", f);
        fclose(f);
        check(ml_image_params_load(dir, &p, err, sizeof err) == ML_ERR_FORMAT, "bad file in model dir");
        unlink(path);
        rmdir(dir);
    }
}

int main(void)
{
    test_plan_examples();
    test_plan_errors();
    test_resize_hand_computed();
    test_resize_matches_pillow();
    test_resize_errors();
    test_value_mapping_matches_numpy();
    test_tiles_layout();
    test_preprocess_errors();
    test_packing();
    test_params();
    return check_done();
}
