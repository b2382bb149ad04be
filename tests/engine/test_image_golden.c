/* engine/image against transformers: every image fixture of
 * tests/golden/fixtures/images (written by tests/golden/gen_fixtures.py with
 * MllamaImageProcessor 4.47.1 and Pillow 13) must match bit for bit: the RGB
 * image after convert_to_rgb, the canvas, the resized uint8 image, and the
 * float32 pixel tensor of every tile; the batch fixtures check the packing
 * (padding tiles and images, aspect ratio ids and masks). The fixtures cover
 * JPEG variants, every PNG colour type and bit depth, tRNS in each form,
 * Adam7 and APNG, lossy and lossless WebP with and without alpha, and GIFs
 * Pillow writes and GIFs it only reads (tests/golden/README.md lists them). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "image/image.h"
#include "sha256.h"
#include "tokenizer_util.h"

#define FIXTURE_DIR ML_SOURCE_DIR "/tests/golden/fixtures/images/"
#define MAX_SLOT_IMAGES 16

/* ---- helpers ------------------------------------------------------------ */

/* The file `name` of FIXTURE_DIR, as ml_tok_read_file reads it (owned,
 * NUL-terminated), or NULL. */
static char *read_file(const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s", FIXTURE_DIR, name);
    return ml_tok_read_file(path, len);
}

static cJSON *read_json(const char *name)
{
    size_t len;
    char *text = read_file(name, &len);
    if (!text)
        return NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    return j;
}

/* The fixture's description, <name>.json (owned: cJSON_Delete); NULL, and a
 * check failure, when it cannot be read or parsed. */
static cJSON *read_fixture(const char *name)
{
    char json_name[256];
    snprintf(json_name, sizeof json_name, "%s.json", name);
    cJSON *fx = read_json(json_name);
    check(fx != NULL, "%s: cannot read or parse", json_name);
    return fx;
}

static const char *json_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static long json_int(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : -1;
}

static void hex_of(const void *data, size_t len, char hex[ML_SHA256_HEX_SIZE])
{
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    ml_sha256(data, len, d);
    ml_sha256_hex(d, hex);
}

/* A decoded, planned and preprocessed image. */
typedef struct prepared {
    ml_image_rgb img;
    ml_image_layout layout;
    float *pixels; /* (n_tiles, 3, S, S) */
} prepared;

static void prepared_deinit(prepared *pr)
{
    ml_image_rgb_deinit(&pr->img);
    free(pr->pixels);
    memset(pr, 0, sizeof *pr);
}

/* Decode + plan + preprocess. Returns the decode status (plan and
 * preprocess failures are test failures). */
static ml_status prepare(const char *file, const ml_image_params *p, prepared *pr)
{
    memset(pr, 0, sizeof *pr);
    size_t len;
    uint8_t *bytes = (uint8_t *)read_file(file, &len);
    if (!bytes) {
        check(0, "%s: cannot read", file);
        return ML_ERR_IO;
    }
    char err[256];
    ml_status st = ml_image_decode(bytes, len, &p->limits, &pr->img, err, sizeof err);
    free(bytes);
    if (st != ML_OK)
        return st;
    check(ml_image_plan(pr->img.width, pr->img.height, p, &pr->layout, err, sizeof err) == ML_OK,
          "%s: plan: %s", file, err);
    size_t n = ml_image_pixels_count(&pr->layout), ws = ml_image_workspace_size(&pr->layout);
    void *work = malloc(ws ? ws : 1);
    pr->pixels = malloc(n * sizeof(float));
    check(ml_image_preprocess(&pr->img, p, &pr->layout, work, ws, pr->pixels, n, err, sizeof err) ==
              ML_OK,
          "%s: preprocess: %s", file, err);
    free(work);
    return ML_OK;
}

/* ---- one image fixture -------------------------------------------------- */

/* Returns 1 when every check of the fixture passed, 0 otherwise. */
static int check_image(const char *name, const ml_image_params *p)
{
    cJSON *fx = read_fixture(name);
    if (!fx)
        return 0;
    int failures_before = ml_test_failures;
    const char *file = json_str(fx, "file");
    prepared pr;
    ml_status st = prepare(file, p, &pr);
    check(st == ML_OK, "%s: decode %s", name, ml_status_name(st));
    if (st != ML_OK) {
        cJSON_Delete(fx);
        return 0;
    }

    const ml_image_layout *l = &pr.layout;
    char hex[ML_SHA256_HEX_SIZE];
    check(pr.img.width == json_int(fx, "width") && pr.img.height == json_int(fx, "height"),
          "%s: size %ux%u", name, pr.img.width, pr.img.height);
    hex_of(pr.img.pixels, (size_t)pr.img.width * pr.img.height * 3, hex);
    int rgb_ok = !strcmp(hex, json_str(fx, "rgb_sha256"));
    check(rgb_ok, "%s: decoded RGB %s, transformers %s", name, hex, json_str(fx, "rgb_sha256"));

    check(l->tiles_h == json_int(fx, "tiles_h") && l->tiles_w == json_int(fx, "tiles_w") &&
              l->n_tiles == json_int(fx, "num_tiles") &&
              l->aspect_ratio_id == json_int(fx, "aspect_ratio_id"),
          "%s: grid (%u,%u) id %u", name, l->tiles_h, l->tiles_w, l->aspect_ratio_id);
    const cJSON *mask = cJSON_GetObjectItemCaseSensitive(fx, "aspect_ratio_mask");
    check(cJSON_GetArraySize(mask) == (int)l->max_tiles, "%s: mask length", name);
    for (uint32_t t = 0; t < l->max_tiles && t < (uint32_t)cJSON_GetArraySize(mask); t++)
        check(l->aspect_ratio_mask[t] == cJSON_GetArrayItem(mask, (int)t)->valuedouble,
              "%s: mask[%u]", name, t);
    check(l->resized_height == json_int(fx, "resized_height") &&
              l->resized_width == json_int(fx, "resized_width"),
          "%s: resized %ux%u", name, l->resized_width, l->resized_height);

    size_t rbytes = (size_t)l->resized_width * l->resized_height * 3;
    uint8_t *resized = malloc(rbytes);
    size_t ws = ml_image_resize_workspace_size(l->width, l->height, l->resized_width, l->resized_height);
    void *work = malloc(ws);
    check(ml_image_resize(pr.img.pixels, l->width, l->height, resized, l->resized_width,
                          l->resized_height, work, ws) == ML_OK,
          "%s: resize", name);
    hex_of(resized, rbytes, hex);
    int resized_ok = !strcmp(hex, json_str(fx, "resized_sha256"));
    check(resized_ok, "%s: resized %s, transformers %s", name, hex, json_str(fx, "resized_sha256"));
    free(resized);
    free(work);

    size_t tile_floats = (size_t)3 * l->tile_size * l->tile_size;
    hex_of(pr.pixels, ml_image_pixels_count(l) * sizeof(float), hex);
    int pixels_ok = !strcmp(hex, json_str(fx, "pixel_values_sha256"));
    check(pixels_ok, "%s: pixel_values %s, transformers %s", name, hex,
          json_str(fx, "pixel_values_sha256"));
    const cJSON *tiles = cJSON_GetObjectItemCaseSensitive(fx, "pixel_values_tile_sha256");
    int bad_tiles = 0;
    for (uint32_t t = 0; t < l->n_tiles; t++) {
        const cJSON *want = cJSON_GetArrayItem(tiles, (int)t);
        hex_of(pr.pixels + t * tile_floats, tile_floats * sizeof(float), hex);
        bad_tiles += !cJSON_IsString(want) || strcmp(hex, want->valuestring);
    }
    check(bad_tiles == 0, "%s: %d of %u tiles differ", name, bad_tiles, l->n_tiles);

    fprintf(stderr, "  %-28s %-5s %5ux%-5u -> %4ux%-4u grid %ux%u id %u  rgb %s resized %s pixels %s\n",
            name, json_str(fx, "pil_mode"), l->width, l->height, l->resized_width, l->resized_height,
            l->tiles_h, l->tiles_w, l->aspect_ratio_id, rgb_ok ? "ok" : "DIFF",
            resized_ok ? "ok" : "DIFF", pixels_ok ? "ok" : "DIFF");
    prepared_deinit(&pr);
    cJSON_Delete(fx);
    return ml_test_failures == failures_before;
}

/* ---- batch fixtures ----------------------------------------------------- */

/* Rebuild pixel_values (B, N, max_tiles, 3, S, S) and the aspect ratio ids
 * and masks from the listed images with ml_image_pack_slot and
 * ml_image_pack_aspect. */
static void check_batch(const char *name, const ml_image_params *p)
{
    cJSON *fx = read_fixture(name);
    if (!fx)
        return;
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(fx, "images");
    const cJSON *want_slots = cJSON_GetObjectItemCaseSensitive(fx, "pixel_values_slot_sha256");
    const cJSON *want_ids = cJSON_GetObjectItemCaseSensitive(fx, "aspect_ratio_ids");
    const cJSON *want_mask = cJSON_GetObjectItemCaseSensitive(fx, "aspect_ratio_mask");
    int n_samples = cJSON_GetArraySize(samples), n_slots = 0;
    for (int b = 0; b < n_samples; b++) {
        int n = cJSON_GetArraySize(cJSON_GetArrayItem(samples, b));
        n_slots = n > n_slots ? n : n_slots;
    }
    check(n_slots <= MAX_SLOT_IMAGES, "%s: too many images per sample", name);

    size_t slot_floats = (size_t)p->max_tiles * 3 * p->tile_size * p->tile_size;
    float *slot = malloc(slot_floats * sizeof *slot);
    ml_sha256_ctx whole;
    ml_sha256_init(&whole);
    int bad = 0;
    for (int b = 0; b < n_samples; b++) {
        const cJSON *files = cJSON_GetArrayItem(samples, b);
        int n_images = cJSON_GetArraySize(files);
        ml_image_layout layouts[MAX_SLOT_IMAGES];
        for (int i = 0; i < n_slots && i < MAX_SLOT_IMAGES; i++) {
            memset(slot, 0, slot_floats * sizeof *slot); /* a padding image is all zeros */
            if (i < n_images) {
                prepared pr;
                if (prepare(cJSON_GetArrayItem(files, i)->valuestring, p, &pr) == ML_OK) {
                    memcpy(slot, pr.pixels, ml_image_pixels_count(&pr.layout) * sizeof(float));
                    ml_image_pack_slot(&pr.layout, slot);
                    layouts[i] = pr.layout;
                }
                prepared_deinit(&pr);
            }
            char hex[ML_SHA256_HEX_SIZE];
            hex_of(slot, slot_floats * sizeof *slot, hex);
            const cJSON *want = cJSON_GetArrayItem(cJSON_GetArrayItem(want_slots, b), i);
            bad += !cJSON_IsString(want) || strcmp(hex, want->valuestring);
            check(cJSON_IsString(want) && !strcmp(hex, want->valuestring), "%s: slot (%d,%d) %s",
                  name, b, i, hex);
            ml_sha256_update(&whole, slot, slot_floats * sizeof *slot);
        }
        int32_t ids[MAX_SLOT_IMAGES], mask[MAX_SLOT_IMAGES * ML_IMAGE_MAX_TILES_CAP];
        ml_image_pack_aspect(layouts, (size_t)n_images, (size_t)n_slots, p->max_tiles, ids, mask);
        for (int i = 0; i < n_slots; i++) {
            const cJSON *id = cJSON_GetArrayItem(cJSON_GetArrayItem(want_ids, b), i);
            check(cJSON_IsNumber(id) && ids[i] == id->valuedouble, "%s: aspect id (%d,%d) = %d",
                  name, b, i, ids[i]);
            const cJSON *m = cJSON_GetArrayItem(cJSON_GetArrayItem(want_mask, b), i);
            for (uint32_t t = 0; t < p->max_tiles; t++)
                check(mask[i * p->max_tiles + t] == cJSON_GetArrayItem(m, (int)t)->valuedouble,
                      "%s: mask (%d,%d,%u)", name, b, i, t);
        }
    }
    uint8_t d[ML_SHA256_DIGEST_SIZE];
    char hex[ML_SHA256_HEX_SIZE];
    ml_sha256_final(&whole, d);
    ml_sha256_hex(d, hex);
    check(!strcmp(hex, json_str(fx, "pixel_values_sha256")), "%s: pixel_values %s, transformers %s",
          name, hex, json_str(fx, "pixel_values_sha256"));
    fprintf(stderr, "  %-28s B=%d N=%d: %s\n", name, n_samples, n_slots,
            bad ? "slots DIFF" : "all slots, ids and masks ok");
    free(slot);
    cJSON_Delete(fx);
}

int main(void)
{
    cJSON *index = read_json("index.json");
    if (!index)
        ml_test_skip("no image fixtures (tests/golden/fixtures/images/index.json)");

    /* The generator's processor config goes through the config parser. */
    ml_image_params p;
    ml_image_params_default(&p);
    const cJSON *processor = cJSON_GetObjectItemCaseSensitive(index, "processor");
    char *config = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(processor, "config"));
    char err[256];
    check(config && ml_image_params_parse(config, strlen(config), &p, err, sizeof err) == ML_OK,
          "processor config: %s", config ? err : "missing");
    cJSON_free(config);

    int passed = 0, failed = 0;
    const cJSON *name;
    cJSON_ArrayForEach(name, cJSON_GetObjectItemCaseSensitive(index, "images"))
    {
        int r = check_image(name->valuestring, &p);
        passed += r == 1;
        failed += r == 0;
    }
    cJSON_ArrayForEach(name, cJSON_GetObjectItemCaseSensitive(index, "batches"))
        check_batch(name->valuestring, &p);
    fprintf(stderr, "image fixtures: %d bit-exact, %d different\n", passed, failed);
    check(passed > 0, "no fixture was checked");
    cJSON_Delete(index);
    return check_done();
}
