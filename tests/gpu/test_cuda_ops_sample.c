/* The sample op of the CUDA backend against the CPU backend: eagerly, as a
 * recorded graph, with and without per-row constraint masks and logit
 * biases, a +100 bias forcing its token and -100 banning it, and its
 * refusal of invalid shapes.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include "cuda_ops_harness.h"

/* ---- sampling ------------------------------------------------------------------------------- */

/* The sample op against the CPU backend's on random rows and controls.
 * Greedy tokens, the rows with no token and the top logprob ids must be the
 * CPU's exactly (both take the first maximum of the same penalised floats,
 * rounded the same way). Logprob values: both sum exp(z - max) over the
 * same logits in double, the GPU with CUDA's expf (<= 2 ulp), the CPU with
 * its own exp (<= 1 ulp), so the log-sums differ by <= 3 * 2^-24 ≈ 1.8e-7;
 * each side then rounds z - lse to float (half an ulp each):
 * |diff| <= LOGPROB_ATOL + LOGPROB_RTOL * |want|. A draw may differ only
 * when u lies within rounding of a boundary of the cumulative distribution:
 * the GPU's token must then be one the CPU keeps, and u within SAMPLE_U_TOL
 * of its cumulative interval. Masses differ by the same 3 * 2^-24 per term,
 * so cumulative fractions by at most twice that (7e-7); 2e-6 leaves room
 * for the GPU's fixed-point sums (under 2^-30 of the total) and is still
 * far below a token's probability for all but the flattest rows. */
#define LOGPROB_ATOL 5e-7
#define LOGPROB_RTOL 2.4e-7 /* 2^-22: the result's float rounding on both sides, with room */
#define SAMPLE_U_TOL 2e-6
#define SAMPLE_MAX_PEN 48 /* penalty entries per row, at most */
#define SAMPLE_MAX_BIAS 8 /* bias entries per row in the random batches, at most */
#define SAMPLE_RNG_SEED 0x5a3d1e8c6b7f9021ull

typedef enum logit_shape {
    SHAPE_NORMAL,       /* N(0, sigma), sigma from shape_sigma (as every shape's base) */
    SHAPE_TIED_TOP,     /* a few ids share the maximum */
    SHAPE_MASKED,       /* a block of -inf */
    SHAPE_NAN,          /* NaN at id 0 and inside the row */
    SHAPE_COARSE,       /* values on a 0.5 grid: ties everywhere */
    SHAPE_FLAT,         /* every logit 0, half of them -0 */
    SHAPE_PEAKED,       /* one dominant logit over N(0, 2) */
    SHAPE_ALL_NEG_INF,  /* no token */
    SHAPE_ALL_NAN,      /* no token */
    SHAPE_POS_INF       /* one +inf: no token */
} logit_shape;

static const float shape_sigma[] = {0.3f, 1.0f, 3.0f, 10.0f};

/* The shapes of consecutive rows: mostly ordinary ones, each no-token shape
 * once in a cycle. */
static const logit_shape shape_cycle[] = {
    SHAPE_NORMAL,  SHAPE_TIED_TOP,    SHAPE_NORMAL, SHAPE_MASKED,
    SHAPE_NORMAL,  SHAPE_NAN,         SHAPE_COARSE, SHAPE_NORMAL,
    SHAPE_FLAT,    SHAPE_PEAKED,      SHAPE_NORMAL, SHAPE_ALL_NEG_INF,
    SHAPE_NORMAL,  SHAPE_TIED_TOP,    SHAPE_PEAKED, SHAPE_ALL_NAN,
    SHAPE_NORMAL,  SHAPE_COARSE,      SHAPE_NORMAL, SHAPE_POS_INF};
#define SHAPE_CYCLE ((int)(sizeof shape_cycle / sizeof shape_cycle[0]))

/* Standard normal (Box-Muller on test_rand.h's stream). */
static float gauss(void)
{
    const double a = 1.0 - urand(), b = urand(); /* a in (0, 1] */
    return (float)(sqrt(-2.0 * log(a)) * cos(2.0 * M_PI * b));
}

static void fill_logits(float *x, int V, logit_shape shape)
{
    const float sigma = shape_sigma[irand(sizeof shape_sigma / sizeof shape_sigma[0])];
    for (int i = 0; i < V; i++)
        x[i] = sigma * gauss();
    switch (shape) {
    case SHAPE_NORMAL:
        break;
    case SHAPE_TIED_TOP: {
        const float top = 4.0f * sigma + 5.0f;
        for (int k = 0; k < 4; k++)
            x[irand(V)] = top;
        break;
    }
    case SHAPE_MASKED:
        for (int i = V / 4; i < V / 2 + 1 && i < V; i++)
            x[i] = -INFINITY;
        break;
    case SHAPE_NAN:
        x[0] = NAN;
        x[irand(V)] = NAN;
        break;
    case SHAPE_COARSE:
        for (int i = 0; i < V; i++)
            x[i] = roundf(2.0f * x[i] / sigma) * 0.5f;
        break;
    case SHAPE_FLAT:
        for (int i = 0; i < V; i++)
            x[i] = irand(2) ? -0.0f : 0.0f;
        break;
    case SHAPE_PEAKED:
        for (int i = 0; i < V; i++)
            x[i] = 2.0f * gauss();
        x[irand(V)] = 12.0f;
        break;
    case SHAPE_ALL_NEG_INF:
        for (int i = 0; i < V; i++)
            x[i] = -INFINITY;
        break;
    case SHAPE_ALL_NAN:
        for (int i = 0; i < V; i++)
            x[i] = NAN;
        break;
    case SHAPE_POS_INF:
        x[irand(V)] = INFINITY;
        break;
    }
}

/* Up to SAMPLE_MAX_BIAS bias entries with distinct ids for row r of
 * logits x (V), a third of the rows, into bias from index r->bias_start:
 * the best id among them half the time, values anywhere in [-100, 100]. */
static void random_bias(ml_sample_row *r, const float *x, int V, ml_logit_bias *bias)
{
    if (irand(3) != 0)
        return;
    int best = 0;
    for (int i = 1; i < V; i++)
        best = x[i] > x[best] ? i : best;
    const int n = 1 + irand(SAMPLE_MAX_BIAS);
    for (int j = 0; j < n && j < V; j++) {
        int32_t id = j == 0 && irand(2) ? best : irand(V);
        for (int k = 0; k < r->n_bias; k++)
            if (bias[r->bias_start + k].id == id) {
                id = -1; /* taken: ids are distinct */
                break;
            }
        if (id >= 0)
            bias[r->bias_start + r->n_bias++] =
                (ml_logit_bias){id, frand(-ML_SAMPLE_MAX_ABS_BIAS, ML_SAMPLE_MAX_ABS_BIAS)};
    }
}

/* Random controls for a row of logits x (V): greedy or a draw with any mix
 * of top-k, top-p and min-p; penalties on up to SAMPLE_MAX_PEN distinct ids
 * (the best one among them half the time, so they matter), some with count
 * 0; logprobs with 0..20 top ids; u including 0 and 1 - 2^-53. The entries
 * go to pen_id/pen_count from index pen_start. */
static ml_sample_row random_controls(const float *x, int V, int pen_start, int32_t *pen_id,
                                     uint32_t *pen_count)
{
    static const float temps[] = {0.3f, 0.7f, 1.0f, 1.5f};
    static const uint32_t top_ks[] = {1, 5, 50, 1000, 5000};
    static const float top_ps[] = {0.1f, 0.5f, 0.9f, 0.95f};
    static const float min_ps[] = {0.01f, 0.05f, 0.2f};
    ml_sample_row r = {.u = urand(), .temperature = 0.0f, .top_p = 1.0f,
                       .repetition_penalty = 1.0f, .pen_start = pen_start};
    if (irand(4) != 0) { /* a quarter greedy */
        const int filters = irand(8); /* 0: temperature only */
        r.temperature = temps[irand(4)];
        if (filters & 1) /* top_k = V (off) and values below V */
            r.top_k = top_ks[irand(5)] % (uint32_t)(V + 1);
        if (filters & 2)
            r.top_p = top_ps[irand(4)];
        if (filters & 4)
            r.min_p = min_ps[irand(3)];
    }
    const int u_kind = irand(8);
    if (u_kind == 0)
        r.u = 0.0;
    else if (u_kind == 1)
        r.u = 1.0 - 0x1.0p-53;
    if (irand(3) == 0)
        r.repetition_penalty = irand(2) ? 1.3f : 0.7f;
    if (irand(3) == 0)
        r.presence_penalty = frand(-1.0f, 1.0f);
    if (irand(3) == 0)
        r.frequency_penalty = frand(-1.0f, 1.0f);
    /* Entries also without a penalty on: the op must then leave them be. */
    const int n_pen = irand(4) == 0 ? 0 : irand(SAMPLE_MAX_PEN + 1);
    int best = 0;
    for (int i = 1; i < V; i++)
        best = x[i] > x[best] ? i : best;
    for (int j = 0; j < n_pen && j < V; j++) {
        int32_t id = j == 0 && irand(2) ? best : irand(V);
        for (int k = 0; k < r.n_pen; k++)
            if (pen_id[pen_start + k] == id) {
                id = -1; /* taken: ids are distinct */
                break;
            }
        if (id < 0)
            continue;
        pen_id[pen_start + r.n_pen] = id;
        pen_count[pen_start + r.n_pen] = (uint32_t)irand(4);
        r.n_pen++;
    }
    if (irand(2)) {
        r.logprobs = 1;
        r.n_top = (uint32_t)irand(ML_SAMPLE_MAX_TOP + 1);
        r.n_top = r.n_top < (uint32_t)V ? r.n_top : (uint32_t)V;
    }
    return r;
}

static int logprob_close(float got, float want)
{
    if (isinf(want) || isinf(got))
        return got == want;
    return fabsf(got - want) <= LOGPROB_ATOL + LOGPROB_RTOL * fabsf(want);
}

/* Is u within SAMPLE_U_TOL of the cumulative interval of id in dist (n
 * kept tokens, best first, renormalised logprobs)? */
static int drawable(const ml_token_logprob *dist, size_t n, int32_t id, double u)
{
    double before = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double p = exp((double)dist[i].logprob);
        if (dist[i].id == id)
            return u >= before - SAMPLE_U_TOL && u <= before + p + SAMPLE_U_TOL;
        before += p;
    }
    return 0;
}

typedef struct sample_batch {
    int rows, vocab, n_entries;
    float *logits;        /* (rows, vocab) */
    ml_sample_row *row;   /* (rows) */
    int32_t *pen_id;      /* (rows * SAMPLE_MAX_PEN) */
    uint32_t *pen_count;  /* (rows * SAMPLE_MAX_PEN) */
    uint64_t *mask;       /* (rows, words) constraint slices, NULL when unconstrained */
    int words, n_masks;
    ml_logit_bias *bias;  /* (rows * SAMPLE_MAX_BIAS), n_bias of them used */
    int n_bias;
} sample_batch;

typedef enum mask_kind {
    MASK_HALF,         /* each id with probability 1/2 */
    MASK_SPARSE,       /* about 1% of the ids, never the raw best */
    MASK_ONE,          /* all but one masked */
    MASK_EOS,          /* only the last id: an end-of-sequence id once a document is complete */
    MASK_TEXT_AND_EOS, /* a few ids and the last one */
    MASK_NONE_ALLOWED, /* nothing: no token */
    MASK_KINDS
} mask_kind;

static void mask_set(uint64_t *m, int id)
{
    m[id >> 6] |= 1ull << (id & 63);
}

/* A random constraint of the given kind over x (V) into m (words, zeroed). */
static void fill_mask(uint64_t *m, const float *x, int V, mask_kind kind)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        best = x[i] > x[best] ? i : best;
    switch (kind) {
    case MASK_HALF:
        for (int i = 0; i < V; i++)
            if (irand(2))
                mask_set(m, i);
        break;
    case MASK_SPARSE:
        for (int i = 0; i < V; i++)
            if (i != best && irand(100) == 0)
                mask_set(m, i);
        break;
    case MASK_ONE: mask_set(m, irand(V)); break;
    case MASK_EOS: mask_set(m, V - 1); break;
    case MASK_TEXT_AND_EOS:
        for (int j = 0; j < 5; j++)
            mask_set(m, irand(V));
        mask_set(m, V - 1);
        break;
    case MASK_NONE_ALLOWED:
    case MASK_KINDS: break;
    }
}

/* Random rows; with `masked` three rows in four carry a constraint, its
 * slice numbered from the end (the op must follow row.mask, not the row
 * index). */
static sample_batch sample_batch_make(int rows, int V, int masked)
{
    sample_batch b = {rows, V, 0, xmalloc((size_t)rows * V * 4),
                      xmalloc((size_t)rows * sizeof(ml_sample_row)),
                      xmalloc((size_t)rows * SAMPLE_MAX_PEN * 4),
                      xmalloc((size_t)rows * SAMPLE_MAX_PEN * 4), NULL, (V + 63) / 64, 0,
                      xmalloc((size_t)rows * SAMPLE_MAX_BIAS * sizeof(ml_logit_bias)), 0};
    if (masked) {
        b.mask = xmalloc((size_t)rows * b.words * sizeof *b.mask);
        memset(b.mask, 0, (size_t)rows * b.words * sizeof *b.mask);
    }
    for (int r = 0; r < rows; r++) {
        float *x = b.logits + (size_t)r * V;
        fill_logits(x, V, shape_cycle[r % SHAPE_CYCLE]);
        b.row[r] = random_controls(x, V, b.n_entries, b.pen_id, b.pen_count);
        b.n_entries += b.row[r].n_pen;
        b.row[r].bias_start = b.n_bias;
        random_bias(&b.row[r], x, V, b.bias);
        b.n_bias += b.row[r].n_bias;
        if (masked && r % 4 != 0) {
            uint32_t slice = (uint32_t)(rows - 1 - b.n_masks++);
            fill_mask(b.mask + (size_t)slice * b.words, x, V, (mask_kind)irand(MASK_KINDS));
            b.row[r].mask = slice + 1;
        }
    }
    return b;
}

static void sample_batch_free(sample_batch *b)
{
    free(b->logits);
    free(b->row);
    free(b->pen_id);
    free(b->pen_count);
    free(b->mask);
    free(b->bias);
}

/* Row r's constraint, NULL when it has none. */
static const uint64_t *row_mask(const sample_batch *b, int r)
{
    return b->row[r].mask ? b->mask + (size_t)(b->row[r].mask - 1) * b->words : NULL;
}

/* The CPU backend's outputs for the batch (caller frees). */
static ml_sample_out *sample_cpu(const sample_batch *b)
{
    ml_sample_out *want = xmalloc((size_t)b->rows * sizeof *want);
    const size_t bytes = g_cpu->ops->sample_scratch_bytes(g_cpu, b->rows, b->vocab);
    void *scratch = g_cpu->ops->alloc(g_cpu, bytes);
    check(scratch != NULL, "cpu sample scratch");
    ml_sample_params p = {.out = want, .logits = b->logits, .row = b->row, .pen_id = b->pen_id,
                          .pen_count = b->pen_count, .bias = b->bias, .mask = b->mask,
                          .scratch = scratch, .rows = b->rows, .vocab = b->vocab};
    g_cpu->ops->sample(g_cpu, &p);
    g_cpu->ops->free(g_cpu, scratch);
    return want;
}

/* Device copies of a batch and the op's parameters over them. */
typedef struct sample_dev {
    ml_sample_params p;
    void *dev[8];
} sample_dev;

static sample_dev sample_dev_make(const sample_batch *b)
{
    sample_dev d;
    const size_t pen_bytes = (size_t)(b->n_entries ? b->n_entries : 1) * 4;
    d.dev[0] = dput(NULL, (size_t)b->rows * sizeof(ml_sample_out));
    d.dev[1] = dput(b->logits, (size_t)b->rows * b->vocab * 4);
    d.dev[2] = dput(b->row, (size_t)b->rows * sizeof *b->row);
    d.dev[3] = dput(b->pen_id, pen_bytes);
    d.dev[4] = dput(b->pen_count, pen_bytes);
    d.dev[5] = dput(NULL, g_gpu->ops->sample_scratch_bytes(g_gpu, b->rows, b->vocab));
    d.dev[6] = b->mask ? dput(b->mask, (size_t)b->rows * b->words * sizeof *b->mask) : NULL;
    d.dev[7] = dput(b->bias, (size_t)b->rows * SAMPLE_MAX_BIAS * sizeof *b->bias);
    d.p = (ml_sample_params){.out = d.dev[0], .logits = d.dev[1], .row = d.dev[2],
                             .pen_id = d.dev[3], .pen_count = d.dev[4], .bias = d.dev[7],
                             .mask = d.dev[6], .scratch = d.dev[5], .rows = b->rows,
                             .vocab = b->vocab};
    return d;
}

static void sample_dev_free(sample_dev *d)
{
    for (size_t i = 0; i < sizeof d->dev / sizeof d->dev[0]; i++)
        dfree(d->dev[i]);
}

/* Compare the GPU's outputs got with the CPU's want, row by row (see the
 * section comment). */
static void sample_compare(const sample_batch *b, const ml_sample_out *got,
                           const ml_sample_out *want, const char *what)
{
    const int V = b->vocab;
    void *mem = g_cpu->ops->alloc(g_cpu, ml_sample_scratch_bytes((size_t)V)); /* 64-byte aligned */
    ml_sample_scratch *s = ml_sample_scratch_init(mem, (size_t)V);
    ml_token_logprob *dist = xmalloc((size_t)V * sizeof *dist);
    float *masked = xmalloc((size_t)V * sizeof *masked);
    int n_greedy = 0, n_draw = 0, n_none = 0, n_differ = 0, n_masked = 0, n_biased = 0, bad = 0;
    for (int r = 0; r < b->rows && s; r++) {
        const ml_sample_row *row = &b->row[r];
        const float *x = b->logits + (size_t)r * V;
        const ml_sample_out *g = &got[r], *w = &want[r];
        const int32_t *pid = b->pen_id + row->pen_start;
        const uint32_t *pcount = b->pen_count + row->pen_start;
        const ml_logit_bias *bias = b->bias + row->bias_start;
        n_biased += row->n_bias > 0;
        /* A constrained row draws from its logits with the masked ids at
         * -inf (penalties leave -inf there); its logprobs stay the raw x's. */
        const uint64_t *m = row_mask(b, r);
        const float *drawn_from = x;
        if (m) {
            n_masked++;
            for (int i = 0; i < V; i++)
                masked[i] = m[i >> 6] >> (i & 63) & 1 ? x[i] : -INFINITY;
            drawn_from = masked;
        }
        int ok = m == NULL || g->chosen.id == ML_SAMPLE_NO_TOKEN ||
                 (m[g->chosen.id >> 6] >> (g->chosen.id & 63) & 1);
        if (w->chosen.id == ML_SAMPLE_NO_TOKEN) {
            n_none++;
            ok = g->chosen.id == ML_SAMPLE_NO_TOKEN && g->n_top == 0 && g->chosen.logprob == 0.0f;
        } else if (row->temperature < ML_SAMPLE_GREEDY_TEMPERATURE) {
            n_greedy++;
            ok = ok && g->chosen.id == w->chosen.id;
        } else {
            n_draw++;
            if (g->chosen.id != w->chosen.id) {
                n_differ++;
                size_t n_kept = 0;
                ok = ok &&
                     ml_sample_distribution(s, drawn_from, row, pid, pcount, bias, dist,
                                            (size_t)V, &n_kept, NULL, 0) == ML_OK &&
                     drawable(dist, n_kept, g->chosen.id, row->u);
            }
        }
        if (ok && w->chosen.id != ML_SAMPLE_NO_TOKEN) {
            ml_sample_out ref = *w;
            if (row->logprobs && g->chosen.id != w->chosen.id)
                ok = ml_sample_logprobs(x, (size_t)V, g->chosen.id, row->n_top, &ref, NULL, 0) ==
                     ML_OK;
            ok = ok && g->n_top == ref.n_top &&
                 (row->logprobs ? logprob_close(g->chosen.logprob, ref.chosen.logprob)
                                : g->chosen.logprob == 0.0f);
            for (uint32_t j = 0; ok && j < ref.n_top; j++)
                ok = g->top[j].id == ref.top[j].id &&
                     logprob_close(g->top[j].logprob, ref.top[j].logprob);
        }
        /* Entries past n_top are zero, as the CPU leaves them. */
        for (uint32_t j = g->n_top; ok && j < ML_SAMPLE_MAX_TOP; j++)
            ok = g->top[j].id == 0 && g->top[j].logprob == 0.0f;
        if (!ok && bad++ < 8)
            fprintf(stderr,
                    "  row %d (shape %d, t %g, k %u, p %g, min_p %g, u %.17g, pen %d, bias %d, "
                    "n_top %u): gpu id %d lp %.9g n_top %u, cpu id %d lp %.9g n_top %u\n",
                    r, (int)shape_cycle[r % SHAPE_CYCLE], (double)row->temperature,
                    (unsigned)row->top_k, (double)row->top_p, (double)row->min_p, row->u,
                    (int)row->n_pen, (int)row->n_bias, (unsigned)row->n_top, (int)g->chosen.id,
                    (double)g->chosen.logprob, (unsigned)g->n_top, (int)w->chosen.id,
                    (double)w->chosen.logprob, (unsigned)w->n_top);
    }
    check(s != NULL, "%s: host scratch", what);
    check(bad == 0, "%s: %d of %d rows disagree with the CPU", what, bad, b->rows);
    fprintf(stderr,
            "  %-64s %d greedy, %d drawn (%d differ within %.0e of a boundary), %d none, "
            "%d masked, %d biased\n",
            what, n_greedy, n_draw, n_differ, SAMPLE_U_TOL, n_none, n_masked, n_biased);
    g_cpu->ops->free(g_cpu, mem);
    free(dist);
    free(masked);
}

static void sample_case(int rows, int V, int masked)
{
    sample_batch b = sample_batch_make(rows, V, masked);
    ml_sample_out *want = sample_cpu(&b);
    ml_sample_out *got = xmalloc((size_t)rows * sizeof *got);
    ml_sample_out *again = xmalloc((size_t)rows * sizeof *again);
    sample_dev d = sample_dev_make(&b);
    char what[96];
    snprintf(what, sizeof what, "sample, %d rows of vocab %d%s", rows, V,
             masked ? ", constrained" : "");
    g_gpu->ops->sample(g_gpu, &d.p);
    dget(got, d.p.out, (size_t)rows * sizeof *got, what);
    sample_compare(&b, got, want, what);
    g_gpu->ops->sample(g_gpu, &d.p);
    dget(again, d.p.out, (size_t)rows * sizeof *again, what);
    snprintf(what, sizeof what, "sample, vocab %d: a second run is bit-identical", V);
    check_exact(again, got, (size_t)rows * sizeof *got, what);
    sample_dev_free(&d);
    sample_batch_free(&b);
    free(want);
    free(got);
    free(again);
}

/* Recorded once, replayed with new logits, controls, penalty and bias
 * entries and masks written into the same buffers: the op reads them when
 * it runs. */
static void sample_graph(void)
{
    enum { ROWS = 24, V = 1000, SLOT = 5 };
    sample_batch b = sample_batch_make(ROWS, V, 1);
    sample_dev d = sample_dev_make(&b);
    ml_sample_out *got = xmalloc(ROWS * sizeof *got);
    sync_ok("sample graph setup");
    g_gpu->ops->graph_begin(g_gpu, SLOT);
    g_gpu->ops->sample(g_gpu, &d.p);
    g_gpu->ops->graph_end(g_gpu, SLOT);
    sync_ok("sample graph record");
    for (int rep = 0; rep < 2; rep++) {
        sample_batch next = sample_batch_make(ROWS, V, 1);
        g_gpu->ops->upload(g_gpu, d.dev[1], next.logits, (size_t)ROWS * V * 4);
        g_gpu->ops->upload(g_gpu, d.dev[6], next.mask, (size_t)ROWS * next.words * 8);
        /* Within the recorded capacity: the first batch's entry count. */
        const int n = next.n_entries < b.n_entries ? next.n_entries : b.n_entries;
        for (int r = 0; r < ROWS; r++)
            if (next.row[r].pen_start + next.row[r].n_pen > n)
                next.row[r].n_pen = next.row[r].pen_start < n ? n - next.row[r].pen_start : 0;
        g_gpu->ops->upload(g_gpu, d.dev[2], next.row, ROWS * sizeof *next.row);
        if (next.n_bias > 0)
            g_gpu->ops->upload(g_gpu, d.dev[7], next.bias,
                               (size_t)next.n_bias * sizeof *next.bias);
        if (n > 0) {
            g_gpu->ops->upload(g_gpu, d.dev[3], next.pen_id, (size_t)n * 4);
            g_gpu->ops->upload(g_gpu, d.dev[4], next.pen_count, (size_t)n * 4);
        }
        g_gpu->ops->graph_replay(g_gpu, SLOT);
        char what[96];
        snprintf(what, sizeof what, "sample graph replay %d, vocab %d", rep, V);
        dget(got, d.p.out, ROWS * sizeof *got, what);
        ml_sample_out *want = sample_cpu(&next);
        sample_compare(&next, got, want, what);
        free(want);
        sample_batch_free(&next);
    }
    sample_dev_free(&d);
    sample_batch_free(&b);
    free(got);
}

/* OpenAI's logit_bias in practice, on both backends: +100 on the least
 * likely token always yields it, -100 on the best never yields it, greedy
 * and drawn (temperature only, and with top-k and top-p; u at 0, the
 * middle and 1 - 2^-53), alone, with penalties (on the forced token too)
 * and with a constraint mask (allowing both tokens); the GPU agrees with
 * the CPU row by row. */
enum { BIAS_CONFIGS = 3, BIAS_EXTRAS = 3, BIAS_US = 3 };
#define BIAS_LOGIT_SIGMA 3.0f

static void sample_bias_forces_and_bans(int V)
{
    static const double us[BIAS_US] = {0.0, 0.5, 1.0 - 0x1.0p-53};
    const int rows = BIAS_CONFIGS * BIAS_EXTRAS * 2 * BIAS_US;
    sample_batch b = {rows, V, 0, xmalloc((size_t)rows * V * 4),
                      xmalloc((size_t)rows * sizeof(ml_sample_row)),
                      xmalloc((size_t)rows * SAMPLE_MAX_PEN * 4),
                      xmalloc((size_t)rows * SAMPLE_MAX_PEN * 4), NULL, (V + 63) / 64, 0,
                      xmalloc((size_t)rows * SAMPLE_MAX_BIAS * sizeof(ml_logit_bias)), 0};
    b.mask = xmalloc((size_t)rows * b.words * sizeof *b.mask);
    memset(b.mask, 0, (size_t)rows * b.words * sizeof *b.mask);
    int32_t *target = xmalloc((size_t)rows * sizeof *target);
    int r = 0;
    for (int config = 0; config < BIAS_CONFIGS; config++)
        for (int extra = 0; extra < BIAS_EXTRAS; extra++) /* none, penalties, mask */
            for (int banning = 0; banning < 2; banning++)
                for (int k = 0; k < BIAS_US; k++, r++) {
                    /* Logits of a realistic spread: +100 outweighs them
                     * (with sigma 10 the lowest would lie 90 below the
                     * best, and +100 would not force it in practice). */
                    float *x = b.logits + (size_t)r * V;
                    for (int i = 0; i < V; i++)
                        x[i] = BIAS_LOGIT_SIGMA * gauss();
                    int best = 0, low = 0;
                    for (int i = 1; i < V; i++) {
                        best = x[i] > x[best] ? i : best;
                        low = x[i] < x[low] ? i : low;
                    }
                    ml_sample_row *row = &b.row[r];
                    *row = (ml_sample_row){.u = us[k], .temperature = config ? 1.0f : 0.0f,
                                           .top_p = config == 2 ? 0.9f : 1.0f,
                                           .top_k = config == 2 ? 50 : 0,
                                           .repetition_penalty = 1.0f, .logprobs = 1,
                                           .pen_start = b.n_entries, .bias_start = b.n_bias,
                                           .n_bias = 1};
                    if (extra == 1) { /* they only lower logits: best stays the best */
                        row->repetition_penalty = 1.3f;
                        row->presence_penalty = 0.5f;
                        row->frequency_penalty = 0.5f;
                        const int32_t ids[] = {low, (best + 1) % V, (best + 2) % V};
                        for (int j = 0; j < 3; j++) {
                            int taken = ids[j] == best;
                            for (int e = 0; e < row->n_pen; e++)
                                taken |= b.pen_id[row->pen_start + e] == ids[j];
                            if (taken)
                                continue;
                            b.pen_id[b.n_entries] = ids[j];
                            b.pen_count[b.n_entries++] = 1;
                            row->n_pen++;
                        }
                    }
                    if (extra == 2) {
                        uint64_t *m = b.mask + (size_t)b.n_masks * b.words;
                        fill_mask(m, x, V, MASK_HALF);
                        mask_set(m, best);
                        mask_set(m, low);
                        row->mask = (uint32_t)++b.n_masks;
                    }
                    target[r] = banning ? best : low;
                    b.bias[b.n_bias++] = (ml_logit_bias){
                        target[r], banning ? -ML_SAMPLE_MAX_ABS_BIAS : ML_SAMPLE_MAX_ABS_BIAS};
                }
    ml_sample_out *want = sample_cpu(&b);
    ml_sample_out *got = xmalloc((size_t)rows * sizeof *got);
    sample_dev d = sample_dev_make(&b);
    char what[96];
    snprintf(what, sizeof what, "sample, vocab %d: +100 forces, -100 bans", V);
    g_gpu->ops->sample(g_gpu, &d.p);
    dget(got, d.p.out, (size_t)rows * sizeof *got, what);
    sample_compare(&b, got, want, what);
    int bad = 0;
    for (int i = 0; i < rows; i++) {
        const int banned = b.bias[b.row[i].bias_start].value < 0.0f;
        const int ok = banned ? got[i].chosen.id != target[i] && want[i].chosen.id != target[i]
                              : got[i].chosen.id == target[i] && want[i].chosen.id == target[i];
        if (!ok && bad++ < 8)
            fprintf(stderr, "  row %d: %s %d, gpu %d, cpu %d\n", i, banned ? "banned" : "forced",
                    (int)target[i], (int)got[i].chosen.id, (int)want[i].chosen.id);
    }
    check(bad == 0, "%s: %d of %d rows ignore the bias", what, bad, rows);
    sample_dev_free(&d);
    sample_batch_free(&b);
    free(target);
    free(want);
    free(got);
}

static void test_sample(void)
{
    /* A stream of its own: the tests after this one draw the same inputs
     * whatever this one draws. */
    const uint64_t stream = ml_test_rng;
    rand_seed(SAMPLE_RNG_SEED);
    sample_case(120, 128256, 0);
    sample_case(600, 1000, 0);
    sample_case(60, 3, 0);
    sample_case(48, 128256, 1);
    sample_case(300, 1000, 1);
    sample_case(60, 3, 1);
    sample_graph();
    sample_bias_forces_and_bans(128256);
    sample_bias_forces_and_bans(1000);
    ml_test_rng = stream;

    /* Invalid shapes are latched and reported at synchronize. */
    char err[ERRLEN] = "";
    ml_sample_params bad = {.rows = -1, .vocab = 1000};
    g_gpu->ops->sample(g_gpu, &bad);
    check(g_gpu->ops->synchronize(g_gpu, err, sizeof err) == ML_ERR_INVALID_ARG,
          "sample with rows -1 is refused at synchronize");
    fprintf(stderr, "  reported: %s\n", err);
    bad = (ml_sample_params){.rows = 0, .vocab = 1000};
    g_gpu->ops->sample(g_gpu, &bad);
    sync_ok("sample with rows 0 is a no-op");
}

int main(void)
{
    cuda_ops_open();
    fprintf(stderr, "sampling\n");
    test_sample();
    return cuda_ops_close();
}
