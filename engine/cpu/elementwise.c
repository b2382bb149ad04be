/* Normalisations, activations, RoPE and the small data-movement ops.
 *
 * These are memory-bound and a small share of a forward pass, so they are
 * portable C for every ISA (the same results whichever kernels were
 * selected), split over threads by rows when large enough. Reductions use
 * REDUCE_LANES independent partial sums, which the compiler can keep in
 * vector registers without reassociating anything. The exception is GELU
 * and SiLU: per element they cost an erf or exp, which libm computes one
 * element at a time, so their loops are the ISA's kernels (cpu_kernels.h;
 * the vector ones agree with libm to vmath.h's bounds, not bitwise). */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "dtype.h"

#define REDUCE_LANES 16

static inline ml_cpu_pool *pool_of(ml_backend *be)
{
    return ml_cpu_of(be)->pool;
}

/* Σ f(x[i]) for f = identity (centre == NULL) or f = (x - *centre)². */
static float reduce_sum(const float *x, int n, const float *centre)
{
    float acc[REDUCE_LANES] = {0};
    int i = 0;
    if (!centre) {
        for (; i + REDUCE_LANES <= n; i += REDUCE_LANES)
            for (int l = 0; l < REDUCE_LANES; l++)
                acc[l] += x[i + l];
        for (; i < n; i++)
            acc[i % REDUCE_LANES] += x[i];
    } else {
        const float c = *centre;
        for (; i + REDUCE_LANES <= n; i += REDUCE_LANES)
            for (int l = 0; l < REDUCE_LANES; l++)
                acc[l] += (x[i + l] - c) * (x[i + l] - c);
        for (; i < n; i++)
            acc[i % REDUCE_LANES] += (x[i] - c) * (x[i] - c);
    }
    for (int w = REDUCE_LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

/* ---- normalisation ------------------------------------------------------------ */

typedef struct norm_job {
    float *y;           /* (rows, dim) */
    const float *x;     /* (rows, dim) */
    const uint16_t *w;  /* (dim) bf16 */
    const uint16_t *b;  /* (dim) bf16, layernorm only */
    int dim;
    float eps;
} norm_job;

/* MllamaTextRMSNorm in f32: y = (x · rsqrt(mean(x²) + eps)) · w. HF rounds
 * the normalised value to the activation dtype before the weight multiply,
 * which is the identity for f32 activations. */
static void rmsnorm_rows(void *ctx, int64_t begin, int64_t end, int tid)
{
    const norm_job *j = ctx;
    const float zero = 0.0f;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + (size_t)r * j->dim;
        float *y = j->y + (size_t)r * j->dim;
        const float ms = reduce_sum(x, j->dim, &zero) / (float)j->dim;
        const float inv = 1.0f / sqrtf(ms + j->eps);
        for (int i = 0; i < j->dim; i++)
            y[i] = (x[i] * inv) * ml_bf16_to_f32(j->w[i]);
    }
}

void ml_cpu_rmsnorm(ml_backend *be, float *y, const float *x, const uint16_t *w, int rows,
                    int dim, float eps)
{
    norm_job j = {.y = y, .x = x, .w = w, .dim = dim, .eps = eps};
    ml_cpu_pool_for(pool_of(be), rows, ml_cpu_grain(3.0 * dim), rmsnorm_rows, &j);
}

/* nn.LayerNorm: biased variance (two passes), eps inside the square root. */
static void layernorm_rows(void *ctx, int64_t begin, int64_t end, int tid)
{
    const norm_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + (size_t)r * j->dim;
        float *y = j->y + (size_t)r * j->dim;
        const float mean = reduce_sum(x, j->dim, NULL) / (float)j->dim;
        const float var = reduce_sum(x, j->dim, &mean) / (float)j->dim;
        const float inv = 1.0f / sqrtf(var + j->eps);
        for (int i = 0; i < j->dim; i++)
            y[i] = (x[i] - mean) * inv * ml_bf16_to_f32(j->w[i]) + ml_bf16_to_f32(j->b[i]);
    }
}

void ml_cpu_layernorm(ml_backend *be, float *y, const float *x, const uint16_t *w,
                      const uint16_t *b, int rows, int dim, float eps)
{
    norm_job j = {.y = y, .x = x, .w = w, .b = b, .dim = dim, .eps = eps};
    ml_cpu_pool_for(pool_of(be), rows, ml_cpu_grain(5.0 * dim), layernorm_rows, &j);
}

/* ---- activations ---------------------------------------------------------------- */

/* Elements per work item of the activations (a cache-friendly chunk). */
#define ACT_CHUNK 4096
/* Rough cost of one libm erff / expf / cosf in the units of
 * ML_CPU_MIN_WORK_PER_THREAD, and of one element of the vector activations
 * (a few dozen instructions per vector of 8 or 16). */
#define TRANSCENDENTAL_COST 16.0
#define VECTOR_ACT_COST 2.0

typedef struct act_job {
    const ml_cpu_kernels *kern; /* borrowed */
    float *y;
    const float *a, *b;
    size_t n;
} act_job;

/* The elements [lo, hi) of work items begin .. end. */
static void act_range(const act_job *j, int64_t begin, int64_t end, size_t *lo, size_t *hi)
{
    *lo = (size_t)begin * ACT_CHUNK;
    *hi = (size_t)end * ACT_CHUNK < j->n ? (size_t)end * ACT_CHUNK : j->n;
}

static void act_run(ml_backend *be, act_job *j, ml_cpu_pool_fn fn)
{
    const double cost = j->kern->isa == ML_CPU_ISA_PLAIN ? TRANSCENDENTAL_COST : VECTOR_ACT_COST;
    ml_cpu_pool_for(pool_of(be), (int64_t)((j->n + ACT_CHUNK - 1) / ACT_CHUNK),
                    ml_cpu_grain(cost * ACT_CHUNK), fn, j);
}

/* ACT2FN["gelu"]: x · ½ · (1 + erf(x / √2)), exact erf (not the tanh form). */
static void gelu_chunks(void *ctx, int64_t begin, int64_t end, int tid)
{
    const act_job *j = ctx;
    size_t lo, hi;
    act_range(j, begin, end, &lo, &hi);
    j->kern->gelu(j->y + lo, hi - lo);
}

void ml_cpu_gelu(ml_backend *be, float *x, size_t n)
{
    act_job j = {.kern = ml_cpu_of(be)->kern, .y = x, .n = n};
    act_run(be, &j, gelu_chunks);
}

/* silu(g) · u with silu(g) = g / (1 + exp(-g)) as torch computes it. */
static void silu_mul_chunks(void *ctx, int64_t begin, int64_t end, int tid)
{
    const act_job *j = ctx;
    size_t lo, hi;
    act_range(j, begin, end, &lo, &hi);
    j->kern->silu_mul(j->y + lo, j->a + lo, j->b + lo, hi - lo);
}

void ml_cpu_silu_mul(ml_backend *be, float *y, const float *gate, const float *up, size_t n)
{
    act_job j = {.kern = ml_cpu_of(be)->kern, .y = y, .a = gate, .b = up, .n = n};
    act_run(be, &j, silu_mul_chunks);
}

/* ---- RoPE ------------------------------------------------------------------------ */

typedef struct rope_job {
    float *x;              /* (n_tokens, n_heads, head_dim) */
    const int32_t *pos;    /* (n_tokens) */
    const float *inv_freq; /* (head_dim / 2) */
    int n_heads, head_dim;
} rope_job;

/* Half-split rotation (rotate_half): x' = x·cos + rotate_half(x)·sin with
 * angle (float)pos · inv_freq[i] formed in f32 and cos/sin of it in f32, as
 * MllamaRotaryEmbedding does before any dtype cast. */
static void rope_tokens(void *ctx, int64_t begin, int64_t end, int tid)
{
    const rope_job *j = ctx;
    const int half = j->head_dim / 2;
    float cs[ML_CPU_MAX_HEAD_DIM / 2], sn[ML_CPU_MAX_HEAD_DIM / 2];
    for (int64_t t = begin; t < end; t++) {
        for (int i = 0; i < half; i++) {
            const float angle = (float)j->pos[t] * j->inv_freq[i];
            cs[i] = cosf(angle);
            sn[i] = sinf(angle);
        }
        for (int h = 0; h < j->n_heads; h++) {
            float *x = j->x + ((size_t)t * j->n_heads + (size_t)h) * j->head_dim;
            for (int i = 0; i < half; i++) {
                const float x0 = x[i], x1 = x[i + half];
                x[i] = x0 * cs[i] - x1 * sn[i];
                x[i + half] = x1 * cs[i] + x0 * sn[i];
            }
        }
    }
}

void ml_cpu_rope(ml_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                 int n_tokens, int n_heads, int head_dim)
{
    assert(head_dim % 2 == 0 && head_dim <= ML_CPU_MAX_HEAD_DIM);
    rope_job j = {.x = x, .pos = pos, .inv_freq = inv_freq, .n_heads = n_heads,
                  .head_dim = head_dim};
    const double work = TRANSCENDENTAL_COST * head_dim + 3.0 * n_heads * head_dim;
    ml_cpu_pool_for(pool_of(be), n_tokens, ml_cpu_grain(work), rope_tokens, &j);
}

/* ---- elementwise ------------------------------------------------------------------ */

typedef struct rows_job {
    float *y;
    const float *x;
    const float *row_scale;
    const uint16_t *w;
    float gate;
    int dim, period;
} rows_job;

static void add_rows_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const rows_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        const float c = j->gate * (j->row_scale ? j->row_scale[r] : 1.0f);
        float *y = j->y + (size_t)r * j->dim;
        const float *x = j->x + (size_t)r * j->dim;
        for (int i = 0; i < j->dim; i++)
            y[i] += c * x[i];
    }
}

void ml_cpu_add_rows(ml_backend *be, float *y, const float *x, const float *row_scale, float gate,
                     int rows, int dim)
{
    rows_job j = {.y = y, .x = x, .row_scale = row_scale, .gate = gate, .dim = dim};
    ml_cpu_pool_for(pool_of(be), rows, ml_cpu_grain(dim), add_rows_part, &j);
}

static void add_bf16_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const rows_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        float *y = j->y + (size_t)r * j->dim;
        const uint16_t *w = j->w + (size_t)(r % j->period) * j->dim;
        for (int i = 0; i < j->dim; i++)
            y[i] += j->gate * ml_bf16_to_f32(w[i]);
    }
}

void ml_cpu_add_bf16(ml_backend *be, float *y, const uint16_t *w, float alpha, int rows,
                     int period, int dim)
{
    assert(period >= 1);
    rows_job j = {.y = y, .w = w, .gate = alpha, .dim = dim, .period = period};
    ml_cpu_pool_for(pool_of(be), rows, ml_cpu_grain(dim), add_bf16_part, &j);
}

void ml_cpu_zero(ml_backend *be, float *y, size_t n)
{
    if (n)
        memset(y, 0, n * sizeof *y);
}

typedef struct copy_job {
    float *dst;
    const float *src;
    int cols;
    size_t dst_row, dst_col, src_row;
} copy_job;

static void copy_2d_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const copy_job *j = ctx;
    for (int64_t r = begin; r < end; r++) {
        float *d = j->dst + (size_t)r * j->dst_row;
        const float *s = j->src + (size_t)r * j->src_row;
        if (j->dst_col == 1) {
            memcpy(d, s, (size_t)j->cols * sizeof *d);
            continue;
        }
        for (int c = 0; c < j->cols; c++)
            d[(size_t)c * j->dst_col] = s[c];
    }
}

void ml_cpu_copy_2d(ml_backend *be, float *dst, const float *src, int rows, int cols,
                    size_t dst_row, size_t dst_col, size_t src_row)
{
    copy_job j = {.dst = dst, .src = src, .cols = cols, .dst_row = dst_row, .dst_col = dst_col,
                  .src_row = src_row};
    ml_cpu_pool_for(pool_of(be), rows, ml_cpu_grain(cols), copy_2d_part, &j);
}

void ml_cpu_embed(ml_backend *be, float *y, const uint16_t *table, const int32_t *ids, int n,
                  int dim)
{
    for (int i = 0; i < n; i++) {
        assert(ids[i] >= 0);
        ml_bf16_to_f32_n(y + (size_t)i * dim, table + (size_t)ids[i] * dim, (size_t)dim);
    }
}

typedef struct patch_job {
    float *patches;      /* (n_img, grid², 3·patch²) */
    const float *pixels; /* (n_img, 3, side, side) */
    int side, patch, grid;
} patch_job;

#define PATCH_CHANNELS 3

/* Work items are (image, patch row) pairs. */
static void patchify_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const patch_job *j = ctx;
    const int p = j->patch, g = j->grid;
    const size_t plane = (size_t)j->side * j->side;
    const size_t row_len = (size_t)PATCH_CHANNELS * p * p;
    for (int64_t item = begin; item < end; item++) {
        const int64_t img = item / g;
        const int py = (int)(item % g);
        const float *src = j->pixels + (size_t)img * PATCH_CHANNELS * plane;
        for (int px = 0; px < g; px++) {
            float *dst = j->patches + ((size_t)img * g * g + (size_t)py * g + px) * row_len;
            for (int c = 0; c < PATCH_CHANNELS; c++)
                for (int ky = 0; ky < p; ky++)
                    memcpy(dst + ((size_t)c * p + ky) * p,
                           src + c * plane + (size_t)(py * p + ky) * j->side + (size_t)px * p,
                           (size_t)p * sizeof *dst);
        }
    }
}

void ml_cpu_patchify(ml_backend *be, float *patches, const float *pixels, int n_img, int side,
                     int patch)
{
    assert(patch >= 1 && side % patch == 0);
    patch_job j = {.patches = patches, .pixels = pixels, .side = side, .patch = patch,
                   .grid = side / patch};
    ml_cpu_pool_for(pool_of(be), (int64_t)n_img * j.grid,
                    ml_cpu_grain((double)PATCH_CHANNELS * side * patch), patchify_part, &j);
}

/* ---- caches ------------------------------------------------------------------------- */

/* n f32 values into the kv type at element offset `at` of dst: copied, or
 * rounded to bf16 (RNE, as the CUDA backend's caches) under ml_cpu_kv16. */
static void kv_put(const ml_cpu_backend *cb, void *dst, size_t at, const float *src, size_t n)
{
    if (ml_cpu_kv16(cb))
        ml_f32_to_bf16_n((uint16_t *)dst + at, src, n);
    else
        memcpy((float *)dst + at, src, n * sizeof *src);
}

void ml_cpu_kv_write(ml_backend *be, void *k_cache, void *v_cache, const float *k,
                     const float *v, const int32_t *slot, int n_tokens, int n_kv_heads,
                     int head_dim)
{
    const ml_cpu_backend *cb = ml_cpu_of(be);
    const size_t row = (size_t)n_kv_heads * head_dim;
    for (int t = 0; t < n_tokens; t++) {
        if (slot[t] < 0) /* a padding row */
            continue;
        kv_put(cb, k_cache, (size_t)slot[t] * row, k + (size_t)t * row, row);
        kv_put(cb, v_cache, (size_t)slot[t] * row, v + (size_t)t * row, row);
    }
}

void ml_cpu_kv_store(ml_backend *be, void *dst, const float *src, size_t n)
{
    if (n)
        kv_put(ml_cpu_of(be), dst, 0, src, n);
}

/* Keys per part of kv_store_keys: a part reads KEYS_PER_PART rows of K and
 * writes head_dim runs of as many keys, a few KiB each way. */
#define KEYS_PER_PART 64

typedef struct keys_job {
    void *dst;
    const float *src;
    int n_keys, n_kv_heads, head_dim, parts_per_head;
    const ml_cpu_backend *cb;
} keys_job;

/* Parts (kv head, block of KEYS_PER_PART keys): each dimension's run of
 * keys gathered from K's rows, then stored in the kv type. */
static void keys_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const keys_job *j = ctx;
    const size_t hd = (size_t)j->head_dim, row = (size_t)j->n_kv_heads * hd;
    float run[KEYS_PER_PART];
    for (int64_t part = begin; part < end; part++) {
        const int kvh = (int)(part / j->parts_per_head);
        const int k0 = (int)(part % j->parts_per_head) * KEYS_PER_PART;
        const int k1 = k0 + KEYS_PER_PART < j->n_keys ? k0 + KEYS_PER_PART : j->n_keys;
        const size_t plane = (size_t)kvh * hd * (size_t)j->n_keys;
        const float *src = j->src + (size_t)kvh * hd;
        for (size_t d = 0; d < hd; d++) {
            for (int key = k0; key < k1; key++)
                run[key - k0] = src[(size_t)key * row + d];
            kv_put(j->cb, j->dst, plane + d * (size_t)j->n_keys + (size_t)k0, run,
                   (size_t)(k1 - k0));
        }
    }
}

void ml_cpu_kv_store_keys(ml_backend *be, void *dst, const float *src, int n_keys,
                          int n_kv_heads, int head_dim)
{
    keys_job j = {.dst = dst, .src = src, .n_keys = n_keys, .n_kv_heads = n_kv_heads,
                  .head_dim = head_dim,
                  .parts_per_head = (n_keys + KEYS_PER_PART - 1) / KEYS_PER_PART,
                  .cb = ml_cpu_of(be)};
    ml_cpu_pool_for(pool_of(be), (int64_t)n_kv_heads * j.parts_per_head,
                    ml_cpu_grain((double)KEYS_PER_PART * head_dim), keys_part, &j);
}

/* ---- sampling ------------------------------------------------------------------------ */

/* Each thread of the op gets one scratch of sample.h, 64-byte aligned. */
static size_t sample_scratch_each(int vocab)
{
    return (ml_sample_scratch_bytes((size_t)vocab) + 63) / 64 * 64;
}

/* Threads the op uses for `rows` rows: one row per thread at least. */
static int sample_threads(ml_backend *be, int rows)
{
    int threads = ml_cpu_pool_threads(pool_of(be));
    return rows < threads ? rows : threads;
}

size_t ml_cpu_sample_scratch_bytes(ml_backend *be, int rows, int vocab)
{
    return rows > 0 ? (size_t)sample_threads(be, rows) * sample_scratch_each(vocab) : 0;
}

typedef struct sample_job {
    const ml_sample_params *p;
    size_t scratch_each;
} sample_job;

static void sample_rows(void *ctx, int64_t begin, int64_t end, int tid)
{
    const sample_job *j = ctx;
    const ml_sample_params *p = j->p;
    ml_sample_scratch *s =
        ml_sample_scratch_init((char *)p->scratch + (size_t)tid * j->scratch_each, (size_t)p->vocab);
    for (int64_t r = begin; r < end; r++) {
        const ml_sample_row *row = &p->row[r];
        /* A constraint or a bias never turns into a free draw. */
        if ((row->mask && !p->mask) || (row->n_bias > 0 && !p->bias)) {
            p->out[r] = (ml_sample_out){.chosen = {ML_SAMPLE_NO_TOKEN, 0.0f}};
            continue;
        }
        const uint64_t *allowed =
            row->mask ? p->mask + (size_t)(row->mask - 1) * (((size_t)p->vocab + 63) / 64) : NULL;
        const ml_logit_bias *bias = row->n_bias > 0 ? p->bias + row->bias_start : NULL;
        ml_sample_one(s, p->logits + (size_t)r * p->vocab, row, p->pen_id + row->pen_start,
                      p->pen_count + row->pen_start, bias, allowed, &p->out[r]);
    }
}

void ml_cpu_sample(ml_backend *be, const ml_sample_params *p)
{
    assert(p->vocab >= 1 && p->rows >= 0);
    if (p->rows == 0)
        return;
    sample_job j = {.p = p, .scratch_each = sample_scratch_each(p->vocab)};
    /* A row is a pass or more over the vocabulary: one row is enough work
     * for a thread, and the pool then runs sample_threads ranges, thread
     * tid owning scratch slot tid. */
    ml_cpu_pool_for(pool_of(be), p->rows, 1, sample_rows, &j);
}
