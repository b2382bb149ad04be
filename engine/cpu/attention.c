/* Attention: the three kinds of backend.h (vision bidirectional, causal over
 * the paged cache, cross over resident vision K/V) as one flash-style loop.
 *
 * A row block is up to ATTN_BQ query rows sharing one K/V stream:
 * (sequence, kv head, rows r0 .. r0+nq), where row r is token r / group and
 * query head kv_head·group + r % group, so the GQA heads of one kv head read
 * each key once. A work item is up to ATTN_ITEM_BLOCKS consecutive row
 * blocks of one (sequence, kv head), which take each key block in turn.
 * For each block of up to ATTN_BK keys that some row of the item may see,
 * and each row block that may see it:
 *   K, V (nk, head_dim)     key and value rows, in place (vision: a copy of
 *                           K and V by head, made once per call; cross: the
 *                           image state; both prefetched while the previous
 *                           block runs) or gathered from the paged cache
 *                           (causal)
 *   S (nk, nq) = K · Qᵀ     gemm_tile; Qᵀ (head_dim, nq) packed once per row block
 *                           (cross: Sᵀ = Q · Kᵀ from the state's transposed K,
 *                           then transposed: the same sums, see scores_keys)
 *   masked entries of S = -inf
 *   online softmax down S's columns (softmax_block, in powers of 2 of
 *                           scores scaled by scale · log2 e); O rows *= alpha
 *   O (nq, head_dim) += Sᵀ · V    gemm_tile reading S column-major
 * and at the end out = O / l. No score matrix larger than one (BK, BQ) block
 * exists; all arithmetic is f32 with max subtraction.
 *
 * Masks are exclusions rather than HF's additive finfo(bf16).min
 * (-3.39e38): adding that constant makes a masked weight exactly 0 whenever
 * its row has one unmasked key, which every row here has (a valid vision
 * query sees every key and an invalid one the valid keys, which the graph
 * guarantees exist; a causal row sees itself; a cross row sees its chunks
 * or, seeing none, all keys unmasked as HF's full_text_row_mask makes it).
 * The one row without any key, a cross row of a text-only sequence, is 0.
 *
 * Threads claim items in order from a counter they share, so that each
 * takes another as soon as it is free: a thread the host slows (another
 * process on its core, the worker's own I/O threads) runs fewer, and the
 * causal triangle's unequal items balance. Each item's result does not
 * depend on the thread that runs it, nor on the thread count.
 *
 * bf16 activations (cb->bf16_x, ml_backend_cpu_bf16_activations): the
 * vision tower's attention, most of its time, multiplies in bf16 as
 * transformers' bf16 model does. Q, K and V are rounded to bf16 once per
 * call (K in pairs along head_dim, V in pairs of keys, in the act buffer),
 * and both products run gemm_tile_bf16: S from K and Qᵀ in pairs, then,
 * after the f32 online softmax, O from the weights rounded to bf16 in pairs
 * of keys and V. The scores, the softmax, its sums and O stay f32. Needs an
 * even head_dim and sequence length (the engine's are: multiples of 8);
 * otherwise the f32 path runs. The causal and cross kinds compute in f32.
 *
 * A bf16 K/V cache (ml_cpu_kv16, ml_backend_cpu_bf16_kv_cache): the causal
 * gather widens each key's bf16 K and V rows into its f32 block as it
 * copies them, and cross attention, whose keys are otherwise used in place,
 * widens each visited block of an image's K and V likewise (prefetching the
 * next block's bf16 lines meanwhile); the tiles then run on f32 blocks as
 * before. Widening is exact, so the results are the f32 cache's for K and V
 * rounded to bf16. */
#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "dtype.h"

/* Query rows per item and keys per block: multiples of every ISA's tile
 * shape (12 x 32, 6 x 16); S (BK x BQ) fits in L1. */
#define ATTN_BQ 96
#define ATTN_BK 96
/* Row blocks of one item. A head's K and V over a 4-tile image are 4 MB
 * in the vision tower at the real widths (6432 keys x 80 x 2) and 6.6 MB
 * per kv head of an image state (x 128), past L2, so an item of one row
 * block read every key block from the L3 and waited on it; a causal item
 * gathered every key block from the paged cache. Each key block serves the
 * item's row blocks from L1 and L2 after the first (and a gathered or
 * widened block is made once for them). Measured (`bench_cpu_ops`, the
 * Intel Xeon VM, 2026-12-06, against one row block): attn_vision at 16
 * heads x 80, a 4-tile image, 2 threads on malloc's 4 KiB pages 1014-1022
 * -> 938-949 ms with 3 (931-948 with 4, 971-982 with 2, 971 with 6), one
 * thread on the backend's huge pages 1764-1776 -> 1644-1656 ms; a 2-tile
 * image 772-814 -> 717-729 ms (2 threads); attn_cross, 32 sequences on a
 * 4-tile image, 153-155 -> 133-135 ms. Three fit the thread's scratch as
 * the matmul sizes it. */
#define ATTN_ITEM_BLOCKS 3
/* log2 e: the softmax runs in powers of 2 (softmax_block), its scores
 * scaled by scale · log2 e, so that each weight's exponential needs no
 * reduction by ln 2. */
#define LOG2_E 1.4426950408889634
/* Bytes per cache line, the prefetch stride. */
#define CACHE_LINE 64
/* Keys ahead of the one it copies that the causal gather prefetches (into
 * L2): a decode step's attention is a stream of paged K/V rows, a few
 * hundred bytes each at scattered slots, which waited on memory one row
 * at a time (the copy loop was 11% of a 16-sequence decode run's samples).
 * Measured on the 2-vCPU AMD EPYC VM, `small`, 256 tokens a sequence,
 * alternating processes: 16 sequences 0.89-0.94x the step time with bf16
 * activations, 0.87-0.88x in f32 (a third pair 1.05x), 1 sequence
 * 0.91-0.97x; 24 keys ahead no better. Reading the rows where they are
 * instead (the scores over each run of consecutive slots, PV with V's rows
 * by pointer, the next block and the next item's first block prefetched;
 * the same bits) took 0.98-1.07x the step time (2026-12-04, 3 alternating
 * pairs, 16 sequences, 250 tokens, bf16 activations): the misses the copy
 * waited on moved into the tiles, which then ran 2.5x longer. Nor did a
 * block laid out by kv head, (kv head, slot, dim), which makes an item's
 * keys of a block one run copied at once: 0.93-1.09x, median 1.02 (8 pairs,
 * 16 sequences, 1,141 tokens, f32, the same bits; tests/bench/results-log.md). */
#define GATHER_AHEAD 8

/* The bf16 weights (BK / 2, BQ) pairs of keys reuse the gathered-K scratch,
 * which vision keys (used in place) leave free. */
_Static_assert(ATTN_BK % 2 == 0 && ATTN_BQ / 2 <= ML_CPU_MAX_HEAD_DIM,
               "bf16 attention: the weights' pairs fit the K scratch");

typedef enum attn_kind {
    ATTN_VISION,
    ATTN_CAUSAL,
    ATTN_CROSS,
} attn_kind;

/* One attention call in a kind-neutral form plus each kind's extras. */
typedef struct attn_job {
    attn_kind kind;
    float *out;          /* (tokens, n_heads, head_dim) */
    const float *q;      /* (tokens, n_heads, head_dim) */
    /* causal: the paged caches of its params, f32, or bf16 where ml_cpu_kv16
     * says so; vision in f32: K and V by head, (n_seqs, n_kv_heads, seq_len,
     * head_dim) (ml_cpu_attn_vision; with bf16 activations the items read
     * k2 and v2 below instead, and blocks of k and v are never read); see
     * key_block */
    const void *k, *v;
    int n_seqs, n_heads, n_kv_heads, group, head_dim;
    float scale;
    /* scale · log2 e (run): softmax_block's scale, whose exponentials are
     * powers of 2 */
    float scale2;
    /* vision */
    const uint8_t *valid; /* (n_seqs, seq_len) */
    int seq_len;
    /* vision with bf16 activations, else NULL: K rounded in pairs along
     * head_dim, (n_seqs, n_kv_heads, seq_len, kpairs) dwords (a head's keys
     * together: rows n_kv_heads apart fell on a few L1 sets); V rounded in pairs of
     * keys, (n_seqs, n_kv_heads, seq_len / 2, head_dim) dwords, or on AMX
     * its transpose (n_seqs, n_kv_heads, head_dim, seq_len / 2), the
     * product's A as it loads */
    const uint32_t *k2, *v2;
    /* K's pairs per head in k2: head_dim / 2, or on AMX that rounded up to
     * whole chunks of the kernel with zero pairs (so that no score takes
     * a short last chunk, which the kernel copies) */
    int kpairs;
    /* vision with bf16 activations on gemm_tile_amx (cb->amx): O is kept
     * transposed, Oᵀ (head_dim, BQ), the product of Vᵀ and the weights */
    int amx;
    /* causal, cross */
    const int32_t *seq_start;
    /* causal */
    const int32_t *block_table, *pos0;
    int max_blocks, block_size;
    /* cross: image i of sequence s has its keys (image_keys, n_kv_heads,
     * head_dim) k_offset bytes into states[s * max_images + i] */
    const void *const *states;
    size_t k_offset, v_offset;
    const int32_t *n_images; /* (n_seqs) */
    const uint8_t *allowed;  /* (tokens, n_chunks) */
    int max_images, max_tiles, n_chunks, chunk_len, image_keys;

    const ml_cpu_backend *cb;
    int64_t n_items;
    atomic_int_fast64_t next_item; /* the first item no thread has claimed */
} attn_job;

/* Where one item is: sequence, kv head, group of row blocks. */
typedef struct attn_cursor {
    int seq, kv_head, row_group;
} attn_cursor;

/* Per-column masking data of one item. */
typedef struct attn_cols {
    int nq;
    uint8_t q_invalid[ATTN_BQ];     /* vision: query is padding: sees valid keys only */
    int any_invalid;
    int all_invalid;                /* vision: every query is padding */
    int32_t last_key[ATTN_BQ];      /* causal: highest key position visible */
    const uint8_t *chunks[ATTN_BQ]; /* cross: allowed chunks, NULL = every key */
} attn_cols;

/* Scratch of one row block of an item: Qᵀ (head_dim, BQ), S (BK, BQ), O
 * (BQ, head_dim). */
#define BLOCK_SCRATCH_FLOATS                                                              \
    ((size_t)ML_CPU_MAX_HEAD_DIM * ATTN_BQ + (size_t)ATTN_BK * ATTN_BQ +                 \
     (size_t)ATTN_BQ * ML_CPU_MAX_HEAD_DIM)

size_t ml_cpu_attn_scratch_floats(void)
{
    /* gathered or widened K and V, cross attention's Sᵀ, then each row
     * block's */
    return 2 * (size_t)ATTN_BK * ML_CPU_MAX_HEAD_DIM + (size_t)ATTN_BK * ATTN_BQ +
           ATTN_ITEM_BLOCKS * BLOCK_SCRATCH_FLOATS;
}

static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

static int seq_tokens(const attn_job *j, int s)
{
    switch (j->kind) {
    case ATTN_VISION: return j->seq_len;
    case ATTN_CAUSAL:
    case ATTN_CROSS: return j->seq_start[s + 1] - j->seq_start[s];
    }
    return 0;
}

/* Index of the sequence's first token in q and out. */
static int seq_first_token(const attn_job *j, int s)
{
    switch (j->kind) {
    case ATTN_VISION: return s * j->seq_len;
    case ATTN_CAUSAL:
    case ATTN_CROSS: return j->seq_start[s];
    }
    return 0;
}

static int seq_row_blocks(const attn_job *j, int s)
{
    return (seq_tokens(j, s) * j->group + ATTN_BQ - 1) / ATTN_BQ;
}

static int seq_row_groups(const attn_job *j, int s)
{
    return (seq_row_blocks(j, s) + ATTN_ITEM_BLOCKS - 1) / ATTN_ITEM_BLOCKS;
}

static int64_t seq_items(const attn_job *j, int s)
{
    return (int64_t)j->n_kv_heads * seq_row_groups(j, s);
}

/* Prefetch the cache lines of `bytes` bytes at p into L1 (to_l1) or L2. */
static void prefetch_span(const void *p, size_t bytes, int to_l1)
{
    const uintptr_t first = (uintptr_t)p & ~(uintptr_t)(CACHE_LINE - 1);
    const uintptr_t last = (uintptr_t)p + bytes - 1;
    for (uintptr_t line = first; line <= last; line += CACHE_LINE) {
        if (to_l1)
            __builtin_prefetch((const void *)line, 0, 3);
        else
            __builtin_prefetch((const void *)line, 0, 2);
    }
}

/* Prefetch the first hd floats of n rows (row stride ld). Keys used in
 * place are short runs a whole token apart, which the hardware prefetchers
 * do not follow: unprefetched, each block of K and V arrives one demand miss
 * at a time. */
static void prefetch_rows(const float *rows, size_t ld, int n, int hd, int to_l1)
{
    for (int r = 0; r < n; r++)
        prefetch_span(rows + (size_t)r * ld, (size_t)hd * sizeof *rows, to_l1);
}

/* n elements of the cache or a state at element offset at, copied (f32) or
 * widened (bf16: exact) into dst. */
static void kv_load(const attn_job *j, float *dst, const void *base, size_t at, size_t n)
{
    if (ml_cpu_kv16(j->cb))
        j->cb->kern->bf16_widen(dst, (const uint16_t *)base + at, n);
    else
        memcpy(dst, (const float *)base + at, n * sizeof *dst);
}

/* The offset in the paged K (and V) cache of key pos of kv head kvh in
 * sequence s. */
static size_t causal_row(const attn_job *j, int s, int kvh, int pos)
{
    const int32_t blk = j->block_table[(size_t)s * j->max_blocks + (size_t)(pos / j->block_size)];
    const size_t slot = (size_t)blk * j->block_size + (size_t)(pos % j->block_size);
    return (slot * (size_t)j->n_kv_heads + (size_t)kvh) * (size_t)j->head_dim;
}

/* A block of keys: its first key and value, and their strides. K holds
 * the keys' rows (ldk floats apart), except in cross attention, whose state
 * holds K transposed (ml_cpu_kv_store_keys): head_dim rows of ldk keys. V
 * holds the rows of the values, ldv floats apart. */
typedef struct key_blk {
    const float *k, *v;
    size_t ldk, ldv;
} key_blk;

/* Keys in the block starting at key kb (< n_keys): up to ATTN_BK; a cross
 * block never straddles two images. */
static int block_keys(const attn_job *j, int kb, int n_keys)
{
    const int nk = imin(ATTN_BK, n_keys - kb);
    return j->kind == ATTN_CROSS ? imin(nk, j->image_keys - kb % j->image_keys) : nk;
}

/* Whether the item reads its keys where they are (vision, and cross over
 * f32 states) rather than from copies in its scratch. */
static int keys_in_place(const attn_job *j)
{
    return j->kind == ATTN_VISION || (j->kind == ATTN_CROSS && !ml_cpu_kv16(j->cb));
}

/* The nk keys from key kb of kv head kvh in sequence s: sets *b. Keys in
 * place are used where they are (kp, vp are not touched and may be NULL);
 * the others are copied into kp, vp, each (ATTN_BK, head_dim) floats:
 * causal keys gathered from the paged cache, cross keys widened from bf16
 * states (K transposed, (head_dim, ATTN_BK)). A copy prefetches into L2
 * meanwhile the `ahead` keys the item visits after the block. */
static void key_block(const attn_job *j, int s, int kvh, int kb, int nk, int ahead, float *kp,
                      float *vp, key_blk *b)
{
    const size_t hd = (size_t)j->head_dim, n_kv = (size_t)j->n_kv_heads;
    switch (j->kind) {
    case ATTN_VISION: {
        const size_t off = (((size_t)s * n_kv + (size_t)kvh) * j->seq_len + (size_t)kb) * hd;
        *b = (key_blk){.k = (const float *)j->k + off, .v = (const float *)j->v + off,
                       .ldk = hd, .ldv = hd};
        return;
    }
    case ATTN_CROSS: {
        const int img = kb / j->image_keys, first = kb % j->image_keys;
        const char *state = j->states[(size_t)s * j->max_images + (size_t)img];
        const void *kbase = state + j->k_offset, *vbase = state + j->v_offset;
        const size_t keys = (size_t)j->image_keys, ldv = n_kv * hd;
        const size_t k_at = (size_t)kvh * hd * keys + (size_t)first;
        const size_t v_at = ((size_t)first * n_kv + (size_t)kvh) * hd;
        if (!ml_cpu_kv16(j->cb)) {
            *b = (key_blk){.k = (const float *)kbase + k_at, .v = (const float *)vbase + v_at,
                           .ldk = keys, .ldv = ldv};
            return;
        }
        /* The next block's lines, when it is of this image. */
        const int next = first + nk < j->image_keys ? imin(ahead, ATTN_BK) : 0;
        const size_t eb = j->cb->ops.kv_elem_size;
        for (size_t d = 0; d < hd; d++) {
            if (next)
                prefetch_span((const char *)kbase + (k_at + d * keys + (size_t)nk) * eb,
                              (size_t)next * eb, 0);
            kv_load(j, kp + d * ATTN_BK, kbase, k_at + d * keys, (size_t)nk);
        }
        for (int key = 0; key < nk; key++) {
            if (key < next)
                prefetch_span((const char *)vbase + (v_at + (size_t)(nk + key) * ldv) * eb,
                              hd * eb, 0);
            kv_load(j, vp + (size_t)key * hd, vbase, v_at + (size_t)key * ldv, hd);
        }
        *b = (key_blk){.k = kp, .v = vp, .ldk = ATTN_BK, .ldv = hd};
        return;
    }
    case ATTN_CAUSAL: {
        const size_t eb = j->cb->ops.kv_elem_size;
        for (int key = 0; key < nk; key++) {
            const int pos = kb + key;
            if (key + GATHER_AHEAD < nk + ahead) {
                const size_t at = causal_row(j, s, kvh, pos + GATHER_AHEAD) * eb;
                prefetch_span((const char *)j->k + at, hd * eb, 0);
                prefetch_span((const char *)j->v + at, hd * eb, 0);
            }
            const size_t row = causal_row(j, s, kvh, pos);
            kv_load(j, kp + (size_t)key * hd, j->k, row, hd);
            kv_load(j, vp + (size_t)key * hd, j->v, row, hd);
        }
        *b = (key_blk){.k = kp, .v = vp, .ldk = hd, .ldv = hd};
        return;
    }
    }
}

/* Move the cursor `steps` items forward; seq == n_seqs means past the end. */
static void cursor_advance(const attn_job *j, attn_cursor *c, int64_t steps)
{
    int64_t idx = (int64_t)c->kv_head * seq_row_groups(j, c->seq) + c->row_group + steps;
    while (c->seq < j->n_seqs && idx >= seq_items(j, c->seq)) {
        idx -= seq_items(j, c->seq);
        c->seq++;
    }
    if (c->seq < j->n_seqs) {
        const int ng = seq_row_groups(j, c->seq);
        c->kv_head = (int)(idx / ng);
        c->row_group = (int)(idx % ng);
    }
}

/* S[key][c] = -inf where column c may not see key kb + key. */
static void apply_mask(const attn_job *j, const attn_cols *cols, int s, int kb, int nk, float *sc)
{
    switch (j->kind) {
    case ATTN_VISION:
        if (!cols->any_invalid)
            return;
        for (int key = 0; key < nk; key++) {
            if (j->valid[(size_t)s * j->seq_len + (size_t)(kb + key)])
                continue;
            float *row = sc + (size_t)key * ATTN_BQ;
            for (int c = 0; c < cols->nq; c++)
                if (cols->q_invalid[c])
                    row[c] = -INFINITY;
        }
        return;
    case ATTN_CAUSAL:
        for (int c = 0; c < cols->nq; c++) {
            const int first = cols->last_key[c] + 1 - kb;
            for (int key = first < 0 ? 0 : first; key < nk; key++)
                sc[(size_t)key * ATTN_BQ + c] = -INFINITY;
        }
        return;
    case ATTN_CROSS:
        for (int c = 0; c < cols->nq; c++) {
            if (!cols->chunks[c])
                continue;
            for (int key = kb; key < kb + nk;) {
                const int chunk = key / j->chunk_len;
                const int end = imin((chunk + 1) * j->chunk_len, kb + nk);
                if (!cols->chunks[c][chunk])
                    for (; key < end; key++)
                        sc[(size_t)(key - kb) * ATTN_BQ + c] = -INFINITY;
                key = end;
            }
        }
        return;
    }
}

/* Cross: whether no column may see a key of chunks first .. last. A column
 * with chunks[c] == NULL sees every key (all its chunks allowed, or none:
 * HF's full_text_row_mask quirk), so one such column keeps every block. The
 * group columns of one token share its mask row: each row is read once. */
static int cross_chunks_masked(const attn_cols *cols, int first, int last)
{
    for (int c = 0; c < cols->nq; c++) {
        const uint8_t *row = cols->chunks[c];
        if (!row)
            return 0;
        if (c > 0 && row == cols->chunks[c - 1])
            continue;
        for (int ch = first; ch <= last; ch++)
            if (row[ch])
                return 0;
    }
    return 1;
}

/* Whether every score of the key block kb .. kb+nk is masked in every
 * column. Such a block changes nothing: its weights are exp(-inf) = 0 and
 * alpha = exp(0) = 1 (or, before the first visible key, m, l and O stay at
 * -inf, 0 and 0), so the item skips it. */
static int block_masked(const attn_job *j, const attn_cols *cols, int s, int kb, int nk)
{
    switch (j->kind) {
    case ATTN_VISION: {
        if (!cols->all_invalid)
            return 0;
        const uint8_t *valid = j->valid + (size_t)s * j->seq_len + (size_t)kb;
        for (int key = 0; key < nk; key++)
            if (valid[key])
                return 0;
        return 1;
    }
    case ATTN_CAUSAL: /* an item's keys end at its last visible one */
        return 0;
    case ATTN_CROSS: /* e.g. the empty tile slots of an image with fewer tiles */
        return cross_chunks_masked(cols, kb / j->chunk_len, (kb + nk - 1) / j->chunk_len);
    }
    return 0;
}

/* Per-column mask data for rows r0 .. r0+nq of sequence s; returns the
 * number of keys the item must visit. */
static int item_columns(const attn_job *j, int s, int r0, int nq, attn_cols *cols)
{
    cols->nq = nq;
    cols->any_invalid = 0;
    cols->all_invalid = 0;
    switch (j->kind) {
    case ATTN_VISION:
        cols->all_invalid = 1;
        for (int c = 0; c < nq; c++) {
            const int t = (r0 + c) / j->group;
            cols->q_invalid[c] = !j->valid[(size_t)s * j->seq_len + (size_t)t];
            cols->any_invalid |= cols->q_invalid[c];
            cols->all_invalid &= cols->q_invalid[c];
        }
        return j->seq_len;
    case ATTN_CAUSAL: {
        int n_keys = 0;
        for (int c = 0; c < nq; c++) {
            cols->last_key[c] = j->pos0[s] + (r0 + c) / j->group;
            if (cols->last_key[c] + 1 > n_keys)
                n_keys = cols->last_key[c] + 1;
        }
        return n_keys;
    }
    case ATTN_CROSS: {
        const int chunks = j->n_images[s] * j->max_tiles, tok0 = seq_first_token(j, s);
        for (int c = 0; c < nq; c++) {
            const uint8_t *row = j->allowed + (size_t)(tok0 + (r0 + c) / j->group) * j->n_chunks;
            int seen = 0;
            for (int ch = 0; ch < chunks; ch++)
                seen += row[ch] != 0;
            /* None allowed: HF zeroes the whole additive row (full_text_row_mask).
             * All allowed: nothing to mask. */
            cols->chunks[c] = seen == 0 || seen == chunks ? NULL : row;
        }
        return chunks * j->chunk_len;
    }
    }
    return 0;
}

/* bf16, vision: S (nk, BQ) = K · Qᵀ for the key block kb of kv head kvh in
 * sequence s from the pairs of k2 and qt2 (head_dim / 2, BQ); the rows of
 * the next block (kb_next, -1: none) go to L2 meanwhile, as in the f32
 * path. */
static void scores_bf16(const attn_job *j, int s, int kvh, int kb, int nk, int kb_next,
                        const uint32_t *qt2, int nq, float *sc)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const int mr = j->amx ? ML_CPU_AMX_TILE_ROWS : kn->tile_rows;
    const int nr = j->amx ? ML_CPU_MAX_STRIP_COLS : kn->tile_cols, kp = j->kpairs;
    const size_t ld = (size_t)kp;
    const uint32_t *k2 =
        j->k2 + (((size_t)s * j->n_kv_heads + (size_t)kvh) * j->seq_len + (size_t)kb) * ld;
    const uint32_t *next = kb_next < 0 ? NULL : k2 + (size_t)(kb_next - kb) * ld;
    for (int k0 = 0; k0 < nk; k0 += mr) {
        if (next && kb_next + k0 < j->seq_len)
            prefetch_rows((const float *)next + (size_t)k0 * ld, ld,
                          imin(mr, j->seq_len - kb_next - k0), kp, 0);
        for (int c0 = 0; c0 < nq; c0 += nr) {
            const int m = imin(mr, nk - k0), n = imin(nr, nq - c0);
            float *c = sc + (size_t)k0 * ATTN_BQ + c0;
            if (j->amx)
                kn->gemm_tile_amx(m, n, kp, k2 + (size_t)k0 * ld, ld, qt2 + c0, ATTN_BQ, NULL, c,
                                  ATTN_BQ, 0);
            else
                kn->gemm_tile_bf16(m, n, kp, k2 + (size_t)k0 * ld, ld, 1, qt2 + c0, ATTN_BQ, NULL,
                                   c, ATTN_BQ, 0);
        }
    }
}

/* bf16, vision: O (nq, head_dim) += the weights S (nk, BQ) of the key block
 * kb, rounded in pairs of keys into s2 (nk / 2, BQ), times its V pairs. */
static void values_bf16(const attn_job *j, int s, int kvh, int kb, int nk, const float *sc,
                        int nq, uint32_t *s2, float *o)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const int mr = kn->tile_rows, nr = kn->tile_cols, hd = j->head_dim;
    assert(nk % 2 == 0 && kb % 2 == 0);
    for (int p = 0; p < nk / 2; p++)
        kn->bf16_pair_rows(s2 + (size_t)p * ATTN_BQ, sc + (size_t)2 * p * ATTN_BQ,
                           sc + (size_t)(2 * p + 1) * ATTN_BQ, (size_t)nq);
    const size_t per_seq = (size_t)j->seq_len / 2;
    const size_t head = (size_t)s * j->n_kv_heads + (size_t)kvh;
    if (j->amx) { /* Oᵀ (head_dim, BQ) += Vᵀ · the weights' pairs */
        const int tr = ML_CPU_AMX_TILE_ROWS, tc = ML_CPU_MAX_STRIP_COLS;
        const uint32_t *vt = j->v2 + head * (size_t)hd * per_seq + (size_t)kb / 2;
        for (int d0 = 0; d0 < hd; d0 += tr)
            for (int c0 = 0; c0 < nq; c0 += tc)
                kn->gemm_tile_amx(imin(tr, hd - d0), imin(tc, nq - c0), nk / 2,
                                  vt + (size_t)d0 * per_seq, per_seq, s2 + c0, ATTN_BQ, NULL,
                                  o + (size_t)d0 * ATTN_BQ + c0, ATTN_BQ, 1);
        return;
    }
    const uint32_t *v2 = j->v2 + (head * per_seq + (size_t)kb / 2) * (size_t)hd;
    for (int c0 = 0; c0 < nq; c0 += mr)
        for (int d0 = 0; d0 < hd; d0 += nr)
            kn->gemm_tile_bf16(imin(mr, nq - c0), imin(nr, hd - d0), nk / 2, s2 + c0, 1, ATTN_BQ,
                               v2 + d0, (size_t)hd, NULL,
                               o + (size_t)c0 * hd + d0, (size_t)hd, 1);
}

/* Vision and causal in f32: S (nk, BQ) = K · Qᵀ of the key block blk from
 * its rows and qt (head_dim, BQ). Meanwhile the next block's (next, nk_next
 * of them; 0: none) K rows go to L2 and, with fetch_v, keys used in place
 * (vision) send this block's V rows to L1 for the PV product. */
static void scores_rows(const attn_job *j, const key_blk *blk, int nk, int fetch_v,
                        const key_blk *next, int nk_next, const float *qt, int nq, float *sc)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const int mr = kn->tile_rows, nr = kn->tile_cols, hd = j->head_dim;
    const int in_place = fetch_v && keys_in_place(j);
    for (int k0 = 0; k0 < nk; k0 += mr) {
        if (in_place)
            prefetch_rows(blk->v + (size_t)k0 * blk->ldv, blk->ldv, imin(mr, nk - k0), hd, 1);
        if (k0 < nk_next)
            prefetch_rows(next->k + (size_t)k0 * next->ldk, next->ldk, imin(mr, nk_next - k0),
                          hd, 0);
        for (int c0 = 0; c0 < nq; c0 += nr)
            kn->gemm_tile(imin(mr, nk - k0), imin(nr, nq - c0), hd, blk->k + (size_t)k0 * blk->ldk,
                          blk->ldk, 1, qt + c0, ATTN_BQ, sc + (size_t)k0 * ATTN_BQ + c0, ATTN_BQ,
                          0);
    }
}

/* Cross: S (nk, BQ) of the key block blk from its transposed K. Sᵀ (nq, nk)
 * = Q · Kᵀ runs in gemm_tile's tiles of query rows by a vector of keys, so
 * that a decode step's few rows (one token's GQA group) fill the vector
 * lanes, which they fill a quarter of as the columns of K · Qᵀ. Each score
 * is the same sum, over head_dim in increasing order, as K · Qᵀ's: the
 * bits do not change. Sᵀ goes to st (nq, BK) and is transposed into sc.
 * Meanwhile the next block's keys (next, nk_next of them; 0: none) go to L2
 * and, with fetch_v, this block's V rows to L1 for the PV product. */
static void scores_keys(const attn_job *j, const key_blk *blk, int nk, int fetch_v,
                        const key_blk *next, int nk_next, const float *qt, int nq, float *st,
                        float *sc)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const int mr = kn->tile_rows, nr = kn->tile_cols, hd = j->head_dim;
    for (int k0 = 0; k0 < nk; k0 += nr) {
        const int n = imin(nr, nk - k0);
        if (fetch_v && keys_in_place(j))
            prefetch_rows(blk->v + (size_t)k0 * blk->ldv, blk->ldv, n, hd, 1);
        if (k0 < nk_next)
            prefetch_rows(next->k + k0, next->ldk, hd, imin(nr, nk_next - k0), 0);
        for (int c0 = 0; c0 < nq; c0 += mr)
            kn->gemm_tile(imin(mr, nq - c0), n, hd, qt + c0, 1, ATTN_BQ, blk->k + k0, blk->ldk,
                          st + (size_t)c0 * ATTN_BK + k0, ATTN_BK, 0);
    }
    for (int key = 0; key < nk; key++)
        for (int c = 0; c < nq; c++)
            sc[(size_t)key * ATTN_BQ + c] = st[(size_t)c * ATTN_BK + key];
}

/* One row block of an item: its queries, running softmax and output. */
typedef struct row_block {
    int r0, nq, n_keys;
    float *qt; /* Qᵀ (head_dim, BQ); bf16: (kpairs, BQ) pairs */
    float *sc; /* S (BK, BQ) */
    float *o;  /* O (BQ, head_dim); on AMX Oᵀ (head_dim, BQ) */
    float m[ATTN_BQ], l[ATTN_BQ], alpha[ATTN_BQ];
    attn_cols cols;
} row_block;

/* O scaled by the softmax's alpha, each row (column of Oᵀ) by its own. */
static void rescale_o(const attn_job *j, row_block *rb)
{
    const int hd = j->head_dim, nq = rb->nq;
    int all_one = 1;
    for (int c = 0; c < nq; c++)
        all_one &= rb->alpha[c] == 1.0f;
    if (all_one)
        return;
    if (j->amx) {
        for (int d = 0; d < hd; d++) {
            float *ocol = rb->o + (size_t)d * ATTN_BQ;
            for (int c = 0; c < nq; c++)
                ocol[c] *= rb->alpha[c];
        }
        return;
    }
    for (int c = 0; c < nq; c++) {
        if (rb->alpha[c] == 1.0f)
            continue;
        float *orow = rb->o + (size_t)c * hd;
        for (int d = 0; d < hd; d++)
            orow[d] *= rb->alpha[c];
    }
}

/* The block's Qᵀ packed, its softmax state and O cleared, its columns'
 * masks read. */
static void row_block_start(const attn_job *j, const attn_cursor *cur, row_block *rb)
{
    const int hd = j->head_dim, group = j->group, s = cur->seq, tok0 = seq_first_token(j, s);
    uint32_t *qt2 = (uint32_t *)rb->qt;
    for (int c = 0; c < rb->nq; c++) {
        const int r = rb->r0 + c;
        const int head = cur->kv_head * group + r % group;
        const float *qr = j->q + ((size_t)(tok0 + r / group) * j->n_heads + (size_t)head) * hd;
        if (j->k2) {
            for (int d = 0; d < hd / 2; d++)
                qt2[(size_t)d * ATTN_BQ + c] = ml_cpu_bf16_pair(qr[2 * d], qr[2 * d + 1]);
            for (int d = hd / 2; d < j->kpairs; d++) /* k2's zero pairs */
                qt2[(size_t)d * ATTN_BQ + c] = 0;
        } else
            for (int d = 0; d < hd; d++)
                rb->qt[(size_t)d * ATTN_BQ + c] = qr[d];
        rb->m[c] = -INFINITY;
        rb->l[c] = 0.0f;
    }
    memset(rb->o, 0, (size_t)(j->amx ? ATTN_BQ : rb->nq) * hd * sizeof *rb->o);
    rb->n_keys = item_columns(j, s, rb->r0, rb->nq, &rb->cols);
}

/* Whether the key block kb .. kb+nk adds nothing to the row block. */
static int row_block_skips(const attn_job *j, const row_block *rb, int s, int kb, int nk)
{
    return kb >= rb->n_keys || block_masked(j, &rb->cols, s, kb, nk);
}

/* Whether some of the item's row blocks see a key of the block. */
static int key_block_needed(const attn_job *j, const row_block *rbs, int blocks, int s, int kb,
                            int nk)
{
    for (int b = 0; b < blocks; b++)
        if (!row_block_skips(j, &rbs[b], s, kb, nk))
            return 1;
    return 0;
}

/* out = O / l for the block's rows. */
static void row_block_finish(const attn_job *j, const attn_cursor *cur, const row_block *rb)
{
    const int hd = j->head_dim, group = j->group, tok0 = seq_first_token(j, cur->seq);
    for (int c = 0; c < rb->nq; c++) {
        const int r = rb->r0 + c;
        const int head = cur->kv_head * group + r % group;
        float *out = j->out + ((size_t)(tok0 + r / group) * j->n_heads + (size_t)head) * hd;
        for (int d = 0; d < hd; d++) { /* no key at all (text-only cross rows): 0, not 0/0 */
            const float o = j->amx ? rb->o[(size_t)d * ATTN_BQ + c] : rb->o[(size_t)c * hd + d];
            out[d] = rb->n_keys > 0 ? o / rb->l[c] : 0.0f;
        }
    }
}

/* An item: up to ATTN_ITEM_BLOCKS row blocks of one (sequence, kv head) over the
 * keys they see, a key block at a time, each row block in turn. The first
 * row block over a key block fetches (the next block's keys into L2, keys
 * used in place this block's V into L1); the others find the block there.
 * Each row's sums and softmax are those of its block alone, in the same
 * order: an item's grouping changes no bit. */
static void run_item(const attn_job *j, const attn_cursor *cur, float *scratch)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const int hd = j->head_dim, s = cur->seq;
    const int mr = kn->tile_rows, nr = kn->tile_cols;
    const int rows = seq_tokens(j, s) * j->group;
    const int first_block = cur->row_group * ATTN_ITEM_BLOCKS;
    const int blocks = imin(ATTN_ITEM_BLOCKS, seq_row_blocks(j, s) - first_block);

    float *kp = scratch;                                     /* (BK, head_dim) */
    float *vp = kp + (size_t)ATTN_BK * ML_CPU_MAX_HEAD_DIM;  /* (BK, head_dim) */
    float *st = vp + (size_t)ATTN_BK * ML_CPU_MAX_HEAD_DIM;  /* cross: Sᵀ (BQ, BK) */
    float *own = st + (size_t)ATTN_BK * ATTN_BQ;             /* each row block's */
    uint32_t *s2 = (uint32_t *)kp; /* bf16: (BK / 2, BQ) */
    row_block rbs[ATTN_ITEM_BLOCKS];

    int n_keys = 0;
    for (int b = 0; b < blocks; b++) {
        row_block *rb = &rbs[b];
        rb->r0 = (first_block + b) * ATTN_BQ;
        rb->nq = imin(ATTN_BQ, rows - rb->r0);
        rb->qt = own + (size_t)b * BLOCK_SCRATCH_FLOATS;
        rb->sc = rb->qt + (size_t)ML_CPU_MAX_HEAD_DIM * ATTN_BQ;
        rb->o = rb->sc + (size_t)ATTN_BK * ATTN_BQ;
        row_block_start(j, cur, rb);
        n_keys = rb->n_keys > n_keys ? rb->n_keys : n_keys;
    }

    const int in_place = keys_in_place(j);
    for (int kb = 0, nk; kb < n_keys; kb += nk) {
        nk = block_keys(j, kb, n_keys);
        if (!key_block_needed(j, rbs, blocks, s, kb, nk))
            continue;
        /* The next block, unless it is skipped in turn (not worth its
         * bandwidth): copied keys prefetch it as they copy, keys in place
         * while S is computed (this block's V rows go to L1 meanwhile). */
        int nk_next = kb + nk < n_keys ? block_keys(j, kb + nk, n_keys) : 0;
        if (nk_next && !key_block_needed(j, rbs, blocks, s, kb + nk, nk_next))
            nk_next = 0;
        key_blk blk, next = {0};
        key_block(j, s, cur->kv_head, kb, nk, j->kind == ATTN_CAUSAL ? n_keys - kb - nk : nk_next,
                  kp, vp, &blk);
        if (in_place && nk_next)
            key_block(j, s, cur->kv_head, kb + nk, nk_next, 0, NULL, NULL, &next);
        else
            nk_next = 0;
        int fetch = 1;
        for (int b = 0; b < blocks; b++) {
            row_block *rb = &rbs[b];
            if (row_block_skips(j, rb, s, kb, nk))
                continue;
            const int nq = rb->nq, ahead = fetch ? nk_next : 0;
            if (j->kind == ATTN_CROSS)
                scores_keys(j, &blk, nk, fetch, &next, ahead, rb->qt, nq, st, rb->sc);
            else if (j->k2)
                scores_bf16(j, s, cur->kv_head, kb, nk, ahead ? kb + nk : -1,
                            (const uint32_t *)rb->qt, nq, rb->sc);
            else
                scores_rows(j, &blk, nk, fetch, &next, ahead, rb->qt, nq, rb->sc);
            fetch = 0;
            apply_mask(j, &rb->cols, s, kb, nk, rb->sc);
            kn->softmax_block(rb->sc, ATTN_BQ, nk, nq, j->scale2, rb->m, rb->l, rb->alpha);
            rescale_o(j, rb);
            if (j->k2)
                values_bf16(j, s, cur->kv_head, kb, nk, rb->sc, nq, s2, rb->o);
            else
                for (int c0 = 0; c0 < nq; c0 += mr)
                    for (int d0 = 0; d0 < hd; d0 += nr)
                        kn->gemm_tile(imin(mr, nq - c0), imin(nr, hd - d0), nk, rb->sc + c0, 1,
                                      ATTN_BQ, blk.v + d0, blk.ldv, rb->o + (size_t)c0 * hd + d0,
                                      (size_t)hd, 1);
        }
    }
    for (int b = 0; b < blocks; b++)
        row_block_finish(j, cur, &rbs[b]);
}

static void attn_thread(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)begin;
    (void)end;
    attn_job *j = ctx;
    float *scratch = ml_cpu_scratch(j->cb, tid);
    attn_cursor cur = {0, 0, 0};
    /* Relaxed: the items' outputs are disjoint, and the pool's return
     * orders them before the caller reads any. */
    for (int64_t at = 0, i;
         (i = atomic_fetch_add_explicit(&j->next_item, 1, memory_order_relaxed)) < j->n_items;
         at = i) {
        cursor_advance(j, &cur, i - at);
        run_item(j, &cur, scratch);
    }
}

static void run(ml_backend *be, attn_job *j)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    assert(j->head_dim >= 1 && j->head_dim <= ML_CPU_MAX_HEAD_DIM);
    assert(j->n_kv_heads >= 1 && j->n_heads % j->n_kv_heads == 0);
    j->cb = cb;
    j->group = j->n_heads / j->n_kv_heads;
    j->scale2 = (float)((double)j->scale * LOG2_E);

    int64_t items = 0;
    double work = 0;
    for (int s = 0; s < j->n_seqs; s++) {
        items += seq_items(j, s);
        /* multiply-adds: rows x keys x head_dim, twice (QKᵀ and PV) */
        work += 2.0 * seq_tokens(j, s) * j->n_heads * (double)j->head_dim *
                (j->kind == ATTN_CAUSAL ? j->pos0[s] + seq_tokens(j, s)
                 : j->kind == ATTN_VISION ? j->seq_len
                                          : (double)j->n_images[s] * j->image_keys);
    }
    if (items == 0)
        return;
    int64_t threads = (int64_t)(work / ML_CPU_MIN_WORK_PER_THREAD);
    if (threads > ml_cpu_pool_threads(cb->pool))
        threads = ml_cpu_pool_threads(cb->pool);
    if (threads > items)
        threads = items;
    j->n_items = items;
    atomic_init(&j->next_item, 0);
    ml_cpu_pool_for(cb->pool, threads < 1 ? 1 : threads, 1, attn_thread, j);
}

typedef struct round_job {
    uint32_t *k2, *v2;
    int kpairs, amx; /* attn_job's */
    const ml_attn_vision_params *p;
    const ml_cpu_kernels *kn;
} round_job;

/* Pairs of keys [begin, end) of every sequence (pair i: sequence i /
 * (seq_len / 2)) rounded to bf16: K in pairs along head_dim, V in pairs
 * of keys (attn_job's k2 and v2). */
static void round_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const round_job *r = ctx;
    const ml_attn_vision_params *p = r->p;
    const size_t hd = (size_t)p->head_dim, heads = (size_t)p->n_heads;
    const int64_t per_seq = p->seq_len / 2;
    const size_t kp = (size_t)r->kpairs;
    uint32_t vpairs[ML_CPU_MAX_HEAD_DIM];
    for (int64_t i = begin; i < end; i++) {
        const size_t s = (size_t)(i / per_seq), pair = (size_t)(i % per_seq);
        const size_t tok = s * (size_t)p->seq_len + 2 * pair;
        for (size_t h = 0; h < heads; h++) {
            for (size_t t = tok; t < tok + 2; t++) {
                uint32_t *k2 = r->k2 + ((s * heads + h) * (size_t)p->seq_len + t % p->seq_len) * kp;
                r->kn->bf16_pairs(k2, p->k + (t * heads + h) * hd, hd);
                memset(k2 + hd / 2, 0, (kp - hd / 2) * sizeof *k2);
            }
            const float *v0 = p->v + (tok * heads + h) * hd, *v1 = v0 + heads * hd;
            if (!r->amx) {
                r->kn->bf16_pair_rows(r->v2 + ((s * heads + h) * (size_t)per_seq + pair) * hd, v0,
                                      v1, hd);
                continue;
            }
            r->kn->bf16_pair_rows(vpairs, v0, v1, hd);
            uint32_t *vt = r->v2 + (s * heads + h) * hd * (size_t)per_seq + pair;
            for (size_t d = 0; d < hd; d++)
                vt[d * (size_t)per_seq] = vpairs[d];
        }
    }
}

typedef struct by_head_job {
    float *k, *v; /* (n_seq, n_heads, seq_len, head_dim) */
    const ml_attn_vision_params *p;
} by_head_job;

/* Tokens [begin, end) of every sequence (token i: sequence i / seq_len)
 * copied from K and V as the projections leave them, (tokens, n_heads,
 * head_dim), to their rows by head. In the projections' layout a head's
 * rows are n_heads · head_dim floats apart (1 KiB in `small`, 5 KiB at the
 * real widths): a key block's rows start on a quarter of L1's sets and its
 * 96 rows overflow their ways, so the PV tiles fetched V again from L2 for
 * every row tile. By head they are contiguous. Measured (`bench_cpu_ops`
 * attn_vision, 16 heads x 80, 2 threads, the Intel Xeon VM, 2026-12-07,
 * 8 alternations, the copy included): a 4-tile image 786-1023 -> 762-927
 * ms, a 2-tile one 607-760 -> 591-631 ms (7 of 8 pairs faster); in a
 * one-thread harness of a row block's products and softmax 0.84-0.89x the
 * time. The bits are the same: the values and the order of every sum. */
static void by_head_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const by_head_job *r = ctx;
    const ml_attn_vision_params *p = r->p;
    const size_t hd = (size_t)p->head_dim, heads = (size_t)p->n_heads, len = (size_t)p->seq_len;
    for (int64_t i = begin; i < end; i++) {
        const size_t s = (size_t)i / len, t = (size_t)i % len;
        for (size_t h = 0; h < heads; h++) {
            const size_t from = ((size_t)i * heads + h) * hd, to = ((s * heads + h) * len + t) * hd;
            memcpy(r->k + to, p->k + from, hd * sizeof(float));
            memcpy(r->v + to, p->v + from, hd * sizeof(float));
        }
    }
}

void ml_cpu_attn_vision(ml_backend *be, const ml_attn_vision_params *p)
{
    /* An all-padding sequence would leave its invalid queries no key. */
    for (int s = 0; s < p->n_seq; s++) {
        int any = 0;
        for (int t = 0; t < p->seq_len && !any; t++)
            any = p->valid[(size_t)s * p->seq_len + (size_t)t] != 0;
        assert(any && "attn_vision: a sequence without a valid token");
    }
    attn_job j = {.kind = ATTN_VISION, .out = p->out, .q = p->q, .k = p->k, .v = p->v,
                  .n_seqs = p->n_seq, .n_heads = p->n_heads, .n_kv_heads = p->n_heads,
                  .head_dim = p->head_dim, .scale = p->scale, .valid = p->valid,
                  .seq_len = p->seq_len};
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (cb->bf16_x && p->head_dim % 2 == 0 && p->seq_len % 2 == 0 && p->n_seq > 0) {
        const int amx = cb->amx, hp = p->head_dim / 2;
        const int chunk = ML_CPU_AMX_CHUNK_PAIRS;
        const int kpairs = amx ? (hp + chunk - 1) / chunk * chunk : hp;
        const size_t tokens = (size_t)p->n_seq * p->seq_len;
        const size_t n_k = tokens * p->n_heads * kpairs, n_v = tokens * p->n_heads * hp;
        /* gemm_tile_amx's A loads read up to a tile's rows past the last
         * (keys of K, head dims of Vᵀ, a chunk each) */
        const size_t slack = amx ? (size_t)ML_CPU_AMX_ROW_STEP * (p->seq_len / 2 + chunk) : 0;
        uint32_t *k2 = (uint32_t *)ml_cpu_act_buffer(cb, n_k + n_v + slack, "attn_vision");
        if (!k2)
            return;
        round_job r = {.k2 = k2, .v2 = k2 + n_k, .kpairs = kpairs, .amx = amx, .p = p,
                       .kn = cb->kern};
        ml_cpu_pool_for(cb->pool, (int64_t)p->n_seq * (p->seq_len / 2),
                        ml_cpu_grain(4.0 * p->n_heads * p->head_dim), round_part, &r);
        j.k2 = r.k2;
        j.v2 = r.v2;
        j.kpairs = kpairs;
        j.amx = amx;
    } else {
        const size_t n = (size_t)p->n_seq * p->seq_len * p->n_heads * p->head_dim;
        float *k = ml_cpu_act_buffer(cb, 2 * n, "attn_vision");
        if (!k)
            return;
        by_head_job r = {.k = k, .v = k + n, .p = p};
        ml_cpu_pool_for(cb->pool, (int64_t)p->n_seq * p->seq_len,
                        ml_cpu_grain(2.0 * p->n_heads * p->head_dim), by_head_part, &r);
        j.k = r.k;
        j.v = r.v;
    }
    run(be, &j);
}

void ml_cpu_attn_causal(ml_backend *be, const ml_attn_causal_params *p)
{
    for (int s = 0; s < p->n_seqs; s++) {
        const int n_keys = p->pos0[s] + p->seq_start[s + 1] - p->seq_start[s];
        assert(p->pos0[s] >= 0 && p->seq_start[s + 1] >= p->seq_start[s]);
        assert(n_keys <= p->max_blocks_per_seq * p->block_size && "attn_causal: block table too short");
    }
    attn_job j = {.kind = ATTN_CAUSAL, .out = p->out, .q = p->q, .k = p->k_cache,
                  .v = p->v_cache, .n_seqs = p->n_seqs, .n_heads = p->n_heads,
                  .n_kv_heads = p->n_kv_heads, .head_dim = p->head_dim, .scale = p->scale,
                  .block_table = p->block_table, .seq_start = p->seq_start, .pos0 = p->pos0,
                  .max_blocks = p->max_blocks_per_seq, .block_size = p->block_size};
    run(be, &j);
}

/* Whether sequences a and b see the same images: the same states in the
 * same order. */
static int same_images(const ml_attn_cross_params *p, int a, int b)
{
    if (p->n_images[a] != p->n_images[b])
        return 0;
    const void *const *sa = p->states + (size_t)a * p->max_images;
    const void *const *sb = p->states + (size_t)b * p->max_images;
    for (int i = 0; i < p->n_images[a]; i++)
        if (sa[i] != sb[i])
            return 0;
    return 1;
}

/* Cross attention's items over runs of consecutive sequences that see the
 * same images. A decode sequence is one token, a GQA group of query rows (4
 * in every Llama 3.2 Vision), which alone fills a few columns of an item's
 * tiles and reads the image's whole K and V for them; B sequences decoding
 * against one image (n > 1 choices of a request, questions about one
 * document) read it B times. Their tokens are consecutive rows of q, out and
 * allowed, so a run of them is one sequence to the item loop: one item per kv
 * head and ATTN_ITEM_BLOCKS blocks of ATTN_BQ rows multiplies the run's rows
 * against each block of keys, read once. Every row keeps its own mask
 * (allowed) and its own m, l and O, and each of its sums runs over the same
 * keys in the same order, so its result does not change: a key block the
 * other rows of a run see and this one may not is -inf in its column
 * (softmax_block: its weights 0, alpha 1, or m, l and O left at -inf, 0 and
 * 0), and O gains +0, which leaves every element as it was but one exactly -0
 * (every visible key's V -0 there), which becomes +0: a value every later op
 * reads alike, since its sums start from +0. Runs are cut at an item's rows,
 * and at `cap` tokens so that the items still number at least the pool's
 * threads. The view's arrays live in the act buffer; without it the sequences
 * run apart (ml_cpu_act_buffer has latched why). */
static void merge_image_runs(ml_cpu_backend *cb, const ml_attn_cross_params *p, attn_job *j)
{
    const int tokens = p->seq_start[p->n_seqs] - p->seq_start[0];
    const int group = p->n_heads / p->n_kv_heads;
    const int min_runs = (ml_cpu_pool_threads(cb->pool) + p->n_kv_heads - 1) / p->n_kv_heads;
    const int item_tokens = ATTN_ITEM_BLOCKS * ATTN_BQ / group;
    int cap = item_tokens > 1 ? item_tokens : 1;
    if (min_runs > 1 && tokens / min_runs < cap)
        cap = tokens / min_runs > 1 ? tokens / min_runs : 1;
    if (cap == 1 || p->n_seqs < 2)
        return;
    const size_t n = (size_t)p->n_seqs;
    const size_t bytes = n * (size_t)p->max_images * sizeof(void *) + (2 * n + 1) * sizeof(int32_t);
    float *buf = ml_cpu_act_buffer(cb, (bytes + sizeof(float) - 1) / sizeof(float), "attn_cross");
    if (!buf)
        return;
    const void **states = (const void **)buf; /* first: the buffer is aligned for pointers */
    int32_t *n_images = (int32_t *)(states + n * (size_t)p->max_images);
    int32_t *seq_start = n_images + n;
    int runs = 0;
    for (int s = 0; s < p->n_seqs;) {
        int e = s + 1;
        while (e < p->n_seqs && same_images(p, s, e) &&
               p->seq_start[e + 1] - p->seq_start[s] <= cap)
            e++;
        memcpy(states + (size_t)runs * p->max_images, p->states + (size_t)s * p->max_images,
               (size_t)p->max_images * sizeof *states);
        n_images[runs] = p->n_images[s];
        seq_start[runs++] = p->seq_start[s];
        s = e;
    }
    seq_start[runs] = p->seq_start[p->n_seqs];
    j->states = states;
    j->n_images = n_images;
    j->seq_start = seq_start;
    j->n_seqs = runs;
}

void ml_cpu_attn_cross(ml_backend *be, const ml_attn_cross_params *p)
{
    assert(p->max_images >= 0 && p->max_tiles >= 1 && p->chunk_len >= 1);
    for (int s = 0; s < p->n_seqs; s++) {
        assert(p->n_images[s] >= 0 && p->n_images[s] <= p->max_images);
        assert(p->seq_start[s] >= 0 && p->seq_start[s + 1] >= p->seq_start[s] &&
               p->seq_start[s + 1] <= p->n_tokens);
    }
    attn_job j = {.kind = ATTN_CROSS, .out = p->out, .q = p->q, .n_seqs = p->n_seqs,
                  .n_heads = p->n_heads, .n_kv_heads = p->n_kv_heads, .head_dim = p->head_dim,
                  .scale = p->scale, .seq_start = p->seq_start, .states = p->states,
                  .k_offset = p->k_offset, .v_offset = p->v_offset, .n_images = p->n_images,
                  .allowed = p->allowed, .max_images = p->max_images, .max_tiles = p->max_tiles,
                  .n_chunks = p->max_images * p->max_tiles, .chunk_len = p->chunk_len,
                  .image_keys = p->max_tiles * p->chunk_len};
    merge_image_runs(ml_cpu_of(be), p, &j);
    run(be, &j);
}
