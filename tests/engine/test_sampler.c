/* Sampler controls: parameter validation, greedy, every filter against a
 * brute-force reference written here from the HF / vLLM definitions (sort
 * everything, softmax in double), the penalties and the logit bias. The draw, logprobs and
 * timing are in test_sampler_draw.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sampler_test_util.h"

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
    ml_logit_bias bias[ML_SAMPLE_MAX_BIAS + 1];
    for (int i = 0; i <= ML_SAMPLE_MAX_BIAS; i++)
        bias[i] = (ml_logit_bias){i, (float)(i % 201 - 100)};
    INVALID((p.logit_bias = bias, p.n_logit_bias = ML_SAMPLE_MAX_BIAS + 1), "logit_bias");
    INVALID(p.n_logit_bias = 1, "logit_bias"); /* NULL entries */
    const ml_logit_bias over_vocab[] = {{1000, 1.0f}}, negative_id[] = {{-1, 1.0f}},
                        over_max[] = {{5, 100.5f}}, under_min[] = {{5, -101.0f}},
                        nan_value[] = {{5, NAN}}, twice[] = {{5, 1.0f}, {6, 2.0f}, {5, 3.0f}};
    INVALID((p.logit_bias = over_vocab, p.n_logit_bias = 1), "logit_bias");
    INVALID((p.logit_bias = negative_id, p.n_logit_bias = 1), "logit_bias");
    INVALID((p.logit_bias = over_max, p.n_logit_bias = 1), "logit_bias");
    INVALID((p.logit_bias = under_min, p.n_logit_bias = 1), "logit_bias");
    INVALID((p.logit_bias = nan_value, p.n_logit_bias = 1), "logit_bias");
    INVALID((p.logit_bias = twice, p.n_logit_bias = 3), "logit_bias");
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
    p.logit_bias = bias; /* ids 0..299, values -100..100 */
    p.n_logit_bias = ML_SAMPLE_MAX_BIAS;
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

/* Greedy over vocabularies long enough for the vectorised pass over the
 * logits (its lanes and blocks): the first of tied maxima wherever the ties
 * fall, a later tie in a lower lane, the maximum in the scalar tail, NaN
 * and -inf around it. */
static void test_greedy_first_max(void)
{
    static const size_t sizes[] = {16, 17, 31, 64, 1000, 1013};
    char err[256];
    for (size_t v = 0; v < N_OF(sizes); v++) {
        const size_t n = sizes[v];
        ml_sampler *s = make_sampler(n);
        ml_sampling_params p;
        ml_sampling_params_default(&p);
        p.temperature = 0.0f;
        ml_sampler_seq *seq = make_seq(&p, n, NULL, 0);
        float *z = malloc(n * sizeof *z);
        for (size_t first = 0; first < n; first += 1 + first / 3) {
            for (size_t i = 0; i < n; i++)
                z[i] = i % 7 == 3 ? NAN : i % 11 == 5 ? -INFINITY : (float)(i % 5);
            /* The maximum at first, tied at every later place 5 apart
             * (another lane, chain or block), one tie in lane 0 of a
             * later block. */
            for (size_t i = first; i < n; i += 5)
                z[i] = 9.0f;
            if (first + 16 < n)
                z[(first + 16) / 16 * 16] = 9.0f;
            int32_t tok = -1;
            check(sample_token(s, seq, z, &tok, err, sizeof err) == ML_OK &&
                      tok == (int32_t)first,
                  "greedy over %zu: first maximum at %zu (got %d)", n, first, (int)tok);
        }
        free(z);
        ml_sampler_seq_destroy(seq);
        ml_sampler_destroy(s);
    }
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

/* ---- logit bias ------------------------------------------------------------ */

/* The bias is added to the raw logits before everything else (sample.h
 * step 0): the distribution is the reference's over z + bias, and the
 * repetition penalty acts on the biased logit. The sequence keeps its own
 * copy of the entries. */
static void test_logit_bias_exact(void)
{
    enum { V = 8 };
    ml_sampler *s = make_sampler(V);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    const float z[V] = {0.5f, 1.0f, -1.0f, 2.0f, 0.0f, 1.5f, 1.0f, -0.5f};
    ml_logit_bias bias[] = {{3, -1.25f}, {7, 2.0f}, {0, 0.75f}};
    p.logit_bias = bias;
    p.n_logit_bias = N_OF(bias);
    ml_sampler_seq *seq = make_seq(&p, V, NULL, 0);
    bias[0].value = 50.0f; /* the caller's array may change: the sequence copied it */
    float want_z[V];
    memcpy(want_z, z, sizeof want_z);
    want_z[3] = 2.0f - 1.25f;
    want_z[7] = -0.5f + 2.0f;
    want_z[0] = 0.5f + 0.75f;
    ml_sampling_params ref;
    ml_sampling_params_default(&ref);
    double got[V], want[V], margin;
    ref_distribution(want_z, V, &ref, want, &margin);
    got_distribution(s, seq, z, V, got);
    expect_same_distribution(got, want, V, "logit bias added to the logits");
    ml_sampler_seq_destroy(seq);

    /* Bias, then penalty: id 2's logit 1.0 - 3.0 = -2.0 is negative, so the
     * repetition penalty multiplies it (-3.0); applied the other way round
     * it would be 1.0 / 1.5 - 3.0. */
    const ml_logit_bias down[] = {{2, -3.0f}};
    p.logit_bias = down;
    p.n_logit_bias = 1;
    p.repetition_penalty = 1.5f;
    const float y[V] = {0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const int32_t prompt[] = {2};
    seq = make_seq(&p, V, prompt, 1);
    memcpy(want_z, y, sizeof want_z);
    want_z[2] = (1.0f - 3.0f) * 1.5f;
    ref_distribution(want_z, V, &ref, want, &margin);
    got_distribution(s, seq, y, V, got);
    expect_same_distribution(got, want, V, "logit bias before the repetition penalty");
    ml_sampler_seq_destroy(seq);
    ml_sampler_destroy(s);
}

/* Force a token with +100 and ban one with -100 over Llama 3's vocabulary
 * of N(0, 3) logits, greedy and drawn (temperature only, and with top-k and
 * top-p), with penalties on and with a grammar mask: +100 always yields its
 * token, -100 never yields the token that is the argmax without it. The
 * logprobs stay the raw model's. */
enum { BIAS_CONFIGS = 3, BIAS_STEPS = 16 };

static void bias_params(ml_sampling_params *p, int config)
{
    ml_sampling_params_default(p);
    p->max_tokens = BIAS_STEPS;
    p->logprobs = true;
    p->seed = 0xb1a5u + (uint64_t)config;
    if (config == 0)
        p->temperature = 0.0f;
    if (config == 2) {
        p->top_k = 50;
        p->top_p = 0.9f;
    }
}

/* The token the sequence's controls pick without a bias (greedy). */
static int32_t unbiased_greedy(ml_sampler *s, const ml_sampling_params *base, const float *z,
                               const int32_t *prompt, size_t n_prompt, const uint64_t *allowed)
{
    ml_sampling_params p = *base;
    p.temperature = 0.0f;
    p.logit_bias = NULL;
    p.n_logit_bias = 0;
    ml_sampler_seq *seq = make_seq(&p, LLAMA3_VOCAB, prompt, n_prompt);
    ml_sample_out out;
    char err[256] = "";
    check(ml_sampler_sample(s, seq, z, allowed, &out, err, sizeof err) == ML_OK, "%s", err);
    ml_sampler_seq_destroy(seq);
    return out.chosen.id;
}

static void test_logit_bias_force_ban(void)
{
    const size_t V = LLAMA3_VOCAB, words = (V + 63) / 64;
    ml_sampler *s = make_sampler(V);
    float *z = malloc(V * sizeof *z);
    uint64_t *allowed = malloc(words * sizeof *allowed);
    ml_sample_out raw;
    char err[256] = "";
    for (int penalties = 0; penalties < 2; penalties++)
        for (int masked = 0; masked < 2; masked++)
            for (int config = 0; config < BIAS_CONFIGS; config++) {
                for (size_t i = 0; i < V; i++)
                    z[i] = test_normal(3.0f);
                int32_t low = 0; /* the least likely token: the one forced */
                for (size_t i = 1; i < V; i++)
                    low = z[i] < z[low] ? (int32_t)i : low;
                /* A grammar's mask: about half the vocabulary, and the
                 * forced token. */
                for (size_t w = 0; w < words; w++)
                    allowed[w] = (uint64_t)(test_uniform() * 0x1.0p32) << 32 |
                                 (uint64_t)(test_uniform() * 0x1.0p32);
                allowed[low >> 6] |= 1ull << (low & 63);
                const uint64_t *mask = masked ? allowed : NULL;
                /* Penalties on the forced token and on a few others. */
                const int32_t prompt[] = {low, 17, 4242, 90000};
                ml_sampling_params p;
                bias_params(&p, config);
                if (penalties) {
                    p.repetition_penalty = 1.3f;
                    p.presence_penalty = 0.5f;
                    p.frequency_penalty = 0.5f;
                }
                size_t n_prompt = penalties ? N_OF(prompt) : 0;
                int32_t best = unbiased_greedy(s, &p, z, prompt, n_prompt, mask);
                const ml_logit_bias force[] = {{low, ML_SAMPLE_MAX_ABS_BIAS}};
                const ml_logit_bias ban[] = {{best, -ML_SAMPLE_MAX_ABS_BIAS}};
                for (int banning = 0; banning < 2; banning++) {
                    p.logit_bias = banning ? ban : force;
                    p.n_logit_bias = 1;
                    ml_sampler_seq *seq = make_seq(&p, V, prompt, n_prompt);
                    int bad = 0;
                    for (int step = 0; step < BIAS_STEPS; step++) {
                        ml_sample_out out;
                        ml_finish fin;
                        check(ml_sampler_sample(s, seq, z, mask, &out, err, sizeof err) == ML_OK,
                              "biased sample: %s", err);
                        int32_t id = out.chosen.id;
                        bad += banning ? id == best : id != low;
                        bad += ml_sample_logprobs(z, V, id, 0, &raw, NULL, 0) != ML_OK ||
                               out.chosen.logprob != raw.chosen.logprob;
                        /* The penalties see every token accepted. */
                        check(ml_sampler_seq_accept(seq, id, &fin, err, sizeof err) == ML_OK,
                              "accept: %s", err);
                    }
                    check(bad == 0,
                          "logit bias %s (config %d, penalties %d, mask %d): %d of %d steps "
                          "wrong",
                          banning ? "-100 bans the argmax" : "+100 forces the least likely", config,
                          penalties, masked, bad, BIAS_STEPS);
                    ml_sampler_seq_destroy(seq);
                }
            }
    free(z);
    free(allowed);
    ml_sampler_destroy(s);
}

int main(void)
{
    test_validate();
    test_greedy();
    test_greedy_first_max();
    test_filters_exact();
    test_filters_reference();
    test_filters_full_vocab();
    test_repetition_penalty();
    test_presence_frequency();
    test_penalty_table();
    test_accept();
    test_logit_bias_exact();
    test_logit_bias_force_ban();
    return check_done();
}
