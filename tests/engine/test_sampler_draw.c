/* Sampler draw: the draw against its distribution (chi-square), the random
 * stream against an independent Python implementation of splitmix64 +
 * xoshiro256**, logprobs against a double-precision log_softmax, constraints,
 * and the time per sample at the Llama 3 vocabulary (printed, not checked: it
 * depends on the machine). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sampler_test_util.h"

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
