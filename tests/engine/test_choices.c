/* n choices of one request (engine/runtime/runtime.h ml_request.n) on the
 * LoRA golden fixture (m3's configuration, two images, two adapters) and
 * the real tokenizer, on the CPU backend, which is batch-invariant, so
 * every comparison is bit for bit:
 * - choice i of a request with seed s equals the request alone with n = 1
 *   and seed s + i (tokens, logprobs, first logits), with other requests
 *   batched alongside, with the prefix cache off and on, with images and
 *   with an adapter, a prompt ending inside a block (its last block shared,
 *   then copied by the first choice to write into it) and on a block edge;
 *   the prompt is prefilled once (prefill_tokens), its images encoded once;
 * - JSON mode, a JSON Schema, a grammar bound on '{' (tool_choice auto) and
 *   a stop string: each choice its own constraint or stop state, equal to
 *   its n = 1 request;
 * - sampled by the backend (the worker's path) as well as on the host;
 * - preemption: a pool too small for every choice at once, so choices are
 *   preempted and recomputed, their output unchanged;
 * - cancel before the fork and mid-way ends every choice once, the pool
 *   whole again;
 * - n over max_running, and n > 1 without callbacks, are refused, every
 *   choice told;
 * - on a CPU group of 2 ranks (each rank's half of a block copied). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "runtime_test_util.h"

#define A1 "a1_all_r8"
#define MAX_LORA_RANK 8
#define MAX_PROMPT 256
#define MAX_CHOICES ML_RT_STEP_SEQS
#define KV_BLOCKS 256
#define IMAGE_SLOTS 4
#define TEXT_ID_MAX 440 /* ordinary text ids of the fixture vocabulary: [1, 440) */
#define IMAGE_KEY_SALT 0x5A

/* ---- requests -------------------------------------------------------------- */

typedef struct creq {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    int n_images;            /* the fixture's images 0 .. n_images-1, in order */
    const char *adapter;
    int max_tokens;
    int json;
    ml_grammar *grammar;     /* borrowed; NULL: none */
    int on_brace;            /* the grammar binds only an answer beginning with '{' */
    const char *stop;        /* a stop string; NULL: none */
    int n;                   /* choices */
    uint64_t seed;
    /* Sampled where the logits are (ML_LOGITS_SAMPLE, as the worker's
     * requests), not on the host from the first logits kept. */
    int on_device;
} creq;

/* A prompt of n_text pseudo-random text tokens from stream `seed`, with
 * n_images <|image|> tokens spread in it. */
static void make_prompt(const ml_rt_fixture *f, creq *q, uint32_t seed, int n_text, int n_images)
{
    memset(q, 0, sizeof *q);
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n_text && q->n_prompt < MAX_PROMPT; i++) {
        if (q->n_images < n_images && i == q->n_images * 7) {
            q->prompt[q->n_prompt++] = ml_model_config(f->model)->image_token_index;
            q->n_images++;
        }
        x = x * 1664525u + 1013904223u;
        q->prompt[q->n_prompt++] = 1 + (int32_t)((x >> 8) % (TEXT_ID_MAX - 1));
    }
    q->max_tokens = 24;
    q->n = 1;
}

/* Submit q; choice i reports into r[i] (first logits kept). Returns the handle. */
static uint64_t submit(const ml_rt_fixture *f, ml_runtime *rt, const creq *q, ml_rt_result *r)
{
    ml_request_image images[ML_RT_IMAGES];
    memset(images, 0, sizeof images);
    for (int k = 0; k < q->n_images; k++) {
        ml_request_image *im = &images[k];
        im->key[0] = (uint8_t)(k + 1);
        im->key[1] = IMAGE_KEY_SALT;
        im->aspect_ratio_id = f->ar_ids[k];
        im->n_tiles = f->n_tiles[k];
        memcpy(im->aspect_ratio_mask, f->ar_mask[k], sizeof im->aspect_ratio_mask);
        im->pixels = malloc((size_t)f->slot_floats * sizeof *im->pixels); /* transferred */
        if (!im->pixels) {
            fprintf(stderr, "choices test: out of memory for pixels\n");
            exit(1);
        }
        memcpy(im->pixels, f->pixels + (size_t)k * f->slot_floats,
               (size_t)f->slot_floats * sizeof *im->pixels);
    }
    ml_request_callbacks cbs[MAX_CHOICES + 1];
    for (int i = 0; i < q->n && i <= MAX_CHOICES; i++)
        cbs[i] = ml_rt_callbacks(&r[i], !q->on_device);
    ml_request req = {
        .prompt = q->prompt,
        .n_prompt = q->n_prompt,
        .images = images,
        .n_images = q->n_images,
        .adapter = q->adapter,
        .cb = ml_rt_callbacks(&r[0], !q->on_device),
        .n = q->n,
        .choices = q->n > 1 ? cbs : NULL,
    };
    ml_sampling_params_default(&req.sampling);
    req.sampling.seed = q->seed;
    req.sampling.temperature = 1.0f;
    req.sampling.logprobs = true;
    req.sampling.top_logprobs = 3;
    req.sampling.json_object = q->json != 0;
    req.sampling.grammar = q->grammar;
    req.sampling.grammar_on_brace = q->on_brace != 0;
    if (q->stop) {
        req.sampling.stop[0] = q->stop;
        req.sampling.stop_len[0] = strlen(q->stop);
        req.sampling.n_stop = 1;
    }
    req.sampling.max_tokens = (uint32_t)q->max_tokens;
    uint64_t h = 0;
    char err[256] = "";
    check(ml_runtime_submit(rt, &req, &h, err, sizeof err) == ML_OK, "submit: %s", err);
    return h;
}

static int adapter_resolve(void *ctx, const char *name, char *dir, size_t n)
{
    (void)ctx;
    if (strcmp(name, A1))
        return 0;
    snprintf(dir, n, "%s", ML_RT_LORA_FIXTURE "/" A1);
    return 1;
}

static ml_runtime *runtime(ml_rt_fixture *f, int prefix_cache, int kv_blocks)
{
    ml_runtime_config rc = ml_rt_config(f, (size_t)kv_blocks, IMAGE_SLOTS);
    rc.max_adapters = 1;
    rc.resolve_adapter = adapter_resolve;
    rc.prefix_cache = prefix_cache;
    return ml_rt_runtime_create(f, &rc);
}

static void results_deinit(ml_rt_result *r, int n)
{
    for (int i = 0; i < n; i++)
        ml_rt_result_deinit(&r[i]);
}

/* x (a choice) equals y (its n = 1 request) bit for bit; the first logits
 * too when kept (sampled on the host). */
static void check_same(const ml_rt_result *x, const ml_rt_result *y, const char *what, int i,
                       int kept)
{
    check(x->done == 1 && x->error == ML_REQERR_NONE && x->n_out > 0,
          "%s: choice %d ran once ('%s')", what, i, x->message);
    check(ml_rt_same_output(x, y), "%s: choice %d: the same %d tokens as n = 1 (%d)", what, i,
          x->n_out, y->n_out);
    check(ml_rt_same_logprobs(x->lp, y->lp, x->n_out), "%s: choice %d: the same logprobs", what,
          i);
    check(!kept || (x->first_logits && y->first_logits && x->vocab == y->vocab &&
                    !memcmp(x->first_logits, y->first_logits,
                            (size_t)x->vocab * sizeof(float))),
          "%s: choice %d: the same first logits", what, i);
}

/* Each choice of q, run in its own runtime alone with n = 1 and seed
 * q->seed + i, into want[i]. */
static void run_alone(ml_rt_fixture *f, const creq *q, int prefix_cache, ml_rt_result *want)
{
    for (int i = 0; i < q->n; i++) {
        creq one = *q;
        one.n = 1;
        one.seed = q->seed + (uint64_t)i;
        memset(&want[i], 0, sizeof want[i]);
        ml_runtime *rt = runtime(f, prefix_cache, KV_BLOCKS);
        submit(f, rt, &one, &want[i]);
        ml_rt_drain(rt, 0);
        ml_runtime_destroy(rt);
    }
}

/* The pool is whole once idle. */
static void check_idle(ml_runtime *rt, const char *what)
{
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    check(ml_runtime_active(rt) == 0 && st.kv_blocks_free == st.kv_blocks_total,
          "%s: idle, the whole pool free (%d of %d)", what, st.kv_blocks_free,
          st.kv_blocks_total);
}

/* ---- choice i == n = 1 with seed s + i ------------------------------------- */

enum { BATCHED = 2 };

/* q with n choices, after BATCHED other requests and before one more, in
 * one runtime of kv_blocks; every choice equals its request alone. The
 * prompt is prefilled once: alone, q's prefill is its prompt and each
 * fork's last partial block, and its images are encoded once. */
static void check_choices(ml_rt_fixture *f, const creq *q, int prefix_cache, int kv_blocks,
                          const char *what)
{
    ml_rt_result got[MAX_CHOICES], want[MAX_CHOICES], other[BATCHED + 1];
    memset(got, 0, sizeof got);
    memset(other, 0, sizeof other);
    run_alone(f, q, prefix_cache, want);

    ml_runtime *rt = runtime(f, prefix_cache, kv_blocks);
    creq o;
    for (int k = 0; k < BATCHED; k++) {
        make_prompt(f, &o, 900 + (uint32_t)k, 30 + 11 * k, k);
        o.seed = 77 + (uint64_t)k;
        submit(f, rt, &o, &other[k]);
    }
    ml_rt_steps(rt, 1);
    submit(f, rt, q, got);
    make_prompt(f, &o, 950, 20, 0);
    submit(f, rt, &o, &other[BATCHED]);
    ml_rt_drain(rt, 0);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    check(st.choices_forked == (uint64_t)(q->n - 1), "%s: %llu choices forked, want %d", what,
          (unsigned long long)st.choices_forked, q->n - 1);
    check_idle(rt, what);
    ml_runtime_destroy(rt);
    for (int i = 0; i < q->n; i++)
        check_same(&got[i], &want[i], what, i, !q->on_device);
    for (int k = 0; k <= BATCHED; k++)
        check(other[k].done == 1 && other[k].error == ML_REQERR_NONE,
              "%s: the request batched alongside %d ran ('%s')", what, k, other[k].message);

    /* Alone, with nothing cached: the prompt once, nothing for the forks. */
    results_deinit(got, q->n);
    memset(got, 0, sizeof got);
    rt = runtime(f, prefix_cache, kv_blocks);
    submit(f, rt, q, got);
    ml_rt_drain(rt, 0);
    ml_runtime_get_stats(rt, &st);
    check(st.preemptions > 0 || st.prefill_tokens == (uint64_t)q->n_prompt,
          "%s: prefill of %llu tokens, want the prompt once (%d)", what,
          (unsigned long long)st.prefill_tokens, q->n_prompt);
    check(st.images_encoded == (uint64_t)q->n_images, "%s: %llu images encoded, want %d", what,
          (unsigned long long)st.images_encoded, q->n_images);
    for (int i = 0; i < q->n; i++)
        check(got[i].usage.prompt_tokens == q->n_prompt && got[i].usage.images == q->n_images,
              "%s: choice %d: usage of the whole prompt (%d tokens, %d images)", what, i,
              got[i].usage.prompt_tokens, got[i].usage.images);
    check_idle(rt, what);
    ml_runtime_destroy(rt);
    results_deinit(got, q->n);
    results_deinit(want, q->n);
    results_deinit(other, BATCHED + 1);
}

static void test_equal(ml_rt_fixture *f)
{
    creq q;
    make_prompt(f, &q, 1, 45, 0);
    q.n = 3;
    q.seed = 1000;
    check_choices(f, &q, 0, KV_BLOCKS, "text, n 3");
    check_choices(f, &q, 1, KV_BLOCKS, "text, n 3, prefix cache");
    /* A prompt ending on a block edge: nothing to copy, each writes a new block. */
    make_prompt(f, &q, 2, 32, 0);
    q.n = 2;
    q.seed = 5;
    check_choices(f, &q, 0, KV_BLOCKS, "a prompt of whole blocks, n 2");
    make_prompt(f, &q, 3, 40, 2);
    q.n = 4;
    q.seed = (uint64_t)-2; /* s + i wraps */
    check_choices(f, &q, 1, KV_BLOCKS, "two images, n 4");
    make_prompt(f, &q, 4, 38, 1);
    q.n = 3;
    q.seed = 31;
    q.adapter = A1;
    check_choices(f, &q, 0, KV_BLOCKS, "an adapter and an image, n 3");
    make_prompt(f, &q, 5, 25, 0);
    q.n = 3;
    q.seed = 4242;
    q.json = 1;
    q.max_tokens = 40;
    check_choices(f, &q, 0, KV_BLOCKS, "JSON mode, n 3");
    q.on_device = 1;
    check_choices(f, &q, 0, KV_BLOCKS, "JSON mode, n 3, sampled by the backend");
    make_prompt(f, &q, 9, 50, 1);
    q.n = 5;
    q.seed = 77;
    q.on_device = 1;
    check_choices(f, &q, 1, KV_BLOCKS, "an image, n 5, sampled by the backend");

    static const char schema[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                                 "\"integer\"},\"b\":{\"enum\":[\"x\",\"y\"]}},"
                                 "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}";
    ml_schema_limits lim;
    ml_schema_limits_default(&lim);
    ml_grammar *g = NULL;
    char err[256] = "";
    check(ml_grammar_compile_schema(schema, sizeof schema - 1, &lim, &g, err, sizeof err) ==
              ML_OK,
          "the schema compiles: %s", err);
    make_prompt(f, &q, 10, 30, 0);
    q.n = 3;
    q.seed = 808;
    q.max_tokens = 40;
    q.grammar = g;
    check_choices(f, &q, 0, KV_BLOCKS, "a JSON Schema, n 3");
    q.on_brace = 1;
    check_choices(f, &q, 1, KV_BLOCKS, "a grammar bound on '{' (tools auto), n 3");
    ml_grammar_unref(g);
    make_prompt(f, &q, 11, 30, 0);
    q.n = 3;
    q.seed = 9;
    q.stop = "e";
    check_choices(f, &q, 0, KV_BLOCKS, "a stop string, n 3");
}

/* ---- preemption ------------------------------------------------------------ */

enum { PREEMPT_BLOCKS = 12, PREEMPT_N = 4, PREEMPT_OUT = 60 };

/* Four choices of a 40-token prompt, 60 tokens each, in a pool of 12
 * blocks: they cannot all hold their blocks at once. */
static void test_preempt(ml_rt_fixture *f)
{
    creq q;
    make_prompt(f, &q, 6, 40, 0);
    q.n = PREEMPT_N;
    q.seed = 99;
    q.max_tokens = PREEMPT_OUT;
    ml_rt_result got[PREEMPT_N], want[PREEMPT_N];
    memset(got, 0, sizeof got);
    run_alone(f, &q, 0, want);
    for (int cached = 0; cached < 2; cached++) {
        ml_runtime *rt = runtime(f, cached, PREEMPT_BLOCKS);
        submit(f, rt, &q, got);
        ml_rt_drain(rt, 0);
        ml_runtime_stats st;
        ml_runtime_get_stats(rt, &st);
        check(st.preemptions > 0, "preemption (cache %d): %llu preemptions", cached,
              (unsigned long long)st.preemptions);
        check_idle(rt, "preemption");
        ml_runtime_destroy(rt);
        for (int i = 0; i < PREEMPT_N; i++)
            check_same(&got[i], &want[i], cached ? "preemption, cache" : "preemption", i, 1);
        results_deinit(got, PREEMPT_N);
        memset(got, 0, sizeof got);
    }
    results_deinit(want, PREEMPT_N);
}

/* ---- cancel ---------------------------------------------------------------- */

/* Cancelled after `steps` steps: every choice ends once, cancelled. */
static void cancel_after(ml_rt_fixture *f, int steps, const char *what)
{
    creq q;
    make_prompt(f, &q, 7, 50, 1);
    q.n = 3;
    q.seed = 8;
    q.max_tokens = 200;
    ml_rt_result r[3];
    memset(r, 0, sizeof r);
    ml_runtime *rt = runtime(f, 1, KV_BLOCKS);
    uint64_t h = submit(f, rt, &q, r);
    ml_rt_steps(rt, steps);
    ml_runtime_cancel(rt, h);
    for (int i = 0; i < 3; i++)
        check(r[i].done == 1 && r[i].reason == ML_FINISH_REASON_CANCELLED,
              "%s: choice %d ended once (%d), cancelled (%d)", what, i, r[i].done, r[i].reason);
    check_idle(rt, what);
    ml_runtime_destroy(rt);
    results_deinit(r, 3);
}

static void test_cancel(ml_rt_fixture *f)
{
    cancel_after(f, 0, "cancel before the fork");
    cancel_after(f, 4, "cancel mid-way");
}

/* ---- refusals -------------------------------------------------------------- */

static void test_refused(ml_rt_fixture *f)
{
    creq q;
    make_prompt(f, &q, 8, 10, 0);
    q.n = ML_RT_STEP_SEQS + 1;
    ml_rt_result r[ML_RT_STEP_SEQS + 1];
    memset(r, 0, sizeof r);
    ml_runtime *rt = runtime(f, 0, KV_BLOCKS);
    submit(f, rt, &q, r);
    for (int i = 0; i < q.n; i++)
        check(r[i].done == 1 && r[i].error == ML_REQERR_INVALID_REQUEST &&
                  strstr(r[i].message, "max_running"),
              "n over max_running: choice %d refused ('%s')", i, r[i].message);

    memset(r, 0, sizeof r);
    uint64_t h = 0;
    char err[256] = "";
    ml_request req = {.prompt = q.prompt, .n_prompt = q.n_prompt,
                      .cb = ml_rt_callbacks(&r[0], 0), .n = 2};
    ml_sampling_params_default(&req.sampling);
    check(ml_runtime_submit(rt, &req, &h, err, sizeof err) == ML_OK && r[0].done == 1 &&
              r[0].error == ML_REQERR_INVALID_REQUEST && strstr(r[0].message, "n 2"),
          "n 2 without choices: refused ('%s')", r[0].message);
    check_idle(rt, "refusals");
    ml_runtime_destroy(rt);
}

/* ---- tensor parallelism ---------------------------------------------------- */

enum { WORLD = 2 };

/* On a CPU group of 2 ranks: every rank's half of a shared block is copied
 * on write, and the choices still equal their n = 1 requests there. */
static void test_tensor_parallel(const ml_rt_fixture *whole)
{
    ml_rt_tp tp;
    if (ml_rt_tp_open(&tp, whole, WORLD, MAX_LORA_RANK)) {
        creq q;
        make_prompt(&tp.f, &q, 10, 37, 1);
        q.n = 3;
        q.seed = 123;
        check_choices(&tp.f, &q, 1, KV_BLOCKS, "2 ranks, an image, n 3");
    }
    ml_rt_tp_close(&tp);
}

int main(void)
{
    ml_rt_fixture f;
    ml_model_limits lim = ml_rt_limits();
    lim.max_lora_rank = MAX_LORA_RANK;
    ml_rt_fixture_open_lora(&f, &lim);
    test_equal(&f);
    test_preempt(&f);
    test_cancel(&f);
    test_refused(&f);
    test_tensor_parallel(&f);
    ml_rt_fixture_close(&f);
    return check_done();
}
