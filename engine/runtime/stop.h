/* Stop strings: a streaming matcher over the generated text.
 *
 * The runtime feeds the detokenized text piece by piece (one piece per token,
 * as ml_token_stream_push produces it) and emits only what the matcher
 * releases. A stop string is found even when it spans pieces, and no part of
 * it is ever emitted: a suffix of the text that could still grow into a stop
 * string is held back (at most the longest stop string's length minus one
 * bytes) and released as soon as it can no longer match, or at flush.
 *
 * Semantics. The generation stops at the first point of the byte stream where
 * an occurrence of any stop string completes (earliest end); when several
 * complete at that same byte, the longest one (earliest start) wins. The text
 * before that occurrence is emitted, the occurrence and anything after it are
 * not. Matching is exact bytes, case-sensitive. The outcome depends only on
 * the concatenated text, never on how it was cut into pieces, so streamed and
 * non-streamed replies agree. (vLLM instead takes the first stop string in list
 * order that occurs in the text; the two differ only when several stop strings
 * complete within one piece.)
 *
 * UTF-8: stop strings may not begin with a continuation byte (10xxxxxx).
 * Then, for valid UTF-8 input, every occurrence and every held-back suffix
 * begins on a character boundary, so each emitted chunk cuts the text only
 * where the caller's pieces do or at the start of a stop string: with whole
 * characters in, whole characters come out.
 *
 * @locality: an ml_stop belongs to one sequence and one thread at a time. */
#ifndef ML_RUNTIME_STOP_H
#define ML_RUNTIME_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

/* OpenAI accepts up to 4 stop strings; vLLM has no limit. 16 leaves room
 * without making the per-byte scan cost unbounded. */
#define ML_STOP_MAX_STRINGS 16
/* Longest stop string, in bytes; bounds the held-back text. */
#define ML_STOP_MAX_LEN 256

typedef struct ml_stop ml_stop;

/* What one feed or flush releases. */
typedef struct ml_stop_out {
    const char *text; /* borrowed, never NULL: valid until the next call on the matcher */
    size_t len;
    bool stopped; /* a stop string completed; text is everything before it */
    int which;    /* index of that stop string, -1 when !stopped */
} ml_stop_out;

/* Check a list of stop strings (strings[i] has lens[i] bytes, NULs allowed).
 * Errors: ML_ERR_INVALID_ARG naming the entry ("stop[2]: empty"): more than
 * ML_STOP_MAX_STRINGS, an empty string, one over ML_STOP_MAX_LEN bytes, one
 * beginning with a UTF-8 continuation byte, NULL pointers with n > 0. */
ml_status ml_stop_validate(const char *const *strings, const size_t *lens, size_t n, char *err,
                           size_t errlen);

/* A matcher for n stop strings (n may be 0: everything passes through, nothing
 * is held). The strings are copied; the caller keeps ownership of its arrays.
 * On success *out is owned by the caller (ml_stop_destroy). Errors: those of
 * ml_stop_validate, ML_ERR_NOMEM; *out untouched on error. */
ml_status ml_stop_create(const char *const *strings, const size_t *lens, size_t n, ml_stop **out,
                         char *err, size_t errlen);

/* No-op on NULL. */
void ml_stop_destroy(ml_stop *s);

/* Forget held text and a past stop, for a new sequence with the same strings. */
void ml_stop_reset(ml_stop *s);

/* Feed the next piece (len bytes; piece may be NULL when len is 0). *out
 * receives the text that is now safe to emit, possibly empty, and whether a
 * stop string completed. After a stop every further feed releases nothing
 * and reports stopped again, until ml_stop_reset. Allocates only when a piece
 * is longer than any before it. Errors: ML_ERR_INVALID_ARG (NULL piece with
 * len > 0), ML_ERR_NOMEM; the matcher is then unchanged and *out is empty. */
ml_status ml_stop_feed(ml_stop *s, const char *piece, size_t len, ml_stop_out *out, char *err,
                       size_t errlen);

/* End of text (max_tokens, a stop token, cancellation): release everything
 * held back, since it can no longer become a stop string. Nothing after a stop.
 * out->stopped tells whether a stop string had matched. */
void ml_stop_flush(ml_stop *s, ml_stop_out *out);

#endif
