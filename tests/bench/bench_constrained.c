/* The cost of constrained decoding per step (label bench; skipped unless
 * ML_BENCH=1; tests/bench/constrained_bench.sh runs it): a batch of
 * ML_BENCH_BATCH (default 16) sequences decoding together on a generated
 * model (ML_BENCH_PRESET, default "small": real vocabulary), the CPU
 * backend, all constrained ("json": JSON mode, or the JSON Schema in the
 * file ML_BENCH_SCHEMA, compiled once and shared) or all free ("free"),
 * timed step by step around ml_runtime_step over STEPS steps.
 * Every step has the same shape: each of the batch's slots holds one
 * request whose prompt is the one token BOS, so that a request's first step
 * is one token like a decode step. A JSON request ends when its object is
 * complete, and its slot gets a new request at once. The free run replays
 * the JSON run's schedule: the k-th request of a slot gets as max_tokens
 * the length the k-th JSON request of that slot had, so both runs step
 * through the same batch sizes and positions and differ only by the
 * constraint. The two runs alternate ML_BENCH_REPS times (default 5), each
 * in a fresh runtime; printed: per run the median step time (wall) and the
 * process CPU time per step (every thread, the mask thread's included: the
 * figure a loaded shared machine moves least), then the median of each side
 * and their ratios json / free (goal, issue 22: at most 1.05 on wall time). The JSON masks are computed on the runtime's mask thread during
 * the forward pass and applied in the sample op, so the ratio is the masked
 * sample op plus whatever the mask thread takes from the forward pass's
 * cores. Threads: ML_BENCH_THREADS (default 2). The model is written to a
 * scratch directory removed at exit. */
#include "engine/model_test_util.h" /* first: it sets _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "grammar/grammar.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "bench/bench_samples.h"
#include "checkpoint/mkmodel.h"
#include "runtime/runtime.h"
#include "test_rand.h"
#include "tokenizer_util.h"

#define TOKENIZER_DIR ML_SOURCE_DIR "/config/tokenizer"
#define SEED 4321
#define MAX_BATCH 64
#define STEPS 64
#define WARMUP_STEPS 2   /* not timed: the first masks, the first graph recordings */
#define MAX_TOKENS 4096  /* a JSON request ends with its object or the run */
#define MAX_PER_SLOT STEPS
#define KV_BLOCKS 2048
#define DEFAULT_REPS 5
#define DEFAULT_BATCH 16
#define BOS 128000
#define GOAL_RATIO 1.05

typedef struct bench {
    int batch;
    ml_model *model;   /* borrowed */
    ml_tokenizer *tok; /* borrowed */
    ml_grammar *grammar; /* owned; NULL: JSON mode */
    /* The JSON run's schedule: slot i's k-th request had lengths[i][k]
     * tokens; n_len[i] of them ended within the run. */
    int lengths[MAX_BATCH][MAX_PER_SLOT];
    int n_len[MAX_BATCH];
} bench;

typedef struct answer {
    int n_out, done;
    ml_finish_reason reason;
} answer;

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_sample_out *lp)
{
    (void)id, (void)text, (void)len, (void)lp;
    ((answer *)ctx)->n_out++;
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage)
{
    (void)tail, (void)tail_len, (void)usage;
    answer *a = ctx;
    a->done = 1;
    a->reason = reason;
    if (error != ML_REQERR_NONE) {
        fprintf(stderr, "request failed: %s\n", message ? message : "?");
        exit(1);
    }
}

static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* Slot i's k-th request: JSON mode, or free with the k-th JSON request's
 * length as max_tokens. */
static uint64_t submit(ml_runtime *rt, const bench *b, int json, int i, int k, answer *a)
{
    static const int32_t prompt[] = {BOS};
    ml_request req = {.prompt = prompt, .n_prompt = 1,
                      .cb = {.on_token = on_token, .on_finish = on_finish, .ctx = a}};
    ml_sampling_params_default(&req.sampling);
    req.sampling.seed = SEED + (uint64_t)(i * MAX_PER_SLOT + k);
    req.sampling.json_object = json && !b->grammar;
    req.sampling.grammar = json ? b->grammar : NULL;
    req.sampling.max_tokens = !json && k < b->n_len[i] ? (uint32_t)b->lengths[i][k] : MAX_TOKENS;
    memset(a, 0, sizeof *a);
    uint64_t h;
    char err[256];
    if (ml_runtime_submit(rt, &req, &h, err, sizeof err) != ML_OK) {
        fprintf(stderr, "submit: %s\n", err);
        exit(1);
    }
    return h;
}

/* One run in a fresh runtime: the median step time; the process CPU time
 * per timed step in *cpu_per_step; with json the schedule is recorded into
 * b, without it is replayed (and checked). The requests that ended within
 * the run in *n_ended. */
static double run(bench *b, int json, double *cpu_per_step, int *n_ended)
{
    const ml_model_limits *lim = ml_model_limits_of(b->model);
    ml_runtime_config rc = {
        .kv_bytes = (size_t)KV_BLOCKS * ml_model_kv_block_bytes(b->model),
        .image_bytes = ml_model_image_state_bytes(b->model),
        .max_running = b->batch,
        .max_step_tokens = lim->max_step_tokens,
    };
    ml_runtime *rt;
    char err[256];
    if (ml_runtime_create(&rt, b->model, b->tok, &rc, err, sizeof err) != ML_OK) {
        fprintf(stderr, "runtime: %s\n", err);
        exit(1);
    }
    answer answers[MAX_BATCH];
    uint64_t handle[MAX_BATCH];
    int k[MAX_BATCH] = {0};
    for (int i = 0; i < b->batch; i++) {
        if (json)
            b->n_len[i] = 0;
        handle[i] = submit(rt, b, json, i, 0, &answers[i]);
    }
    double times[STEPS], cpu0 = 0;
    *n_ended = 0;
    for (int step = 0; step < STEPS; step++) {
        if (step == WARMUP_STEPS)
            cpu0 = cpu_ms();
        double t0 = ml_clock_ms();
        if (ml_runtime_step(rt, err, sizeof err) != ML_OK) {
            fprintf(stderr, "step: %s\n", err);
            exit(1);
        }
        times[step] = ml_clock_ms() - t0;
        for (int i = 0; i < b->batch; i++) {
            if (!answers[i].done)
                continue;
            if (json)
                b->lengths[i][b->n_len[i]++] = answers[i].n_out;
            else if (answers[i].n_out != b->lengths[i][k[i]])
                fprintf(stderr, "slot %d: free request %d ended after %d tokens, not %d\n", i,
                        k[i], answers[i].n_out, b->lengths[i][k[i]]);
            ++*n_ended;
            handle[i] = submit(rt, b, json, i, ++k[i], &answers[i]);
        }
    }
    *cpu_per_step = (cpu_ms() - cpu0) / (STEPS - WARMUP_STEPS);
    for (int i = 0; i < b->batch; i++)
        ml_runtime_cancel(rt, handle[i]);
    ml_runtime_destroy(rt);
    return bench_median(times + WARMUP_STEPS, (size_t)STEPS - WARMUP_STEPS);
}

int main(void)
{
    ml_bench_require();
    int threads = ml_bench_env_int("ML_BENCH_THREADS", 2, 1, INT_MAX);
    int reps = ml_bench_env_int("ML_BENCH_REPS", DEFAULT_REPS, 1, 100);
    const char *preset = getenv("ML_BENCH_PRESET") ? getenv("ML_BENCH_PRESET") : "small";
    static bench b;
    b = (bench){.batch = ml_bench_env_int("ML_BENCH_BATCH", DEFAULT_BATCH, 1, MAX_BATCH)};
    char model_dir[300], err[512];
    snprintf(model_dir, sizeof model_dir, "%s/model", ml_scratch_dir());
    ml_model_limits lim = ml_model_limits_default();
    lim.max_step_seqs = b.batch;
    lim.max_logit_rows = b.batch;
    lim.max_step_tokens = b.batch;
    lim.max_seq_images = 1;
    ml_backend *be = NULL;
    ml_model *model = NULL;
    if (ml_mkmodel(preset, model_dir, TOKENIZER_DIR, SEED, 0, err, sizeof err) != ML_OK ||
        !(be = ml_backend_cpu_create(threads, err, sizeof err)) ||
        ml_model_load(&model, model_dir, be, &lim, err, sizeof err) != ML_OK) {
        fprintf(stderr, "setup: %s\n", err);
        return 1;
    }
    b.model = model;
    b.tok = ml_tok_load(ML_TOK_REAL_PATH, NULL);
    const char *schema_path = getenv("ML_BENCH_SCHEMA");
    if (schema_path) {
        size_t len = 0;
        char *text = ml_tok_read_file(schema_path, &len);
        ml_schema_limits sl;
        ml_schema_limits_default(&sl);
        if (!text || ml_grammar_compile_schema(text, len, &sl, &b.grammar, err, sizeof err) != ML_OK) {
            fprintf(stderr, "%s: %s\n", schema_path, text ? err : "cannot be read");
            return 1;
        }
        free(text);
    }
    printf("constrained decoding (%s): preset %s, batch %d, %d threads, %s, %d steps (%d timed), "
           "%d runs a side\n",
           schema_path ? schema_path : "JSON mode", preset, b.batch, threads, be->ops->name, STEPS,
           STEPS - WARMUP_STEPS, reps);
    double free_ms[100], json_ms[100], free_cpu[100], json_cpu[100];
    for (int r = 0; r < reps; r++) {
        int ended;
        json_ms[r] = run(&b, 1, &json_cpu[r], &ended);
        printf("  run %d json: %.3f ms/step, CPU %.3f ms/step (%d objects completed and "
               "replaced)\n",
               r, json_ms[r], json_cpu[r], ended);
        free_ms[r] = run(&b, 0, &free_cpu[r], &ended);
        printf("  run %d free: %.3f ms/step, CPU %.3f ms/step (%d requests ended on the same "
               "schedule)\n",
               r, free_ms[r], free_cpu[r], ended);
    }
    double f = bench_median(free_ms, (size_t)reps), j = bench_median(json_ms, (size_t)reps);
    double fc = bench_median(free_cpu, (size_t)reps), jc = bench_median(json_cpu, (size_t)reps);
    printf("median step: free %.3f ms, json %.3f ms; json / free %.3f (goal <= %.2f)\n", f, j,
           j / f, GOAL_RATIO);
    printf("median CPU per step: free %.3f ms, json %.3f ms; json / free %.3f\n", fc, jc,
           jc / fc);
    ml_grammar_unref(b.grammar);
    ml_tokenizer_destroy(b.tok);
    ml_model_destroy(model);
    be->ops->destroy(be);
    return 0;
}
