/* Multi-LoRA decode throughput (label bench; skipped unless ML_BENCH=1):
 * the runtime on a generated "small" model (ml_mkmodel: real vocabulary,
 * 10 text layers of 1024) serving 8 text-only sequences at once, first all
 * on the base model, then each with its own adapter (r=16 on every text
 * Linear: self/cross q, k, v, o and the MLP), and the same at batch 1.
 * Adapters are random, written by the bench in PEFT's format.
 *
 * Reported: decode tokens/s after every sequence has its first token (so
 * prefill is excluded) and the ratio LoRA / base (goal >= 0.85 at batch 8,
 * tests/bench/README.md "Results"). Base and LoRA runs alternate ML_BENCH_REPS times and
 * the best of each counts, by wall clock and by CPU time (process CPU
 * seconds / threads): on a shared machine the wall figure is what this run
 * got, the CPU figure what the code does with the cores to itself.
 * Threads: ML_BENCH_THREADS (default 2). The model (~0.8 GB) and the
 * adapters are written to a scratch directory removed at exit. */
#include "engine/model_test_util.h" /* first: it sets _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtype.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "model/lora.h"
#include "checkpoint/mkmodel.h"
#include "checkpoint/safetensors.h"
#include "runtime/runtime.h"
#include "test_rand.h"
#include "tokenizer_util.h"

#define TOKENIZER_DIR ML_SOURCE_DIR "/config/tokenizer"
#define PRESET "small"
#define SEED 1234
#define N_SEQS 8
#define RANK 16
#define ALPHA 32
#define PROMPT_TOKENS 16
#define NEW_TOKENS 48
#define MAX_LAYERS 64
#define DEFAULT_REPS 3
/* Random adapter weights: small enough to leave activations O(1). */
#define LORA_INIT 0.02f
#define ORDINARY_TOKENS 100000 /* random prompt ids below the special tokens */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

/* ---- adapters -------------------------------------------------------------- */

typedef struct bench {
    ml_backend *be;     /* owned */
    ml_model *model;    /* owned */
    ml_tokenizer *tok;  /* owned */
} bench;

/* Adapters are the scratch directory's subdirectories of their name. */
static int resolve(void *ctx, const char *name, char *dir, size_t n)
{
    snprintf(dir, n, "%s/%s", ml_scratch_dir(), name);
    return 1;
}

/* One random r=RANK adapter on every text Linear, in PEFT's layout. */
static int write_adapter(const bench *b, const char *name)
{
    const ml_text_config *tc = &ml_model_config(b->model)->text;
    const int D = tc->hidden_size, Q = tc->num_attention_heads * tc->head_dim;
    const int KV = tc->num_key_value_heads * tc->head_dim, I = tc->intermediate_size;
    static const char *const leaves[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const int in[] = {D, D, D, Q, D, D, I}, out[] = {Q, KV, KV, D, I, I, D};
    enum { MODULES = 7 };
    if (tc->num_hidden_layers > MAX_LAYERS)
        return 0;
    char dir[512], path[600], err[256];
    ml_scratch_subdir(name, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/" ML_LORA_CONFIG_FILE, dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    fprintf(f, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, \"bias\": \"none\", "
               "\"target_modules\": \".*language_model.*\\\\.(q_proj|k_proj|v_proj|o_proj|"
               "gate_proj|up_proj|down_proj)\"}\n",
            RANK, ALPHA);
    fclose(f);

    size_t n = (size_t)tc->num_hidden_layers * MODULES * 2, total = 0;
    ml_tensor_view *views = calloc(n, sizeof *views);
    char (*names)[128] = calloc(n, sizeof *names);
    for (int l = 0, k = 0; l < tc->num_hidden_layers; l++) {
        int cross = ml_config_cross_index(ml_model_config(b->model), l) >= 0;
        for (int m = 0; m < MODULES; m++, k += 2) {
            const char *attn = m < 4 ? (cross ? "cross_attn." : "self_attn.") : "";
            for (int ab = 0; ab < 2; ab++) /* lora_A, then lora_B */
                snprintf(names[k + ab], sizeof names[k + ab],
                         "base_model.model.language_model.model.layers.%d.%s%s.lora_%c.weight", l,
                         attn, leaves[m], "AB"[ab]);
            views[k] = (ml_tensor_view){.name = names[k], .dtype = ML_DTYPE_BF16, .ndim = 2,
                                        .shape = {RANK, in[m]}};
            views[k + 1] = (ml_tensor_view){.name = names[k + 1], .dtype = ML_DTYPE_BF16,
                                            .ndim = 2, .shape = {out[m], RANK}};
            total += (size_t)RANK * (in[m] + out[m]);
        }
    }
    uint16_t *data = xmalloc(total * sizeof *data), *next = data;
    fill_bf16(data, total, -LORA_INIT, LORA_INIT);
    for (size_t k = 0; k < n; k++) {
        size_t numel = (size_t)(views[k].shape[0] * views[k].shape[1]);
        views[k].data = next;
        views[k].nbytes = numel * sizeof *data;
        next += numel;
    }
    snprintf(path, sizeof path, "%s/" ML_LORA_WEIGHTS_FILE, dir);
    ml_status st = ml_safetensors_write(path, views, n, err, sizeof err);
    if (st != ML_OK)
        fprintf(stderr, "adapter %s: %s\n", name, err);
    free(data);
    free(names);
    free(views);
    return st == ML_OK;
}

/* ---- runs ------------------------------------------------------------------ */

typedef struct counter {
    int tokens, started, done;
} counter;

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_sample_out *lp)
{
    counter *c = ctx;
    c->started += c->tokens++ == 0;
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage)
{
    counter *c = ctx;
    c->done = 1;
    if (reason != ML_FINISH_REASON_LENGTH)
        fprintf(stderr, "request ended early: %s\n", message ? message : "?");
}

/* Decode throughput of one run, by wall clock and by CPU time. */
typedef struct rate {
    double wall, cpu; /* tokens/s */
} rate;

/* Decode tokens/s of n sequences, each with adapter names[i] (NULL: base). */
static rate run(bench *b, int n, const char *const *names, int threads)
{
    int blocks_per_seq = (PROMPT_TOKENS + NEW_TOKENS) / 16 + 2;
    ml_runtime_config rc = {
        .kv_bytes = (size_t)N_SEQS * blocks_per_seq * ml_model_kv_block_bytes(b->model),
        .image_bytes = 0,
        .max_running = N_SEQS,
        .max_step_tokens = N_SEQS * PROMPT_TOKENS,
        .max_adapters = N_SEQS,
        .max_adapter_rank = RANK,
        .resolve_adapter = resolve,
    };
    ml_runtime *rt;
    char err[256];
    if (ml_runtime_create(&rt, b->model, b->tok, &rc, err, sizeof err) != ML_OK) {
        fprintf(stderr, "runtime: %s\n", err);
        return (rate){0, 0};
    }
    counter c[N_SEQS] = {{0}};
    for (int i = 0; i < n; i++) {
        int32_t prompt[PROMPT_TOKENS];
        for (int t = 0; t < PROMPT_TOKENS; t++)
            prompt[t] = irand(ORDINARY_TOKENS);
        ml_request req = {.prompt = prompt, .n_prompt = PROMPT_TOKENS, .adapter = names[i],
                          .cb = {.on_token = on_token, .on_finish = on_finish, .ctx = &c[i]}};
        ml_sampling_params_default(&req.sampling);
        req.sampling.temperature = 0;
        req.sampling.max_tokens = NEW_TOKENS;
        uint64_t h;
        if (ml_runtime_submit(rt, &req, &h, err, sizeof err) != ML_OK)
            fprintf(stderr, "submit: %s\n", err);
    }
    /* Prefill (and adapter loads) until every sequence has its first token. */
    int started = 0;
    while (started < n && ml_runtime_active(rt) > 0) {
        ml_runtime_step(rt, err, sizeof err);
        started = 0;
        for (int i = 0; i < n; i++)
            started += c[i].started;
    }
    int before = 0, after = 0;
    for (int i = 0; i < n; i++)
        before += c[i].tokens;
    double w0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    while (ml_runtime_active(rt) > 0)
        if (ml_runtime_step(rt, err, sizeof err) != ML_OK) {
            fprintf(stderr, "step: %s\n", err);
            break;
        }
    double wall = now_s() - w0, cpu = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / threads;
    for (int i = 0; i < n; i++)
        after += c[i].tokens;
    ml_runtime_destroy(rt);
    return (rate){wall > 0 ? (after - before) / wall : 0, cpu > 0 ? (after - before) / cpu : 0};
}

static void keep_best(rate *best, rate r)
{
    best->wall = r.wall > best->wall ? r.wall : best->wall;
    best->cpu = r.cpu > best->cpu ? r.cpu : best->cpu;
}

/* Base and LoRA at batch n, alternating, best of reps each. */
static void compare(bench *b, int n, const char *const *names, int reps, int threads)
{
    const char *base[N_SEQS] = {NULL};
    rate best_base = {0, 0}, best_lora = {0, 0};
    for (int r = 0; r < reps; r++) {
        keep_best(&best_base, run(b, n, base, threads));
        keep_best(&best_lora, run(b, n, names, threads));
    }
    printf("batch %d, %s: base %.1f tok/s, LoRA %.1f tok/s, ratio %.3f (wall); base %.1f, "
           "LoRA %.1f, ratio %.3f (cpu)\n",
           n, n > 1 ? "a distinct adapter per sequence" : "one adapter", best_base.wall,
           best_lora.wall, best_lora.wall / best_base.wall, best_base.cpu, best_lora.cpu,
           best_lora.cpu / best_base.cpu);
}

int main(void)
{
    ml_bench_require();
    int threads = ml_bench_env_int("ML_BENCH_THREADS", 2, 1, INT_MAX);
    int reps = ml_bench_env_int("ML_BENCH_REPS", DEFAULT_REPS, 1, INT_MAX);
    bench b = {0};
    char model_dir[300], err[512];
    snprintf(model_dir, sizeof model_dir, "%s/model", ml_scratch_dir());
    double t0 = now_s();
    ml_model_limits lim = ml_model_limits_default();
    lim.max_step_seqs = N_SEQS;
    lim.max_step_tokens = N_SEQS * PROMPT_TOKENS;
    lim.max_logit_rows = N_SEQS;
    lim.max_lora_rank = RANK;
    int ok = ml_mkmodel(PRESET, model_dir, TOKENIZER_DIR, SEED, 0, err, sizeof err) == ML_OK &&
             (b.be = ml_backend_cpu_create(threads, err, sizeof err)) != NULL &&
             ml_model_load(&b.model, model_dir, b.be, &lim, err, sizeof err) == ML_OK;
    char names[N_SEQS][16];
    const char *distinct[N_SEQS];
    for (int i = 0; ok && i < N_SEQS; i++) {
        snprintf(names[i], sizeof names[i], "lora%d", i);
        distinct[i] = names[i];
        ok = write_adapter(&b, names[i]);
    }
    if (!ok) {
        fprintf(stderr, "setup: %s\n", err);
        return 1;
    }
    b.tok = ml_tok_load(ML_TOK_REAL_PATH, NULL);
    printf("setup (model %s, %d adapters r=%d) %.1f s; %d threads, %s, best of %d; goal: "
           "ratio >= 0.85 at batch %d\n",
           PRESET, N_SEQS, RANK, now_s() - t0, threads, b.be->ops->name, reps, N_SEQS);
    fflush(stdout);
    compare(&b, N_SEQS, distinct, reps, threads);
    compare(&b, 1, distinct, reps, threads);

    ml_tokenizer_destroy(b.tok);
    ml_model_destroy(b.model);
    b.be->ops->destroy(b.be);
    return 0;
}
