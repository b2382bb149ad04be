/* Preprocessing parameters: the published defaults and preprocessor_config.json. */
#include "image/image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#define PIL_BILINEAR 2                      /* PIL.Image.Resampling.BILINEAR */
#define MAX_CONFIG_BYTES (1024 * 1024)      /* a preprocessor config is < 1 KiB */
#define CONFIG_NAME "preprocessor_config.json"

/* The published values (engine/model/README.md §1). mean and std are written as the
 * decimal doubles of the JSON file and then cast, because transformers reads
 * them as Python floats and casts to float32; a float literal could round the
 * decimal differently. */
static const double DEFAULT_MEAN[ML_IMAGE_CHANNELS] = {0.48145466, 0.4578275, 0.40821073};
static const double DEFAULT_STD[ML_IMAGE_CHANNELS] = {0.26862954, 0.26130258, 0.27577711};
static const double DEFAULT_RESCALE = 1.0 / 255.0; /* the JSON's 0.00392156862745098 */

void ml_image_params_default(ml_image_params *p)
{
    memset(p, 0, sizeof *p);
    p->tile_size = ML_IMAGE_DEFAULT_TILE_SIZE;
    p->max_tiles = ML_IMAGE_DEFAULT_MAX_TILES;
    p->do_rescale = 1;
    p->rescale_factor = DEFAULT_RESCALE;
    p->do_normalize = 1;
    for (int c = 0; c < ML_IMAGE_CHANNELS; c++) {
        p->mean[c] = (float)DEFAULT_MEAN[c];
        p->std[c] = (float)DEFAULT_STD[c];
    }
    ml_image_limits_default(&p->limits);
}

/* ---- JSON fields -------------------------------------------------------- */

static ml_status get_uint(const cJSON *obj, const char *key, uint32_t max, uint32_t *out,
                          char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return ML_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > max ||
        v->valuedouble != (double)(uint32_t)v->valuedouble)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: %s must be an integer in 1..%u",
                       CONFIG_NAME, key, max);
    *out = (uint32_t)v->valuedouble;
    return ML_OK;
}

static ml_status get_bool(const cJSON *obj, const char *key, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return ML_OK;
    if (!cJSON_IsBool(v))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: %s must be true or false", CONFIG_NAME,
                       key);
    *out = cJSON_IsTrue(v);
    return ML_OK;
}

/* A flag transformers' Mllama processor requires to be true. */
static ml_status require_true(const cJSON *obj, const char *key, char *err, size_t errlen)
{
    int on = 1;
    ml_status st = get_bool(obj, key, &on, err, errlen);
    if (st == ML_OK && !on)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "%s: %s=false is not supported",
                       CONFIG_NAME, key);
    return st;
}

static ml_status get_triple(const cJSON *obj, const char *key, int positive,
                            float out[ML_IMAGE_CHANNELS], char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v)
        return ML_OK;
    if (cJSON_IsNumber(v)) { /* transformers broadcasts a scalar to every channel */
        if (positive && !(v->valuedouble > 0))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: %s must be positive", CONFIG_NAME, key);
        for (int c = 0; c < ML_IMAGE_CHANNELS; c++)
            out[c] = (float)v->valuedouble;
        return ML_OK;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != ML_IMAGE_CHANNELS)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: %s must be a number or %d numbers",
                       CONFIG_NAME, key, ML_IMAGE_CHANNELS);
    float tmp[ML_IMAGE_CHANNELS];
    for (int c = 0; c < ML_IMAGE_CHANNELS; c++) {
        const cJSON *e = cJSON_GetArrayItem(v, c);
        if (!cJSON_IsNumber(e) || (positive && !(e->valuedouble > 0)))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: %s[%d] must be a %snumber",
                           CONFIG_NAME, key, c, positive ? "positive " : "");
        tmp[c] = (float)e->valuedouble;
    }
    memcpy(out, tmp, sizeof tmp);
    return ML_OK;
}

static ml_status parse_fields(const cJSON *root, ml_image_params *p, char *err, size_t errlen)
{
    ml_status st;
    if (!cJSON_IsObject(root))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: not a JSON object", CONFIG_NAME);
    static const char *const required[] = {"do_resize", "do_pad", "do_convert_rgb"};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if ((st = require_true(root, required[i], err, errlen)) != ML_OK)
            return st;

    const cJSON *size = cJSON_GetObjectItemCaseSensitive(root, "size");
    if (size) {
        uint32_t h = 0, w = 0;
        if (!cJSON_IsObject(size))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: size must be an object", CONFIG_NAME);
        if ((st = get_uint(size, "height", UINT16_MAX, &h, err, errlen)) != ML_OK ||
            (st = get_uint(size, "width", UINT16_MAX, &w, err, errlen)) != ML_OK)
            return st;
        if (h == 0 || h != w)
            return ml_fail(err, errlen, ML_ERR_FORMAT,
                           "%s: size needs equal height and width (got %u, %u)", CONFIG_NAME, h, w);
        p->tile_size = h;
    }
    if ((st = get_uint(root, "max_image_tiles", ML_IMAGE_MAX_TILES_CAP, &p->max_tiles, err,
                       errlen)) != ML_OK)
        return st;
    const cJSON *resample = cJSON_GetObjectItemCaseSensitive(root, "resample");
    if (resample && !(cJSON_IsNumber(resample) && resample->valuedouble == PIL_BILINEAR))
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "%s: only resample=%d (bilinear) is supported", CONFIG_NAME, PIL_BILINEAR);
    if ((st = get_bool(root, "do_rescale", &p->do_rescale, err, errlen)) != ML_OK ||
        (st = get_bool(root, "do_normalize", &p->do_normalize, err, errlen)) != ML_OK)
        return st;
    const cJSON *factor = cJSON_GetObjectItemCaseSensitive(root, "rescale_factor");
    if (factor) {
        if (!cJSON_IsNumber(factor) || !(factor->valuedouble > 0))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: rescale_factor must be positive",
                           CONFIG_NAME);
        p->rescale_factor = factor->valuedouble;
    }
    if ((st = get_triple(root, "image_mean", 0, p->mean, err, errlen)) != ML_OK ||
        (st = get_triple(root, "image_std", 1, p->std, err, errlen)) != ML_OK)
        return st;
    return ML_OK;
}

ml_status ml_image_params_parse(const char *json, size_t len, ml_image_params *p, char *err,
                                size_t errlen)
{
    const char *end = json;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: invalid JSON near byte %td", CONFIG_NAME,
                       end - json);
    ml_image_params tmp = *p;
    ml_status st = parse_fields(root, &tmp, err, errlen);
    cJSON_Delete(root);
    if (st == ML_OK)
        *p = tmp;
    return st;
}

ml_status ml_image_params_load(const char *model_dir, ml_image_params *p, char *err,
                               size_t errlen)
{
    ml_image_params_default(p);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", model_dir, CONFIG_NAME) >= (int)sizeof path)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "model path too long: %s", model_dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            return ML_OK;
        return ml_fail(err, errlen, ML_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char *buf = malloc(MAX_CONFIG_BYTES);
    if (!buf) {
        fclose(f);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t n = fread(buf, 1, MAX_CONFIG_BYTES, f);
    int bad = ferror(f), too_big = n == MAX_CONFIG_BYTES && fgetc(f) != EOF;
    fclose(f);
    ml_status st;
    if (bad)
        st = ml_fail(err, errlen, ML_ERR_IO, "%s: read error", path);
    else if (too_big)
        st = ml_fail(err, errlen, ML_ERR_FORMAT, "%s: larger than %d bytes", path,
                     MAX_CONFIG_BYTES);
    else
        st = ml_image_params_parse(buf, n, p, err, errlen);
    free(buf);
    return st;
}
