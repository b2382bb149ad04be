/* config.json's quantization_config (config.h, ml_quant_config): the
 * compressed-tensors schema as its QuantizationConfig serialises it
 * (quant_method, format, quantization_status, config_groups of
 * {targets, weights, input_activations, output_activations}, ignore,
 * kv_cache_scheme, sparsity_config), and its ignore matching
 * (compressed_tensors.utils.match: a name equal to the entry, or "re:"
 * and re.match). Every field that changes what a weight means is checked;
 * the informational ones (observer, global_compression_ratio, version) are
 * not read. */
#include "checkpoint/quant_config.h"

#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint/json_util.h"
#include "checkpoint/pyregex.h"

#define QUANT_METHOD "compressed-tensors"
#define FORMAT_FLOAT "float-quantized"
#define STATUS_COMPRESSED "compressed"
#define TARGET_LINEAR "Linear"
#define TYPE_FLOAT "float"
#define STRATEGY_CHANNEL "channel"
#define STRATEGY_TOKEN "token"
#define REGEX_PREFIX "re:"
#define FP8_BITS 8
#define PATH_LEN 256

typedef struct qctx {
    char *err;
    size_t errlen;
} qctx;

static int is_unset(const cJSON *v)
{
    return !v || cJSON_IsNull(v);
}

/* obj.key must be a string equal to want; required when `required`, else
 * absent and null pass. ML_ERR_FORMAT for another type, ML_ERR_UNSUPPORTED
 * for another value, naming path.key and what is supported. */
static ml_status want_string(const qctx *c, const cJSON *obj, const char *path, const char *key,
                             const char *want, int required)
{
    const cJSON *v = ml_json_member(obj, key);
    if (is_unset(v)) {
        if (!required)
            return ML_OK;
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s.%s: required (\"%s\")", path, key,
                       want);
    }
    if (!cJSON_IsString(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s.%s: expected a string, got %s", path,
                       key, ml_json_type_name(v));
    if (strcmp(v->valuestring, want))
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "%s.%s: \"%.64s\" is not supported (only \"%s\")", path, key,
                       v->valuestring, want);
    return ML_OK;
}

/* obj.key must be absent, null, false or (when empty_ok) an empty object or
 * list: a feature this build does not implement. */
static ml_status want_unset(const qctx *c, const cJSON *obj, const char *path, const char *key,
                            int empty_ok)
{
    const cJSON *v = ml_json_member(obj, key);
    if (is_unset(v) || cJSON_IsFalse(v) ||
        (empty_ok && (cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child))
        return ML_OK;
    return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED, "%s.%s: is not supported (only null)",
                   path, key);
}

/* obj.key a boolean equal to want; absent means `def`. */
static ml_status want_bool(const qctx *c, const cJSON *obj, const char *path, const char *key,
                           int want, int def, const char *why)
{
    const cJSON *v = ml_json_member(obj, key);
    int got = def;
    if (!is_unset(v)) {
        if (!cJSON_IsBool(v))
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s.%s: expected a boolean, got %s",
                           path, key, ml_json_type_name(v));
        got = cJSON_IsTrue(v);
    }
    if (got != want)
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED, "%s.%s: %s is not supported (%s)",
                       path, key, got ? "true" : "false", why);
    return ML_OK;
}

/* A QuantizationArgs object: FP8 (type float, 8 bits), symmetric, the given
 * strategy and dynamic flag, no groups or blocks. */
static ml_status check_args(const qctx *c, const cJSON *a, const char *path, const char *strategy,
                            int dynamic)
{
    if (!cJSON_IsObject(a))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected an object, got %s", path,
                       ml_json_type_name(a));
    const cJSON *bits = ml_json_member(a, "num_bits");
    if (!cJSON_IsNumber(bits))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s.num_bits: expected an integer, got %s",
                       path, ml_json_type_name(bits));
    if (bits->valuedouble != FP8_BITS)
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "%s.num_bits: %.17g is not supported (only 8)", path, bits->valuedouble);
    ml_status rc;
    if ((rc = want_string(c, a, path, "type", TYPE_FLOAT, 1)) ||
        (rc = want_string(c, a, path, "strategy", strategy, 1)) ||
        (rc = want_bool(c, a, path, "symmetric", 1, 1, "only symmetric scales")) ||
        (rc = want_bool(c, a, path, "dynamic", dynamic, 0,
                        dynamic ? "activation scales are computed per token at run time"
                                : "weight scales are stored")) ||
        (rc = want_unset(c, a, path, "group_size", 0)) ||
        (rc = want_unset(c, a, path, "block_structure", 0)) ||
        (rc = want_unset(c, a, path, "actorder", 0)))
        return rc;
    return ML_OK;
}

/* The one scheme group: targets ["Linear"], FP8 channel weights, FP8
 * per-token dynamic inputs or none, no output quantization. */
static ml_status parse_group(const qctx *c, const cJSON *g, const char *path, ml_quant_config *q)
{
    if (!cJSON_IsObject(g))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected an object, got %s", path,
                       ml_json_type_name(g));
    const cJSON *targets = ml_json_member(g, "targets");
    if (!cJSON_IsArray(targets) || cJSON_GetArraySize(targets) != 1 ||
        !cJSON_IsString(targets->child) || strcmp(targets->child->valuestring, TARGET_LINEAR))
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED,
                       "%s.targets: only [\"" TARGET_LINEAR "\"] is supported", path);
    char sub[PATH_LEN + 32]; /* path and ".input_activations" */
    snprintf(sub, sizeof sub, "%s.weights", path);
    const cJSON *w = ml_json_member(g, "weights");
    if (is_unset(w))
        return ml_fail(c->err, c->errlen, ML_ERR_UNSUPPORTED, "%s: weights are not quantized",
                       sub);
    ml_status rc = check_args(c, w, sub, STRATEGY_CHANNEL, 0);
    if (rc != ML_OK)
        return rc;
    const cJSON *in = ml_json_member(g, "input_activations");
    snprintf(sub, sizeof sub, "%s.input_activations", path);
    if (!is_unset(in) && (rc = check_args(c, in, sub, STRATEGY_TOKEN, 1)))
        return rc;
    if ((rc = want_unset(c, g, path, "output_activations", 0)) ||
        (rc = want_string(c, g, path, "format", FORMAT_FLOAT, 0)))
        return rc;
    q->act_dynamic_token = !is_unset(in);
    return ML_OK;
}

static ml_status parse_ignore(const qctx *c, const cJSON *v, ml_quant_config *q)
{
    if (is_unset(v))
        return ML_OK;
    if (!cJSON_IsArray(v))
        return ml_fail(c->err, c->errlen, ML_ERR_FORMAT,
                       "quantization_config.ignore: expected a list of strings, got %s",
                       ml_json_type_name(v));
    size_t used = 0;
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        char path[PATH_LEN];
        snprintf(path, sizeof path, "quantization_config.ignore[%d]", i);
        if (!cJSON_IsString(e))
            return ml_fail(c->err, c->errlen, ML_ERR_FORMAT, "%s: expected a string, got %s",
                           path, ml_json_type_name(e));
        const size_t len = strlen(e->valuestring) + 1;
        if (i >= ML_QUANT_MAX_IGNORE || used + len > sizeof q->ignore)
            return ml_fail(c->err, c->errlen, ML_ERR_TOO_LARGE,
                           "quantization_config.ignore: more than %d entries or %u bytes",
                           ML_QUANT_MAX_IGNORE, ML_QUANT_IGNORE_BYTES);
        if (!strncmp(e->valuestring, REGEX_PREFIX, strlen(REGEX_PREFIX))) {
            regex_t re;
            ml_status rc = ml_pyregex_compile(&re, e->valuestring + strlen(REGEX_PREFIX),
                                              ML_PYREGEX_MATCH, path, c->err, c->errlen);
            if (rc != ML_OK)
                return rc;
            regfree(&re);
        }
        memcpy(q->ignore + used, e->valuestring, len);
        used += len;
    }
    q->n_ignore = i;
    return ML_OK;
}

ml_status ml_quant_config_parse(ml_quant_config *q, const cJSON *v, char *err, size_t errlen)
{
    const qctx c = {err, errlen};
    const char *path = "quantization_config";
    memset(q, 0, sizeof *q);
    if (is_unset(v))
        return ML_OK;
    if (!cJSON_IsObject(v))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: expected an object, got %s", path,
                       ml_json_type_name(v));
    ml_status rc;
    if ((rc = want_string(&c, v, path, "quant_method", QUANT_METHOD, 1)) ||
        (rc = want_string(&c, v, path, "format", FORMAT_FLOAT, 1)) ||
        (rc = want_string(&c, v, path, "quantization_status", STATUS_COMPRESSED, 0)) ||
        (rc = want_unset(&c, v, path, "kv_cache_scheme", 0)) ||
        (rc = want_unset(&c, v, path, "sparsity_config", 1)) ||
        (rc = want_unset(&c, v, path, "transform_config", 1)))
        return rc;
    const cJSON *groups = ml_json_member(v, "config_groups");
    if (!cJSON_IsObject(groups) || !groups->child)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s.config_groups: expected a non-empty object",
                       path);
    if (groups->child->next)
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                       "%s.config_groups: %d groups, only one scheme is supported", path,
                       cJSON_GetArraySize(groups));
    char gpath[PATH_LEN];
    snprintf(gpath, sizeof gpath, "%s.config_groups.%.64s", path, groups->child->string);
    if ((rc = parse_group(&c, groups->child, gpath, q)) ||
        (rc = parse_ignore(&c, ml_json_member(v, "ignore"), q)))
        return rc;
    q->scheme = ML_QUANT_FP8_CHANNEL;
    return ML_OK;
}

void ml_quant_config_fp8_at_load(ml_quant_config *q)
{
    static const char *const ignore[] = {
        "re:.*lm_head",           "re:multi_modal_projector.*",       "re:vision_model.*",
        "re:model\\.vision_model.*", "re:model\\.multi_modal_projector.*",
    };
    memset(q, 0, sizeof *q);
    q->scheme = ML_QUANT_FP8_CHANNEL;
    q->at_load = 1;
    size_t used = 0;
    for (size_t i = 0; i < sizeof ignore / sizeof ignore[0]; i++) {
        const size_t len = strlen(ignore[i]) + 1;
        memcpy(q->ignore + used, ignore[i], len);
        used += len;
    }
    q->n_ignore = (int)(sizeof ignore / sizeof ignore[0]);
}

ml_status ml_quant_config_ignores(const ml_quant_config *q, const char *module, int *ignored,
                                  char *err, size_t errlen)
{
    *ignored = 0;
    const char *e = q->ignore;
    for (int i = 0; i < q->n_ignore; i++, e += strlen(e) + 1) {
        if (strncmp(e, REGEX_PREFIX, strlen(REGEX_PREFIX))) {
            if (!strcmp(e, module)) {
                *ignored = 1;
                return ML_OK;
            }
            continue;
        }
        char path[PATH_LEN];
        snprintf(path, sizeof path, "quantization_config.ignore[%d]", i);
        regex_t re;
        ml_status rc = ml_pyregex_compile(&re, e + strlen(REGEX_PREFIX), ML_PYREGEX_MATCH, path,
                                          err, errlen);
        if (rc != ML_OK)
            return rc;
        *ignored = regexec(&re, module, 0, NULL, 0) == 0;
        regfree(&re);
        if (*ignored)
            return ML_OK;
    }
    return ML_OK;
}
