/* config.json parsing and validation (MllamaConfig, engine/model/README.md §1). */
#include "checkpoint/config.h"
#include "checkpoint/json_util.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint/mapped_file.h"
#include "checkpoint/quant_config.h"

/* Upper bounds on sizes, so every derived product (the tile embedding is
 * max_num_tiles * num_patches * hidden_size elements) stays far inside
 * int64 and the per-tile quantities fit an int. */
#define MAX_DIM (1 << 20) /* hidden and intermediate sizes, head counts */
#define MAX_VOCAB (1 << 24)
#define MAX_IMAGE_SIZE (1 << 14) /* pixels per tile side */
#define MAX_TILES 64
#define MAX_TOKEN_ID INT_MAX

/* Default lists of MllamaVisionConfig / MllamaTextConfig (v4.47). */
static const int default_aspect_ratios[][2] = {{1, 1}, {1, 2}, {1, 3}, {1, 4},
                                               {2, 1}, {2, 2}, {3, 1}, {4, 1}};
/* transformers only fills the default aspect ratios for this tile count. */
#define DEFAULT_ASPECT_RATIOS_TILES 4
static const int default_intermediate_layers[] = {3, 7, 15, 23, 30};
static const int default_cross_layers[] = {3, 8, 13, 18, 23, 28, 33, 38};
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- JSON access with field paths in every error ----------------------- */

/* The error sink and the object path ("text_config.rope_scaling") that
 * prefixes every field name in messages. */
typedef struct jctx {
    char *err;
    size_t errlen;
    const char *sec; /* "" at the top level */
} jctx;

/* Full path of key in the current section, in buf. */
static const char *field_path(const jctx *c, const char *key, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s", c->sec, c->sec[0] ? "." : "", key);
    return buf;
}

#define PATH_LEN 192

/* Absent or JSON null. */
static int is_unset(const cJSON *v)
{
    return !v || cJSON_IsNull(v);
}

/* v must be an integral number in [lo, hi]. */
static ml_status value_int(const jctx *c, const cJSON *v, const char *path, long lo, long hi,
                           int *out)
{
    if (!cJSON_IsNumber(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected an integer, got %s", path,
                       ml_json_type_name(v));
    double d = v->valuedouble;
    if (!isfinite(d) || floor(d) != d)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected an integer, got %.17g", path,
                       d);
    if (d < (double)lo || d > (double)hi)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: %.17g out of range [%ld, %ld]", path,
                       d, lo, hi);
    *out = (int)d;
    return ML_OK;
}

/* Integer member; def when absent. null is an error: transformers would
 * pass None on and fail later. */
static ml_status get_int(const jctx *c, const cJSON *obj, const char *key, int def, long lo,
                         long hi, int *out)
{
    const cJSON *v = ml_json_member(obj, key);
    if (!v) {
        *out = def;
        return ML_OK;
    }
    char path[PATH_LEN];
    return value_int(c, v, field_path(c, key, path, sizeof path), lo, hi, out);
}

/* A token id: def when absent, -1 when null (transformers allows None). */
static ml_status get_token_id(const jctx *c, const cJSON *obj, const char *key, int def, int *out)
{
    const cJSON *v = ml_json_member(obj, key);
    if (cJSON_IsNull(v)) {
        *out = -1;
        return ML_OK;
    }
    return get_int(c, obj, key, def, 0, MAX_TOKEN_ID, out);
}

/* Finite number > 0 (epsilons, rope factors); def when absent, or an error
 * naming the key when absent and required (def < 0). */
static ml_status get_positive(const jctx *c, const cJSON *obj, const char *key, double def,
                              double *out)
{
    char path[PATH_LEN];
    field_path(c, key, path, sizeof path);
    const cJSON *v = ml_json_member(obj, key);
    if (!v) {
        if (def < 0)
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: required", path);
        *out = def;
        return ML_OK;
    }
    if (!cJSON_IsNumber(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a number, got %s", path,
                       ml_json_type_name(v));
    if (!isfinite(v->valuedouble) || !(v->valuedouble > 0))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: %.17g must be a positive number",
                       path, v->valuedouble);
    *out = v->valuedouble;
    return ML_OK;
}

/* A string member that must equal `want` when present (activation names,
 * model_type). Anything else is ML_ERR_UNSUPPORTED. */
static ml_status expect_string(const jctx *c, const cJSON *obj, const char *key, const char *want)
{
    const cJSON *v = ml_json_member(obj, key);
    if (!v)
        return ML_OK;
    char path[PATH_LEN];
    field_path(c, key, path, sizeof path);
    if (!cJSON_IsString(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a string, got %s", path,
                       ml_json_type_name(v));
    if (strcmp(v->valuestring, want))
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "%s: \"%.64s\" is not supported (only \"%s\")", path, v->valuestring, want);
    return ML_OK;
}

/* A boolean member; def when absent or null. */
static ml_status get_bool(const jctx *c, const cJSON *obj, const char *key, int def, int *out)
{
    const cJSON *v = ml_json_member(obj, key);
    if (is_unset(v)) {
        *out = def;
        return ML_OK;
    }
    if (!cJSON_IsBool(v)) {
        char path[PATH_LEN];
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a boolean, got %s",
                       field_path(c, key, path, sizeof path), ml_json_type_name(v));
    }
    *out = cJSON_IsTrue(v);
    return ML_OK;
}

/* A nested object member: NULL when absent or null. */
static ml_status get_object(const jctx *c, const cJSON *obj, const char *key, const cJSON **out)
{
    const cJSON *v = ml_json_member(obj, key);
    *out = NULL;
    if (is_unset(v))
        return ML_OK;
    if (!cJSON_IsObject(v)) {
        char path[PATH_LEN];
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected an object, got %s",
                       field_path(c, key, path, sizeof path), ml_json_type_name(v));
    }
    *out = v;
    return ML_OK;
}

/* A list of integers in [lo, hi]. Absent or null: a copy of def (n_def
 * entries). A bare integer is accepted as a one-element list when
 * scalar_ok (eos_token_id). */
static ml_status get_int_list(const jctx *c, const cJSON *obj, const char *key, const int *def,
                              int n_def, int scalar_ok, int cap, long lo, long hi, int *out,
                              int *n_out)
{
    char path[PATH_LEN];
    field_path(c, key, path, sizeof path);
    const cJSON *v = ml_json_member(obj, key);
    if (is_unset(v)) {
        if (n_def > 0)
            memcpy(out, def, (size_t)n_def * sizeof *out);
        *n_out = n_def;
        return ML_OK;
    }
    if (scalar_ok && cJSON_IsNumber(v)) {
        *n_out = 1;
        return value_int(c, v, path, lo, hi, out);
    }
    if (!cJSON_IsArray(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected %s, got %s", path,
                       scalar_ok ? "an integer or a list of integers" : "a list of integers",
                       ml_json_type_name(v));
    int n = cJSON_GetArraySize(v);
    if (n > cap)
        return ml_fail(c->err, c->errlen, ML_ERR_TOO_LARGE, "%s: %d entries exceed the limit %d",
                       path, n, cap);
    int i = 0;
    for (const cJSON *it = v->child; it; it = it->next, i++) {
        char ipath[PATH_LEN + 16];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i);
        ml_status st = value_int(c, it, ipath, lo, hi, &out[i]);
        if (st != ML_OK)
            return st;
    }
    *n_out = n;
    return ML_OK;
}

/* ---- vision_config ----------------------------------------------------- */

static ml_status parse_aspect_ratios(const jctx *c, const cJSON *obj, ml_vision_config *v)
{
    char path[PATH_LEN];
    field_path(c, "supported_aspect_ratios", path, sizeof path);
    const cJSON *list = ml_json_member(obj, "supported_aspect_ratios");
    if (is_unset(list)) {
        if (v->max_num_tiles != DEFAULT_ASPECT_RATIOS_TILES)
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                           "%s: required when max_num_tiles is %d (the default list is for %d)",
                           path, v->max_num_tiles, DEFAULT_ASPECT_RATIOS_TILES);
        memcpy(v->supported_aspect_ratios, default_aspect_ratios, sizeof default_aspect_ratios);
        v->n_aspect_ratios = N_OF(default_aspect_ratios);
        return ML_OK;
    }
    if (!cJSON_IsArray(list))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a list of pairs, got %s",
                       path, ml_json_type_name(list));
    int n = cJSON_GetArraySize(list);
    if (n == 0)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: empty", path);
    if (n > ML_CONFIG_MAX_ASPECT_RATIOS)
        return ml_fail(c->err, c->errlen, ML_ERR_TOO_LARGE, "%s: %d entries exceed the limit %d",
                       path, n, ML_CONFIG_MAX_ASPECT_RATIOS);
    int i = 0;
    for (const cJSON *pair = list->child; pair; pair = pair->next, i++) {
        char ipath[PATH_LEN + 16];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, i);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2)
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                           "%s: expected a pair [tiles_high, tiles_wide]", ipath);
        int *hw = v->supported_aspect_ratios[i];
        ml_status st = value_int(c, pair->child, ipath, 1, v->max_num_tiles, &hw[0]);
        if (st == ML_OK)
            st = value_int(c, pair->child->next, ipath, 1, v->max_num_tiles, &hw[1]);
        if (st != ML_OK)
            return st;
        if (hw[0] * hw[1] > v->max_num_tiles)
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                           "%s: [%d, %d] needs %d tiles, more than max_num_tiles %d", ipath, hw[0],
                           hw[1], hw[0] * hw[1], v->max_num_tiles);
    }
    v->n_aspect_ratios = n;
    return ML_OK;
}

static ml_status parse_vision(jctx *c, const cJSON *obj, ml_vision_config *v)
{
    c->sec = "vision_config";
    char path[PATH_LEN];
    ml_status st;
    double eps;
    const cJSON *heads = ml_json_member(obj, "attention_heads");
    if ((st = get_int(c, obj, "hidden_size", 1280, 1, MAX_DIM, &v->hidden_size)) ||
        (st = get_int(c, obj, heads ? "attention_heads" : "num_attention_heads", 16, 1, MAX_DIM,
                      &v->attention_heads)) ||
        (st = get_int(c, obj, "intermediate_size", 5120, 1, MAX_DIM, &v->intermediate_size)) ||
        (st = get_int(c, obj, "num_hidden_layers", 32, 1, ML_CONFIG_MAX_LAYERS,
                      &v->num_hidden_layers)) ||
        (st = get_int(c, obj, "num_global_layers", 8, 0, ML_CONFIG_MAX_LAYERS,
                      &v->num_global_layers)) ||
        (st = expect_string(c, obj, "hidden_act", "gelu")) ||
        (st = get_int(c, obj, "patch_size", 14, 1, MAX_IMAGE_SIZE, &v->patch_size)) ||
        (st = get_int(c, obj, "num_channels", 3, 1, MAX_DIM, &v->num_channels)) ||
        (st = get_positive(c, obj, "norm_eps", 1e-5, &eps)) ||
        (st = get_int(c, obj, "max_num_tiles", 4, 1, MAX_TILES, &v->max_num_tiles)) ||
        (st = parse_aspect_ratios(c, obj, v)) ||
        (st = get_int_list(c, obj, "intermediate_layers_indices", default_intermediate_layers,
                           N_OF(default_intermediate_layers), 0, ML_CONFIG_MAX_INTERMEDIATE, 0,
                           v->num_hidden_layers, v->intermediate_layers_indices,
                           &v->n_intermediate_layers)) ||
        (st = get_int(c, obj, "vision_output_dim", 7680, 1, INT_MAX, &v->vision_output_dim)))
        return st;
    v->norm_eps = (float)eps;

    /* Required: the class default (448) differs from every published
     * checkpoint (560), see the header comment. */
    if (!ml_json_member(obj, "image_size"))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: required",
                       field_path(c, "image_size", path, sizeof path));
    if ((st = get_int(c, obj, "image_size", 0, 1, MAX_IMAGE_SIZE, &v->image_size)))
        return st;
    if (v->image_size % v->patch_size)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "vision_config.image_size: %d is not a multiple of patch_size %d",
                       v->image_size, v->patch_size);
    if (v->hidden_size % v->attention_heads)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "vision_config.attention_heads: %d does not divide hidden_size %d",
                       v->attention_heads, v->hidden_size);
    v->head_dim = v->hidden_size / v->attention_heads;
    long long want_out = (long long)v->hidden_size * (1 + v->n_intermediate_layers);
    if (v->vision_output_dim != want_out)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "vision_config.vision_output_dim: %d, expected hidden_size * (1 + "
                       "len(intermediate_layers_indices)) = %lld",
                       v->vision_output_dim, want_out);
    return ML_OK;
}

/* ---- text_config ------------------------------------------------------- */

/* rope_scaling (legacy) or rope_parameters (newer): the type, and the
 * llama3 parameters (all required for llama3, as _validate_llama3 wants). */
static ml_status parse_rope_object(jctx *c, const cJSON *obj, ml_rope_scaling *rs)
{
    char path[PATH_LEN];
    memset(rs, 0, sizeof *rs);
    rs->type = ML_ROPE_DEFAULT;
    if (!obj)
        return ML_OK;
    /* BC in transformers: "rope_type" was once "type". */
    const char *key = ml_json_member(obj, "rope_type") ? "rope_type" : "type";
    const cJSON *t = ml_json_member(obj, key);
    if (is_unset(t))
        return ML_OK;
    field_path(c, key, path, sizeof path);
    if (!cJSON_IsString(t))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a string, got %s", path,
                       ml_json_type_name(t));
    if (!strcmp(t->valuestring, "default"))
        return ML_OK;
    if (strcmp(t->valuestring, "llama3"))
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "%s: \"%.64s\" is not supported (only \"default\" and \"llama3\")", path,
                       t->valuestring);
    rs->type = ML_ROPE_LLAMA3;
    double factor, low, high;
    ml_status st;
    if ((st = get_positive(c, obj, "factor", -1, &factor)) ||
        (st = get_positive(c, obj, "low_freq_factor", -1, &low)) ||
        (st = get_positive(c, obj, "high_freq_factor", -1, &high)))
        return st;
    if (!ml_json_member(obj, "original_max_position_embeddings"))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: required",
                       field_path(c, "original_max_position_embeddings", path, sizeof path));
    if ((st = get_int(c, obj, "original_max_position_embeddings", 0, 1, INT_MAX,
                      &rs->original_max_position_embeddings)))
        return st;
    /* transformers only warns here, then divides by (high - low). */
    if (!(high > low))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "%s: %g must be greater than low_freq_factor %g",
                       field_path(c, "high_freq_factor", path, sizeof path), high, low);
    rs->factor = (float)factor;
    rs->low_freq_factor = (float)low;
    rs->high_freq_factor = (float)high;
    return ML_OK;
}

static ml_status parse_rope(jctx *c, const cJSON *obj, ml_text_config *t)
{
    ml_status st;
    const cJSON *params, *scaling;
    if ((st = get_positive(c, obj, "rope_theta", 500000.0, &t->rope_theta)) ||
        (st = get_object(c, obj, "rope_parameters", &params)))
        return st;
    if (params) {
        c->sec = "text_config.rope_parameters";
        if ((st = get_positive(c, params, "rope_theta", t->rope_theta, &t->rope_theta)))
            return st;
        st = parse_rope_object(c, params, &t->rope_scaling);
    } else {
        if ((st = get_object(c, obj, "rope_scaling", &scaling)))
            return st;
        c->sec = "text_config.rope_scaling";
        st = parse_rope_object(c, scaling, &t->rope_scaling);
    }
    c->sec = "text_config";
    return st;
}

static ml_status check_cross_layers(const jctx *c, const ml_text_config *t)
{
    for (int i = 0; i < t->n_cross_layers; i++) {
        int l = t->cross_attention_layers[i];
        if (l >= t->num_hidden_layers)
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                           "text_config.cross_attention_layers[%d]: %d out of range [0, %d)", i, l,
                           t->num_hidden_layers);
        if (i > 0 && l <= t->cross_attention_layers[i - 1])
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                           "text_config.cross_attention_layers[%d]: %d after %d (the list must be "
                           "sorted and unique)",
                           i, l, t->cross_attention_layers[i - 1]);
    }
    return ML_OK;
}

static ml_status parse_text(jctx *c, const cJSON *obj, ml_text_config *t)
{
    c->sec = "text_config";
    ml_status st;
    double eps;
    int tied = 0, head_dim;
    if ((st = get_int(c, obj, "vocab_size", 128256, 1, MAX_VOCAB, &t->vocab_size)) ||
        (st = get_int(c, obj, "hidden_size", 4096, 1, MAX_DIM, &t->hidden_size)) ||
        (st = get_int(c, obj, "intermediate_size", 14336, 1, MAX_DIM, &t->intermediate_size)) ||
        (st = get_int(c, obj, "num_hidden_layers", 40, 1, ML_CONFIG_MAX_LAYERS,
                      &t->num_hidden_layers)) ||
        (st = get_int(c, obj, "num_attention_heads", 32, 1, MAX_DIM, &t->num_attention_heads)) ||
        (st = get_int(c, obj, "num_key_value_heads", 8, 1, MAX_DIM, &t->num_key_value_heads)) ||
        (st = get_int_list(c, obj, "cross_attention_layers", default_cross_layers,
                           N_OF(default_cross_layers), 0, ML_CONFIG_MAX_LAYERS, 0, INT_MAX,
                           t->cross_attention_layers, &t->n_cross_layers)) ||
        (st = get_positive(c, obj, "rms_norm_eps", 1e-5, &eps)) || (st = parse_rope(c, obj, t)) ||
        (st = get_int(c, obj, "max_position_embeddings", 131072, 1, INT_MAX,
                      &t->max_position_embeddings)) ||
        (st = expect_string(c, obj, "hidden_act", "silu")) ||
        (st = get_bool(c, obj, "tie_word_embeddings", 0, &tied)) ||
        (st = get_token_id(c, obj, "bos_token_id", 128000, &t->bos_token_id)) ||
        (st = get_token_id(c, obj, "pad_token_id", 128004, &t->pad_token_id)))
        return st;
    t->rms_norm_eps = (float)eps;
    static const int default_eos[] = {128001};
    if (cJSON_IsNull(ml_json_member(obj, "eos_token_id")))
        t->n_eos = 0;
    else if ((st = get_int_list(c, obj, "eos_token_id", default_eos, N_OF(default_eos), 1,
                                ML_CONFIG_MAX_EOS, 0, MAX_TOKEN_ID, t->eos_token_ids, &t->n_eos)))
        return st;
    if (tied)
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "text_config.tie_word_embeddings: true is not supported (Mllama "
                       "checkpoints have a separate lm_head)");
    if ((st = check_cross_layers(c, t)))
        return st;
    if (t->hidden_size % t->num_attention_heads)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "text_config.num_attention_heads: %d does not divide hidden_size %d",
                       t->num_attention_heads, t->hidden_size);
    if (t->num_attention_heads % t->num_key_value_heads)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "text_config.num_key_value_heads: %d does not divide num_attention_heads %d",
                       t->num_key_value_heads, t->num_attention_heads);
    t->head_dim = t->hidden_size / t->num_attention_heads;
    if ((st = get_int(c, obj, "head_dim", t->head_dim, 1, MAX_DIM, &head_dim)))
        return st;
    if (head_dim != t->head_dim)
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "text_config.head_dim: %d differs from hidden_size / num_attention_heads = "
                       "%d, which transformers uses",
                       head_dim, t->head_dim);
    if (t->head_dim % 2)
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "text_config: head_dim %d is odd; half-split RoPE needs an even head_dim",
                       t->head_dim);
    return ML_OK;
}

/* ---- top level --------------------------------------------------------- */

static ml_status parse_dtype(jctx *c, const cJSON *root, ml_dtype *out)
{
    static const struct {
        const char *torch;
        ml_dtype dtype;
    } names[] = {{"bfloat16", ML_DTYPE_BF16}, {"float16", ML_DTYPE_F16}, {"float32", ML_DTYPE_F32}};
    const char *key = is_unset(ml_json_member(root, "dtype")) ? "torch_dtype" : "dtype";
    const cJSON *v = ml_json_member(root, key);
    *out = ML_DTYPE_BF16;
    if (is_unset(v))
        return ML_OK;
    if (!cJSON_IsString(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a string, got %s", key,
                       ml_json_type_name(v));
    for (int i = 0; i < N_OF(names); i++) {
        if (!strcmp(v->valuestring, names[i].torch)) {
            *out = names[i].dtype;
            return ML_OK;
        }
    }
    return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                   "%s: \"%.64s\" is not supported (bfloat16, float16 or float32)", key,
                   v->valuestring);
}

/* Trailing bytes after the JSON value may only be whitespace. */
static int only_space(const char *p, const char *end)
{
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return 0;
    return 1;
}

ml_status ml_config_parse(ml_config *cfg, const char *json, size_t len, char *err, size_t errlen)
{
    if (!json && len)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "config: NULL buffer");
    const char *end = NULL;
    cJSON *root = len ? cJSON_ParseWithLengthOpts(json, len, &end, 0) : NULL;
    if (!root) /* on failure cJSON points end at the error */
        return ml_fail(err, errlen, ML_ERR_FORMAT, "config: invalid JSON near byte %zu",
                       end ? (size_t)(end - json) : 0);
    jctx c = {err, errlen, ""};
    ml_config tmp;
    memset(&tmp, 0, sizeof tmp);
    ml_status st = ML_OK;
    const cJSON *vision, *text;
    if (!only_space(end, json + len))
        st = ml_fail(err, errlen, ML_ERR_FORMAT,
                     "config: trailing bytes after the JSON value at "
                     "byte %zu",
                     (size_t)(end - json));
    else if (!cJSON_IsObject(root))
        st = ml_fail(err, errlen, ML_ERR_FORMAT, "config: expected a JSON object, got %s",
                     ml_json_type_name(root));
    if (st == ML_OK &&
        !((st = expect_string(&c, root, "model_type", "mllama")) ||
          (st = get_int(&c, root, "image_token_index", 128256, 0, MAX_TOKEN_ID,
                        &tmp.image_token_index)) ||
          (st = parse_dtype(&c, root, &tmp.dtype)) ||
          (st = get_object(&c, root, "vision_config", &vision)) ||
          (st = get_object(&c, root, "text_config", &text)) ||
          (st = parse_vision(&c, vision, &tmp.vision)) || (st = parse_text(&c, text, &tmp.text)) ||
          (st = ml_quant_config_parse(&tmp.quant, ml_json_member(root, "quantization_config"), err,
                                      errlen))))
        *cfg = tmp;
    cJSON_Delete(root);
    return st;
}

ml_status ml_config_load(ml_config *cfg, const char *path, char *err, size_t errlen)
{
    ml_mapped_file mf;
    ml_status st = ml_mapped_file_init(&mf, path, ML_CONFIG_MAX_FILE_BYTES, err, errlen);
    if (st != ML_OK)
        return st;
    char detail[256];
    st = ml_config_parse(cfg, (const char *)mf.data, mf.size, detail, sizeof detail);
    ml_mapped_file_deinit(&mf);
    if (st != ML_OK)
        ml_fail(err, errlen, st, "%s: %s", path, detail);
    return st;
}

/* ---- derived quantities ------------------------------------------------ */

int ml_config_n_self_layers(const ml_config *cfg)
{
    return cfg->text.num_hidden_layers - cfg->text.n_cross_layers;
}

int ml_config_cross_index(const ml_config *cfg, int layer)
{
    for (int i = 0; i < cfg->text.n_cross_layers; i++)
        if (cfg->text.cross_attention_layers[i] == layer)
            return i;
    return -1;
}

int ml_config_num_patches(const ml_config *cfg)
{
    int side = cfg->vision.image_size / cfg->vision.patch_size;
    return side * side + 1;
}

/* Vision sequences are padded to a multiple of this (MllamaVisionModel). */
#define VISION_SEQ_ALIGN 8

int ml_config_num_patches_padded(const ml_config *cfg)
{
    int n = ml_config_num_patches(cfg);
    return (n + VISION_SEQ_ALIGN - 1) / VISION_SEQ_ALIGN * VISION_SEQ_ALIGN;
}

int ml_config_n_aspect_ratio_ids(const ml_config *cfg)
{
    return cfg->vision.n_aspect_ratios + 1;
}

void ml_config_rope_inv_freq(const ml_config *cfg, float *out)
{
    const ml_text_config *t = &cfg->text;
    const ml_rope_scaling *rs = &t->rope_scaling;
    int half = t->head_dim / 2;
    /* Every step in float32, in transformers' order of operations; the
     * python-float operands are rounded to float32 as torch does when they
     * meet a float32 tensor. */
    const float base = (float)t->rope_theta;
    const float two_pi = (float)(2.0 * M_PI);
    for (int i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)t->head_dim;
        float inv = 1.0f / powf(base, exponent);
        if (rs->type == ML_ROPE_LLAMA3) {
            const float old_ctx = (float)rs->original_max_position_embeddings;
            const float low_wavelen =
                (float)((double)rs->original_max_position_embeddings / rs->low_freq_factor);
            const float high_wavelen =
                (float)((double)rs->original_max_position_embeddings / rs->high_freq_factor);
            float wavelen = two_pi / inv;
            if (wavelen > low_wavelen) {
                inv = inv / rs->factor;
            } else if (!(wavelen < high_wavelen)) {
                float smooth = (old_ctx / wavelen - rs->low_freq_factor) /
                               (rs->high_freq_factor - rs->low_freq_factor);
                inv = (1.0f - smooth) * inv / rs->factor + smooth * inv;
            }
        }
        out[i] = inv;
    }
}
