/* Private to request.c and request_options.c: the request as allocated, the
 * parser state and the field helpers both use. */
#ifndef SVC_PROTOCOL_REQUEST_INTERNAL_H
#define SVC_PROTOCOL_REQUEST_INTERNAL_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "protocol/arena.h"
#include "protocol/json_span.h"
#include "protocol/protocol.h"

/* The request as allocated: the public part first, so a svc_request pointer
 * is also a request_impl pointer. */
typedef struct request_impl {
    svc_request pub;
    svc_arena arena; /* what pub points into */
} request_impl;

typedef struct parser {
    request_impl *r;
    const char *body;  /* the record value, for spans of it (json_span.h) */
    size_t body_len;
    svc_span root;      /* the body as a span, once scanned (request_tools.c) */
    svc_span *msg_spans; /* the messages' spans, once one is needed (request_tools.c) */
    const svc_limits *lim;
    char *err;
    size_t errlen;
    svc_error first; /* the first error; later ones are not reported */
    svc_image *images; /* capacity lim->max_images, allocated at the first image */
    size_t n_parts;
} parser;

static inline svc_error fail(parser *p, svc_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record an error (only the first one is kept) and return it. */
static inline svc_error fail(parser *p, svc_error e, const char *fmt, ...)
{
    if (p->first != SVC_ERROR_NONE)
        return e;
    p->first = e;
    va_list ap;
    va_start(ap, fmt);
    svc_verrf(p->err, p->errlen, fmt, ap);
    va_end(ap);
    return e;
}

static inline svc_error out_of_memory(parser *p)
{
    return fail(p, SVC_ERROR_INTERNAL, "out of memory while parsing the request");
}

/* Member `name` of obj; NULL when absent or JSON null (the same thing here). */
static inline const cJSON *member(const cJSON *obj, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

/* Largest integer a JSON number (an IEEE double) holds exactly. */
#define JSON_INT_MAX 9007199254740991.0 /* 2^53 - 1 */

/* Optional integer in [lo, hi]; *out unchanged when absent. */
static inline svc_error opt_int(parser *p, const cJSON *obj, const char *name, int64_t lo, int64_t hi,
                         int64_t *out, bool *present)
{
    const cJSON *it = member(obj, name);
    if (present)
        *present = it != NULL;
    if (!it)
        return SVC_ERROR_NONE;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || fabs(v) > JSON_INT_MAX)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: expected an integer", name);
    if (v < (double)lo || v > (double)hi)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: %.0f is out of range [%lld, %lld]", name,
                    v, (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return SVC_ERROR_NONE;
}

/* A closed or open bound of a number range. */
typedef struct bound {
    double v;
    bool open;
} bound;

/* Optional number in the range (lo, hi) with the given openness; *out
 * unchanged when absent. */
static inline svc_error opt_number(parser *p, const cJSON *obj, const char *name, bound lo, bound hi,
                            float *out)
{
    const cJSON *it = member(obj, name);
    if (!it)
        return SVC_ERROR_NONE;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: expected a number", name);
    bool ok = (lo.open ? v > lo.v : v >= lo.v) && (hi.open ? v < hi.v : v <= hi.v);
    if (!ok)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: %g is out of range %c%g, %g%c", name, v,
                    lo.open ? '(' : '[', lo.v, hi.v, hi.open ? ')' : ']');
    *out = (float)v;
    return SVC_ERROR_NONE;
}

static inline svc_error opt_bool(parser *p, const cJSON *obj, const char *name, bool *out)
{
    const cJSON *it = member(obj, name);
    if (!it)
        return SVC_ERROR_NONE;
    if (!cJSON_IsBool(it))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: expected true or false", name);
    *out = cJSON_IsTrue(it);
    return SVC_ERROR_NONE;
}

/* The generation options of the body (request_options.c): sampling,
 * limits, stop strings, response format, tools, date_string, adapter. */
svc_error svc_request_parse_options(parser *p, const cJSON *root);

/* A JSON Schema's compact text into the arena (*text, *text_len), printed
 * into a buffer of max_schema_bytes so that a schema over the bound costs
 * no more than that (escapes can make the text several times the size of
 * its share of the record); `field` names it in the error. */
svc_error svc_request_keep_schema(parser *p, const cJSON *schema, const char *field,
                                  const char **text, size_t *text_len);

/* tools, tool_choice and parallel_tool_calls (request_tools.c), after
 * response_format and stop, which a tool choice excludes. */
svc_error svc_request_parse_tools(parser *p, const cJSON *root);

/* What tools exclude in the messages, once they are parsed (images). */
svc_error svc_request_check_tools(parser *p);

/* An assistant message's tool_calls, or a tool message's content
 * (request_tools.c, for request.c's messages). */
svc_error svc_request_parse_tool_call(parser *p, svc_message *m, const cJSON *calls, size_t i);
svc_error svc_request_parse_tool_content(parser *p, svc_message *m, size_t i);

#endif
