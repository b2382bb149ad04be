/* The Llama 3 tokenizer: a byte-level BPE read from a Hugging Face
 * tokenizer.json, reproducing `tokenizers` (Tokenizer.encode with
 * add_special_tokens=False, Tokenizer.decode) id for id.
 *
 * Pipeline of ml_tokenizer_encode, as in `tokenizers`:
 *   1. added tokens (AddedVocabulary): the text is split around occurrences of
 *      added tokens, leftmost match first and the longest one at that position;
 *      each occurrence becomes its id directly;
 *   2. pre-tokenizer: the Llama 3 split regex, hand-written (pretokenize.c);
 *   3. model: each pre-token's bytes map to one id if the whole byte string is
 *      in the vocabulary (ignore_merges), else BPE merges by rank.
 * No normalizer, no BOS/EOS: the post-processor is not applied.
 *
 * Only tokenizer.json files of this shape are accepted (anything else is
 * ML_ERR_UNSUPPORTED): model BPE without byte_fallback, dropout, subword
 * prefix or suffix; no normalizer; pre_tokenizer Sequence[Split(the Llama 3
 * pattern, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)];
 * decoder ByteLevel; added tokens without lstrip, rstrip or single_word.
 *
 * Mllama: `<|image|>` is added as a special token with the next free id
 * (128256 for the Llama 3.1 vocabulary) when the file does not define it.
 *
 * Invalid UTF-8 in the text to encode (HF never sees it: Python strings are
 * valid) is not an error: each byte that does not begin a well-formed
 * sequence is a character of its own that is neither letter, number nor
 * space. Bytes always round-trip: decode(encode(x)) == x for any x.
 *
 * @locality: a loaded ml_tokenizer is immutable; encode, decode and the
 * lookups may run on any number of threads at once. Each call keeps its
 * scratch on the stack (long pre-tokens: on the heap, freed before return).
 * An ml_token_buf or ml_token_stream belongs to one thread at a time. */
#ifndef ML_TOKENIZER_H
#define ML_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct ml_tokenizer ml_tokenizer;

/* ---- id buffer ------------------------------------------------------------- */

/* A growable array of token ids owned by the caller. Encode appends to it, so
 * one buffer can collect a whole prompt and be reused across requests. */
typedef struct ml_token_buf {
    int32_t *ids; /* owned; n valid entries, room for cap */
    size_t n;
    size_t cap;
} ml_token_buf;

void ml_token_buf_init(ml_token_buf *buf);
/* Frees the ids; the buffer is left empty and may be reused. */
void ml_token_buf_deinit(ml_token_buf *buf);
/* Append one id. ML_ERR_NOMEM leaves the buffer unchanged. */
ml_status ml_token_buf_push(ml_token_buf *buf, int32_t id);

/* ---- loading and lookups ---------------------------------------------------- */

/* Load a tokenizer.json file. On success *out is a new tokenizer (owned by the
 * caller: ml_tokenizer_destroy). Errors: ML_ERR_IO (cannot read),
 * ML_ERR_TOO_LARGE (file over 1 GiB), ML_ERR_FORMAT (malformed JSON or
 * inconsistent vocabulary/merges; err names the field), ML_ERR_UNSUPPORTED
 * (a component this implementation does not reproduce), ML_ERR_NOMEM.
 * *out is untouched on error. */
ml_status ml_tokenizer_load(const char *path, ml_tokenizer **out, char *err, size_t errlen);

/* Same from a JSON document in memory (len bytes, no NUL needed); `name`
 * prefixes error messages. */
ml_status ml_tokenizer_load_buffer(const char *json, size_t len, const char *name,
                                   ml_tokenizer **out, char *err, size_t errlen);

/* No-op on NULL. */
void ml_tokenizer_destroy(ml_tokenizer *tok);

/* One more than the largest id (128257 for Mllama). Ids below it may still be
 * unassigned if the file leaves holes; ml_tokenizer_token_bytes says. */
size_t ml_tokenizer_n_ids(const ml_tokenizer *tok);

/* Id of a token given as text: an added token by its content
 * ("<|eot_id|>"), else the vocabulary token whose bytes are exactly `text`
 * ("user", "\n\n"). -1 when there is none. */
int32_t ml_tokenizer_token_id(const ml_tokenizer *tok, const char *text);

/* Bytes id decodes to (borrowed, valid while tok lives, not NUL-terminated),
 * length in *len. NULL when id is out of range or unassigned. */
const char *ml_tokenizer_token_bytes(const ml_tokenizer *tok, int32_t id, size_t *len);

/* 1 if id is an added token flagged special (<|eot_id|>, <|image|>, ...). */
int ml_tokenizer_is_special(const ml_tokenizer *tok, int32_t id);

/* ---- encode ---------------------------------------------------------------- */

enum {
    /* Match special added tokens in the text (HF encode's default; the
     * `encode_special_tokens`/split_special_tokens off). Without it a special
     * token's text is tokenized as ordinary text. Non-special added tokens are
     * always matched. */
    ML_ENCODE_PARSE_SPECIAL = 1u << 0,
};

/* Append the ids of text[0..len) to *out. flags: ML_ENCODE_*. Errors:
 * ML_ERR_INVALID_ARG (NULL tok/out, or NULL text with len > 0), ML_ERR_NOMEM;
 * on error *out keeps its old ids (n restored). Any byte content is valid. */
ml_status ml_tokenizer_encode(const ml_tokenizer *tok, const char *text, size_t len,
                              unsigned flags, ml_token_buf *out, char *err, size_t errlen);

/* ---- decode ---------------------------------------------------------------- */

enum {
    ML_DECODE_SKIP_SPECIAL = 1u << 0, /* drop special tokens (HF skip_special_tokens) */
    /* Replace ill-formed UTF-8 by U+FFFD, one per maximal subpart, as HF's
     * decode does (String::from_utf8_lossy). Without it the output is the
     * exact concatenation of token bytes. */
    ML_DECODE_REPLACE_INVALID = 1u << 1,
};

/* Decode ids[0..n) to text. On success *text is a new NUL-terminated string
 * (owned by the caller: free()) of *len bytes (excluding the NUL; the bytes
 * may contain NULs). Errors: ML_ERR_INVALID_ARG when an id is out of range or
 * unassigned (err names its index and value), ML_ERR_NOMEM; *text untouched. */
ml_status ml_tokenizer_decode(const ml_tokenizer *tok, const int32_t *ids, size_t n,
                              unsigned flags, char **text, size_t *len, char *err,
                              size_t errlen);

/* ---- streaming decode ------------------------------------------------------- */

/* Incremental detokenizer for generation: ids go in one at a time and only
 * complete UTF-8 characters come out. An id whose bytes end inside a
 * character emits nothing of that character until a later id completes it.
 * Ill-formed sequences become U+FFFD as soon as they are known to be
 * ill-formed, and flush turns a trailing incomplete character into one
 * U+FFFD, so the concatenated output equals
 * ml_tokenizer_decode(..., ML_DECODE_REPLACE_INVALID) of the same ids. */
typedef struct ml_token_stream ml_token_stream;

/* flags: ML_DECODE_SKIP_SPECIAL or 0. tok is borrowed and must outlive the
 * stream. Errors: ML_ERR_INVALID_ARG, ML_ERR_NOMEM. */
ml_status ml_token_stream_create(const ml_tokenizer *tok, unsigned flags, ml_token_stream **out,
                                 char *err, size_t errlen);

/* No-op on NULL. */
void ml_token_stream_destroy(ml_token_stream *s);

/* Feed one id. *text and *len receive the newly completed text (possibly empty),
 * borrowed from the stream and valid until its next call. No allocation.
 * Errors: ML_ERR_INVALID_ARG for an id out of range or unassigned; the
 * stream is unchanged and *len is 0. */
ml_status ml_token_stream_push(ml_token_stream *s, int32_t id, const char **text, size_t *len,
                               char *err, size_t errlen);

/* End of sequence: emit U+FFFD for a pending incomplete character (or nothing)
 * and reset. *text borrowed as for push. */
void ml_token_stream_flush(ml_token_stream *s, const char **text, size_t *len);

#endif
