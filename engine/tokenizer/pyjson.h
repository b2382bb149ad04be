/* The chat template's `tojson` filter, in C.
 *
 * transformers' chat templates define tojson as Python's
 * json.dumps(x, ensure_ascii=False, indent=indent) of the Python value x.
 * Here x arrives as JSON text (what the client sent), so tojson is
 * json.dumps(json.loads(text)), done as a re-serializer of the text: it
 * keeps what a parse into doubles would lose (the digits of an integer) and
 * writes what Python writes:
 *
 * - Separators ", " and ": "; with an indent, "," at line ends, a newline
 *   and indent * depth spaces before each item and the closing bracket;
 *   empty containers "{}" and "[]" either way. Keys keep their order.
 * - An integer (no '.', 'e' or 'E') as written, "-0" as "0" (Python's int);
 *   more than ML_PYJSON_INT_MAX_DIGITS digits is an error, as Python's int()
 *   refuses them. Any other number as repr(float(text)): the shortest digits
 *   that read back to the same double, fixed notation when the decimal
 *   exponent is in [-4, 16) ("1.0", "0.0001", "-0.0"), else "1e+16",
 *   "1.5e-05". A number past the double range is an error (Python would
 *   write "Infinity", which is not JSON); one that underflows is 0.0.
 * - A string with its escapes decoded, then written with \" \\ \n \r \t \b
 *   \f and other code points below U+0020 as \u00xx (lower-case hex), all
 *   else as raw UTF-8 (ensure_ascii=False).
 * - true, false, null as themselves.
 *
 * Refused (ML_ERR_INVALID_ARG, with the byte offset): text that is not one
 * RFC 8259 JSON value (NaN and Infinity, which Python reads, included), ill-
 * formed UTF-8, a \u escape of a lone surrogate (Python would keep it and
 * then fail to encode it), a key repeated in an object (Python keeps the
 * last value in the first key's place; refuse rather than guess), nesting
 * deeper than ML_PYJSON_MAX_DEPTH. */
#ifndef ML_PYJSON_H
#define ML_PYJSON_H

#include <stddef.h>

#include "status.h"

/* Arrays and objects nested deeper than this are refused. The tool schemas
 * the template renders nest a few levels; the bound keeps the recursive
 * parser's stack small whatever a client sends. */
#define ML_PYJSON_MAX_DEPTH 64
/* Python 3.11's int() refuses decimal strings of more digits than this
 * (sys.get_int_max_str_digits()), so json.loads does too. */
#define ML_PYJSON_INT_MAX_DIGITS 4300
/* The indent argument for json.dumps' indent=None: one line. */
#define ML_PYJSON_NO_INDENT (-1)

/* A growing byte buffer. Zero-initialize; ml_pyjson_buf_deinit frees it.
 * After a successful ml_pyjson_dumps, data is NUL-terminated at len. */
typedef struct ml_pyjson_buf {
    char *data;
    size_t len;
    size_t cap;
} ml_pyjson_buf;

void ml_pyjson_buf_deinit(ml_pyjson_buf *b);

/* Append json.dumps(json.loads(json[0..len)), ensure_ascii=False,
 * indent=indent) to out. indent is ML_PYJSON_NO_INDENT or >= 0 spaces.
 * Returns ML_OK; ML_ERR_INVALID_ARG for input it refuses (above) or a bad
 * indent, with the reason and byte offset in err; ML_ERR_NOMEM. On error
 * out->len is as it was. @locality any thread. */
ml_status ml_pyjson_dumps(const char *json, size_t len, int indent, ml_pyjson_buf *out, char *err,
                          size_t errlen);

#endif
