/* Helpers shared by test_sampler.c and test_sampler_draw.c: a deterministic
 * test stream, sampler construction, and the brute-force reference. */
#ifndef ML_SAMPLER_TEST_UTIL_H
#define ML_SAMPLER_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "harness.h"
#include "runtime/sampler.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define LLAMA3_VOCAB 128256
/* ---- helpers ------------------------------------------------------------- */

/* A deterministic test stream (not the sampler's), normal deviates by Box-Muller. */
static uint64_t test_rng = 0x1234567u;

static inline double test_uniform(void)
{
    test_rng = test_rng * 6364136223846793005u + 1442695040888963407u;
    return (double)(test_rng >> 11) * 0x1.0p-53;
}

static inline float test_normal(float sigma)
{
    double u1 = test_uniform(), u2 = test_uniform();
    return (float)(sigma * sqrt(-2.0 * log(u1 + 1e-300)) * cos(2.0 * M_PI * u2));
}

static inline ml_sampler_seq *make_seq(const ml_sampling_params *p, size_t n_vocab, const int32_t *prompt,
                                size_t n_prompt)
{
    char err[256] = "";
    ml_sampler_seq *seq = NULL;
    ml_status st = ml_sampler_seq_create(p, n_vocab, prompt, n_prompt, &seq, err, sizeof err);
    check(st == ML_OK, "seq_create: %s", err);
    return seq;
}

static inline ml_sampler *make_sampler(size_t n_vocab)
{
    char err[256] = "";
    ml_sampler *s = NULL;
    check(ml_sampler_create(n_vocab, &s, err, sizeof err) == ML_OK, "sampler_create: %s", err);
    return s;
}

static const float *rank_keys;

/* Rank order: higher logit first, lower id on ties; -inf and NaN last. */
static inline int rank_compare(const void *a, const void *b)
{
    int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    float za = rank_keys[ia], zb = rank_keys[ib];
    int fa = za == za, fb = zb == zb; /* NaN sorts last */
    if (fa != fb)
        return fb - fa;
    if (fa && za != zb)
        return za > zb ? -1 : 1;
    return ia < ib ? -1 : ia > ib;
}

/* ml_sampler_sample's token alone. */
static inline ml_status sample_token(ml_sampler *s, ml_sampler_seq *seq, const float *logits,
                              int32_t *token, char *err, size_t errlen)
{
    ml_sample_out out;
    ml_status st = ml_sampler_sample(s, seq, logits, NULL, &out, err, errlen);
    if (st == ML_OK)
        *token = out.chosen.id;
    return st;
}

/* The reference: the HF warpers applied literally to penalised logits z
 * (n), in double, over the whole vocabulary. prob[i] is the probability of
 * id i after renormalisation over the kept set (0 if dropped). *margin is
 * the distance of the top-p / min-p decision nearest to its threshold, so a
 * caller can skip cases that float rounding may legitimately flip. */
static inline void ref_distribution(const float *z, size_t n, const ml_sampling_params *p, double *prob,
                             double *margin)
{
    int32_t *order = malloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++)
        order[i] = (int32_t)i;
    rank_keys = z;
    qsort(order, n, sizeof *order, rank_compare);
    *margin = INFINITY;
    for (size_t i = 0; i < n; i++)
        prob[i] = 0.0;

    if (p->temperature < ML_SAMPLE_GREEDY_TEMPERATURE) {
        prob[order[0]] = 1.0;
        free(order);
        return;
    }
    size_t m = 0; /* finite candidates */
    while (m < n && isfinite(z[order[m]]))
        m++;
    if (p->top_k > 0 && p->top_k < m)
        m = p->top_k;
    double zmax = z[order[0]] / (double)p->temperature, total = 0.0;
    for (size_t r = 0; r < m; r++)
        total += exp(z[order[r]] / (double)p->temperature - zmax);
    if (p->top_p < 1.0f) {
        double before = 0.0;
        size_t keep = 0;
        for (; keep < m; keep++) {
            double d = before - (double)p->top_p;
            if (fabs(d) < *margin)
                *margin = fabs(d);
            if (keep > 0 && !(before < p->top_p))
                break;
            before += exp(z[order[keep]] / (double)p->temperature - zmax) / total;
        }
        m = keep;
    }
    size_t kept = 0;
    for (size_t r = 0; r < m; r++) {
        double rel = exp(z[order[r]] / (double)p->temperature - zmax); /* p / p_max */
        if (p->min_p > 0.0f && fabs(rel - p->min_p) < *margin)
            *margin = fabs(rel - p->min_p);
        if (rel >= p->min_p) {
            prob[order[r]] = rel;
            kept++;
        }
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += prob[i];
    for (size_t i = 0; i < n; i++)
        prob[i] /= sum;
    free(order);
}

/* ml_sampler_distribution as a dense probability vector. Returns the number kept. */
static inline size_t got_distribution(ml_sampler *s, const ml_sampler_seq *seq, const float *logits,
                               size_t n, double *prob)
{
    ml_token_logprob *d = malloc(n * sizeof *d);
    size_t kept = 0;
    char err[256] = "";
    ml_status st = ml_sampler_distribution(s, seq, logits, d, n, &kept, err, sizeof err);
    check(st == ML_OK, "distribution: %s", err);
    for (size_t i = 0; i < n; i++)
        prob[i] = 0.0;
    for (size_t i = 0; i < kept && i < n; i++) {
        prob[d[i].id] = exp((double)d[i].logprob);
        /* Distinct logits may round to one logprob; ties by id are
         * checked on exact ties in test_filters_exact. */
        if (i > 0)
            check(d[i - 1].logprob >= d[i].logprob, "distribution not in rank order at %zu", i);
    }
    free(d);
    return st == ML_OK ? kept : 0;
}

/* Compare got and want probabilities; every id with a non-negligible
 * reference probability must be kept and every kept id must be expected.
 * "Non-negligible" is above 1e-9: the sampler drops ids below 2^-24 / V of
 * the best by design, under 2e-11 for the vocabularies here. */
static inline void expect_same_distribution(const double *got, const double *want, size_t n,
                                     const char *what)
{
    size_t bad = 0, worst = 0;
    double max_diff = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        int in_got = got[i] > 0.0, in_want = want[i] > 1e-9;
        if (d > 1e-6 + 1e-4 * want[i] || (in_want && !in_got) || (in_got && want[i] == 0.0))
            bad++;
        if (d > max_diff) {
            max_diff = d;
            worst = i;
        }
    }
    check(bad == 0, "%s: %zu ids differ; max diff %.3g at id %zu (got %.9g want %.9g)", what, bad,
          max_diff, worst, got[worst], want[worst]);
}

#endif
