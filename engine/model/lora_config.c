/* adapter_config.json of a PEFT LoRA adapter (lora.h): parsing, the checks
 * that refuse what this engine cannot serve exactly, and PEFT's module
 * matching (peft 0.13 tuners_utils.check_target_module_exists). */
#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "checkpoint/json_util.h"
#include "checkpoint/pyregex.h"
#include "model/lora.h"

/* PEFT's defaults (LoraConfig) for absent fields. */
#define DEFAULT_RANK 8
#define DEFAULT_ALPHA 8.0
/* target_modules shorthand for every Linear but the output layer. */
#define ALL_LINEAR "all-linear"
#define LM_HEAD "lm_head"

typedef enum match_kind {
    MATCH_NONE,       /* matches nothing (no exclude_modules) */
    MATCH_LIST,       /* names or dotted suffixes */
    MATCH_REGEX,      /* re.fullmatch */
    MATCH_ALL_LINEAR, /* every Linear but lm_head */
} match_kind;

typedef struct matcher {
    match_kind kind;
    char **names; /* owned (n), MATCH_LIST */
    int n;
    regex_t re;   /* MATCH_REGEX */
} matcher;

struct ml_lora_config {
    int r;
    double alpha;
    int rslora;
    float scale;
    matcher target, exclude;
};

/* ---- JSON access ------------------------------------------------------- */

/* Absent, or a value PEFT writes for a feature that is off: null, false,
 * "", [] or {}. */
static int is_unset(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 1;
    if (cJSON_IsString(v))
        return v->valuestring[0] == '\0';
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return v->child == NULL;
    return 0;
}

/* ---- matching ---------------------------------------------------------- */

static void matcher_deinit(matcher *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->names[i]);
    free(m->names);
    if (m->kind == MATCH_REGEX)
        regfree(&m->re);
    memset(m, 0, sizeof *m);
}

/* name ends with "." + suffix, or equals it. */
static int name_matches(const char *name, const char *entry)
{
    size_t n = strlen(name), e = strlen(entry);
    if (n == e)
        return !strcmp(name, entry);
    return n > e && name[n - e - 1] == '.' && !strcmp(name + n - e, entry);
}

static int matcher_test(const matcher *m, const char *name)
{
    switch (m->kind) {
    case MATCH_NONE: return 0;
    case MATCH_LIST:
        for (int i = 0; i < m->n; i++)
            if (name_matches(name, m->names[i]))
                return 1;
        return 0;
    case MATCH_REGEX: return regexec(&m->re, name, 0, NULL, 0) == 0;
    case MATCH_ALL_LINEAR: return !name_matches(name, LM_HEAD);
    }
    return 0;
}

static ml_status matcher_regex(matcher *m, const char *pat, const char *field, char *err,
                               size_t errlen)
{
    size_t len = strlen(pat);
    if (len > ML_LORA_PATTERN_MAX)
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%s: expression of %zu bytes, limit %d",
                       field, len, ML_LORA_PATTERN_MAX);
    ml_status rc = ml_pyregex_compile(&m->re, pat, ML_PYREGEX_FULLMATCH, field, err, errlen);
    if (rc == ML_OK)
        m->kind = MATCH_REGEX;
    return rc;
}

static ml_status matcher_list(matcher *m, const cJSON *v, const char *field, char *err,
                              size_t errlen)
{
    int n = cJSON_GetArraySize(v);
    if (n > ML_LORA_MAX_PATTERNS)
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%s: %d entries, limit %d", field, n,
                       ML_LORA_MAX_PATTERNS);
    m->kind = MATCH_LIST;
    m->names = calloc((size_t)n + 1, sizeof *m->names);
    if (!m->names)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", field);
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s[%d]: expected a string, got %s",
                           field, i, ml_json_type_name(e));
        size_t len = strlen(e->valuestring);
        if (len == 0 || len > ML_LORA_PATTERN_MAX)
            return ml_fail(err, errlen, len ? ML_ERR_TOO_LARGE : ML_ERR_FORMAT,
                           "%s[%d]: name of %zu bytes (1 .. %d)", field, i, len,
                           ML_LORA_PATTERN_MAX);
        m->names[i] = strdup(e->valuestring);
        if (!m->names[i])
            return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", field);
        m->n = i + 1;
    }
    return ML_OK;
}

/* target_modules (required, all-linear allowed) or exclude_modules. */
static ml_status parse_matcher(matcher *m, const cJSON *root, const char *field, int required,
                               char *err, size_t errlen)
{
    const cJSON *v = ml_json_member(root, field);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: required", field);
        return ML_OK;
    }
    if (cJSON_IsString(v)) {
        if (required && !strcasecmp(v->valuestring, ALL_LINEAR)) {
            m->kind = MATCH_ALL_LINEAR;
            return ML_OK;
        }
        return matcher_regex(m, v->valuestring, field, err, errlen);
    }
    if (!cJSON_IsArray(v))
        return ml_fail(err, errlen, ML_ERR_FORMAT,
                       "%s: expected a list of names or a regular expression, got %s", field,
                       ml_json_type_name(v));
    if (!v->child && required)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: empty", field);
    return matcher_list(m, v, field, err, errlen);
}

/* ---- fields ------------------------------------------------------------ */

/* Features that change the forward or the weights in ways this engine does
 * not reproduce; each must be unset. */
static const char *const must_be_unset[] = {
    "use_dora",       "lora_bias",          "fan_in_fan_out",          "modules_to_save",
    "rank_pattern",   "alpha_pattern",      "layers_to_transform",     "layer_replication",
    "megatron_config", "target_parameters", "trainable_token_indices", "use_qalora",
    "alora_invocation_tokens", "arrow_config",
};

/* init_lora_weights values whose adapters expect modified base weights
 * (PiSSA, OLoRA, LoftQ, CorDA rewrite W at init), as prefixes. */
static const char *const base_rewriting_inits[] = {"pissa", "olora", "loftq", "corda"};

static ml_status check_features(const cJSON *root, char *err, size_t errlen)
{
    const cJSON *v = ml_json_member(root, "peft_type");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !strcmp(v->valuestring, "LORA")))
        return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "peft_type %.64s: only LORA is served",
                       cJSON_IsString(v) ? v->valuestring : ml_json_type_name(v));
    for (size_t i = 0; i < sizeof must_be_unset / sizeof must_be_unset[0]; i++)
        if (!is_unset(ml_json_member(root, must_be_unset[i])))
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED, "%s is set: not supported",
                           must_be_unset[i]);
    v = ml_json_member(root, "bias");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "bias: expected a string, got %s",
                           ml_json_type_name(v));
        if (strcmp(v->valuestring, "none"))
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "bias \"%.32s\": only \"none\" is supported", v->valuestring);
    }
    v = ml_json_member(root, "init_lora_weights");
    if (v && cJSON_IsString(v)) {
        for (size_t i = 0; i < sizeof base_rewriting_inits / sizeof base_rewriting_inits[0]; i++)
            if (!strncasecmp(v->valuestring, base_rewriting_inits[i],
                             strlen(base_rewriting_inits[i])))
                return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                               "init_lora_weights \"%.32s\": the adapter expects modified base "
                               "weights; convert it to a plain LoRA first",
                               v->valuestring);
    } else if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) {
        return ml_fail(err, errlen, ML_ERR_FORMAT,
                       "init_lora_weights: expected a boolean or a string, got %s", ml_json_type_name(v));
    }
    return ML_OK;
}

static ml_status parse_numbers(ml_lora_config *c, const cJSON *root, char *err, size_t errlen)
{
    c->r = DEFAULT_RANK;
    c->alpha = DEFAULT_ALPHA;
    const cJSON *v = ml_json_member(root, "r");
    if (v) {
        if (!cJSON_IsNumber(v))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "r: expected an integer, got %s",
                           ml_json_type_name(v));
        double d = v->valuedouble;
        if (!isfinite(d) || floor(d) != d || d < 1 || d > ML_LORA_MAX_RANK)
            return ml_fail(err, errlen, ML_ERR_FORMAT, "r: %.17g is not an integer in [1, %d]",
                           d, ML_LORA_MAX_RANK);
        c->r = (int)d;
    }
    v = ml_json_member(root, "lora_alpha");
    if (v) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "lora_alpha: expected a number, got %s",
                           ml_json_type_name(v));
        c->alpha = v->valuedouble;
    }
    v = ml_json_member(root, "use_rslora");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v))
            return ml_fail(err, errlen, ML_ERR_FORMAT, "use_rslora: expected a boolean, got %s",
                           ml_json_type_name(v));
        c->rslora = cJSON_IsTrue(v);
    }
    /* LoraLayer.update_layer: Python floats, applied to f32 activations. */
    double scale = c->rslora ? c->alpha / sqrt((double)c->r) : c->alpha / c->r;
    if (!isfinite((float)scale))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "lora_alpha %g: scale out of range", c->alpha);
    c->scale = (float)scale;
    return ML_OK;
}

/* ---- public ------------------------------------------------------------ */

ml_status ml_lora_config_parse(ml_lora_config **out, const char *json, size_t len, char *err,
                               size_t errlen)
{
    *out = NULL;
    if (len > ML_LORA_CONFIG_MAX_BYTES)
        return ml_fail(err, errlen, ML_ERR_TOO_LARGE, "%zu bytes, limit %u", len,
                       ML_LORA_CONFIG_MAX_BYTES);
    cJSON *root = len ? cJSON_ParseWithLength(json, len) : NULL;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ml_fail(err, errlen, ML_ERR_FORMAT, "not a JSON object");
    }
    ml_lora_config *c = calloc(1, sizeof *c);
    ml_status rc = c ? ML_OK : ml_fail(err, errlen, ML_ERR_NOMEM, "out of memory");
    if (rc == ML_OK)
        rc = check_features(root, err, errlen);
    if (rc == ML_OK)
        rc = parse_numbers(c, root, err, errlen);
    if (rc == ML_OK)
        rc = parse_matcher(&c->target, root, "target_modules", 1, err, errlen);
    if (rc == ML_OK)
        rc = parse_matcher(&c->exclude, root, "exclude_modules", 0, err, errlen);
    cJSON_Delete(root);
    if (rc != ML_OK) {
        ml_lora_config_destroy(c);
        return rc;
    }
    *out = c;
    return ML_OK;
}

void ml_lora_config_destroy(ml_lora_config *c)
{
    if (!c)
        return;
    matcher_deinit(&c->target);
    matcher_deinit(&c->exclude);
    free(c);
}

int ml_lora_config_rank(const ml_lora_config *c) { return c->r; }
float ml_lora_config_scale(const ml_lora_config *c) { return c->scale; }

int ml_lora_config_targets(const ml_lora_config *c, const char *name)
{
    return matcher_test(&c->target, name) && !matcher_test(&c->exclude, name);
}
