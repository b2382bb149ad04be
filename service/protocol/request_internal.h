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
#include "protocol/protocol.h"

/* The request as allocated: the public part first, so a svc_request pointer
 * is also a request_impl pointer. */
typedef struct request_impl {
    svc_request pub;
    svc_arena arena; /* what pub points into */
} request_impl;

typedef struct parser {
    request_impl *r;
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
 * limits, stop strings, response format, date_string, adapter. */
svc_error svc_request_parse_options(parser *p, const cJSON *root);

#endif
