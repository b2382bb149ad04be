/* Encoding: added-token split, pre-tokenization, byte-level BPE.
 * Reproduces `tokenizers` AddedVocabulary::extract_and_normalize, the Split
 * pre-tokenizer and BPE::tokenize (Word::merge_all) for the Llama 3 layout. */
#include <stdbool.h>
#include <stdlib.h>

#include "tokenizer/tokenizer_internal.h"

/* Pre-tokens up to this many bytes run BPE on stack arrays; longer ones
 * (CJK runs without spaces, long words) use heap scratch for the call. */
#define BPE_STACK_BYTES 256
/* Each merge pushes at most two candidates, after at most n - 1 initial ones. */
#define BPE_HEAP_PER_BYTE 3

/* ---- growable id buffer ----------------------------------------------------- */

#define TOKEN_BUF_MIN_CAP 64

void ml_token_buf_init(ml_token_buf *buf) { *buf = (ml_token_buf){0}; }

void ml_token_buf_deinit(ml_token_buf *buf)
{
    free(buf->ids);
    *buf = (ml_token_buf){0};
}

static ml_status token_buf_reserve(ml_token_buf *buf, size_t extra)
{
    if (extra <= buf->cap - buf->n)
        return ML_OK;
    size_t cap = buf->cap ? buf->cap : TOKEN_BUF_MIN_CAP;
    while (cap - buf->n < extra) {
        if (cap > SIZE_MAX / 2 / sizeof *buf->ids)
            return ML_ERR_NOMEM;
        cap *= 2;
    }
    int32_t *ids = realloc(buf->ids, cap * sizeof *ids);
    if (!ids)
        return ML_ERR_NOMEM;
    buf->ids = ids;
    buf->cap = cap;
    return ML_OK;
}

ml_status ml_token_buf_push(ml_token_buf *buf, int32_t id)
{
    ml_status st = token_buf_reserve(buf, 1);
    if (st != ML_OK)
        return st;
    buf->ids[buf->n++] = id;
    return ML_OK;
}

/* ---- BPE -------------------------------------------------------------------- */

/* A symbol of the word being merged; symbols form a linked list in place. */
typedef struct bpe_symbol {
    int32_t id; /* -1 once merged into its left neighbour */
    int32_t prev;
    int32_t next; /* -1 at the ends */
} bpe_symbol;

/* A candidate merge of the symbol at pos with its right neighbour, with the
 * ids the pair had when it was pushed. */
typedef struct bpe_cand {
    uint32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    int32_t merged;
} bpe_cand;

typedef struct bpe_scratch {
    bpe_symbol *sym;
    bpe_cand *heap;
    size_t cap; /* bytes of pre-token the arrays can take */
    bool on_heap;
    bpe_symbol sym_stack[BPE_STACK_BYTES];
    bpe_cand heap_stack[BPE_STACK_BYTES * BPE_HEAP_PER_BYTE];
} bpe_scratch;

static void scratch_init(bpe_scratch *sc)
{
    sc->sym = sc->sym_stack;
    sc->heap = sc->heap_stack;
    sc->cap = BPE_STACK_BYTES;
    sc->on_heap = false;
}

static void scratch_deinit(bpe_scratch *sc)
{
    if (sc->on_heap) {
        free(sc->sym);
        free(sc->heap);
    }
}

static ml_status scratch_reserve(bpe_scratch *sc, size_t n)
{
    if (n <= sc->cap)
        return ML_OK;
    if (n > INT32_MAX / BPE_HEAP_PER_BYTE)
        return ML_ERR_NOMEM;
    bpe_symbol *sym = malloc(n * sizeof *sym);
    bpe_cand *heap = malloc(n * BPE_HEAP_PER_BYTE * sizeof *heap);
    if (!sym || !heap) {
        free(sym);
        free(heap);
        return ML_ERR_NOMEM;
    }
    scratch_deinit(sc);
    sc->sym = sym;
    sc->heap = heap;
    sc->cap = n;
    sc->on_heap = true;
    return ML_OK;
}

/* Min-heap order: lower rank first, then the leftmost position. */
static inline bool cand_before(const bpe_cand *a, const bpe_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &h[parent]))
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

/* Put c at slot i of h[0..n) and move it down to its place. */
static void heap_sift_down(bpe_cand *h, size_t n, size_t i, bpe_cand c)
{
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n && cand_before(&h[child + 1], &h[child]))
            child++;
        if (!cand_before(&h[child], &c))
            break;
        h[i] = h[child];
        i = child;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n)
{
    bpe_cand top = h[0];
    if (--*n)
        heap_sift_down(h, *n, 0, h[*n]);
    return top;
}

/* The candidate for merging the symbol at pos with its right neighbour;
 * false when there is no neighbour or the pair does not merge. */
static bool pair_cand(const ml_tokenizer *tok, const bpe_symbol *sym, int32_t pos, bpe_cand *c)
{
    int32_t next = sym[pos].next;
    if (next < 0)
        return false;
    const ml_merge_slot *m = ml_merge_find(tok, sym[pos].id, sym[next].id);
    if (!m)
        return false;
    *c = (bpe_cand){.rank = m->rank, .pos = pos, .left = sym[pos].id, .right = sym[next].id,
                    .merged = m->merged};
    return true;
}

/* Append the ids of one pre-token: merge the lowest-ranked adjacent pair,
 * leftmost first, until no pair merges (Word::merge_all). A popped candidate
 * is stale when its symbol was absorbed (id -1) or either side of the pair
 * merged since the push: ids only change by merging, so comparing the two
 * ids detects it. (HF compares the merged id instead; a changed pair spans
 * more bytes and so always names another token: the two tests agree.) */
static ml_status bpe_word(const ml_tokenizer *tok, const uint8_t *w, size_t n, bpe_scratch *sc,
                          ml_token_buf *out)
{
    if (tok->ignore_merges || n == 1) {
        int32_t id = n == 1 ? tok->byte_id[w[0]] : ml_vocab_find(tok, w, n);
        if (id >= 0)
            return ml_token_buf_push(out, id);
    }
    ml_status st = scratch_reserve(sc, n);
    if (st != ML_OK)
        return st;
    bpe_symbol *sym = sc->sym;
    bpe_cand *heap = sc->heap;
    size_t n_heap = 0;
    for (size_t i = 0; i < n; i++)
        sym[i] = (bpe_symbol){.id = tok->byte_id[w[i]], .prev = (int32_t)i - 1,
                              .next = i + 1 < n ? (int32_t)i + 1 : -1};
    /* The initial pairs go in unordered, then one O(n) heapify. */
    for (size_t i = 0; i + 1 < n; i++)
        n_heap += pair_cand(tok, sym, (int32_t)i, &heap[n_heap]);
    for (size_t i = n_heap / 2; i-- > 0;)
        heap_sift_down(heap, n_heap, i, heap[i]);

    while (n_heap) {
        bpe_cand c = heap_pop(heap, &n_heap);
        bpe_symbol *s = &sym[c.pos];
        if (s->id != c.left || s->next < 0 || sym[s->next].id != c.right)
            continue;
        bpe_symbol *right = &sym[s->next];
        s->id = c.merged;
        right->id = -1;
        s->next = right->next;
        if (s->next >= 0)
            sym[s->next].prev = c.pos;
        bpe_cand next;
        if (s->prev >= 0 && pair_cand(tok, sym, s->prev, &next))
            heap_push(heap, &n_heap, next);
        if (pair_cand(tok, sym, c.pos, &next))
            heap_push(heap, &n_heap, next);
    }

    size_t count = 0;
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        count++;
    if ((st = token_buf_reserve(out, count)) != ML_OK)
        return st;
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        out->ids[out->n++] = sym[i].id;
    return ML_OK;
}

/* Pre-tokenize and BPE one stretch of text that holds no added token. */
static ml_status encode_plain(const ml_tokenizer *tok, const uint8_t *s, size_t n,
                              bpe_scratch *sc, ml_token_buf *out)
{
    while (n) {
        size_t m = ml_pretoken_len(s, n);
        ml_status st = bpe_word(tok, s, m, sc, out);
        if (st != ML_OK)
            return st;
        s += m;
        n -= m;
    }
    return ML_OK;
}

/* ---- added tokens -------------------------------------------------------------- */

/* Longest added token that is a prefix of s[0..n): its id and length, or -1.
 * set[] is sorted by content, so the tokens sharing the first k bytes of s
 * are a contiguous range, and the one equal to those k bytes (if any) opens
 * it: narrowing the range byte by byte walks a trie without storing one. */
static int32_t match_added(const ml_added_token *set, size_t n_set, const uint8_t *s, size_t n,
                           size_t *match_len)
{
    size_t lo = 0, hi = n_set;
    int32_t best = -1;
    for (size_t k = 0; lo < hi; k++) {
        if (set[lo].len == k) {
            best = set[lo].id;
            *match_len = k;
            lo++;
        }
        if (k == n || lo == hi)
            break;
        /* Every token in [lo, hi) is longer than k: bisect on byte k. */
        uint8_t c = s[k];
        size_t a = lo, b = hi;
        while (a < b) {
            size_t mid = a + (b - a) / 2;
            if (set[mid].text[k] < c)
                a = mid + 1;
            else
                b = mid;
        }
        lo = a;
        b = hi;
        while (a < b) {
            size_t mid = a + (b - a) / 2;
            if (set[mid].text[k] <= c)
                a = mid + 1;
            else
                b = mid;
        }
        hi = a;
    }
    return best;
}

ml_status ml_tokenizer_encode(const ml_tokenizer *tok, const char *text, size_t len,
                              unsigned flags, ml_token_buf *out, char *err, size_t errlen)
{
    if (!tok || !out || (!text && len))
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "tokenizer encode: NULL argument");
    bool special = flags & ML_ENCODE_PARSE_SPECIAL;
    const ml_added_token *set = special ? tok->added_all : tok->added_plain;
    size_t n_set = special ? tok->n_added_all : tok->n_added_plain;
    uint8_t first_bit = special ? ML_ADDED_FIRST_ANY : ML_ADDED_FIRST_PLAIN;
    const uint8_t *s = (const uint8_t *)text;
    size_t n0 = out->n, start = 0;
    ml_status st = ML_OK;
    bpe_scratch sc;
    scratch_init(&sc);

    /* Leftmost match wins, the longest at that position (aho-corasick's
     * LeftmostLongest in HF): scan positions in order. */
    for (size_t i = 0; i < len && st == ML_OK;) {
        size_t mlen = 0;
        int32_t id = (tok->added_first[s[i]] & first_bit)
                         ? match_added(set, n_set, s + i, len - i, &mlen)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        st = encode_plain(tok, s + start, i - start, &sc, out);
        if (st == ML_OK)
            st = ml_token_buf_push(out, id);
        i += mlen;
        start = i;
    }
    if (st == ML_OK)
        st = encode_plain(tok, s + start, len - start, &sc, out);
    scratch_deinit(&sc);
    if (st != ML_OK) {
        out->n = n0;
        return ml_fail(err, errlen, st, "tokenizer encode: out of memory (%zu bytes of text)",
                       len);
    }
    return ML_OK;
}
