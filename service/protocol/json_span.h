/* A strict JSON scanner that finds spans instead of building a tree, for
 * JSON that must be passed on as it was written (escapes, numbers and UTF-8
 * byte for byte, an escaped NUL included, which a C-string tree would cut):
 * the gateway copies the worker's reply records into its answers at no
 * allocation per chunk; the request parser hands each of a request's tools
 * to the chat template as the client wrote it (the template prints numbers
 * as Python does: 1.0 stays 1.0, which a double read by cJSON cannot tell
 * from 1); `mllama grammar` takes a schema's text from an input line.
 *
 * Strict: RFC 8259 values, valid UTF-8 in strings, surrogate escapes in
 * pairs, numbers of at most SVC_JSON_NUMBER_MAX characters and at most
 * SVC_JSON_DEPTH_MAX levels of nesting. Whatever it accepts, cJSON parses.
 *
 * Only svc_json_value validates; the other functions take spans it (or they)
 * returned, so they are well formed.
 *
 * @locality any thread: no state. */
#ifndef SVC_PROTOCOL_JSON_SPAN_H
#define SVC_PROTOCOL_JSON_SPAN_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

/* The worker's records nest 6 deep (choices, logprobs, content, entry,
 * top_logprobs, bytes); a request's tool schemas rarely nest past 20. The
 * bound keeps hostile nesting off the stack (one small frame a level). */
#define SVC_JSON_DEPTH_MAX 128
/* cJSON reads at most 63 characters of a number: longer ones are refused
 * so that whatever the gateway passes on parses with cJSON too. The worker
 * writes at most 20. */
#define SVC_JSON_NUMBER_MAX 63

/* A run of bytes: a JSON value inside a record or an event. */
typedef struct svc_span {
    const char *p; /* borrowed; NULL = absent */
    size_t n;
} svc_span;

/* The one value that fills s[0..n) with whitespace around it, or an absent
 * span when s is not exactly one strict JSON value. */
svc_span svc_json_value(const char *s, size_t n);

/* The value of member `key` of the object obj, or an absent span. Keys
 * compare as written (the worker never escapes them); the first of
 * duplicate keys counts, as in cJSON. */
svc_span svc_json_member(svc_span obj, const char *key);

/* The first element of the array arr, or an absent span when it is empty. */
svc_span svc_json_first(svc_span arr);

/* The element after elem (an element of arr), or an absent span after the
 * last. */
svc_span svc_json_next(svc_span arr, svc_span elem);

/* True when v is present and starts with `first`: '{' an object, '[' an
 * array, '"' a string. */
bool svc_json_is(svc_span v, char first);

/* True when v is absent or null. */
bool svc_json_is_null(svc_span v);

/* True when v is a number. */
bool svc_json_is_number(svc_span v);

/* True when the object or array v has no member or element. */
bool svc_json_is_empty(svc_span v);

/* What is between the brackets, braces or quotes of v. */
svc_span svc_json_inner(svc_span v);

/* Append v without the whitespace outside its strings (SSE data must stay
 * on one line). Returns 0, or -1 when out of memory (b keeps what it had). */
int svc_json_put_compact(svc_buf *b, svc_span v);

#endif
