/* What json_mode.c (the recognizer and the mask walk) and json_vocab.c
 * (building the trie) share; not an API. */
#ifndef ML_RUNTIME_JSON_MODE_INTERNAL_H
#define ML_RUNTIME_JSON_MODE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar/json_mode.h"

/* The string states whose tokens are decided once, at creation: inside a
 * string, neither the key flag nor the container stack changes what is
 * accepted, so a token that stays in the string has the same verdict every
 * time. Between characters is where most steps of a long string are; after
 * a backslash, nearly every token that begins with an escape letter
 * (n, t, r, ...) is allowed, too many to walk. */
enum { JSON_PRE_STR, JSON_PRE_ESC, JSON_N_PRE };

/* ml_json_vocab.flags: bit p (JSON_NODE_CLOSES << p) set when, from state
 * json_pre_mode[p] (json_mode.c), some token through this node leaves the string here or
 * below, so its verdict depends on more than the string. */
#define JSON_NODE_CLOSES 1u

struct ml_json_vocab {
    size_t n_vocab;
    size_t n_words;   /* (n_vocab + 63) / 64 */
    uint32_t *offset; /* owned: n_vocab + 1; token i's bytes are bytes[offset[i], offset[i + 1]),
                         empty when it is never allowed */
    uint8_t *bytes;   /* owned */

    /* The trie of the token byte strings, breadth-first: node 0 is the root
     * (the empty prefix); the children of node i are nodes [child[i],
     * child[i + 1]) in byte order, so scanning them reads contiguous memory;
     * the tokens spelled by the path to node i are ids[tok[i], tok[i + 1]).
     * n_node + 1 entries each, the last a sentinel. */
    size_t n_node;
    uint8_t *byte;   /* owned: the byte leading to the node (the root's unused) */
    uint8_t *flags;  /* owned: JSON_NODE_* */
    uint32_t *child; /* owned */
    uint32_t *tok;   /* owned */
    int32_t *ids;    /* owned: n_tok */
    size_t n_tok;
    size_t max_len; /* longest token: the trie's depth */

    /* The same trie in depth-first order, for walks that read it front to
     * back (grammar.c): node i (the root left out) is reached by byte
     * pre_byte[i] from its parent, the nearest node before it with depth
     * pre_depth[i] - 1; its subtree is [i, pre_skip[i]); the tokens spelled
     * by the path to it are pre_ids[pre_tok[i], pre_tok[i + 1]). */
    size_t pre_n;
    uint8_t *pre_byte;   /* owned: pre_n */
    uint16_t *pre_depth; /* owned: pre_n, 1 for the root's children */
    uint32_t *pre_skip;  /* owned: pre_n */
    uint32_t *pre_tok;   /* owned: pre_n + 1 */
    int32_t *pre_ids;    /* owned: n_tok */

    /* grammar.c's string shortcut. From between two characters of a string
     * written in lexemes.h's one form per character: canon_upto + c *
     * n_words is the mask of the tokens that stay inside the string having
     * begun at most c characters, for c in [0, canon_max_chars] (the last
     * one: every token that stays inside); pre_closes[i] != 0 when a token
     * through depth-first node i leaves the string. */
    uint64_t *canon_upto;     /* owned: (canon_max_chars + 1, n_words) */
    uint32_t canon_max_chars; /* the most characters one token begins inside a string */
    uint8_t *pre_closes;      /* owned: pre_n */

    /* owned: n_words each; the tokens that, from json_pre_mode[p], are
     * accepted without leaving the string */
    uint64_t *in_string[JSON_N_PRE];

    /* owned: n_words; ml_json_vocab_prose's mask */
    uint64_t *prose;
};

/* JSON's whitespace (RFC 8259): what may stand between tokens. */
static inline bool ml_json_is_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The bytes of token (*len of them), or NULL when it is never allowed
 * (special, without bytes, or outside [0, n_vocab)). */
const uint8_t *ml_json_vocab_token(const ml_json_vocab *v, int32_t token, size_t *len);

/* Decide, on a vocabulary whose trie is built, the tokens that stay inside
 * a string from each JSON_PRE_* state (in_string) and the nodes where one
 * leaves it (JSON_NODE_CLOSES flags). Errors: ML_ERR_NOMEM. */
ml_status ml_json_vocab_mark_strings(ml_json_vocab *v, char *err, size_t errlen);

/* Decide canon_upto and pre_closes (grammar.c) on a vocabulary whose
 * trie is built. Errors: ML_ERR_NOMEM. */
ml_status ml_grammar_vocab_mark_strings(ml_json_vocab *v, char *err, size_t errlen);

#endif
