/* A strict JSON scanner that finds spans instead of building a tree: the
 * gateway copies the worker's reply records into its answers as they were
 * written (escapes, numbers and UTF-8 byte for byte, an escaped NUL
 * included, which a C-string tree would cut), and a chunk costs no
 * allocation.
 *
 * Strict: RFC 8259 values, valid UTF-8 in strings, surrogate escapes in
 * pairs, numbers of at most GW_JSON_NUMBER_MAX characters and at most
 * GW_JSON_DEPTH_MAX levels of nesting. Whatever it accepts, cJSON parses.
 *
 * Only gw_json_value validates; the other functions take spans it (or they)
 * returned, so they are well formed.
 *
 * @locality any thread: no state. */
#ifndef SVC_GW_JSON_H
#define SVC_GW_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

/* The worker's records nest 6 deep (choices, logprobs, content, entry,
 * top_logprobs, bytes); the bound keeps hostile nesting off the stack. */
#define GW_JSON_DEPTH_MAX 32
/* cJSON reads at most 63 characters of a number: longer ones are refused
 * so that whatever the gateway passes on parses with cJSON too. The worker
 * writes at most 20. */
#define GW_JSON_NUMBER_MAX 63

/* A run of bytes: a JSON value inside a record or an event. */
typedef struct gw_span {
    const char *p; /* borrowed; NULL = absent */
    size_t n;
} gw_span;

/* The one value that fills s[0..n) with whitespace around it, or an absent
 * span when s is not exactly one strict JSON value. */
gw_span gw_json_value(const char *s, size_t n);

/* The value of member `key` of the object obj, or an absent span. Keys
 * compare as written (the worker never escapes them); the first of
 * duplicate keys counts, as in cJSON. */
gw_span gw_json_member(gw_span obj, const char *key);

/* The first element of the array arr, or an absent span when it is empty. */
gw_span gw_json_first(gw_span arr);

/* True when v is present and starts with `first`: '{' an object, '[' an
 * array, '"' a string. */
bool gw_json_is(gw_span v, char first);

/* True when v is absent or null. */
bool gw_json_is_null(gw_span v);

/* True when v is a number. */
bool gw_json_is_number(gw_span v);

/* True when the object or array v has no member or element. */
bool gw_json_is_empty(gw_span v);

/* What is between the brackets, braces or quotes of v. */
gw_span gw_json_inner(gw_span v);

/* Append v without the whitespace outside its strings (SSE data must stay
 * on one line). Returns 0, or -1 when out of memory (b keeps what it had). */
int gw_json_put_compact(svc_buf *b, gw_span v);

#endif
