/* The generation options of a request record: sampling, limits, stop
 * strings, response format, the template's date and adapter, each type- and
 * range-checked with an error naming the field. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "protocol/request_internal.h"

/* ---- Generation options ------------------------------------------------- */

static svc_error add_stop(parser *p, const cJSON *s, size_t i, const char **slot)
{
    if (!cJSON_IsString(s))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop[%zu]: expected a string", i);
    size_t len = strlen(s->valuestring);
    if (len == 0 || len > p->lim->max_stop_bytes || !svc_utf8_valid(s->valuestring, len, NULL))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop[%zu]: expected 1..%zu bytes of UTF-8", i,
                    p->lim->max_stop_bytes);
    *slot = svc_arena_strndup(&p->r->arena, s->valuestring, len);
    return *slot ? SVC_ERROR_NONE : out_of_memory(p);
}

static svc_error parse_stop(parser *p, const cJSON *root)
{
    const cJSON *stop = member(root, "stop");
    if (!stop)
        return SVC_ERROR_NONE;
    size_t n;
    if (cJSON_IsString(stop))
        n = 1;
    else if (cJSON_IsArray(stop))
        n = (size_t)cJSON_GetArraySize(stop);
    else
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop: expected a string or an array of strings");
    if (n > p->lim->max_stop)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop: at most %zu stop strings",
                    p->lim->max_stop);
    if (n == 0)
        return SVC_ERROR_NONE;
    const char **list = svc_arena_alloc(&p->r->arena, n * sizeof *list);
    if (!list)
        return out_of_memory(p);
    p->r->pub.stop = list;
    p->r->pub.n_stop = n;
    if (cJSON_IsString(stop))
        return add_stop(p, stop, 0, &list[0]);
    size_t i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, stop)
    {
        svc_error e = add_stop(p, s, i, &list[i]);
        if (e)
            return e;
        i++;
    }
    return SVC_ERROR_NONE;
}

static svc_error parse_adapter(parser *p, const cJSON *root)
{
    const cJSON *a = member(root, "adapter");
    if (!a)
        return SVC_ERROR_NONE;
    if (!cJSON_IsString(a) || !svc_valid_adapter_name(a->valuestring, strlen(a->valuestring)))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "adapter: expected a name of 1..%d characters [A-Za-z0-9._-], not starting "
                    "with '.'", SVC_ADAPTER_NAME_MAX);
    p->r->pub.adapter = svc_arena_strndup(&p->r->arena, a->valuestring, strlen(a->valuestring));
    return p->r->pub.adapter ? SVC_ERROR_NONE : out_of_memory(p);
}

/* date_string: the chat template's "Today Date", pinned by the client (a
 * reproducible prompt); it is encoded as text, as message text is. */
static svc_error parse_date_string(parser *p, const cJSON *root)
{
    const cJSON *d = member(root, "date_string");
    if (!d)
        return SVC_ERROR_NONE;
    if (!cJSON_IsString(d) || !svc_valid_date_string(d->valuestring, strlen(d->valuestring)))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "date_string: expected 1..%d bytes of UTF-8 without control characters, "
                    "e.g. \"26 Jul 2024\"", SVC_DATE_STRING_MAX);
    p->r->pub.date_string = svc_arena_strndup(&p->r->arena, d->valuestring,
                                              strlen(d->valuestring));
    return p->r->pub.date_string ? SVC_ERROR_NONE : out_of_memory(p);
}

/* Sampling ranges (OpenAI's where it has one). */
#define TEMPERATURE_MAX 2.0
#define PENALTY_ABS_MAX 2.0
#define REPETITION_PENALTY_MAX 10.0

svc_error svc_request_keep_schema(parser *p, const cJSON *schema, const char *field,
                                  const char **text, size_t *text_len)
{
    size_t max = p->lim->max_schema_bytes;
    /* cJSON_PrintPreallocated may need a few bytes past the text it fits
     * (cJSON.h), and the NUL. */
    enum { PRINT_SLACK = 5 };
    char *buf = malloc(max + PRINT_SLACK);
    if (!buf)
        return out_of_memory(p);
    bool fits = cJSON_PrintPreallocated((cJSON *)schema, buf, (int)(max + PRINT_SLACK), false);
    size_t len = fits ? strlen(buf) : 0;
    svc_error e = SVC_ERROR_NONE;
    if (!fits || len > max)
        e = fail(p, SVC_ERROR_INVALID_REQUEST,
                 "%s: its compact JSON text is over the limit of %zu bytes "
                 "(limits.max_schema_bytes)", field, max);
    else if (!(*text = svc_arena_strndup(&p->r->arena, buf, len)))
        e = out_of_memory(p);
    else
        *text_len = len;
    free(buf);
    return e;
}

/* response_format.json_schema, as OpenAI defines it: the shape is checked
 * here and the schema kept as text; whether it can be enforced is the
 * compiler's to say (the worker's prep threads). */
static svc_error parse_json_schema(parser *p, const cJSON *format)
{
    const cJSON *js = member(format, "json_schema");
    if (!cJSON_IsObject(js))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "response_format.json_schema: expected an object with \"name\" and "
                    "\"schema\"");
    const cJSON *name = member(js, "name");
    if (!cJSON_IsString(name) || !svc_valid_openai_name(name->valuestring, strlen(name->valuestring)))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "response_format.json_schema.name: expected 1..%d characters [A-Za-z0-9_-]",
                    SVC_OPENAI_NAME_MAX);
    const cJSON *description = member(js, "description");
    if (description && !cJSON_IsString(description))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "response_format.json_schema.description: expected a string");
    const cJSON *strict = member(js, "strict");
    if (strict && !cJSON_IsBool(strict))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "response_format.json_schema.strict: expected true or false");
    const cJSON *schema = member(js, "schema");
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "response_format.json_schema.schema: expected a JSON Schema (an object or a "
                    "boolean)");
    svc_request *req = &p->r->pub;
    req->json_schema_strict = cJSON_IsTrue(strict);
    req->json_schema_name = svc_arena_strndup(&p->r->arena, name->valuestring,
                                              strlen(name->valuestring));
    return req->json_schema_name
               ? svc_request_keep_schema(p, schema, "response_format.json_schema.schema",
                                         &req->json_schema, &req->json_schema_len)
               : out_of_memory(p);
}

/* response_format: text (the default), json_object (JSON mode) or
 * json_schema. */
static svc_error parse_response_format(parser *p, const cJSON *root)
{
    const cJSON *format = member(root, "response_format");
    const cJSON *type = cJSON_IsObject(format) ? member(format, "type") : NULL;
    if (!format || (cJSON_IsString(type) && !strcmp(type->valuestring, "text")))
        return SVC_ERROR_NONE;
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "json_object")) {
        p->r->pub.json_object = true;
        return SVC_ERROR_NONE;
    }
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "json_schema"))
        return parse_json_schema(p, format);
    return fail(p, SVC_ERROR_INVALID_REQUEST,
                "response_format: expected {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                "or {\"type\": \"json_schema\", \"json_schema\": {...}}");
}

/* A logit_bias key: a token id in decimal digits (OpenAI sends the ids as
 * JSON object keys). Ids past *id's range saturate at UINT64_MAX, which no
 * vocabulary reaches. Returns false when the key is not digits. */
static bool bias_key_id(const char *key, uint64_t *id)
{
    if (!key || !*key)
        return false;
    uint64_t v = 0;
    for (const char *c = key; *c; c++) {
        if (*c < '0' || *c > '9')
            return false;
        unsigned digit = (unsigned)(*c - '0');
        v = v > (UINT64_MAX - digit) / 10 ? UINT64_MAX : v * 10 + digit;
    }
    *id = v;
    return true;
}

/* logit_bias, as OpenAI defines it: {"<token id>": bias, ...}, at most
 * SVC_LOGIT_BIAS_MAX entries, each bias in [-SVC_LOGIT_BIAS_ABS_MAX,
 * SVC_LOGIT_BIAS_ABS_MAX], each id once and below lim->logit_vocab (the
 * output vocabulary; <|image|> has no logit) when the worker set it. */
static svc_error parse_logit_bias(parser *p, const cJSON *root)
{
    const cJSON *bias = member(root, "logit_bias");
    if (!bias)
        return SVC_ERROR_NONE;
    if (!cJSON_IsObject(bias))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "logit_bias: expected an object mapping token ids to numbers in [-%g, %g]",
                    SVC_LOGIT_BIAS_ABS_MAX, SVC_LOGIT_BIAS_ABS_MAX);
    size_t n = (size_t)cJSON_GetArraySize(bias);
    if (n > SVC_LOGIT_BIAS_MAX)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "logit_bias: %zu entries, at most %d", n,
                    SVC_LOGIT_BIAS_MAX);
    if (n == 0)
        return SVC_ERROR_NONE;
    svc_logit_bias *list = svc_arena_alloc(&p->r->arena, n * sizeof *list);
    if (!list)
        return out_of_memory(p);
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, bias)
    {
        uint64_t id;
        if (!bias_key_id(e->string, &id))
            return fail(p, SVC_ERROR_INVALID_REQUEST,
                        "logit_bias: key \"%.32s\" is not a token id (a non-negative integer "
                        "in decimal)", e->string ? e->string : "");
        size_t vocab = p->lim->logit_vocab;
        if (id > INT32_MAX || (vocab && id >= vocab))
            return fail(p, SVC_ERROR_INVALID_REQUEST,
                        "logit_bias: token id %.32s is outside the model's output vocabulary "
                        "[0, %zu) (<|image|> and ids past it have no logit)", e->string,
                        vocab ? vocab : (size_t)INT32_MAX);
        double v = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(fabs(v) <= SVC_LOGIT_BIAS_ABS_MAX))
            return fail(p, SVC_ERROR_INVALID_REQUEST,
                        "logit_bias[\"%.32s\"]: expected a number in [-%g, %g]", e->string,
                        SVC_LOGIT_BIAS_ABS_MAX, SVC_LOGIT_BIAS_ABS_MAX);
        for (size_t j = 0; j < i; j++)
            if (list[j].id == (int32_t)id)
                return fail(p, SVC_ERROR_INVALID_REQUEST,
                            "logit_bias: token id %lld is given twice", (long long)id);
        list[i++] = (svc_logit_bias){(int32_t)id, (float)v};
    }
    p->r->pub.sampling.logit_bias = list;
    p->r->pub.sampling.n_logit_bias = n;
    return SVC_ERROR_NONE;
}

svc_error svc_request_parse_options(parser *p, const cJSON *root)
{
    svc_request *req = &p->r->pub;
    svc_sampling *s = &req->sampling;
    const svc_limits *lim = p->lim;
    svc_error e;

    int64_t v = lim->max_tokens_default;
    bool has_max_tokens, has_alias;
    int64_t alias = 0;
    if ((e = opt_int(p, root, "max_tokens", 1, lim->max_tokens_limit, &v, &has_max_tokens)) ||
        (e = opt_int(p, root, "max_completion_tokens", 1, lim->max_tokens_limit, &alias,
                     &has_alias)))
        return e;
    if (has_max_tokens && has_alias)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "max_tokens: give either max_tokens or max_completion_tokens, not both");
    req->max_tokens = (uint32_t)(has_alias ? alias : v);

    int64_t n = 1;
    if ((e = opt_int(p, root, "n", 1, lim->max_n, &n, NULL)))
        return e;
    req->n = (uint32_t)n;

    if ((e = opt_number(p, root, "temperature", (bound){0, false},
                        (bound){TEMPERATURE_MAX, false}, &s->temperature)) ||
        (e = opt_number(p, root, "top_p", (bound){0, true}, (bound){1, false}, &s->top_p)) ||
        (e = opt_number(p, root, "min_p", (bound){0, false}, (bound){1, true}, &s->min_p)) ||
        (e = opt_number(p, root, "repetition_penalty", (bound){0, true},
                        (bound){REPETITION_PENALTY_MAX, false}, &s->repetition_penalty)) ||
        (e = opt_number(p, root, "presence_penalty", (bound){-PENALTY_ABS_MAX, false},
                        (bound){PENALTY_ABS_MAX, false}, &s->presence_penalty)) ||
        (e = opt_number(p, root, "frequency_penalty", (bound){-PENALTY_ABS_MAX, false},
                        (bound){PENALTY_ABS_MAX, false}, &s->frequency_penalty)))
        return e;

    int64_t top_k = 0;
    if ((e = opt_int(p, root, "top_k", 0, INT32_MAX, &top_k, NULL)))
        return e;
    s->top_k = (int32_t)top_k;
    if ((e = opt_int(p, root, "seed", -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, &s->seed,
                     &s->has_seed)))
        return e;
    /* Choice i samples with seed s + i (protocol.h): every one must stay
     * exact, as the parser holds a seed to. */
    if (s->has_seed && s->seed > (int64_t)JSON_INT_MAX - (n - 1))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "seed: with n %" PRId64 " choices sample with seeds %" PRId64 " .. %" PRId64
                    ", past 2^53 - 1; lower the seed",
                    n, s->seed, s->seed + (n - 1));

    int64_t top_logprobs = 0;
    bool has_top_logprobs;
    if ((e = opt_bool(p, root, "logprobs", &req->logprobs)) ||
        (e = opt_int(p, root, "top_logprobs", 0, SVC_TOP_LOGPROBS_MAX, &top_logprobs,
                     &has_top_logprobs)))
        return e;
    if (top_logprobs > 0 && !req->logprobs)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "top_logprobs: needs \"logprobs\": true");
    req->top_logprobs = (uint32_t)top_logprobs;
    /* A stream: false answer is one record: refuse what may not fit before
     * any work is done (streamed chunks hold one token each). */
    size_t reply_bytes =
        svc_reply_bound(req->n, req->max_tokens, req->logprobs, req->top_logprobs);
    if (!req->stream && lim->max_reply_bytes && reply_bytes > lim->max_reply_bytes) {
        char what[64];
        if (req->n > 1)
            snprintf(what, sizeof what, "n %u choices of %u tokens", req->n, req->max_tokens);
        else
            snprintf(what, sizeof what, "%u tokens", req->max_tokens);
        return fail(p, SVC_ERROR_REPLY_TOO_LARGE,
                    "max_tokens: a stream:false reply of %s%s may need %zu bytes, over the "
                    "limit of %zu; lower %smax_tokens or top_logprobs, or stream",
                    what, req->logprobs ? " with logprobs" : "", reply_bytes,
                    lim->max_reply_bytes, req->n > 1 ? "n, " : "");
    }

    if ((e = parse_stop(p, root)) || (e = parse_response_format(p, root)) ||
        (e = svc_request_parse_tools(p, root)) || (e = parse_logit_bias(p, root)) ||
        (e = parse_date_string(p, root)))
        return e;
    return parse_adapter(p, root);
}
