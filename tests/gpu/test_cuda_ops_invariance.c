/* Batch invariance of the CUDA backend (ml_backend_cuda_create with
 * batch_invariant = 1): the matmul (bf16, and FP8 weights in W8A16 and
 * W8A8) of one row and the attention of one
 * sequence are bit-identical alone and inside calls of other M (1, 7, 16,
 * 17, 64, 300, and a tiled 9000) and of other sequence mixes (decode and
 * prefill neighbours, text-only and two-image neighbours, more sequences
 * than one launch's workspace holds), and so is a row's all_reduce_sum
 * across a group of two devices (when there are two), while agreeing with
 * the CPU backend to the thresholds of cuda_ops_harness.h. On a device the
 * same cases run on a backend without batch invariance for the record: its
 * differences are printed, not checked (they are allowed there). Skipped
 * (77) without a CUDA device. */
#include <pthread.h>

#include "cuda_ops_harness.h"

static ml_backend *g_invariant; /* batch_invariant = 1 */

/* Under AddressSanitizer (CI's sanitizer stage of the host build) the sweep
 * keeps every path (both regimes, tails, tiling over M, the FP8 forms) and
 * leaves out the 11B-sized matmuls: there their time is the emulated
 * cuBLASLt's arithmetic, which the release stage has already run. */
#if defined(__SANITIZE_ADDRESS__)
#define FULL_SIZE_MATMULS 0
#else
#define FULL_SIZE_MATMULS 1
#endif

/* Bitwise equality of got and want; a failure only when `checked`. */
static void same_bits(const float *got, const float *want, size_t n, int checked, const char *what)
{
    size_t at = 0;
    while (at < n && !memcmp(&got[at], &want[at], sizeof *got))
        at++;
    if (checked)
        check(at == n, "%s: element %zu of %zu differs (%.9g, alone %.9g)", what, at, n,
              at < n ? got[at] : 0.0, at < n ? want[at] : 0.0);
    fprintf(stderr, "  %-72s %s%s\n", what, at == n ? "identical" : "DIFFERS",
            checked ? "" : " (not checked)");
}

/* fn(checked) on the invariant backend (checked), then on the harness's
 * plain one (for the record, on a device: what the option buys there). The
 * host execution model leaves the record out: it checks nothing, and
 * emulated it costs as much as the test. The harness's helpers use g_gpu. */
static void on_both(void (*fn)(int checked))
{
    ml_backend *plain = g_gpu;
    fprintf(stderr, "batch-invariant backend\n");
    g_gpu = g_invariant;
    fn(1);
    g_gpu = plain;
#ifndef MLLAMA_CUDA_HOST
    fprintf(stderr, "plain backend (for the record)\n");
    fn(0);
#endif
}

/* ---- matmul ------------------------------------------------------------------------------ */

/* The weights of matmul_rows: bf16 (matmul), or E4M3 with per-row scales
 * (matmul_f8) without or with the activations' quantization. */
typedef enum weight_kind { WEIGHT_BF16, WEIGHT_W8A16, WEIGHT_W8A8 } weight_kind;

static const char *const WEIGHT_NAMES[] = {"matmul", "matmul_f8 W8A16", "matmul_f8 W8A8"};

/* One row x (K) of fixed values at row pos[i] of calls of M[i] rows (other
 * rows random); its output row must be the same bits in every call. With
 * accumulate (bf16 only), the row's y starts from the same values each
 * time. Against the CPU: the first call's row (W8A8: not here, the CPU
 * backend serves W8A16 only; test_cuda_ops_matmul checks it). */
static void matmul_rows(int checked, weight_kind kind, int K, int N, int with_bias, int accumulate,
                        const int *Ms, const int *pos, int n_calls)
{
    float *row = rand_f32((size_t)K, -1, 1), *y_row = rand_f32((size_t)N, -1, 1);
    const int f8 = kind != WEIGHT_BF16;
    const size_t w_bytes = (size_t)N * K * (f8 ? 1 : 2);
    void *w = f8 ? (void *)rand_e4m3((size_t)N * K) : (void *)rand_bf16((size_t)N * K, -1, 1);
    uint16_t *bias = rand_bf16((size_t)N, -1, 1);
    float *scale = rand_f32((size_t)N, 5e-5f, 2e-4f);
    void *dw = dput(w, w_bytes);
    uint16_t *db = dput(bias, (size_t)N * 2);
    float *dscale = dput(scale, (size_t)N * sizeof *scale);
    const char *name = WEIGHT_NAMES[kind];
    float *alone = xmalloc((size_t)N * 4), *got = xmalloc((size_t)N * 4);
    for (int c = 0; c < n_calls; c++) {
        const int M = Ms[c], p = pos[c];
        float *x = rand_f32((size_t)M * K, -1, 1), *y = rand_f32((size_t)M * N, -1, 1);
        memcpy(x + (size_t)p * K, row, (size_t)K * 4);
        memcpy(y + (size_t)p * N, y_row, (size_t)N * 4);
        float *dx = dput(x, (size_t)M * K * 4), *dy = dput(y, (size_t)M * N * 4);
        if (f8)
            g_gpu->ops->matmul_f8(g_gpu, dy, dx, dw, dscale, with_bias ? db : NULL, M, K, N,
                                  kind == WEIGHT_W8A8);
        else
            g_gpu->ops->matmul(g_gpu, dy, dx, dw, with_bias ? db : NULL, M, K, N, accumulate);
        char what[160];
        snprintf(what, sizeof what, "%s %dx%d%s%s: row %d of M = %d against M = %d", name, K, N,
                 with_bias ? " +bias" : "", accumulate ? " +=" : "", p, M, Ms[0]);
        dget(c == 0 ? alone : got, (const float *)dy + (size_t)p * N, (size_t)N * 4, what);
        if (c == 0 && checked && kind != WEIGHT_W8A8) {
            float *want = xmalloc((size_t)N * 4);
            memcpy(want, y_row, (size_t)N * 4);
            if (f8)
                cpu_matmul_f8(want, row, w, scale, with_bias ? bias : NULL, 1, K, N);
            else
                cpu_matmul(want, row, w, with_bias ? bias : NULL, 1, K, N, accumulate);
            snprintf(what, sizeof what, "%s %dx%d%s%s at M = %d against the CPU", name, K, N,
                     with_bias ? " +bias" : "", accumulate ? " +=" : "", M);
            check_nmse(alone, want, (size_t)N, NMSE_GEMM, what);
            free(want);
        } else if (c > 0) {
            same_bits(got, alone, (size_t)N, checked, what);
        }
        dfree(dx);
        dfree(dy);
        free(x);
        free(y);
    }
    dfree(dw);
    dfree(db);
    dfree(dscale);
    free(row);
    free(y_row);
    free(w);
    free(bias);
    free(scale);
    free(alone);
    free(got);
}

static void test_matmul(int checked)
{
    /* The row's place moves with M; 1 takes the GEMV path without invariance. */
    static const int Ms[] = {1, 7, 16, 17, 64, 300}, pos[] = {0, 6, 3, 16, 40, 177};
    const int n = (int)(sizeof Ms / sizeof Ms[0]);
    matmul_rows(checked, WEIGHT_BF16, 4096, 1024, 0, 0, Ms, pos, n);   /* decoder k/v */
    if (FULL_SIZE_MATMULS) {
        matmul_rows(checked, WEIGHT_BF16, 4096, 14336, 0, 0, Ms, pos, n); /* gate/up */
        matmul_rows(checked, WEIGHT_BF16, 14336, 4096, 0, 1, Ms, pos, n); /* down, accumulating */
        matmul_rows(checked, WEIGHT_BF16, 1280, 5120, 1, 0, Ms, pos, n);  /* vision fc1 with its bias */
    }
    matmul_rows(checked, WEIGHT_BF16, 64, 37, 1, 1, Ms, pos, n);       /* odd N */
    /* M·K above the conversion workspace: the row in the second M-tile. */
    static const int tiled[] = {1, 9000}, tiled_pos[] = {0, 8500};
    matmul_rows(checked, WEIGHT_BF16, 8192, 64, 1, 0, tiled, tiled_pos, 2);
    /* FP8 weights: widened bf16 tiles, E4M3 tensor cores, the bf16 path of
     * W8A8 (N % 4 != 0). */
    matmul_rows(checked, WEIGHT_W8A16, 4096, 1024, 1, 0, Ms, pos, n);
    matmul_rows(checked, WEIGHT_W8A8, 4096, 1024, 1, 0, Ms, pos, n);
    matmul_rows(checked, WEIGHT_W8A8, 64, 37, 1, 0, Ms, pos, n);
}

/* ---- causal attention -------------------------------------------------------------------- */

enum { HEADS = 32, KV_HEADS = 8, HD = 128, BLOCK = 16, CACHE_BLOCKS = 4096 };
#define KV_ROW ((size_t)KV_HEADS * HD)
#define Q_ROW ((size_t)HEADS * HD)

/* One sequence of a causal call: cache length before the step, new tokens. */
typedef struct seq_shape {
    int pos0, n_new;
} seq_shape;

typedef struct causal_cache {
    uint16_t *host;  /* (CACHE_BLOCKS, BLOCK, KV_HEADS, HD) bf16, K then V */
    void *k, *v;     /* device copies */
} causal_cache;

static int blocks_of(seq_shape s)
{
    return (s.pos0 + s.n_new + BLOCK - 1) / BLOCK;
}

/* attn_causal over the sequences of `mix`, the one under test at index
 * `at` with physical blocks 0 .. blocks_of - 1 (the same K/V in every mix),
 * the others after it; q of the tested sequence's tokens is q_seq. Its
 * output rows land in got (n_new, HEADS, HD). */
static void causal_call(const causal_cache *cc, const seq_shape *mix, int n_seqs, int at,
                        const float *q_seq, float *got)
{
    int max_blocks = 1, n_tokens = 0;
    for (int s = 0; s < n_seqs; s++) {
        max_blocks = blocks_of(mix[s]) > max_blocks ? blocks_of(mix[s]) : max_blocks;
        n_tokens += mix[s].n_new;
    }
    int32_t *table = xmalloc((size_t)n_seqs * max_blocks * 4), *start = xmalloc((n_seqs + 1) * 4);
    int32_t *pos0 = xmalloc((size_t)n_seqs * 4);
    int next = blocks_of(mix[at]);
    start[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int b = 0; b < max_blocks; b++)
            table[(size_t)s * max_blocks + b] =
                s == at ? b : b < blocks_of(mix[s]) ? (next + b) % CACHE_BLOCKS : 0;
        if (s != at)
            next += blocks_of(mix[s]);
        pos0[s] = mix[s].pos0;
        start[s + 1] = start[s] + mix[s].n_new;
    }
    float *q = rand_f32((size_t)n_tokens * Q_ROW, -2, 2);
    memcpy(q + (size_t)start[at] * Q_ROW, q_seq, (size_t)mix[at].n_new * Q_ROW * 4);
    float *dq = dput(q, (size_t)n_tokens * Q_ROW * 4), *dout = dput(NULL, (size_t)n_tokens * Q_ROW * 4);
    int32_t *dtable = dput(table, (size_t)n_seqs * max_blocks * 4);
    int32_t *dstart = dput(start, (size_t)(n_seqs + 1) * 4), *dpos0 = dput(pos0, (size_t)n_seqs * 4);
    ml_attn_causal_params p = {.out = dout, .q = dq, .k_cache = cc->k, .v_cache = cc->v,
                               .block_table = dtable, .seq_start = dstart, .pos0 = dpos0,
                               .n_seqs = n_seqs, .max_blocks_per_seq = max_blocks,
                               .block_size = BLOCK, .n_heads = HEADS, .n_kv_heads = KV_HEADS,
                               .head_dim = HD, .scale = 1.0f / sqrtf((float)HD)};
    g_gpu->ops->attn_causal(g_gpu, &p);
    dget(got, dout + (size_t)start[at] * Q_ROW, (size_t)mix[at].n_new * Q_ROW * 4, "attn_causal");
    void *dev[] = {dq, dout, dtable, dstart, dpos0};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    free(table);
    free(start);
    free(pos0);
    free(q);
}

/* The CPU's attn_causal of `seq` alone over the same cache, widened to f32. */
static void causal_cpu(const causal_cache *cc, seq_shape seq, const float *q_seq, float *want)
{
    const int nb = blocks_of(seq);
    const size_t n = (size_t)nb * BLOCK * KV_ROW;
    float *k = xmalloc(n * 4), *v = xmalloc(n * 4);
    const uint16_t *vh = cc->host + (size_t)CACHE_BLOCKS * BLOCK * KV_ROW;
    for (size_t i = 0; i < n; i++) {
        k[i] = ml_bf16_to_f32(cc->host[i]);
        v[i] = ml_bf16_to_f32(vh[i]);
    }
    int32_t *table = xmalloc((size_t)nb * 4), start[2] = {0, seq.n_new}, pos0 = seq.pos0;
    for (int b = 0; b < nb; b++)
        table[b] = b;
    ml_attn_causal_params p = {.out = want, .q = q_seq, .k_cache = k, .v_cache = v,
                               .block_table = table, .seq_start = start, .pos0 = &pos0,
                               .n_seqs = 1, .max_blocks_per_seq = nb, .block_size = BLOCK,
                               .n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = HD,
                               .scale = 1.0f / sqrtf((float)HD)};
    g_cpu->ops->attn_causal(g_cpu, &p);
    free(k);
    free(v);
    free(table);
}

static void causal_seq(int checked, const causal_cache *cc, seq_shape seq)
{
    /* Neighbours: decode at other lengths, prefill chunks, and 63 decode
     * sequences (64 in all: more than one launch's workspace at 16 splits). */
    enum { MANY = 64, MIXES = 5 };
    seq_shape mixes[MIXES][MANY];
    int n[MIXES], at[MIXES];
    n[0] = 1, at[0] = 0;
    static const seq_shape m1[] = {{5, 1}, {1200, 1}, {33, 1}, {0, 0}, {90, 1}, {2047, 1}, {16, 1}};
    static const seq_shape m2[] = {{0, 40}, {0, 0}, {1500, 1}};
    static const seq_shape m4[] = {{0, 0}, {64, 300}, {7, 1}, {400, 1}};
    n[1] = 7, at[1] = 3;
    memcpy(mixes[1], m1, sizeof m1);
    n[2] = 3, at[2] = 1;
    memcpy(mixes[2], m2, sizeof m2);
    n[3] = MANY, at[3] = MANY - 1;
    for (int s = 0; s < MANY; s++)
        mixes[3][s] = (seq_shape){(s * 37) % 1000, 1};
    n[4] = 4, at[4] = 0;
    memcpy(mixes[4], m4, sizeof m4);
    for (int m = 0; m < MIXES; m++)
        mixes[m][at[m]] = seq;

    const size_t out_n = (size_t)seq.n_new * Q_ROW;
    float *q_seq = rand_f32(out_n, -2, 2), *alone = xmalloc(out_n * 4), *got = xmalloc(out_n * 4);
    for (int m = 0; m < MIXES; m++) {
        causal_call(cc, mixes[m], n[m], at[m], q_seq, m == 0 ? alone : got);
        char what[160];
        if (m == 0 && checked) {
            float *want = xmalloc(out_n * 4);
            causal_cpu(cc, seq, q_seq, want);
            snprintf(what, sizeof what, "attn_causal pos %d + %d tokens alone against the CPU",
                     seq.pos0, seq.n_new);
            check_nmse(alone, want, out_n, NMSE_F32, what);
            free(want);
        } else if (m > 0) {
            snprintf(what, sizeof what, "attn_causal pos %d + %d: seq %d of %d (mix %d) vs alone",
                     seq.pos0, seq.n_new, at[m], n[m], m);
            same_bits(got, alone, out_n, checked, what);
        }
    }
    free(q_seq);
    free(alone);
    free(got);
}

static void test_causal(int checked)
{
    causal_cache cc;
    const size_t plane = (size_t)CACHE_BLOCKS * BLOCK * KV_ROW;
    cc.host = rand_bf16(2 * plane, -1, 1);
    cc.k = dput(cc.host, plane * 2);
    cc.v = dput(cc.host + plane, plane * 2);
    causal_seq(checked, &cc, (seq_shape){700, 1});  /* decode */
    causal_seq(checked, &cc, (seq_shape){20, 1});   /* decode, one key tile */
    causal_seq(checked, &cc, (seq_shape){100, 40}); /* a prefill chunk */
    dfree(cc.k);
    dfree(cc.v);
    free(cc.host);
}

/* ---- cross attention --------------------------------------------------------------------- */

enum { TILES = 4, CHUNK = 1601, IMAGE_KEYS = TILES * CHUNK, STATES = 3 };
#define PLANE ((size_t)IMAGE_KEYS * KV_ROW)

/* One sequence of a cross call: its tokens, its images (state ids). */
typedef struct cross_seq {
    int n_tok, n_img;
    int state[2];
} cross_seq;

/* attn_cross over `mix` with the tested sequence at `at` (its allowed rows
 * given for max_images = 1 in allowed_seq and laid out for the call's
 * max_images; other sequences see every tile). */
static void cross_call(void *const *states, const cross_seq *mix, int n_seqs, int at,
                       const float *q_seq, const uint8_t *allowed_seq, float *got)
{
    int max_images = 1, n_tokens = 0;
    for (int s = 0; s < n_seqs; s++) {
        max_images = mix[s].n_img > max_images ? mix[s].n_img : max_images;
        n_tokens += mix[s].n_tok;
    }
    const int n_chunks = max_images * TILES;
    int32_t *start = xmalloc((size_t)(n_seqs + 1) * 4), *n_img = xmalloc((size_t)n_seqs * 4);
    const void **table = xmalloc((size_t)n_seqs * max_images * sizeof *table);
    uint8_t *allowed = xmalloc((size_t)n_tokens * n_chunks);
    memset(allowed, 1, (size_t)n_tokens * n_chunks);
    start[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        start[s + 1] = start[s] + mix[s].n_tok;
        n_img[s] = mix[s].n_img;
        for (int i = 0; i < max_images; i++)
            table[(size_t)s * max_images + i] = states[i < mix[s].n_img ? mix[s].state[i] : 0];
    }
    for (int t = 0; t < mix[at].n_tok; t++)
        memcpy(allowed + (size_t)(start[at] + t) * n_chunks, allowed_seq + (size_t)t * TILES, TILES);
    float *q = rand_f32((size_t)n_tokens * Q_ROW, -2, 2);
    memcpy(q + (size_t)start[at] * Q_ROW, q_seq, (size_t)mix[at].n_tok * Q_ROW * 4);
    float *dq = dput(q, (size_t)n_tokens * Q_ROW * 4), *dout = dput(NULL, (size_t)n_tokens * Q_ROW * 4);
    void *dtable = dput(table, (size_t)n_seqs * max_images * sizeof *table);
    int32_t *dstart = dput(start, (size_t)(n_seqs + 1) * 4), *dimg = dput(n_img, (size_t)n_seqs * 4);
    uint8_t *dallowed = dput(allowed, (size_t)n_tokens * n_chunks);
    ml_attn_cross_params p = {.out = dout, .q = dq, .states = dtable, .k_offset = 0,
                              .v_offset = PLANE * 2, .n_images = dimg, .seq_start = dstart,
                              .allowed = dallowed, .n_seqs = n_seqs, .n_tokens = n_tokens,
                              .max_images = max_images, .max_tiles = TILES, .chunk_len = CHUNK,
                              .n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = HD,
                              .scale = 1.0f / sqrtf((float)HD)};
    g_gpu->ops->attn_cross(g_gpu, &p);
    dget(got, dout + (size_t)start[at] * Q_ROW, (size_t)mix[at].n_tok * Q_ROW * 4, "attn_cross");
    void *dev[] = {dq, dout, dtable, dstart, dimg, dallowed};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        dfree(dev[i]);
    free(start);
    free(n_img);
    free(table);
    free(allowed);
    free(q);
}

/* The CPU's attn_cross of the tested sequence alone (one image: state 0). */
static void cross_cpu(const uint16_t *state0, cross_seq seq, const float *q_seq,
                      const uint8_t *allowed_seq, float *want)
{
    float *st = xmalloc(2 * PLANE * 4);
    for (size_t i = 0; i < 2 * PLANE; i++)
        st[i] = ml_bf16_to_f32(state0[i]);
    cpu_state_keys(st, 1, IMAGE_KEYS, KV_HEADS, HD);
    const void *table[1] = {st};
    int32_t start[2] = {0, seq.n_tok}, n_img = seq.n_img;
    ml_attn_cross_params p = {.out = want, .q = q_seq, .states = table, .k_offset = 0,
                              .v_offset = PLANE * 4, .n_images = &n_img, .seq_start = start,
                              .allowed = allowed_seq, .n_seqs = 1, .n_tokens = seq.n_tok,
                              .max_images = 1, .max_tiles = TILES, .chunk_len = CHUNK,
                              .n_heads = HEADS, .n_kv_heads = KV_HEADS, .head_dim = HD,
                              .scale = 1.0f / sqrtf((float)HD)};
    g_cpu->ops->attn_cross(g_cpu, &p);
    free(st);
}

static void cross_seq_case(int checked, void *const *states, const uint16_t *state0, int n_tok)
{
    enum { MANY = 64, MIXES = 4 };
    const cross_seq seq = {n_tok, 1, {0, 0}};
    cross_seq mixes[MIXES][MANY];
    int n[MIXES], at[MIXES];
    n[0] = 1, at[0] = 0;
    /* A text-only neighbour and a two-image one (max_images 2). */
    static const cross_seq m1[] = {{3, 0, {0, 0}}, {0, 0, {0, 0}}, {1, 2, {1, 2}}};
    /* A prefill chunk with an image, then decode neighbours. */
    static const cross_seq m2[] = {{30, 1, {1, 0}}, {0, 0, {0, 0}}, {1, 1, {2, 0}},
                                   {1, 1, {1, 0}}, {1, 1, {0, 0}}, {1, 1, {2, 0}}};
    n[1] = 3, at[1] = 1;
    memcpy(mixes[1], m1, sizeof m1);
    n[2] = 6, at[2] = 1;
    memcpy(mixes[2], m2, sizeof m2);
    n[3] = MANY, at[3] = MANY - 1;
    for (int s = 0; s < MANY; s++)
        mixes[3][s] = (cross_seq){1, 1, {1 + s % 2, 0}};
    for (int m = 0; m < MIXES; m++)
        mixes[m][at[m]] = seq;

    const size_t out_n = (size_t)n_tok * Q_ROW;
    float *q_seq = rand_f32(out_n, -2, 2), *alone = xmalloc(out_n * 4), *got = xmalloc(out_n * 4);
    /* Token t sees tiles 0 .. t % TILES, so masks differ along the sequence. */
    uint8_t *allowed = xmalloc((size_t)n_tok * TILES);
    for (int t = 0; t < n_tok; t++)
        for (int c = 0; c < TILES; c++)
            allowed[(size_t)t * TILES + c] = c <= t % TILES;
    for (int m = 0; m < MIXES; m++) {
        cross_call(states, mixes[m], n[m], at[m], q_seq, allowed, m == 0 ? alone : got);
        char what[160];
        if (m == 0 && checked) {
            float *want = xmalloc(out_n * 4);
            cross_cpu(state0, seq, q_seq, allowed, want);
            snprintf(what, sizeof what, "attn_cross %d tokens x 1 image alone against the CPU",
                     n_tok);
            check_nmse(alone, want, out_n, NMSE_F32, what);
            free(want);
        } else if (m > 0) {
            snprintf(what, sizeof what, "attn_cross %d tokens: seq %d of %d (mix %d) vs alone",
                     n_tok, at[m], n[m], m);
            same_bits(got, alone, out_n, checked, what);
        }
    }
    free(q_seq);
    free(alone);
    free(got);
    free(allowed);
}

static void test_cross(int checked)
{
    uint16_t *host[STATES];
    void *states[STATES];
    for (int i = 0; i < STATES; i++) {
        host[i] = rand_bf16(2 * PLANE, -1, 1);
        states[i] = dput(host[i], 2 * PLANE * 2);
    }
    cross_seq_case(checked, states, host[0], 1);  /* decode */
    cross_seq_case(checked, states, host[0], 20); /* a prefill chunk */
    for (int i = 0; i < STATES; i++) {
        dfree(states[i]);
        free(host[i]);
    }
}

/* ---- all_reduce_sum across a batch-invariant group --------------------------------------- */

/* Two members sum M rows of WIDTH; one row of fixed values at a place that
 * moves with M must come out as row_0 + row_1 in f32 (rank order) on both,
 * whatever M, also when the sum takes several staging chunks (M = 3000). */
static void test_all_reduce(void)
{
    enum { WIDTH = 4096, MEMBERS = 2 };
    if (mlk_device_count() < MEMBERS || !ml_backend_cuda_has_nccl()) {
        fprintf(stderr, "  all_reduce_sum needs two devices and NCCL: not run\n");
        return;
    }
    static const int Ms[] = {1, 7, 300, 3000}, pos[] = {0, 3, 150, 2900};
    const int devices[MEMBERS] = {0, 1};
    ml_backend *group[MEMBERS] = {NULL, NULL};
    char err[ERRLEN] = "";
    /* Next to the other backends' pools: keep the members' small. */
    ml_status st = ml_backend_cuda_create_group(MEMBERS, devices, (size_t)1 << 30, 1, group, err,
                                               sizeof err);
    check(st == ML_OK, "batch-invariant create_group(%d): %s", MEMBERS, err);
    if (st != ML_OK)
        return;
    float *row[MEMBERS], want[WIDTH];
    for (int m = 0; m < MEMBERS; m++)
        row[m] = rand_f32(WIDTH, -1, 1);
    for (int i = 0; i < WIDTH; i++)
        want[i] = row[0][i] + row[1][i];
    for (size_t c = 0; c < sizeof Ms / sizeof Ms[0]; c++) {
        const size_t n = (size_t)Ms[c] * WIDTH;
        cuda_reduce_job jobs[MEMBERS];
        pthread_t th[MEMBERS];
        for (int m = 0; m < MEMBERS; m++) {
            jobs[m] = (cuda_reduce_job){group[m], rand_f32(n, -1, 1), n, ML_OK};
            memcpy(jobs[m].host + (size_t)pos[c] * WIDTH, row[m], WIDTH * 4);
        }
        for (int m = 0; m < MEMBERS; m++)
            pthread_create(&th[m], NULL, cuda_reduce_thread, &jobs[m]);
        for (int m = 0; m < MEMBERS; m++)
            pthread_join(th[m], NULL);
        for (int m = 0; m < MEMBERS; m++) {
            char what[128];
            snprintf(what, sizeof what, "all_reduce_sum M = %d, row %d on member %d: rank order",
                     Ms[c], pos[c], m);
            check(jobs[m].st == ML_OK, "%s: status %d", what, (int)jobs[m].st);
            same_bits(jobs[m].host + (size_t)pos[c] * WIDTH, want, WIDTH, 1, what);
            free(jobs[m].host);
        }
    }
    for (int m = 0; m < MEMBERS; m++) {
        group[m]->ops->destroy(group[m]);
        free(row[m]);
    }
}

int main(void)
{
    cuda_ops_open();
    char err[ERRLEN] = "";
    g_invariant = ml_backend_cuda_create(0, POOL_BYTES, 1, err, sizeof err);
    check(g_invariant != NULL, "batch-invariant cuda backend: %s", err);
    if (!g_invariant)
        return cuda_ops_close();
    fprintf(stderr, "matmul\n");
    on_both(test_matmul);
    fprintf(stderr, "attn_causal\n");
    on_both(test_causal);
    fprintf(stderr, "attn_cross\n");
    on_both(test_cross);
    fprintf(stderr, "all_reduce_sum\n");
    test_all_reduce();
    g_invariant->ops->destroy(g_invariant);
    return cuda_ops_close();
}
