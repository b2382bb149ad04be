/* The sampling pipeline of sample.h on the CPU: penalties on the few ids a
 * row lists, then selection over the tokens that can matter, never a sort of
 * the vocabulary.
 *
 * One row over V logits, without allocating:
 *   - bias and penalties: a copy of the logits (only when a bias, a penalty
 *     or a mask is on) and one update per entry;
 *   - the maximum (greedy stops after finding its first index);
 *   - one pass collecting the candidates: within the negligible-mass gap of
 *     the maximum, and with top-k only the k best (a heap, see
 *     cand_collect_top_k);
 *   - exp of the candidates, with a vectorisable exp (glibc's expf would
 *     cost more than the rest of the step);
 *   - one histogram pass by logit bucket; top-p and the draw each walk the
 *     bucket masses to the bucket where the running mass crosses their
 *     target and finish with a quickselect on that bucket's candidates.
 * Every quickselect falls back to a sort past 2 log2(n) rounds, which bounds
 * the worst case at O(n log n) whatever the logits. */
#include "sample.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ln(n) + 24 ln 2: tokens whose logit (after temperature) lies further below
 * the maximum hold, all n together, under 2^-24 of the softmax mass. */
static float negligible_log_gap(size_t n_vocab)
{
    return logf((float)n_vocab) + (float)FLT_MANT_DIG * (float)M_LN2;
}

/* The strict rank order of sample.h: higher logit first, lower id on ties. */
static inline bool rank_before(float za, int32_t ida, float zb, int32_t idb)
{
    return za > zb || (za == zb && ida < idb);
}

/* ---- passes over the vocabulary ---------------------------------------------
 * Written as plain loops over arrays with independent lanes, so that -O3
 * vectorises them (engine/CMakeLists.txt compiles this file with -O3 and
 * -fno-trapping-math, which lets the compiler turn the selects into blends). */

#define SAMPLER_LANES 8

/* logits_argmax runs on GCC vector types of the baseline x86-64 width (4
 * floats, SSE2), ARGMAX_CHAINS of them apart: the compiler did not
 * vectorise the two selects of a plain loop (it stayed scalar). Measured,
 * 32 rows of 128,256 random logits, one thread of the development VM
 * (Zen 5): 0.69 ms against 1.2-1.8 for a max pass then a scalar search for
 * its index, which was 1.6% of a 32-sequence decode step of the small
 * preset (perf), and 1.0 ms with 2 chains. */
#define ARGMAX_WIDTH 4
#define ARGMAX_CHAINS 4
typedef float argmax_f __attribute__((vector_size(ARGMAX_WIDTH * sizeof(float))));
typedef int32_t argmax_i __attribute__((vector_size(ARGMAX_WIDTH * sizeof(int32_t))));

/* Largest element of z[0, n), NaN ignored (-inf when there is none), and
 * in *first the index of its first occurrence (0 when there is none), in
 * one pass: each lane keeps the block where its maximum first appeared (a
 * strict >), so the first occurrence overall is the lowest index among the
 * lanes holding the maximum. n <= INT32_MAX (ml_sample_scratch_init). */
static float logits_argmax(const float *z, size_t n, size_t *first)
{
    const size_t block = ARGMAX_WIDTH * ARGMAX_CHAINS;
    argmax_f lane[ARGMAX_CHAINS];
    argmax_i at[ARGMAX_CHAINS], blk = {0};
    for (int c = 0; c < ARGMAX_CHAINS; c++) {
        at[c] = (argmax_i){0};
        for (int j = 0; j < ARGMAX_WIDTH; j++)
            lane[c][j] = -INFINITY;
    }
    size_t i = 0;
    for (; i + block <= n; i += block, blk += 1)
        for (int c = 0; c < ARGMAX_CHAINS; c++) {
            argmax_f v;
            memcpy(&v, z + i + (size_t)c * ARGMAX_WIDTH, sizeof v);
            const argmax_i above = v > lane[c];
            lane[c] = (argmax_f)(((argmax_i)v & above) | ((argmax_i)lane[c] & ~above));
            at[c] = (blk & above) | (at[c] & ~above);
        }
    float m = -INFINITY;
    size_t best = 0;
    for (int c = 0; c < ARGMAX_CHAINS; c++)
        for (int j = 0; j < ARGMAX_WIDTH; j++) {
            const size_t idx = (size_t)at[c][j] * block + (size_t)(c * ARGMAX_WIDTH + j);
            if (lane[c][j] > m || (lane[c][j] == m && idx < best)) {
                m = lane[c][j];
                best = idx;
            }
        }
    for (; i < n; i++)
        if (z[i] > m) {
            m = z[i];
            best = i;
        }
    *first = best;
    return m;
}

static double sum_floats(const float *x, size_t n)
{
    double lane[SAMPLER_LANES] = {0};
    size_t i = 0;
    for (; i + SAMPLER_LANES <= n; i += SAMPLER_LANES)
        for (int j = 0; j < SAMPLER_LANES; j++)
            lane[j] += x[i + j];
    double total = 0.0;
    for (int j = 0; j < SAMPLER_LANES; j++)
        total += lane[j];
    for (; i < n; i++)
        total += x[i];
    return total;
}

/* Below this exp underflows to subnormals; inputs are clamped to it. */
#define EXP_MIN_ARG (-87.0f)

/* y[i] = exp((z[i] - zmax) / t) for z[i] <= zmax, t > 0 (arguments below
 * EXP_MIN_ARG, and NaN, give exp(EXP_MIN_ARG), about 1.6e-38). Cephes expf:
 * Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, then a degree-5 minimax
 * polynomial, within about 1 ulp of expf; exp(0) is exactly 1. glibc's expf
 * does not vectorise and would cost more than the rest of a step. */
static void exp_scaled(const float *z, float zmax, float t, float *y, size_t n)
{
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const int32_t round_magic_bits = 0x4B400000;
    const float inv_t = 1.0f / t; /* a multiply: divps would dominate the loop */
    for (size_t i = 0; i < n; i++) {
        float x = (z[i] - zmax) * inv_t;
        float v = x >= EXP_MIN_ARG ? x : EXP_MIN_ARG;
        float rounded = v * 1.44269504088896341f + round_magic; /* log2(e) */
        float k = rounded - round_magic;
        int32_t rounded_bits;
        memcpy(&rounded_bits, &rounded, sizeof rounded_bits);
        int32_t ki = rounded_bits - round_magic_bits;
        float r = v - k * 0.693359375f; /* ln 2, high part: exact in k * hi */
        r = r - k * -2.12194440e-4f;    /* ln 2, low part */
        float p = 1.9875691500e-4f;
        p = p * r + 1.3981999507e-3f;
        p = p * r + 8.3334519073e-3f;
        p = p * r + 4.1665795894e-2f;
        p = p * r + 1.6666665459e-1f;
        p = p * r + 5.0000001201e-1f;
        int32_t scale_bits = (ki + 127) << 23; /* 2^k, k >= -126 for v >= EXP_MIN_ARG */
        float scale;
        memcpy(&scale, &scale_bits, sizeof scale);
        y[i] = (p * r * r + r + 1.0f) * scale;
    }
}

/* ---- candidate selection ---------------------------------------------------
 * The candidates live in parallel arrays (cz, ce, cid, cb: logit, exp, id,
 * bucket). Top-p and the draw each look for one candidate: where, in rank
 * order, the running probability mass crosses a target. Rather than sorting,
 *   1. the candidates are histogrammed by logit into SAMPLER_BUCKETS equal
 *      slices of [zlo, zmax]; rank order never crosses back over a bucket
 *      boundary, so bucket masses summed best first are exact prefix sums;
 *   2. a walk over the buckets finds the one where the target is crossed;
 *   3. that bucket's candidates are gathered and a quickselect weighted by
 *      mass (cand_select_mass) finds the candidate. */

/* Enough buckets that the one holding a crossing has a few hundred
 * candidates at most for realistic logits (128k N(0, 1) logits at T = 1 put
 * about 350 in the densest); few enough to clear and walk cheaply. */
#define SAMPLER_BUCKETS 4096

typedef struct sampler_cand {
    float z; /* prepared (biased, penalised) logit: the rank key */
    float e; /* exp((z - max) / temperature): unnormalised probability */
    int32_t id;
} sampler_cand;

struct ml_sample_scratch {
    size_t n_vocab;
    float log_gap;          /* negligible_log_gap(n_vocab) */
    float *work;            /* (n_vocab) biased, penalised, masked logits */
    float *cz;              /* (n_vocab) candidate logits */
    float *ce;              /* (n_vocab) candidate exp((z - zmax) / t) */
    int32_t *cid;           /* (n_vocab) candidate ids */
    sampler_cand *scratch;  /* (n_vocab) one bucket's candidates */
    uint16_t *cb;           /* (n_vocab) candidate buckets */
    float hist_zmax;        /* the bucket scale of the histogram in bucket_* and cb */
    float hist_scale;
    uint32_t *bucket_count; /* (SAMPLER_BUCKETS) */
    double *bucket_mass;    /* (SAMPLER_BUCKETS) */
};

static inline bool cand_before(const sampler_cand *a, const sampler_cand *b)
{
    return rank_before(a->z, a->id, b->z, b->id);
}

static inline void cand_swap(sampler_cand *c, size_t i, size_t j)
{
    sampler_cand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

static int cand_compare(const void *a, const void *b)
{
    return cand_before(a, b) ? -1 : cand_before(b, a) ? 1 : 0;
}

/* Rounds of quickselect before falling back to a sort: 2 floor(log2(n)) + 1. */
static unsigned select_budget(size_t n)
{
    unsigned b = 1;
    for (; n > 1; n >>= 1)
        b += 2;
    return b;
}

/* Reorder c[lo, hi), hi - lo >= 2, around a median-of-three pivot. Returns
 * the pivot's position p: c[lo, p) rank before c[p], c[p + 1, hi) after. */
static size_t cand_partition(sampler_cand *c, size_t lo, size_t hi)
{
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (cand_before(&c[mid], &c[lo]))
        cand_swap(c, lo, mid);
    if (cand_before(&c[last], &c[lo]))
        cand_swap(c, lo, last);
    if (cand_before(&c[mid], &c[last]))
        cand_swap(c, mid, last);
    sampler_cand pivot = c[last];
    size_t store = lo;
    for (size_t i = lo; i < last; i++)
        if (cand_before(&c[i], &pivot))
            cand_swap(c, i, store++);
    cand_swap(c, store, last);
    return store;
}

static double cand_mass(const sampler_cand *c, size_t lo, size_t hi)
{
    double m = 0.0;
    for (size_t i = lo; i < hi; i++)
        m += c[i].e;
    return m;
}

/* How the cumulative mass in rank order must relate to the target at the
 * candidate looked for. */
typedef enum mass_mode {
    MASS_REACH, /* top-p: the first whose cumulative mass is >= target */
    MASS_EXCEED /* the draw: the first whose cumulative mass is > target */
} mass_mode;

static inline bool mass_crosses(mass_mode mode, double cumulative, double target)
{
    return mode == MASS_EXCEED ? cumulative > target : cumulative >= target;
}

/* Find the candidate, in rank order over c[0, n) (n >= 1), at which the
 * cumulative mass first crosses target, and reorder c so that it sits at the
 * returned index j with everything ranked before it in c[0, j). When rounding
 * keeps the total below the target, j is the last ranked candidate. */
static size_t cand_select_mass(sampler_cand *c, size_t n, double target, mass_mode mode)
{
    size_t lo = 0, hi = n;
    double before = 0.0; /* mass of c[0, lo) */
    unsigned budget = select_budget(n);
    /* Invariant: c[0, lo) rank before c[lo, hi), which rank before c[hi, n);
     * the crossing is not in c[0, lo). */
    while (hi - lo > 1) {
        if (budget-- == 0) {
            qsort(c + lo, hi - lo, sizeof *c, cand_compare);
            for (size_t i = lo; i < hi; i++) {
                before += c[i].e;
                if (mass_crosses(mode, before, target))
                    return i;
            }
            return hi - 1;
        }
        size_t p = cand_partition(c, lo, hi);
        double above = before + cand_mass(c, lo, p);
        if (p > lo && mass_crosses(mode, above, target)) {
            hi = p;
            continue;
        }
        double through = above + c[p].e;
        if (mass_crosses(mode, through, target))
            return p;
        before = through;
        lo = p + 1;
    }
    /* lo == hi: the last pivot, the lowest ranked of the range, is c[hi - 1]. */
    return lo < hi ? lo : hi - 1;
}

/* Scale of cand_bucket for logits in [zlo, zmax]. */
static float bucket_scale(float zmax, float zlo)
{
    float scale = (float)(SAMPLER_BUCKETS - 1) / (zmax - zlo);
    /* One value, or a range too wide for float: everything in bucket 0. */
    return isfinite(scale) ? scale : 0.0f;
}

/* Bucket of logit z <= zmax: 0 at zmax, the last one for anything at or
 * below the zlo of the scale (and for -inf and NaN). A better ranked logit
 * never lands in a later bucket. */
static inline unsigned cand_bucket(float z, float zmax, float scale)
{
    float f = (zmax - z) * scale;
    return f < (float)(SAMPLER_BUCKETS - 1) ? (unsigned)(int32_t)f : SAMPLER_BUCKETS - 1;
}

/* Collect the logits of z (n_vocab) at or above floor_z into cz/cid, in id
 * order. Branch-free: every id is written, only candidates advance the
 * count. NaN and -inf fail the comparison. Returns how many. */
static size_t cand_collect(ml_sample_scratch *s, const float *z, float floor_z)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n_vocab; i++) {
        s->cz[n] = z[i];
        s->cid[n] = (int32_t)i;
        n += z[i] >= floor_z;
    }
    return n;
}

/* Min-heap on rank: h[0] is the worst ranked of h[0, n). Restore the heap
 * below position at. */
static void heap_sift_down(sampler_cand *h, size_t n, size_t at)
{
    sampler_cand x = h[at];
    for (;;) {
        size_t child = 2 * at + 1;
        if (child >= n)
            break;
        if (child + 1 < n && cand_before(&h[child], &h[child + 1]))
            child++; /* the worse ranked child */
        if (!cand_before(&x, &h[child]))
            break;
        h[at] = h[child];
        at = child;
    }
    h[at] = x;
}

static void heap_sift_up(sampler_cand *h, size_t at)
{
    sampler_cand x = h[at];
    while (at > 0 && cand_before(&h[(at - 1) / 2], &x)) {
        h[at] = h[(at - 1) / 2];
        at = (at - 1) / 2;
    }
    h[at] = x;
}

/* Collect only the k best ranked logits of z at or above *floor_z (fewer if
 * fewer qualify) into cz/cid, in one pass with a heap of the k best so far in
 * scratch: once it is full, a logit enters only if it beats the heap's worst,
 * which after the first few thousand ids is rare, so the pass costs about one
 * compare per id. Ids arrive in increasing order, so an equal logit never
 * beats the worst (ties go to the lower id). *floor_z is raised to the worst
 * kept logit. Returns how many. */
static size_t cand_collect_top_k(ml_sample_scratch *s, const float *z, float *floor_z, size_t k)
{
    sampler_cand *h = s->scratch;
    size_t n = 0;
    for (size_t i = 0; i < s->n_vocab; i++) {
        float v = z[i];
        if (n < k) {
            if (v >= *floor_z) {
                h[n] = (sampler_cand){v, 0.0f, (int32_t)i};
                heap_sift_up(h, n++);
            }
        } else if (v > h[0].z) {
            h[0] = (sampler_cand){v, 0.0f, (int32_t)i};
            heap_sift_down(h, n, 0);
        }
    }
    for (size_t i = 0; i < n; i++) {
        s->cz[i] = h[i].z;
        s->cid[i] = h[i].id;
    }
    if (n > 0)
        *floor_z = h[0].z;
    return n;
}

/* Histogram the candidates cz/ce[0, n), all in [zlo, zmax], by bucket:
 * their bucket into cb, count and mass per bucket. */
static void cand_histogram(ml_sample_scratch *s, size_t n, float zmax, float zlo)
{
    s->hist_zmax = zmax;
    s->hist_scale = bucket_scale(zmax, zlo);
    memset(s->bucket_count, 0, SAMPLER_BUCKETS * sizeof *s->bucket_count);
    memset(s->bucket_mass, 0, SAMPLER_BUCKETS * sizeof *s->bucket_mass);
    /* Buckets first, in a loop that vectorises; then the scatter. */
    for (size_t i = 0; i < n; i++)
        s->cb[i] = (uint16_t)cand_bucket(s->cz[i], zmax, s->hist_scale);
    for (size_t i = 0; i < n; i++) {
        s->bucket_count[s->cb[i]]++;
        s->bucket_mass[s->cb[i]] += s->ce[i];
    }
}

/* Copy the candidates of bucket b with logit >= zmin into scratch. Returns
 * how many. */
static size_t cand_gather(ml_sample_scratch *s, size_t n, unsigned b, float zmin)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (s->cb[i] == b && s->cz[i] >= zmin)
            s->scratch[m++] = (sampler_cand){s->cz[i], s->ce[i], s->cid[i]};
    return m;
}

/* ---- the kept set ------------------------------------------------------------
 * Every filter keeps a prefix of the candidates in rank order (top-k, top-p,
 * and min-p, a logit threshold), so the kept set is always: all candidates in
 * buckets [0, cut) of the histogram, plus the kept part of bucket `cut`, the
 * "tail", in scratch. The draw then walks bucket masses and looks at the
 * candidates of one bucket only. */

typedef struct kept_set {
    unsigned cut;    /* SAMPLER_BUCKETS: every bucket, no tail */
    size_t n_tail;   /* in s->scratch[0, n_tail) */
    double mass_cut; /* of buckets [0, cut), summed in bucket order */
} kept_set;

static double bucket_mass_below(const ml_sample_scratch *s, unsigned cut)
{
    double m = 0.0;
    for (unsigned b = 0; b < cut; b++)
        m += s->bucket_mass[b];
    return m;
}

/* The candidate of the kept set (over the n histogrammed candidates) at which
 * the running mass in rank order first crosses target. Returns its index j in
 * scratch, which then holds its bucket's candidates (only the tail's, if it is
 * in the tail) with those ranked before it in scratch[0, j); its bucket in
 * *bucket. When rounding never reaches the target, the last kept candidate. */
static size_t kept_find(ml_sample_scratch *s, size_t n, const kept_set *k, double target,
                        mass_mode mode, unsigned *bucket)
{
    double before = 0.0;
    unsigned last_used = SAMPLER_BUCKETS;
    for (unsigned b = 0; b < k->cut; b++) {
        if (s->bucket_count[b] == 0)
            continue;
        last_used = b;
        if (mass_crosses(mode, before + s->bucket_mass[b], target)) {
            *bucket = b;
            size_t m = cand_gather(s, n, b, -INFINITY);
            return cand_select_mass(s->scratch, m, target - before, mode);
        }
        before += s->bucket_mass[b];
    }
    if (k->n_tail > 0) {
        *bucket = k->cut;
        return cand_select_mass(s->scratch, k->n_tail, target - before, mode);
    }
    assert(last_used < SAMPLER_BUCKETS);
    *bucket = last_used;
    size_t m = cand_gather(s, n, last_used, -INFINITY);
    return cand_select_mass(s->scratch, m, INFINITY, mode);
}

/* Top-p over the whole histogram: keep through the candidate where the mass
 * reaches top_p of the total. */
static kept_set kept_top_p(ml_sample_scratch *s, size_t n, float top_p)
{
    kept_set all = {SAMPLER_BUCKETS, 0, bucket_mass_below(s, SAMPLER_BUCKETS)};
    unsigned b;
    size_t j = kept_find(s, n, &all, (double)top_p * all.mass_cut, MASS_REACH, &b);
    return (kept_set){b, j + 1, bucket_mass_below(s, b)};
}

/* Intersect k with the candidates whose logit is >= zmin (both are
 * prefixes: the shorter one wins). */
static void kept_above(ml_sample_scratch *s, size_t n, kept_set *k, float zmin)
{
    unsigned b = cand_bucket(zmin, s->hist_zmax, s->hist_scale);
    if (b > k->cut)
        return; /* zmin lies below everything kept */
    if (b == k->cut) {
        size_t m = 0;
        for (size_t i = 0; i < k->n_tail; i++)
            if (s->scratch[i].z >= zmin)
                s->scratch[m++] = s->scratch[i];
        k->n_tail = m;
        return;
    }
    k->cut = b;
    k->n_tail = cand_gather(s, n, b, zmin);
    k->mass_cut = bucket_mass_below(s, b);
}

static double kept_mass(const ml_sample_scratch *s, const kept_set *k)
{
    return k->mass_cut + cand_mass(s->scratch, 0, k->n_tail);
}


/* ---- scratch ------------------------------------------------------------------ */

/* Alignment of each array carved from the caller's memory (a cache line). */
#define SCRATCH_ALIGN 64

static size_t align_up(size_t n)
{
    return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* The arrays of a scratch in the order they are carved; with mem NULL only
 * the size is computed. Returns the bytes used. */
static size_t scratch_layout(ml_sample_scratch *s, char *mem, size_t n)
{
    size_t at = align_up(sizeof *s);
#define CARVE(field, count)                                                                 \
    do {                                                                                    \
        if (mem)                                                                            \
            s->field = (void *)(mem + at);                                                  \
        at += align_up((count) * sizeof *s->field);                                         \
    } while (0)
    CARVE(work, n);
    CARVE(cz, n);
    CARVE(ce, n);
    CARVE(cid, n);
    CARVE(scratch, n);
    CARVE(cb, n);
    CARVE(bucket_count, SAMPLER_BUCKETS);
    CARVE(bucket_mass, SAMPLER_BUCKETS);
#undef CARVE
    return at;
}

size_t ml_sample_scratch_bytes(size_t vocab)
{
    if (vocab == 0 || vocab > INT32_MAX)
        return 0;
    ml_sample_scratch layout;
    return scratch_layout(&layout, NULL, vocab);
}

ml_sample_scratch *ml_sample_scratch_init(void *mem, size_t vocab)
{
    if (!mem || vocab == 0 || vocab > INT32_MAX)
        return NULL;
    ml_sample_scratch *s = mem;
    memset(s, 0, sizeof *s);
    s->n_vocab = vocab;
    s->log_gap = negligible_log_gap(vocab);
    scratch_layout(s, mem, vocab);
    return s;
}

/* ---- sampling -------------------------------------------------------------- */

static bool row_is_greedy(const ml_sample_row *row)
{
    return row->temperature < ML_SAMPLE_GREEDY_TEMPERATURE;
}

static bool row_has_penalties(const ml_sample_row *row)
{
    return row->n_pen > 0 &&
           (row->repetition_penalty != 1.0f || row->presence_penalty != 0.0f ||
            row->frequency_penalty != 0.0f);
}

/* z (n_vocab): a copy of the raw logits; sample.h step 0 in place. */
static void apply_bias(const ml_sample_row *row, const ml_logit_bias *bias, float *z)
{
    for (int32_t i = 0; i < row->n_bias; i++)
        z[bias[i].id] += bias[i].value;
}

/* z (n_vocab): the biased logits; sample.h step 1 in place. */
static void apply_penalties(const ml_sample_row *row, const int32_t *pen_id,
                            const uint32_t *pen_count, float *z)
{
    float rep = row->repetition_penalty;
    for (int32_t i = 0; i < row->n_pen; i++) {
        float *v = &z[pen_id[i]];
        *v = *v > 0.0f ? *v / rep : *v * rep;
        if (pen_count[i] > 0) {
            *v -= row->frequency_penalty * (float)pen_count[i];
            *v -= row->presence_penalty;
        }
    }
}

/* z (n): the tokens `allowed` clears at -inf. A word at a time: a
 * grammar's mask is mostly whole words of ones (inside a string) or of
 * zeros (between values), which cost a test or a fill. */
static void apply_mask(const uint64_t *allowed, float *z, size_t n)
{
    for (size_t w = 0; w * 64 < n; w++) {
        uint64_t bits = allowed[w];
        size_t base = w * 64, end = n - base < 64 ? n - base : 64;
        if (bits == UINT64_MAX && end == 64)
            continue;
        for (size_t i = 0; i < end; i++)
            z[base + i] = bits >> i & 1 ? z[base + i] : -INFINITY;
    }
}

/* Biased, penalised, masked logits of the row (logits itself when no bias,
 * penalty or mask is on, else s->work), their maximum *zmax and its first
 * index *best. Returns false when there is no finite maximum. */
static bool sample_prepare(ml_sample_scratch *s, const float *logits, const ml_sample_row *row,
                           const int32_t *pen_id, const uint32_t *pen_count,
                           const ml_logit_bias *bias, const uint64_t *allowed,
                           const float **z_out, float *zmax, size_t *best)
{
    const float *z = logits;
    bool biased = row->n_bias > 0, penalties = row_has_penalties(row);
    if (biased || penalties || allowed) {
        memcpy(s->work, logits, s->n_vocab * sizeof *s->work);
        if (biased)
            apply_bias(row, bias, s->work);
        if (penalties)
            apply_penalties(row, pen_id, pen_count, s->work);
        if (allowed)
            apply_mask(allowed, s->work, s->n_vocab);
        z = s->work;
    }
    float m = logits_argmax(z, s->n_vocab, best);
    if (!isfinite(m))
        return false;
    *z_out = z;
    *zmax = m;
    return true;
}

/* Steps 3-5 of sample.h over penalised logits z with finite maximum zmax:
 * the candidates land in cz/ce/cid/cb[0, *n) with their histogram, and the
 * returned kept set says which of them survive the filters. */
static kept_set sample_filter(ml_sample_scratch *s, const ml_sample_row *row, const float *z,
                              float zmax, size_t *n_out)
{
    float t = row->temperature;
    float floor_z = zmax - s->log_gap * t;
    if (!(floor_z > -FLT_MAX))
        floor_z = -FLT_MAX; /* a huge temperature: still never draw -inf */
    /* min-p: p >= min_p * p_max  <=>  z >= zmax + t ln(min_p), a logit
     * threshold. Without top-p (whose mass must include what min-p drops,
     * as HF applies min-p last) it simply raises the floor. */
    /* ln(min_p) in double, rounded once: a device computes the same bits
     * (its logf may differ from glibc's by an ulp). */
    float min_p_z = row->min_p > 0.0f ? zmax + t * (float)log((double)row->min_p) : -INFINITY;
    bool top_p = row->top_p < 1.0f;
    if (!top_p && min_p_z > floor_z)
        floor_z = min_p_z;

    size_t n = row->top_k > 0 && row->top_k < s->n_vocab
                   ? cand_collect_top_k(s, z, &floor_z, row->top_k)
                   : cand_collect(s, z, floor_z);
    assert(n >= 1);
    exp_scaled(s->cz, zmax, t, s->ce, n);
    cand_histogram(s, n, zmax, floor_z);
    kept_set k = {SAMPLER_BUCKETS, 0, bucket_mass_below(s, SAMPLER_BUCKETS)};
    if (top_p && n > 1) {
        k = kept_top_p(s, n, row->top_p);
        if (row->min_p > 0.0f)
            kept_above(s, n, &k, min_p_z);
    }
    *n_out = n;
    return k;
}

void ml_sample_one(ml_sample_scratch *s, const float *logits, const ml_sample_row *row,
                   const int32_t *pen_id, const uint32_t *pen_count, const ml_logit_bias *bias,
                   const uint64_t *allowed, ml_sample_out *out)
{
    const float *z;
    float zmax;
    size_t best;
    memset(out, 0, sizeof *out);
    if (!sample_prepare(s, logits, row, pen_id, pen_count, bias, allowed, &z, &zmax, &best)) {
        out->chosen.id = ML_SAMPLE_NO_TOKEN;
        return;
    }
    int32_t id = (int32_t)best;
    if (!row_is_greedy(row)) {
        size_t n;
        kept_set k = sample_filter(s, row, z, zmax, &n);
        unsigned bucket;
        size_t j = kept_find(s, n, &k, row->u * kept_mass(s, &k), MASS_EXCEED, &bucket);
        id = s->scratch[j].id;
    }
    out->chosen.id = id;
    /* The raw logits have a finite maximum whenever the prepared ones do
     * (bias and penalties move finite values only, a mask only lowers),
     * unless one is +inf: then there is no token either. */
    if (row->logprobs &&
        ml_sample_logprobs(logits, s->n_vocab, id, row->n_top, out, NULL, 0) != ML_OK)
        out->chosen = (ml_token_logprob){ML_SAMPLE_NO_TOKEN, 0.0f};
}

ml_status ml_sample_distribution(ml_sample_scratch *s, const float *logits,
                                 const ml_sample_row *row, const int32_t *pen_id,
                                 const uint32_t *pen_count, const ml_logit_bias *bias,
                                 ml_token_logprob *out, size_t cap, size_t *n_kept, char *err,
                                 size_t errlen)
{
    const float *z;
    float zmax;
    size_t best;
    if (!sample_prepare(s, logits, row, pen_id, pen_count, bias, NULL, &z, &zmax, &best))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "sample: logits have no finite maximum");
    if (row_is_greedy(row)) {
        if (cap > 0)
            out[0] = (ml_token_logprob){(int32_t)best, 0.0f};
        *n_kept = 1;
        return ML_OK;
    }
    size_t n;
    kept_set k = sample_filter(s, row, z, zmax, &n);
    /* Spell the kept set out: the tail, then every candidate below the cut
     * (the scratch is as long as the vocabulary). */
    sampler_cand *c = s->scratch;
    size_t m = k.n_tail;
    for (size_t i = 0; i < n; i++)
        if (s->cb[i] < k.cut)
            c[m++] = (sampler_cand){s->cz[i], s->ce[i], s->cid[i]};
    qsort(c, m, sizeof *c, cand_compare);
    double log_total = log(cand_mass(c, 0, m)), t = row->temperature;
    for (size_t i = 0; i < m && i < cap; i++)
        out[i] = (ml_token_logprob){c[i].id, (float)(((double)c[i].z - zmax) / t - log_total)};
    *n_kept = m;
    return ML_OK;
}

/* ---- logprobs -------------------------------------------------------------- */

/* Logits per chunk of the log-sum-exp pass (a stack buffer). */
#define LOGPROBS_CHUNK 1024

ml_status ml_sample_logprobs(const float *logits, size_t n_vocab, int32_t chosen, uint32_t top_n,
                             ml_sample_out *out, char *err, size_t errlen)
{
    if (chosen < 0 || (size_t)chosen >= n_vocab)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "logprobs: chosen id %d outside [0, %zu)",
                       (int)chosen, n_vocab);
    if (top_n > ML_SAMPLE_MAX_TOP || top_n > n_vocab)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "logprobs: top_n %u over the limit",
                       (unsigned)top_n);
    size_t argmax;
    float zmax = logits_argmax(logits, n_vocab, &argmax);
    if (!isfinite(zmax))
        return ml_fail(err, errlen, ML_ERR_FORMAT, "logprobs: logits have no finite maximum");

    /* Sum of exp(z - zmax); terms past the negligible gap (and -inf, NaN)
     * enter as exp(EXP_MIN_ARG), which no float result can see. */
    float floor_z = zmax - negligible_log_gap(n_vocab);
    double sum = 0.0;
    float chunk[LOGPROBS_CHUNK];
    for (size_t at = 0; at < n_vocab; at += LOGPROBS_CHUNK) {
        size_t len = n_vocab - at < LOGPROBS_CHUNK ? n_vocab - at : LOGPROBS_CHUNK;
        for (size_t i = 0; i < len; i++) {
            float v = logits[at + i];
            chunk[i] = v >= floor_z ? v : -INFINITY;
        }
        exp_scaled(chunk, zmax, 1.0f, chunk, len);
        sum += sum_floats(chunk, len);
    }
    double lse = (double)zmax + log(sum);

    /* The top_n best ranked, kept sorted by insertion (.logprob holds the raw
     * logit until the end): a new entry is rare after the first few hundred
     * ids, so the pass is about one compare per id. */
    ml_token_logprob top[ML_SAMPLE_MAX_TOP];
    uint32_t n_top = 0;
    for (size_t i = 0; i < n_vocab && top_n > 0; i++) {
        float v = logits[i];
        int32_t id = (int32_t)i;
        if (v != v ||
            (n_top == top_n && !rank_before(v, id, top[n_top - 1].logprob, top[n_top - 1].id)))
            continue;
        uint32_t at = n_top < top_n ? n_top++ : n_top - 1;
        while (at > 0 && rank_before(v, id, top[at - 1].logprob, top[at - 1].id)) {
            top[at] = top[at - 1];
            at--;
        }
        top[at] = (ml_token_logprob){id, v};
    }
    out->chosen = (ml_token_logprob){chosen, (float)((double)logits[chosen] - lse)};
    for (uint32_t i = 0; i < n_top; i++)
        out->top[i] = (ml_token_logprob){top[i].id, (float)((double)top[i].logprob - lse)};
    out->n_top = n_top;
    return ML_OK;
}
