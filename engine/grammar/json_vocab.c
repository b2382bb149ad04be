/* JSON mode's vocabulary (json_mode.h ml_json_vocab): every allowed
 * token's bytes, and the breadth-first trie of them that json_mode.c walks.
 * Built once: sort the byte strings, number the trie's nodes in preorder
 * from the sorted run, lay them out breadth-first, then let json_mode.c
 * decide the in-string verdicts. */
#include "grammar/json_mode.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/json_mode_internal.h"

typedef struct json_sort_entry {
    const uint8_t *bytes; /* borrowed from the vocabulary's pool */
    uint32_t len;
    int32_t id;
} json_sort_entry;

/* Byte order with a prefix first, then id: the trie's depth-first order. */
static int json_sort_cmp(const void *pa, const void *pb)
{
    const json_sort_entry *a = pa, *b = pb;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->bytes, b->bytes, n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static uint32_t json_common_prefix(const json_sort_entry *a, const json_sort_entry *b)
{
    uint32_t n = a->len < b->len ? a->len : b->len, k = 0;
    while (k < n && a->bytes[k] == b->bytes[k])
        k++;
    return k;
}

/* The trie in depth-first order, as the sorted tokens give it (the root
 * left out): node i's subtree is [i, next[i]), its first child, if any,
 * i + 1, and the tokens spelled by the path to it sorted[tok[i], tok[i + 1]).
 * Scratch for json_build_trie. */
typedef struct json_preorder {
    size_t n;
    uint32_t *next;  /* owned, n */
    uint32_t *tok;   /* owned, n + 1 */
    uint8_t *byte;   /* owned, n */
    uint16_t *depth; /* owned, n */
} json_preorder;

static void json_preorder_deinit(json_preorder *p)
{
    free(p->next);
    free(p->tok);
    free(p->byte);
    free(p->depth);
}

static bool json_preorder_init(json_preorder *p, const json_sort_entry *sorted, size_t n_tok)
{
    size_t n = 0;
    for (size_t k = 0; k < n_tok; k++)
        n += sorted[k].len - (k ? json_common_prefix(&sorted[k - 1], &sorted[k]) : 0);
    p->n = n;
    p->next = malloc((n ? n : 1) * sizeof *p->next);
    p->tok = malloc((n + 1) * sizeof *p->tok);
    p->byte = malloc(n ? n : 1);
    p->depth = malloc((n ? n : 1) * sizeof *p->depth);
    if (!p->next || !p->tok || !p->byte || !p->depth)
        return false;

    /* path[d]: the node at depth d (1-based) on the current token's path. */
    uint32_t path[ML_JSON_MAX_TOKEN_BYTES + 1];
    size_t i = 0, open = 0;
    for (size_t k = 0; k < n_tok; k++) {
        const json_sort_entry *e = &sorted[k];
        size_t shared = k ? json_common_prefix(&sorted[k - 1], e) : 0;
        for (; open > shared; open--)
            p->next[path[open]] = (uint32_t)i;
        for (size_t d = shared; d < e->len; d++) {
            p->byte[i] = e->bytes[d];
            p->depth[i] = (uint16_t)(d + 1);
            p->tok[i] = (uint32_t)k;
            path[d + 1] = (uint32_t)i++;
        }
        open = e->len;
    }
    for (; open > 0; open--)
        p->next[path[open]] = (uint32_t)i;
    assert(i == n);
    p->tok[n] = (uint32_t)n_tok;
    return true;
}

/* Lay the sorted tokens out as v's breadth-first trie, and keep the
 * depth-first one (taking pre's arrays). */
static ml_status json_build_trie(ml_json_vocab *v, const json_sort_entry *sorted, char *err,
                                 size_t errlen)
{
    json_preorder pre = {0};
    /* queue[h]: the depth-first index of breadth-first node h + 1. */
    uint32_t *queue = NULL;
    bool ok = json_preorder_init(&pre, sorted, v->n_tok);
    v->n_node = pre.n + 1;
    if (ok) {
        queue = malloc((pre.n ? pre.n : 1) * sizeof *queue);
        v->byte = malloc(v->n_node + 1);
        v->flags = calloc(v->n_node + 1, 1);
        v->child = malloc((v->n_node + 1) * sizeof *v->child);
        v->tok = malloc((v->n_node + 1) * sizeof *v->tok);
        v->ids = malloc((v->n_tok ? v->n_tok : 1) * sizeof *v->ids);
        v->pre_ids = malloc((v->n_tok ? v->n_tok : 1) * sizeof *v->pre_ids);
        ok = queue && v->byte && v->flags && v->child && v->tok && v->ids && v->pre_ids;
    }
    if (!ok) {
        json_preorder_deinit(&pre);
        free(queue);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "json mode: out of memory for the trie");
    }

    size_t tail = 0, n_ids = 0;
    for (size_t c = 0; c < pre.n; c = pre.next[c])
        queue[tail++] = (uint32_t)c;
    v->byte[0] = 0;
    v->child[0] = 1;
    v->tok[0] = 0;
    for (size_t h = 0; h < pre.n; h++) {
        uint32_t p = queue[h];
        size_t node = h + 1;
        v->byte[node] = pre.byte[p];
        v->child[node] = (uint32_t)(tail + 1);
        v->tok[node] = (uint32_t)n_ids;
        for (uint32_t t = pre.tok[p]; t < pre.tok[p + 1]; t++)
            v->ids[n_ids++] = sorted[t].id;
        for (size_t c = p + 1; c < pre.next[p]; c = pre.next[c])
            queue[tail++] = (uint32_t)c;
    }
    assert(tail == pre.n && n_ids == v->n_tok);
    v->byte[v->n_node] = 0;
    v->child[v->n_node] = (uint32_t)v->n_node;
    v->tok[v->n_node] = (uint32_t)n_ids;
    for (size_t k = 0; k < v->n_tok; k++)
        v->pre_ids[k] = sorted[k].id;
    v->pre_n = pre.n;
    v->pre_byte = pre.byte;
    v->pre_depth = pre.depth;
    v->pre_skip = pre.next;
    v->pre_tok = pre.tok;
    free(queue);
    return ML_OK;
}

ml_status ml_json_vocab_create_from_bytes(const char *const *bytes, const size_t *lens,
                                          size_t n_vocab, ml_json_vocab **out, char *err,
                                          size_t errlen)
{
    if (!bytes || !lens || !out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "json mode: NULL argument");
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "json mode: n_vocab %zu out of range",
                       n_vocab);
    size_t total = 0, n_tok = 0, max_len = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        size_t len = bytes[i] ? lens[i] : 0;
        if (len > ML_JSON_MAX_TOKEN_BYTES)
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "json mode: token %zu has %zu bytes, at most %d", i, len,
                           ML_JSON_MAX_TOKEN_BYTES);
        total += len;
        if (total > UINT32_MAX)
            return ml_fail(err, errlen, ML_ERR_TOO_LARGE,
                           "json mode: over 4 GiB of token bytes at token %zu", i);
        n_tok += len > 0;
        if (len > max_len)
            max_len = len;
    }

    ml_json_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "json mode: out of memory");
    v->n_vocab = n_vocab;
    v->n_words = (n_vocab + 63) / 64;
    v->n_tok = n_tok;
    v->max_len = max_len;
    v->offset = malloc((n_vocab + 1) * sizeof *v->offset);
    v->bytes = malloc(total ? total : 1);
    bool ok = v->offset && v->bytes;
    for (size_t p = 0; p < JSON_N_PRE; p++) {
        v->in_string[p] = calloc(v->n_words, sizeof *v->in_string[p]);
        ok = ok && v->in_string[p];
    }
    v->prose = calloc(v->n_words, sizeof *v->prose);
    ok = ok && v->prose;
    json_sort_entry *sorted = malloc((n_tok ? n_tok : 1) * sizeof *sorted);
    ml_status st = ML_OK;
    if (!ok || !sorted) {
        st = ml_fail(err, errlen, ML_ERR_NOMEM, "json mode: out of memory for %zu tokens", n_vocab);
        goto done;
    }
    size_t at = 0, k = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        size_t len = bytes[i] ? lens[i] : 0;
        v->offset[i] = (uint32_t)at;
        if (len == 0)
            continue;
        memcpy(v->bytes + at, bytes[i], len);
        sorted[k++] = (json_sort_entry){v->bytes + at, (uint32_t)len, (int32_t)i};
        size_t lead = 0;
        while (lead < len && ml_json_is_ws((uint8_t)bytes[i][lead]))
            lead++;
        if (lead < len && bytes[i][lead] != '{')
            v->prose[i / 64] |= 1ull << (i % 64);
        at += len;
    }
    v->offset[n_vocab] = (uint32_t)at;
    qsort(sorted, n_tok, sizeof *sorted, json_sort_cmp);
    st = json_build_trie(v, sorted, err, errlen);
    if (st == ML_OK)
        st = ml_json_vocab_mark_strings(v, err, errlen);
    if (st == ML_OK)
        st = ml_grammar_vocab_mark_strings(v, err, errlen);
done:
    free(sorted);
    if (st != ML_OK) {
        ml_json_vocab_destroy(v);
        return st;
    }
    *out = v;
    return ML_OK;
}

ml_status ml_json_vocab_create(const ml_tokenizer *tok, size_t n_vocab, ml_json_vocab **out,
                               char *err, size_t errlen)
{
    if (!tok || !out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "json mode: NULL argument");
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "json mode: n_vocab %zu out of range",
                       n_vocab);
    const char **bytes = malloc(n_vocab * sizeof *bytes);
    size_t *lens = malloc(n_vocab * sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "json mode: out of memory for %zu tokens",
                       n_vocab);
    }
    for (size_t i = 0; i < n_vocab; i++) {
        lens[i] = 0;
        bytes[i] = ml_tokenizer_is_special(tok, (int32_t)i)
                       ? NULL
                       : ml_tokenizer_token_bytes(tok, (int32_t)i, &lens[i]);
    }
    ml_status st = ml_json_vocab_create_from_bytes(bytes, lens, n_vocab, out, err, errlen);
    free(bytes);
    free(lens);
    return st;
}

void ml_json_vocab_destroy(ml_json_vocab *v)
{
    if (!v)
        return;
    free(v->offset);
    free(v->bytes);
    free(v->byte);
    free(v->flags);
    free(v->child);
    free(v->tok);
    free(v->ids);
    free(v->pre_byte);
    free(v->pre_depth);
    free(v->pre_skip);
    free(v->pre_tok);
    free(v->pre_ids);
    free(v->canon_upto);
    free(v->pre_closes);
    for (size_t p = 0; p < JSON_N_PRE; p++)
        free(v->in_string[p]);
    free(v->prose);
    free(v);
}

const uint8_t *ml_json_vocab_token(const ml_json_vocab *v, int32_t token, size_t *len)
{
    if (token < 0 || (size_t)token >= v->n_vocab)
        return NULL;
    *len = v->offset[token + 1] - v->offset[token];
    return *len ? v->bytes + v->offset[token] : NULL;
}

size_t ml_json_vocab_n_vocab(const ml_json_vocab *v)
{
    return v->n_vocab;
}

size_t ml_json_vocab_mask_words(const ml_json_vocab *v)
{
    return v->n_words;
}

const uint64_t *ml_json_vocab_prose(const ml_json_vocab *v)
{
    return v->prose;
}

int ml_json_vocab_blank(const ml_json_vocab *v, int32_t token)
{
    size_t len = 0;
    const uint8_t *b = ml_json_vocab_token(v, token, &len);
    for (size_t i = 0; b && i < len; i++)
        if (!ml_json_is_ws(b[i]))
            return 0;
    return b != NULL;
}

