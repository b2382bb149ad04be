/* Sampler: every control against a brute-force reference written here from
 * the HF / vLLM definitions (sort everything, softmax in double), the draw
 * against its distribution (chi-square), the random stream against an
 * independent Python implementation of splitmix64 + xoshiro256**, logprobs
 * against a double-precision log_softmax, and the time per sample at the
 * Llama 3 vocabulary (printed, not checked: it depends on the machine). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "runtime/sampler.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define LLAMA3_VOCAB 128256

/* ---- helpers ------------------------------------------------------------- */

/* A deterministic test stream (not the sampler's), normal deviates by Box-Muller. */
static uint64_t test_rng = 0x1234567u;

static double test_uniform(void)
{
    test_rng = test_rng * 6364136223846793005u + 1442695040888963407u;
    return (double)(test_rng >> 11) * 0x1.0p-53;
}

static float test_normal(float sigma)
{
    double u1 = test_uniform(), u2 = test_uniform();
    return (float)(sigma * sqrt(-2.0 * log(u1 + 1e-300)) * cos(2.0 * M_PI * u2));
}

static ml_sampler_seq *make_seq(const ml_sampling_params *p, size_t n_vocab, const int32_t *prompt,
                                size_t n_prompt)
{
    char err[256] = "";
    ml_sampler_seq *seq = NULL;
    ml_status st = ml_sampler_seq_create(p, n_vocab, prompt, n_prompt, &seq, err, sizeof err);
    check(st == ML_OK, "seq_create: %s", err);
    return seq;
}

static ml_sampler *make_sampler(size_t n_vocab)
{
    char err[256] = "";
    ml_sampler *s = NULL;
    check(ml_sampler_create(n_vocab, &s, err, sizeof err) == ML_OK, "sampler_create: %s", err);
    return s;
}

static const float *rank_keys;

/* Rank order: higher logit first, lower id on ties; -inf and NaN last. */
static int rank_compare(const void *a, const void *b)
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
static ml_status sample_token(ml_sampler *s, ml_sampler_seq *seq, const float *logits,
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
static void ref_distribution(const float *z, size_t n, const ml_sampling_params *p, double *prob,
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
static size_t got_distribution(ml_sampler *s, const ml_sampler_seq *seq, const float *logits,
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
static void expect_same_distribution(const double *got, const double *want, size_t n,
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

/* ---- parameters ---------------------------------------------------------- */

static void expect_invalid(const ml_sampling_params *p, const char *field)
{
    char err[256] = "";
    ml_status st = ml_sampling_params_validate(p, 1000, err, sizeof err);
    check(st == ML_ERR_INVALID_ARG, "%s: invalid value accepted", field);
    check(strstr(err, field) != NULL, "%s: message '%s' does not name it", field, err);
}

static void test_validate(void)
{
    ml_sampling_params base;
    ml_sampling_params_default(&base);
    char err[256] = "";
    check(ml_sampling_params_validate(&base, 1000, err, sizeof err) == ML_OK, "defaults: %s", err);

    ml_sampling_params p;
#define INVALID(field_expr, name) \
    do {                          \
        p = base;                 \
        field_expr;               \
        expect_invalid(&p, name); \
    } while (0)
    INVALID(p.temperature = -0.1f, "temperature");
    INVALID(p.temperature = NAN, "temperature");
    INVALID(p.temperature = INFINITY, "temperature");
    INVALID(p.top_k = 1001, "top_k");
    INVALID(p.top_p = 0.0f, "top_p");
    INVALID(p.top_p = 1.5f, "top_p");
    INVALID(p.top_p = NAN, "top_p");
    INVALID(p.min_p = -0.01f, "min_p");
    INVALID(p.min_p = 1.01f, "min_p");
    INVALID(p.repetition_penalty = 0.0f, "repetition_penalty");
    INVALID(p.repetition_penalty = NAN, "repetition_penalty");
    INVALID(p.presence_penalty = 2.5f, "presence_penalty");
    INVALID(p.frequency_penalty = -2.01f, "frequency_penalty");
    INVALID(p.frequency_penalty = NAN, "frequency_penalty");
    INVALID(p.max_tokens = 0, "max_tokens");
    INVALID(p.n_stop_ids = ML_SAMPLER_MAX_STOP_IDS + 1, "stop_ids");
    INVALID((p.n_stop_ids = 1, p.stop_ids[0] = 1000), "stop_ids[0]");
    INVALID((p.n_stop_ids = 2, p.stop_ids[0] = 5, p.stop_ids[1] = -1), "stop_ids[1]");
    INVALID((p.n_stop = 1, p.stop[0] = "", p.stop_len[0] = 0), "stop[0]");
    INVALID(p.top_logprobs = ML_SAMPLE_MAX_TOP + 1, "top_logprobs");
    INVALID(p.top_logprobs = 3, "top_logprobs"); /* without logprobs */
#undef INVALID

    p = base;
    p.temperature = 0.0f;
    p.top_k = 1000;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.logprobs = true;
    p.top_logprobs = ML_SAMPLE_MAX_TOP;
    p.n_stop = 1;
    p.stop[0] = "\nUser:";
    p.stop_len[0] = 6;
    check(ml_sampling_params_validate(&p, 1000, err, sizeof err) == ML_OK, "edges: %s", err);

    /* Sequence creation validates too, and rejects negative prompt ids. */
    ml_sampler_seq *seq = NULL;
    p = base;
    p.top_p = 2.0f;
    check(ml_sampler_seq_create(&p, 1000, NULL, 0, &seq, err, sizeof err) == ML_ERR_INVALID_ARG &&
              seq == NULL,
          "seq_create validates params");
    const int32_t bad_prompt[] = {1, -5};
    check(ml_sampler_seq_create(&base, 1000, bad_prompt, 2, &seq, err, sizeof err) ==
                  ML_ERR_INVALID_ARG &&
              strstr(err, "prompt[1]") != NULL,
          "negative prompt id: %s", err);
    ml_sampler *s = NULL;
    check(ml_sampler_create(0, &s, err, sizeof err) == ML_ERR_INVALID_ARG && s == NULL,
          "n_vocab 0");
    ml_sampler_destroy(NULL);
    ml_sampler_seq_destroy(NULL);
}

/* ---- greedy -------------------------------------------------------------- */

static void test_greedy(void)
{
    enum { V = 8 };
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    char err[256];
    int32_t tok = -1;

    const float temps[] = {0.0f, ML_SAMPLE_GREEDY_TEMPERATURE * 0.5f};
    for (size_t t = 0; t < N_OF(temps); t++) {
        p.temperature = temps[t];
        ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
        const float ties[V] = {NAN, 1.0f, 3.0f, -INFINITY, 3.0f, 2.0f, 3.0f, NAN};
        check(sample_token(s, seq, ties, &tok, err, sizeof err) == ML_OK && tok == 2,
              "greedy: first of tied maxima, NaN ignored (got %d)", (int)tok);
        const float neg[V] = {-5, -4, -3, -2, -1.5f, -1.5f, -7, -INFINITY};
        check(sample_token(s, seq, neg, &tok, err, sizeof err) == ML_OK && tok == 4,
              "greedy: negative logits (got %d)", (int)tok);

        const float all_nan[V] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
        const float all_masked[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                                     -INFINITY, -INFINITY, -INFINITY, -INFINITY};
        const float pos_inf[V] = {0, 1, INFINITY, 2, 0, 0, 0, 0};
        tok = -7;
        check(sample_token(s, seq, all_nan, &tok, err, sizeof err) == ML_ERR_FORMAT &&
                  tok == -7,
              "all NaN rejected");
        check(sample_token(s, seq, all_masked, &tok, err, sizeof err) == ML_ERR_FORMAT,
              "all -inf rejected");
        check(sample_token(s, seq, pos_inf, &tok, err, sizeof err) == ML_ERR_FORMAT,
              "+inf rejected");
        ml_sampler_seq_destroy(seq);
    }

    /* A sequence made for another vocabulary size is refused. */
    p.temperature = 0.0f;
    ml_sampler_seq *other = make_seq(&p, V + 1, NULL, 0);
    const float z[V] = {0};
    check(sample_token(s, other, z, &tok, err, sizeof err) == ML_ERR_INVALID_ARG,
          "n_vocab mismatch");
    ml_sampler_seq_destroy(other);
    ml_sampler_destroy(s);
}

/* ---- filters against the reference -------------------------------------- */

static void test_filters_exact(void)
{
    enum { V = 100 };
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    ml_token_logprob d[V];
    size_t kept = 0;
    char err[256];

    /* top-k keeps exactly k, ties broken by the lower id. */
    float flat[V];
    for (int i = 0; i < V; i++)
        flat[i] = 0.5f;
    p.top_k = 3;
    ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
    check(ml_sampler_distribution(s, seq, flat, d, V, &kept, err, sizeof err) == ML_OK &&
              kept == 3 && d[0].id == 0 && d[1].id == 1 && d[2].id == 2,
          "top_k=3 over ties keeps ids 0,1,2 (kept %zu)", kept);
    check_close(d[0].logprob, log(1.0 / 3), 1e-6, 0, "top_k uniform logprob");
    ml_sampler_seq_destroy(seq);

    /* top-p boundary: four equal tokens, p = 0.5 reaches exactly 0.5 after
     * two, which is enough (the third's mass-before is not < p). */
    float four[4] = {1, 1, 1, 1};
    ml_sampler *s4 = make_sampler(4);
    p.top_k = 0;
    p.top_p = 0.5f;
    seq = make_seq(&p, 4, NULL, 0);
    check(ml_sampler_distribution(s4, seq, four, d, 4, &kept, err, sizeof err) == ML_OK &&
              kept == 2 && d[0].id == 0 && d[1].id == 1,
          "top_p=0.5 over 4 ties keeps 2 (kept %zu)", kept);
    ml_sampler_seq_destroy(seq);
    p.top_p = 0.5000001f;
    seq = make_seq(&p, 4, NULL, 0);
    check(ml_sampler_distribution(s4, seq, four, d, 4, &kept, err, sizeof err) == ML_OK &&
              kept == 3,
          "top_p just over 0.5 keeps 3 (kept %zu)", kept);
    ml_sampler_seq_destroy(seq);
    /* A tiny p still keeps the best token. */
    p.top_p = 1e-7f;
    seq = make_seq(&p, 4, NULL, 0);
    const float one_best[4] = {0, 0, 0.001f, 0};
    check(ml_sampler_distribution(s4, seq, one_best, d, 4, &kept, err, sizeof err) == ML_OK &&
              kept == 1 && d[0].id == 2 && d[0].logprob == 0.0f,
          "top_p tiny keeps the best only");
    ml_sampler_seq_destroy(seq);

    /* min-p: relative probabilities 1, 0.5, 0.3, 0.2 with min_p 0.25. */
    p.top_p = 1.0f;
    p.min_p = 0.25f;
    const float minp_z[4] = {logf(0.15f), logf(0.5f), logf(0.1f), logf(0.25f)};
    seq = make_seq(&p, 4, NULL, 0);
    check(ml_sampler_distribution(s4, seq, minp_z, d, 4, &kept, err, sizeof err) == ML_OK &&
              kept == 3 && d[0].id == 1 && d[1].id == 3 && d[2].id == 0,
          "min_p keeps 3 (kept %zu)", kept);
    check_close(exp(d[0].logprob), 0.5 / 0.9, 1e-6, 1e-6, "min_p renormalised");
    ml_sampler_seq_destroy(seq);
    ml_sampler_destroy(s4);
    ml_sampler_destroy(s);
}

/* Random logits, every combination of controls, against ref_distribution. */
static void test_filters_reference(void)
{
    enum { V = 3000 };
    ml_sampler *s = make_sampler(V);
    float *z = malloc(V * sizeof *z);
    double *got = malloc(V * sizeof *got), *want = malloc(V * sizeof *want);
    const float sigmas[] = {1.0f, 3.0f};
    const float temps[] = {0.7f, 1.0f, 1.6f};
    const float top_ps[] = {1.0f, 0.05f, 0.3f, 0.5f, 0.9f, 0.95f, 0.99f};
    const uint32_t top_ks[] = {0, 40, 1};
    const float min_ps[] = {0.0f, 0.05f};
    int cases = 0, skipped = 0;
    for (size_t a = 0; a < N_OF(sigmas); a++)
        for (size_t b = 0; b < N_OF(temps); b++)
            for (size_t c = 0; c < N_OF(top_ps); c++)
                for (size_t d = 0; d < N_OF(top_ks); d++)
                    for (size_t e = 0; e < N_OF(min_ps); e++) {
                        for (int i = 0; i < V; i++)
                            z[i] = test_normal(sigmas[a]);
                        z[17] = -INFINITY;
                        z[18] = NAN;
                        ml_sampling_params p;
                        ml_sampling_params_default(&p);
                        p.temperature = temps[b];
                        p.top_p = top_ps[c];
                        p.top_k = top_ks[d];
                        p.min_p = min_ps[e];
                        double margin;
                        ref_distribution(z, V, &p, want, &margin);
                        if (margin < 1e-5) {
                            skipped++;
                            continue;
                        }
                        ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
                        got_distribution(s, seq, z, V, got);
                        char what[128];
                        snprintf(what, sizeof what, "sigma %g T %g top_p %g top_k %u min_p %g",
                                 (double)sigmas[a], (double)temps[b], (double)top_ps[c],
                                 (unsigned)top_ks[d], (double)min_ps[e]);
                        expect_same_distribution(got, want, V, what);
                        check(got[17] == 0.0 && got[18] == 0.0, "%s: -inf/NaN kept", what);
                        ml_sampler_seq_destroy(seq);
                        cases++;
                    }
    fprintf(stderr, "  filters vs reference: %d cases, %d skipped at a rounding boundary\n", cases,
            skipped);
    check(skipped * 10 < cases, "too many boundary skips");
    free(z);
    free(got);
    free(want);
    ml_sampler_destroy(s);
}

/* The Llama 3 vocabulary, where the bucket histogram holds thousands of
 * candidates per crossing bucket in the flat case. */
static void test_filters_full_vocab(void)
{
    size_t n = LLAMA3_VOCAB;
    ml_sampler *s = make_sampler(n);
    float *z = malloc(n * sizeof *z);
    double *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want), margin;
    struct {
        float sigma, t, top_p, min_p;
        uint32_t top_k;
    } cfg[] = {{1.0f, 1.0f, 0.9f, 0.0f, 0},   {2.5f, 1.0f, 0.9f, 0.0f, 0},
               {2.5f, 0.6f, 0.9f, 0.0f, 0},   {1.0f, 1.0f, 0.5f, 0.3f, 0},
               {1.0f, 1.0f, 0.95f, 0.0f, 500}, {1.0f, 1.0f, 1.0f, 0.0f, 50},
               {0.001f, 1.0f, 0.3f, 0.0f, 0}};
    for (size_t c = 0; c < N_OF(cfg); c++) {
        for (size_t i = 0; i < n; i++)
            z[i] = test_normal(cfg[c].sigma);
        ml_sampling_params p;
        ml_sampling_params_default(&p);
        p.temperature = cfg[c].t;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.top_k = cfg[c].top_k;
        ref_distribution(z, n, &p, want, &margin);
        if (margin < 1e-6) {
            fprintf(stderr, "  full vocab config %zu: at a rounding boundary, skipped\n", c);
            continue;
        }
        ml_sampler_seq *seq = make_seq(&p, n, NULL, 0);
        got_distribution(s, seq, z, n, got);
        char what[64];
        snprintf(what, sizeof what, "full vocab config %zu", c);
        expect_same_distribution(got, want, n, what);
        ml_sampler_seq_destroy(seq);
    }
    free(z);
    free(got);
    free(want);
    ml_sampler_destroy(s);
}

/* ---- penalties ----------------------------------------------------------- */

static void test_repetition_penalty(void)
{
    enum { V = 8 };
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.repetition_penalty = 1.5f;
    p.max_tokens = 4;
    const float z[V] = {3.0f, -2.0f, 0.0f, 1.5f, -0.5f, 2.0f, 0.25f, -4.0f};
    /* Prompt ids 1, 2 (twice), 5; 9 has no logit and is ignored. */
    const int32_t prompt[] = {1, 2, 2, 9, 5};
    ml_sampler_seq *seq = make_seq(&p, V, prompt, N_OF(prompt));
    char err[256];
    ml_finish fin;
    check(ml_sampler_seq_accept(seq, 3, &fin, err, sizeof err) == ML_OK && fin == ML_FINISH_NONE,
          "accept 3");
    check(ml_sampler_seq_accept(seq, 3, &fin, err, sizeof err) == ML_OK, "accept 3 again");

    /* HF: once per distinct id, negative logits multiplied, others divided. */
    float want_z[V];
    memcpy(want_z, z, sizeof want_z);
    want_z[1] = -2.0f * 1.5f;
    want_z[2] = 0.0f;
    want_z[3] = 1.5f / 1.5f;
    want_z[5] = 2.0f / 1.5f;
    double got[V], want[V], margin;
    ml_sampling_params ref = p;
    ref.repetition_penalty = 1.0f;
    ref_distribution(want_z, V, &ref, want, &margin);
    got_distribution(s, seq, z, V, got);
    expect_same_distribution(got, want, V, "repetition penalty");
    ml_sampler_seq_destroy(seq);

    /* Greedy sees the penalty: 1.2 / 1.5 = 0.8 < 1.0. */
    p.temperature = 0.0f;
    const float two[V] = {1.0f, 1.2f, -9, -9, -9, -9, -9, -9};
    const int32_t seen[] = {1};
    seq = make_seq(&p, V, seen, 1);
    int32_t tok = -1;
    check(sample_token(s, seq, two, &tok, err, sizeof err) == ML_OK && tok == 0,
          "greedy with repetition penalty picks 0 (got %d)", (int)tok);
    ml_sampler_seq_destroy(seq);
    ml_sampler_destroy(s);
}

static void test_presence_frequency(void)
{
    enum { V = 8 };
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repetition_penalty = 1.3f;
    p.max_tokens = 10;
    const float z[V] = {0.5f, 1.0f, -1.0f, 2.0f, 0.0f, 1.5f, 1.0f, -0.5f};
    const int32_t prompt[] = {6};
    ml_sampler_seq *seq = make_seq(&p, V, prompt, 1);
    char err[256];
    ml_finish fin;
    const int32_t gen[] = {5, 5, 7};
    for (size_t i = 0; i < N_OF(gen); i++)
        check(ml_sampler_seq_accept(seq, gen[i], &fin, err, sizeof err) == ML_OK, "accept");
    check(ml_sampler_seq_n_generated(seq) == 3, "n_generated");

    /* Repetition on prompt and output (6, 5, 7), then presence and
     * frequency on output only (5 twice, 7 once). */
    float want_z[V];
    memcpy(want_z, z, sizeof want_z);
    want_z[6] = 1.0f / 1.3f;
    want_z[5] = 1.5f / 1.3f - 0.25f * 2 - 0.5f;
    want_z[7] = -0.5f * 1.3f - 0.25f * 1 - 0.5f;
    ml_sampling_params ref;
    ml_sampling_params_default(&ref);
    double got[V], want[V], margin;
    ref_distribution(want_z, V, &ref, want, &margin);
    got_distribution(s, seq, z, V, got);
    expect_same_distribution(got, want, V, "presence/frequency + repetition");
    ml_sampler_seq_destroy(seq);

    /* Negative penalties encourage repetition. */
    p.repetition_penalty = 1.0f;
    p.presence_penalty = -1.0f;
    p.frequency_penalty = 0.0f;
    p.temperature = 0.0f;
    seq = make_seq(&p, V, NULL, 0);
    check(ml_sampler_seq_accept(seq, 5, &fin, err, sizeof err) == ML_OK, "accept");
    int32_t tok = -1;
    check(sample_token(s, seq, z, &tok, err, sizeof err) == ML_OK && tok == 5,
          "negative presence makes 5 (1.5 + 1) beat 3 (2.0): got %d", (int)tok);
    ml_sampler_seq_destroy(seq);
    ml_sampler_destroy(s);
}

/* Many distinct output ids through the count table (collisions, growth to
 * max_tokens), checked through the resulting distribution. */
static void test_penalty_table(void)
{
    enum { V = 3000, STEPS = 4000 };
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.presence_penalty = 0.1f;
    p.frequency_penalty = 0.01f;
    p.max_tokens = STEPS;
    ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
    static uint32_t count[V];
    char err[256];
    ml_finish fin = ML_FINISH_NONE;
    for (int i = 0; i < STEPS; i++) {
        int32_t id = (int32_t)(test_uniform() * test_uniform() * V);
        count[id]++;
        check(ml_sampler_seq_accept(seq, id, &fin, err, sizeof err) == ML_OK, "accept %d", i);
    }
    check(fin == ML_FINISH_LENGTH, "finish at max_tokens");
    /* Sampling and accepting after the end are refused. */
    float *z = calloc(V, sizeof *z), *want_z = malloc(V * sizeof *want_z);
    int32_t tok;
    check(ml_sampler_seq_accept(seq, 0, &fin, err, sizeof err) == ML_ERR_INVALID_ARG,
          "accept after finish");
    check(sample_token(s, seq, z, &tok, err, sizeof err) == ML_ERR_INVALID_ARG,
          "sample after finish");
    ml_sampler_seq_destroy(seq);

    /* Same counts, one step short of the end, to read the distribution. */
    p.max_tokens = STEPS + 1;
    seq = make_seq(&p, V, NULL, 0);
    for (int32_t id = 0; id < V; id++)
        for (uint32_t k = 0; k < count[id]; k++)
            ml_sampler_seq_accept(seq, id, &fin, err, sizeof err);
    for (int i = 0; i < V; i++) {
        want_z[i] = 0.0f;
        if (count[i]) {
            want_z[i] -= 0.01f * (float)count[i];
            want_z[i] -= 0.1f;
        }
    }
    double *got = malloc(V * sizeof *got), *want = malloc(V * sizeof *want), margin;
    ml_sampling_params ref;
    ml_sampling_params_default(&ref);
    ref_distribution(want_z, V, &ref, want, &margin);
    got_distribution(s, seq, z, V, got);
    expect_same_distribution(got, want, V, "4000 counted tokens");
    ml_sampler_seq_destroy(seq);
    free(z);
    free(want_z);
    free(got);
    free(want);
    ml_sampler_destroy(s);
}

static void test_accept(void)
{
    enum { V = 200000 };
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.max_tokens = 3;
    p.n_stop_ids = 3;
    p.stop_ids[0] = 128001;
    p.stop_ids[1] = 128008;
    p.stop_ids[2] = 128009;
    char err[256];
    ml_finish fin;
    ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
    check(ml_sampler_seq_accept(seq, -1, &fin, err, sizeof err) == ML_ERR_INVALID_ARG,
          "negative token");
    check(ml_sampler_seq_accept(seq, V, &fin, err, sizeof err) == ML_ERR_INVALID_ARG,
          "token past the vocabulary");
    check(ml_sampler_seq_accept(seq, 128000, &fin, err, sizeof err) == ML_OK &&
              fin == ML_FINISH_NONE,
          "ordinary token");
    check(ml_sampler_seq_accept(seq, 128009, &fin, err, sizeof err) == ML_OK &&
              fin == ML_FINISH_STOP,
          "eot is a stop");
    check(ml_sampler_seq_accept(seq, 5, &fin, err, sizeof err) == ML_ERR_INVALID_ARG,
          "no token after a stop");
    ml_sampler_seq_destroy(seq);

    /* A stop id that is also the last allowed token reports stop. */
    seq = make_seq(&p, V, NULL, 0);
    ml_sampler_seq_accept(seq, 1, &fin, err, sizeof err);
    ml_sampler_seq_accept(seq, 2, &fin, err, sizeof err);
    check(ml_sampler_seq_accept(seq, 128001, &fin, err, sizeof err) == ML_OK &&
              fin == ML_FINISH_STOP,
          "stop beats length");
    ml_sampler_seq_destroy(seq);
    seq = make_seq(&p, V, NULL, 0);
    ml_sampler_seq_accept(seq, 1, &fin, err, sizeof err);
    ml_sampler_seq_accept(seq, 2, &fin, err, sizeof err);
    check(ml_sampler_seq_accept(seq, 3, &fin, err, sizeof err) == ML_OK &&
              fin == ML_FINISH_LENGTH,
          "length at max_tokens");
    ml_sampler_seq_destroy(seq);
}

/* ---- the draw ------------------------------------------------------------ */

/* Upper 0.1% points of chi-square for 1..7 degrees of freedom. */
static const double chi2_999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};

static void test_empirical(void)
{
    enum { V = 7, DRAWS = 20000 };
    ml_sampler *s = make_sampler(V);
    const float z[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -1.0f, 1.2f};
    struct {
        float t, top_p, min_p;
        uint32_t top_k;
    } cfg[] = {{1.0f, 1.0f, 0.0f, 0}, {0.5f, 1.0f, 0.0f, 0}, {2.0f, 1.0f, 0.0f, 4},
               {1.0f, 0.8f, 0.0f, 0}, {1.0f, 1.0f, 0.2f, 0}, {1.3f, 0.9f, 0.1f, 5}};
    for (size_t c = 0; c < N_OF(cfg); c++) {
        ml_sampling_params p;
        ml_sampling_params_default(&p);
        p.temperature = cfg[c].t;
        p.top_p = cfg[c].top_p;
        p.min_p = cfg[c].min_p;
        p.top_k = cfg[c].top_k;
        p.seed = 1000 + c;
        double want[V], margin;
        ref_distribution(z, V, &p, want, &margin);
        ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
        int hist[V] = {0};
        char err[256];
        for (int i = 0; i < DRAWS; i++) {
            int32_t tok = -1;
            if (sample_token(s, seq, z, &tok, err, sizeof err) != ML_OK || tok < 0 ||
                tok >= V) {
                check(0, "draw failed: %s", err);
                break;
            }
            hist[tok]++;
        }
        double chi2 = 0.0;
        int cells = 0, outside = 0;
        for (int i = 0; i < V; i++) {
            if (want[i] == 0.0) {
                outside += hist[i];
                continue;
            }
            double e = want[i] * DRAWS;
            chi2 += (hist[i] - e) * (hist[i] - e) / e;
            cells++;
        }
        check(outside == 0, "config %zu: %d draws of filtered tokens", c, outside);
        check(cells >= 2 && chi2 < chi2_999[cells - 1], "config %zu: chi2 %.2f with %d dof", c,
              chi2, cells - 1);
        fprintf(stderr, "  empirical config %zu: chi2 %.2f (%d dof, 0.1%% point %.2f)\n", c, chi2,
                cells - 1, chi2_999[cells - 1]);
        ml_sampler_seq_destroy(seq);
    }
    ml_sampler_destroy(s);
}

/* Draws over many buckets (2000 candidates, top-p), checked with cells of
 * about equal expected count taken in rank order. */
static void test_empirical_wide(void)
{
    enum { V = 2000, DRAWS = 50000, CELLS = 20 };
    ml_sampler *s = make_sampler(V);
    float z[V];
    for (int i = 0; i < V; i++)
        z[i] = test_normal(1.0f);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.top_p = 0.95f;
    p.seed = 77;
    static double want[V];
    double margin;
    ref_distribution(z, V, &p, want, &margin);
    int32_t order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    rank_keys = z;
    qsort(order, V, sizeof *order, rank_compare);
    int cell_of[V];
    double expect[CELLS] = {0}, acc = 0.0;
    for (int r = 0; r < V; r++) {
        int c = (int)(acc * CELLS);
        cell_of[order[r]] = c < CELLS ? c : CELLS - 1;
        expect[cell_of[order[r]]] += want[order[r]] * DRAWS;
        acc += want[order[r]];
    }
    ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
    int hist[CELLS] = {0}, outside = 0;
    char err[256];
    for (int i = 0; i < DRAWS; i++) {
        int32_t tok = 0;
        sample_token(s, seq, z, &tok, err, sizeof err);
        outside += want[tok] == 0.0;
        hist[cell_of[tok]]++;
    }
    double chi2 = 0.0;
    for (int c = 0; c < CELLS; c++)
        chi2 += (hist[c] - expect[c]) * (hist[c] - expect[c]) / expect[c];
    /* Upper 0.1% point of chi-square with 19 degrees of freedom. */
    check(chi2 < 43.82 && outside == 0, "wide draw: chi2 %.2f, %d outside top-p", chi2, outside);
    fprintf(stderr, "  empirical 2000 ids, top_p 0.95: chi2 %.2f (19 dof, 0.1%% point 43.82)\n",
            chi2);
    ml_sampler_seq_destroy(seq);
    ml_sampler_destroy(s);
}

/* Temperatures at both ends of the range still never draw a masked token. */
static void test_extreme_temperatures(void)
{
    enum { V = 4 };
    ml_sampler *s = make_sampler(V);
    const float z[V] = {0.0f, -INFINITY, 5.0f, NAN};
    const float temps[] = {1e30f, ML_SAMPLE_GREEDY_TEMPERATURE * 2};
    for (size_t t = 0; t < N_OF(temps); t++) {
        ml_sampling_params p;
        ml_sampling_params_default(&p);
        p.temperature = temps[t];
        ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
        int hist[V] = {0};
        char err[256];
        for (int i = 0; i < 2000; i++) {
            int32_t tok = 1;
            check(sample_token(s, seq, z, &tok, err, sizeof err) == ML_OK, "%s", err);
            hist[tok]++;
        }
        check(hist[1] == 0 && hist[3] == 0, "T=%g: a masked or NaN logit was drawn",
              (double)temps[t]);
        if (t == 0)
            check(hist[0] > 900 && hist[2] > 900, "T=1e30 is uniform over the finite logits "
                  "(%d/%d)", hist[0], hist[2]);
        else
            check(hist[2] == 2000, "a tiny temperature always picks the best");
        ml_sampler_seq_destroy(seq);
    }
    ml_sampler_destroy(s);
}

/* Equal logits over 1024 ids make the draw floor(u * 1024), exposing the
 * stream; the expected values come from an independent Python
 * implementation of splitmix64 seeding + xoshiro256** (53-bit doubles). */
static void test_stream_pinned(void)
{
    enum { V = 1024 };
    static const struct {
        uint64_t seed;
        int32_t tokens[10];
    } want[] = {
        {0, {615, 765, 105, 426, 750, 1023, 432, 548, 876, 940}},
        {42, {85, 388, 696, 946, 1015, 788, 736, 870, 779, 597}},
        {UINT64_MAX, {573, 785, 519, 765, 580, 749, 379, 786, 641, 629}},
    };
    ml_sampler *s = make_sampler(V);
    float z[V] = {0};
    for (size_t w = 0; w < N_OF(want); w++) {
        ml_sampling_params p;
        ml_sampling_params_default(&p);
        p.seed = want[w].seed;
        ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
        int same = 1;
        char err[256];
        for (int i = 0; i < 10; i++) {
            int32_t tok = -1;
            sample_token(s, seq, z, &tok, err, sizeof err);
            same &= tok == want[w].tokens[i];
        }
        check(same, "seed %llu: stream differs from the reference",
              (unsigned long long)want[w].seed);
        ml_sampler_seq_destroy(seq);
    }
    ml_sampler_destroy(s);
}

/* Logits of step t, the same for every sequence. */
static void step_logits(float *z, size_t n, int t)
{
    uint64_t saved = test_rng;
    test_rng = 0xABCDEFu + (uint64_t)t * 7919u;
    for (size_t i = 0; i < n; i++)
        z[i] = test_normal(2.0f);
    test_rng = saved;
}

/* Run steps of seqs[0..n_seqs) round-robin with one sampler; tokens of
 * seqs[0] into out. */
static void run_interleaved(ml_sampler *s, ml_sampler_seq **seqs, int n_seqs, size_t n_vocab,
                            int steps, int32_t *out)
{
    float *z = malloc(n_vocab * sizeof *z);
    char err[256];
    ml_finish fin;
    for (int t = 0; t < steps; t++) {
        step_logits(z, n_vocab, t);
        for (int q = 0; q < n_seqs; q++) {
            int32_t tok = -1;
            check(sample_token(s, seqs[q], z, &tok, err, sizeof err) == ML_OK, "%s", err);
            check(ml_sampler_seq_accept(seqs[q], tok, &fin, err, sizeof err) == ML_OK, "%s", err);
            if (q == 0)
                out[t] = tok;
        }
    }
    free(z);
}

static void test_reproducible(void)
{
    enum { V = 5000, STEPS = 300 };
    ml_sampler *s = make_sampler(V), *s2 = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.presence_penalty = 0.4f;
    p.repetition_penalty = 1.1f;
    p.max_tokens = STEPS;
    p.seed = 7;
    const int32_t prompt[] = {10, 20, 30, 4999, 6000};
    static int32_t alone[STEPS], batched[STEPS], other[STEPS];

    ml_sampler_seq *a = make_seq(&p, V, prompt, N_OF(prompt));
    run_interleaved(s, &a, 1, V, STEPS, alone);
    ml_sampler_seq_destroy(a);

    /* Same seed in a batch with two other requests, on another sampler. */
    ml_sampling_params pb = p, pc = p;
    pb.seed = 8;
    pc.temperature = 1.5f;
    pc.top_k = 10;
    ml_sampler_seq *batch[3] = {make_seq(&p, V, prompt, N_OF(prompt)), make_seq(&pb, V, NULL, 0),
                                make_seq(&pc, V, prompt, 2)};
    run_interleaved(s2, batch, 3, V, STEPS, batched);
    for (int i = 0; i < 3; i++)
        ml_sampler_seq_destroy(batch[i]);
    check(!memcmp(alone, batched, sizeof alone), "same seed, other batch: tokens differ");

    ml_sampler_seq *b = make_seq(&pb, V, prompt, N_OF(prompt));
    run_interleaved(s, &b, 1, V, STEPS, other);
    ml_sampler_seq_destroy(b);
    int differ = 0;
    for (int i = 0; i < STEPS; i++)
        differ += alone[i] != other[i];
    check(differ > STEPS / 2, "seeds 7 and 8 agree on %d of %d tokens", STEPS - differ, STEPS);
    ml_sampler_destroy(s);
    ml_sampler_destroy(s2);
}

/* ---- logprobs ------------------------------------------------------------ */

static void test_logprobs(void)
{
    size_t n = LLAMA3_VOCAB;
    float *z = malloc(n * sizeof *z);
    for (size_t i = 0; i < n; i++)
        z[i] = test_normal(3.0f);
    z[100] = -INFINITY;
    z[5000] = z[7000] = z[9000] = 16.0f; /* tied best */
    z[8000] = 15.0f;
    double m = -INFINITY, sum = 0.0;
    for (size_t i = 0; i < n; i++)
        if (z[i] > m)
            m = z[i];
    for (size_t i = 0; i < n; i++)
        sum += exp((double)z[i] - m);
    double lse = m + log(sum);

    ml_sample_out lp;
    char err[256];
    check(ml_sample_logprobs(z, n, 8000, ML_SAMPLE_MAX_TOP, &lp, err, sizeof err) ==
              ML_OK,
          "logprobs: %s", err);
    check(lp.chosen.id == 8000, "chosen id");
    check_close(lp.chosen.logprob, 15.0 - lse, 1e-5, 0, "chosen logprob");
    check(lp.n_top == ML_SAMPLE_MAX_TOP, "n_top %u", (unsigned)lp.n_top);
    check(lp.top[0].id == 5000 && lp.top[1].id == 7000 && lp.top[2].id == 9000 &&
              lp.top[3].id == 8000,
          "ties by id, then the runner-up");

    int32_t *order = malloc(n * sizeof *order);
    for (size_t i = 0; i < n; i++)
        order[i] = (int32_t)i;
    rank_keys = z;
    qsort(order, n, sizeof *order, rank_compare);
    double max_diff = 0.0;
    int ids_ok = 1;
    for (uint32_t i = 0; i < lp.n_top; i++) {
        ids_ok &= lp.top[i].id == order[i];
        double d = fabs(lp.top[i].logprob - ((double)z[order[i]] - lse));
        if (d > max_diff)
            max_diff = d;
    }
    check(ids_ok, "top ids match a full sort");
    check(max_diff < 1e-5, "top logprobs max diff %.3g", max_diff);

    check(ml_sample_logprobs(z, n, 100, 0, &lp, err, sizeof err) == ML_OK &&
              isinf(lp.chosen.logprob) && lp.chosen.logprob < 0 && lp.n_top == 0,
          "masked chosen: -inf, no alternatives");
    check(ml_sample_logprobs(z, n, (int32_t)n, 0, &lp, err, sizeof err) == ML_ERR_INVALID_ARG,
          "chosen out of range");
    check(ml_sample_logprobs(z, n, 0, ML_SAMPLE_MAX_TOP + 1, &lp, err, sizeof err) ==
              ML_ERR_INVALID_ARG,
          "top_n over the limit");
    const float tiny[3] = {1.0f, 2.0f, NAN};
    check(ml_sample_logprobs(tiny, 3, 0, 3, &lp, err, sizeof err) == ML_OK && lp.n_top == 2 &&
              lp.top[0].id == 1,
          "NaN never among the alternatives");
    free(order);
    free(z);
}

/* ---- time per sample at the Llama 3 vocabulary --------------------------- */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void bench_one(ml_sampler *s, const float *z, const char *name,
                      const ml_sampling_params *p, const int32_t *prompt, size_t n_prompt)
{
    enum { ITERS = 100 };
    ml_sampler_seq *seq = make_seq(p, LLAMA3_VOCAB, prompt, n_prompt);
    char err[256];
    int32_t tok;
    sample_token(s, seq, z, &tok, err, sizeof err); /* warm the scratch */
    double t0 = now_us();
    for (int i = 0; i < ITERS; i++)
        if (sample_token(s, seq, z, &tok, err, sizeof err) != ML_OK)
            check(0, "bench %s: %s", name, err);
    double us = (now_us() - t0) / ITERS;
    fprintf(stderr, "  %-38s %8.1f us/sample\n", name, us);
    ml_sampler_seq_destroy(seq);
}

/* A constraint (ml_sampler_sample's allowed): greedy and drawn tokens stay
 * among the allowed ids, a penalty still applies to them, and the logprobs
 * are those of the raw row; nothing allowed is no token at all. */
static void test_allowed(void)
{
    enum { V = 1000, DRAWS = 200 };
    static float z[V];
    for (int i = 0; i < V; i++)
        z[i] = test_normal(2.0f);
    z[3] = 20.0f; /* the raw best, never allowed */
    uint64_t allowed[(V + 63) / 64] = {0};
    for (int i = 100; i < 200; i += 3)
        allowed[i >> 6] |= 1ull << (i & 63);
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.temperature = 0.0f;
    p.logprobs = true;
    int32_t best = 100;
    for (int i = 100; i < 200; i += 3)
        best = z[i] > z[best] ? i : best;
    ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
    ml_sample_out out, raw;
    char err[256] = "";
    check(ml_sampler_sample(s, seq, z, allowed, &out, err, sizeof err) == ML_OK &&
              out.chosen.id == best,
          "allowed greedy: %d, want %d", out.chosen.id, best);
    check(ml_sample_logprobs(z, V, best, 0, &raw, err, sizeof err) == ML_OK &&
              out.chosen.logprob == raw.chosen.logprob,
          "allowed greedy: raw logprob");
    ml_sampler_seq_destroy(seq);

    p.temperature = 1.5f;
    p.repetition_penalty = 2.0f;
    const int32_t prompt[] = {best};
    seq = make_seq(&p, V, prompt, 1);
    int outside = 0;
    for (int d = 0; d < DRAWS; d++) {
        check(ml_sampler_sample(s, seq, z, allowed, &out, err, sizeof err) == ML_OK, "%s", err);
        int id = out.chosen.id;
        outside += id < 0 || !(allowed[id >> 6] >> (id & 63) & 1);
    }
    check(outside == 0, "allowed draws: %d outside the constraint", outside);
    ml_sampler_seq_destroy(seq);

    memset(allowed, 0, sizeof allowed);
    seq = make_seq(&p, V, NULL, 0);
    check(ml_sampler_sample(s, seq, z, allowed, &out, err, sizeof err) == ML_ERR_FORMAT,
          "nothing allowed: no token");
    ml_sampler_seq_destroy(seq);
    ml_sampler_destroy(s);
}

static void test_bench(void)
{
    size_t n = LLAMA3_VOCAB;
    ml_sampler *s = make_sampler(n);
    float *peaked = malloc(n * sizeof *peaked), *flat = malloc(n * sizeof *flat);
    /* "peaked": a few strong candidates over a broad tail, as from an LM
     * head; "flat": N(0, 1), where every token is a candidate. */
    for (size_t i = 0; i < n; i++) {
        peaked[i] = test_normal(2.5f);
        flat[i] = test_normal(1.0f);
    }
    for (int i = 0; i < 8; i++)
        peaked[(size_t)(test_uniform() * n)] = 14.0f + (float)i;
    int32_t *prompt = malloc(1000 * sizeof *prompt);
    for (int i = 0; i < 1000; i++)
        prompt[i] = (int32_t)(test_uniform() * n);

    /* A yardstick for the machine: one copy of the logits. */
    float *copy = malloc(n * sizeof *copy);
    double t0 = now_us();
    for (int i = 0; i < 100; i++) {
        memcpy(copy, flat, n * sizeof *copy);
        flat[i] += copy[n - 1 - i] * 0.0f; /* keep the copy observable */
    }
    fprintf(stderr, "  (memcpy of the %zu logits: %.1f us; times are thread CPU time)\n", n,
            (now_us() - t0) / 100);
    free(copy);

    const float *dists[] = {peaked, flat};
    const char *dist_names[] = {"peaked", "flat"};
    for (int d = 0; d < 2; d++) {
        fprintf(stderr, "  vocab %zu, %s logits:\n", n, dist_names[d]);
        ml_sampling_params p;
        char name[64];
        ml_sampling_params_default(&p);
        p.temperature = 0.0f;
        snprintf(name, sizeof name, "greedy");
        bench_one(s, dists[d], name, &p, NULL, 0);
        ml_sampling_params_default(&p);
        p.top_k = 50;
        bench_one(s, dists[d], "T=1 top_k=50", &p, NULL, 0);
        ml_sampling_params_default(&p);
        p.top_p = 0.9f;
        bench_one(s, dists[d], "T=1 top_p=0.9", &p, NULL, 0);
        ml_sampling_params_default(&p);
        p.temperature = 0.6f;
        p.top_p = 0.9f;
        bench_one(s, dists[d], "T=0.6 top_p=0.9 (Instruct default)", &p, NULL, 0);
        ml_sampling_params_default(&p);
        bench_one(s, dists[d], "T=1, no filter (OpenAI default)", &p, NULL, 0);
        ml_sampling_params_default(&p);
        p.min_p = 0.05f;
        bench_one(s, dists[d], "T=1 min_p=0.05", &p, NULL, 0);
        ml_sampling_params_default(&p);
        p.top_p = 0.9f;
        p.repetition_penalty = 1.1f;
        p.presence_penalty = 0.5f;
        p.max_tokens = 4096;
        bench_one(s, dists[d], "top_p=0.9 + penalties, 1000-id prompt", &p, prompt, 1000);

        enum { LP_ITERS = 50 };
        ml_sample_out lp;
        char err[256];
        double t_lp = now_us();
        for (int i = 0; i < LP_ITERS; i++)
            ml_sample_logprobs(dists[d], n, 0, 5, &lp, err, sizeof err);
        fprintf(stderr, "  %-38s %8.1f us/call\n", "logprobs top 5", (now_us() - t_lp) / LP_ITERS);
    }
    free(peaked);
    free(flat);
    free(prompt);
    ml_sampler_destroy(s);
}

int main(void)
{
    test_validate();
    test_greedy();
    test_filters_exact();
    test_filters_reference();
    test_filters_full_vocab();
    test_repetition_penalty();
    test_presence_frequency();
    test_penalty_table();
    test_accept();
    test_empirical();
    test_empirical_wide();
    test_extreme_temperatures();
    test_stream_pinned();
    test_reproducible();
    test_logprobs();
    test_allowed();
    test_bench();
    return check_done();
}
