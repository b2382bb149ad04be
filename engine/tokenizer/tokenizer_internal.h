/* Private layout of ml_tokenizer, shared by the files of engine/tokenizer. */
#ifndef ML_TOKENIZER_INTERNAL_H
#define ML_TOKENIZER_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

/* Per-id flags. */
enum {
    ML_TOKF_ASSIGNED = 1u << 0, /* the id has bytes */
    ML_TOKF_ADDED = 1u << 1,    /* from added_tokens */
    ML_TOKF_SPECIAL = 1u << 2,  /* added token with "special": true */
};

/* Bits of ml_tokenizer.added_first: which added-token sets have a token
 * starting with a given byte. */
enum {
    ML_ADDED_FIRST_ANY = 1u << 0,   /* some added token */
    ML_ADDED_FIRST_PLAIN = 1u << 1, /* some non-special added token */
};

/* An added token as matched in text. */
typedef struct ml_added_token {
    const uint8_t *text; /* borrowed from ml_tokenizer.arena; the raw content */
    uint32_t len;
    int32_t id;
} ml_added_token;

/* One slot of the vocabulary map. The key's length, arena offset and hash
 * sit in the slot so a probe touches the slot and the key bytes only. */
typedef struct ml_vocab_slot {
    int32_t id; /* -1 marks a free slot */
    uint32_t hash; /* high half of ml_tok_hash */
    uint32_t off;  /* key bytes: arena[off .. off + len) */
    uint32_t len;
} ml_vocab_slot;

/* One slot of the merge map: pair (left, right) -> (rank, merged id). */
typedef struct ml_merge_slot {
    uint64_t key; /* (uint64_t)left << 32 | right; ML_MERGE_EMPTY when free */
    uint32_t rank;
    int32_t merged;
} ml_merge_slot;

#define ML_MERGE_EMPTY UINT64_MAX

struct ml_tokenizer {
    size_t n_ids; /* one more than the largest id */

    /* id -> bytes it decodes to: arena[off[id] .. off[id] + len[id]). */
    uint32_t *tok_off;  /* owned, (n_ids) */
    uint32_t *tok_len;  /* owned, (n_ids) */
    uint8_t *tok_flags; /* owned, (n_ids) ML_TOKF_* */
    uint8_t *arena;     /* owned: token bytes, then added-token contents */
    size_t max_token_len;

    /* vocabulary bytes -> id, open addressing. Holds the model vocabulary
     * only (what BPE can produce), not added tokens. */
    ml_vocab_slot *vocab_slots; /* owned, (vocab_mask + 1) */
    size_t vocab_mask;

    ml_merge_slot *merge_slots; /* owned, (merge_mask + 1) */
    size_t merge_mask;

    int32_t byte_id[256]; /* id of each single-byte token: BPE's starting symbols */
    int ignore_merges;    /* a pre-token found whole in the vocabulary maps directly */

    /* Added tokens sorted by content (memcmp order, a prefix before its
     * extensions): every token, and the non-special ones only. */
    ml_added_token *added_all; /* owned */
    size_t n_added_all;
    ml_added_token *added_plain; /* owned */
    size_t n_added_plain;
    uint8_t added_first[256]; /* ML_ADDED_FIRST_* per first byte */
};

/* Hash of a byte string for the vocabulary map (load and encode must agree). */
static inline uint64_t ml_tok_hash(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return h;
}

static inline uint64_t ml_merge_hash(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

/* Id of the vocabulary token with exactly these bytes, or -1. */
static inline int32_t ml_vocab_find(const ml_tokenizer *tok, const uint8_t *p, size_t n)
{
    uint64_t h = ml_tok_hash(p, n);
    size_t i = (size_t)h & tok->vocab_mask;
    for (;;) {
        const ml_vocab_slot *s = &tok->vocab_slots[i];
        if (s->id < 0)
            return -1;
        if (s->hash == (uint32_t)(h >> 32) && s->len == n &&
            memcmp(tok->arena + s->off, p, n) == 0)
            return s->id;
        i = (i + 1) & tok->vocab_mask;
    }
}

/* Merge slot for the pair (left, right), or NULL when they do not merge. */
static inline const ml_merge_slot *ml_merge_find(const ml_tokenizer *tok, int32_t left,
                                                 int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = (size_t)ml_merge_hash(key) & tok->merge_mask;
    for (;;) {
        const ml_merge_slot *s = &tok->merge_slots[i];
        if (s->key == key)
            return s;
        if (s->key == ML_MERGE_EMPTY)
            return NULL;
        i = (i + 1) & tok->merge_mask;
    }
}

/* Length in bytes of the pre-token that starts s[0..n), n >= 1: the match of
 * the Llama 3 split regex at position 0 (pretokenize.c). Always >= 1. */
size_t ml_pretoken_len(const uint8_t *s, size_t n);

#endif
