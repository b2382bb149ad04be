/* The prefix cache (engine/runtime/prefix.c, engine/model/kv_cache.c) on the
 * LoRA golden fixture (m3's configuration, two images, two adapters) and
 * the real tokenizer. Every scenario runs twice, in a runtime with the
 * cache and one without, and every request's tokens, logprobs and first
 * logits must be bitwise equal (seeded sampling at temperature 1, so one
 * rounding apart changes a draw sooner or later); the run with the cache
 * must also have found exactly the blocks the keys promise:
 * - a shared system prompt longer than a step (chunked prefill), joined by
 *   concurrent requests, one in JSON mode, and one with an image after it;
 * - a multi-turn chat with an image in turn 1 and another in turn 3, each
 *   turn the previous prompt plus its answer: in the reference row-mask
 *   mode every turn finds everything the previous turn computed; in the
 *   transformers mode, where text before an image depends on every image
 *   of the request, turn 3 (a new image list) finds nothing;
 * - two adapters, a second name for adapter 1's files and the base model
 *   with an image: nothing is shared across them, each finds its own
 *   blocks again, in a mixed batch;
 * - eviction under pressure: a pool too small for the prompts seen, so
 *   idle cached blocks are evicted, the pool is whole again when idle;
 * - preemption of sequences holding shared blocks;
 * - cache partitions: the same prompt with an image under two cache salts
 *   finds neither blocks nor image states of the other salt, and finds its
 *   own salt's again;
 * - the shared system prompt and the chat on a CPU group of 2 ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime_test_util.h"

#define A1 "a1_all_r8"
#define A2 "a2_text_rslora_r4"
#define MAX_LORA_RANK 8
#define MAX_PROMPT 512
#define MAX_REQS 16
#define KV_BLOCKS 256
#define IMAGE_SLOTS 4
#define WORLD 2
#define TEXT_ID_MAX 440   /* ordinary text ids of the fixture vocabulary: [1, 440) */
#define IMAGE_KEY_SALT 0xA5

/* ---- requests -------------------------------------------------------------- */

/* A request: its prompt, the fixture image (0 or 1) of each <|image|> in
 * order, adapter (NULL: base), output length, JSON mode. */
typedef struct preq {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    int image[ML_RT_IMAGES];
    int n_images;
    const char *adapter;
    int max_tokens;
    int json;
    int salt; /* ml_request.cache_salt's first byte */
} preq;

static int32_t image_token(const ml_rt_fixture *f)
{
    return ml_model_config(f->model)->image_token_index;
}

/* Append n pseudo-random text tokens drawn from stream `seed`. */
static void add_text(preq *q, uint32_t seed, int n)
{
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n && q->n_prompt < MAX_PROMPT; i++) {
        x = x * 1664525u + 1013904223u;
        q->prompt[q->n_prompt++] = 1 + (int32_t)((x >> 8) % (TEXT_ID_MAX - 1));
    }
}

static void add_image(const ml_rt_fixture *f, preq *q, int which)
{
    q->prompt[q->n_prompt++] = image_token(f);
    q->image[q->n_images++] = which;
}

/* Append r's generated tokens: the next turn's prompt holds the answer. */
static void add_answer(preq *q, const ml_rt_result *r)
{
    for (int i = 0; i < r->n_out && q->n_prompt < MAX_PROMPT; i++)
        q->prompt[q->n_prompt++] = r->out[i];
}

/* Submit q, seeded by `seed`, its callbacks filling r (first logits kept). */
static void submit(const ml_rt_fixture *f, ml_runtime *rt, const preq *q, uint64_t seed,
                   ml_rt_result *r)
{
    ml_request_image images[ML_RT_IMAGES];
    memset(images, 0, sizeof images);
    for (int i = 0; i < q->n_images; i++) {
        ml_request_image *im = &images[i];
        int k = q->image[i];
        im->key[0] = (uint8_t)(k + 1);
        im->key[1] = IMAGE_KEY_SALT;
        im->aspect_ratio_id = f->ar_ids[k];
        im->n_tiles = f->n_tiles[k];
        memcpy(im->aspect_ratio_mask, f->ar_mask[k], sizeof im->aspect_ratio_mask);
        /* Transferred to the runtime, which frees it. */
        im->pixels = malloc((size_t)f->slot_floats * sizeof *im->pixels);
        if (!im->pixels) {
            fprintf(stderr, "prefix test: out of memory for pixels\n");
            exit(1);
        }
        memcpy(im->pixels, f->pixels + (size_t)k * f->slot_floats,
               (size_t)f->slot_floats * sizeof *im->pixels);
    }
    ml_request req = {
        .prompt = q->prompt,
        .n_prompt = q->n_prompt,
        .images = images,
        .n_images = q->n_images,
        .adapter = q->adapter,
        .cache_salt = {(uint8_t)q->salt},
        .cb = ml_rt_callbacks(r, 1),
    };
    ml_sampling_params_default(&req.sampling);
    req.sampling.seed = seed;
    req.sampling.temperature = 1.0f;
    req.sampling.logprobs = true;
    req.sampling.top_logprobs = 3;
    req.sampling.json_object = q->json != 0;
    req.sampling.max_tokens = (uint32_t)q->max_tokens;
    uint64_t h = 0;
    char err[256] = "";
    check(ml_runtime_submit(rt, &req, &h, err, sizeof err) == ML_OK, "submit: %s", err);
}

/* ---- runs ------------------------------------------------------------------ */

/* What one scenario reported in one runtime. */
typedef struct run {
    ml_rt_result r[MAX_REQS];
    int n;
    ml_runtime_stats stats; /* after the last request */
} run;

static void run_deinit(run *u)
{
    for (int i = 0; i < u->n; i++)
        ml_rt_result_deinit(&u->r[i]);
}

static int adapter_resolve(void *ctx, const char *name, char *dir, size_t n)
{
    static const struct {
        const char *name, *dir;
    } known[] = {
        {A1, ML_RT_LORA_FIXTURE "/" A1},
        {A2, ML_RT_LORA_FIXTURE "/" A2},
        {"a1_copy", ML_RT_LORA_FIXTURE "/" A1},
    };
    (void)ctx;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (!strcmp(name, known[i].name)) {
            snprintf(dir, n, "%s", known[i].dir);
            return 1;
        }
    }
    return 0;
}

static ml_runtime *runtime(ml_rt_fixture *f, int prefix_cache, int kv_blocks)
{
    ml_runtime_config rc = ml_rt_config(f, (size_t)kv_blocks, IMAGE_SLOTS);
    rc.max_adapters = 2;
    rc.resolve_adapter = adapter_resolve;
    rc.prefix_cache = prefix_cache;
    return ml_rt_runtime_create(f, &rc);
}

/* Every request of both runs ended once, without error, and a's equals b's
 * bit for bit: tokens, logprobs, first logits. */
static void check_same(const run *a, const run *b, const char *what)
{
    check(a->n == b->n, "%s: %d and %d requests", what, a->n, b->n);
    for (int i = 0; i < a->n && i < b->n; i++) {
        const ml_rt_result *x = &a->r[i], *y = &b->r[i];
        check(x->done == 1 && x->error == ML_REQERR_NONE && x->n_out > 0,
              "%s: request %d ran ('%s')", what, i, x->message);
        check(ml_rt_same_output(x, y), "%s: request %d: the same %d tokens (%d)", what, i,
              x->n_out, y->n_out);
        check(!memcmp(x->lp, y->lp, (size_t)x->n_out * sizeof x->lp[0]),
              "%s: request %d: the same logprobs", what, i);
        check(x->first_logits && y->first_logits && x->vocab == y->vocab &&
                  !memcmp(x->first_logits, y->first_logits, (size_t)x->vocab * sizeof(float)),
              "%s: request %d: the same first logits", what, i);
    }
}

/* A scenario: submits and steps its requests into u in runtime rt. */
typedef void (*scenario_fn)(ml_rt_fixture *f, ml_runtime *rt, run *u);

/* The scenario in a runtime without the cache (*off) and one with (*on),
 * each of kv_blocks blocks; the outputs must be equal. */
static void run_both(ml_rt_fixture *f, scenario_fn fn, int kv_blocks, run *off, run *on,
                     const char *what)
{
    memset(off, 0, sizeof *off);
    memset(on, 0, sizeof *on);
    for (int cached = 0; cached < 2; cached++) {
        run *u = cached ? on : off;
        ml_runtime *rt = runtime(f, cached, kv_blocks);
        fn(f, rt, u);
        ml_rt_drain(rt, 0);
        ml_runtime_get_stats(rt, &u->stats);
        check(u->stats.kv_blocks_free == u->stats.kv_blocks_total,
              "%s (cache %d): idle, the whole pool is free (%d of %d)", what, cached,
              u->stats.kv_blocks_free, u->stats.kv_blocks_total);
        ml_runtime_destroy(rt);
    }
    check_same(off, on, what);
    for (int i = 0; i < off->n; i++)
        check(off->r[i].usage.prompt_tokens_cached == 0,
              "%s: request %d: nothing cached without the cache", what, i);
}

/* Tokens a request's blocks made available to the next: full blocks of
 * what it computed (its prompt and all its answer but the last token). */
static int computed_blocks_tokens(const ml_rt_fixture *f, const preq *q, const ml_rt_result *r)
{
    int B = ml_model_limits_of(f->model)->kv_block_size;
    return (q->n_prompt + r->n_out - 1) / B * B;
}

/* What a request of prompt n finds when all of `avail` tokens are cached:
 * full blocks, never its last block. */
static int expect_hit(const ml_rt_fixture *f, int n_prompt, int avail)
{
    int B = ml_model_limits_of(f->model)->kv_block_size;
    int most = (n_prompt - 1) / B * B;
    return avail < most ? avail : most;
}

static void drain(ml_runtime *rt) { ml_rt_drain(rt, 0); }

/* ---- shared system prompt -------------------------------------------------- */

enum { SYS_TOKENS = 200, SYS_OUT = 24 };

static void sys_prompt(preq *q)
{
    memset(q, 0, sizeof *q);
    q->prompt[q->n_prompt++] = ML_RT_FILLER_TOKEN;
    add_text(q, 1, SYS_TOKENS - 1);
    q->max_tokens = SYS_OUT;
}

/* Requests 0 and 1 one after the other; 2 (JSON mode), 3 and 4 (an image
 * after the system prompt) at once. */
static void scenario_system(ml_rt_fixture *f, ml_runtime *rt, run *u)
{
    for (int i = 0; i < 5; i++) {
        preq q;
        sys_prompt(&q);
        if (i == 4)
            add_image(f, &q, 0);
        add_text(&q, 100 + (uint32_t)i, 20 + 3 * i);
        q.json = i == 2;
        submit(f, rt, &q, 7 + (uint64_t)i, &u->r[u->n++]);
        if (i < 2)
            drain(rt);
    }
}

static void test_system_prompt(ml_rt_fixture *f, const char *what)
{
    run off, on;
    run_both(f, scenario_system, KV_BLOCKS, &off, &on, what);
    int B = ml_model_limits_of(f->model)->kv_block_size;
    int sys_blocks = SYS_TOKENS / B * B;
    check(on.r[0].usage.prompt_tokens_cached == 0, "%s: the first request finds nothing", what);
    for (int i = 1; i < 5; i++)
        check(on.r[i].usage.prompt_tokens_cached == sys_blocks,
              "%s: request %d finds the system prompt's %d full-block tokens (%d)", what, i,
              sys_blocks, on.r[i].usage.prompt_tokens_cached);
    check(on.stats.prefix_block_hits == 4 * (uint64_t)(SYS_TOKENS / B),
          "%s: %llu block hits", what, (unsigned long long)on.stats.prefix_block_hits);
    run_deinit(&off);
    run_deinit(&on);
}

/* ---- multi-turn chat --------------------------------------------------------- */

enum { TURNS = 4, TURN_OUT = 24 };

/* Extend q (turn t-1's prompt, or empty) into turn t's prompt: turn t-1's
 * answer `prev`, then new text; turn 0 opens with a header and image 0,
 * turn 2 brings image 1. */
static void chat_turn(const ml_rt_fixture *f, preq *q, int t, const ml_rt_result *prev)
{
    if (t == 0) {
        add_text(q, 200, 5);
        add_image(f, q, 0);
    } else {
        add_answer(q, prev);
    }
    add_text(q, 300 + (uint32_t)t, 17 + 5 * t);
    if (t == 2) {
        add_image(f, q, 1);
        add_text(q, 400, 9);
    }
    q->max_tokens = TURN_OUT;
}

static void scenario_chat(ml_rt_fixture *f, ml_runtime *rt, run *u)
{
    preq q;
    memset(&q, 0, sizeof q);
    for (int t = 0; t < TURNS; t++) {
        chat_turn(f, &q, t, t ? &u->r[t - 1] : NULL);
        submit(f, rt, &q, 50 + (uint64_t)t, &u->r[u->n++]);
        drain(rt);
    }
}

static void test_chat(ml_rt_fixture *f, const char *what)
{
    run off, on;
    run_both(f, scenario_chat, KV_BLOCKS, &off, &on, what);
    preq turns[TURNS];
    memset(&turns[0], 0, sizeof turns[0]);
    for (int t = 0; t < TURNS; t++) {
        if (t)
            turns[t] = turns[t - 1];
        chat_turn(f, &turns[t], t, t ? &on.r[t - 1] : NULL);
    }
    int transformers = ml_model_limits_of(f->model)->row_mask == ML_ROW_MASK_TRANSFORMERS;
    for (int t = 1; t < TURNS; t++) {
        int want = expect_hit(f, turns[t].n_prompt,
                              computed_blocks_tokens(f, &turns[t - 1], &on.r[t - 1]));
        /* Transformers mode: turn 2's image list differs from turn 1's. */
        if (transformers && t == 2)
            want = 0;
        check(on.r[t].usage.prompt_tokens_cached == want && (want > 0 || t == 2),
              "%s: turn %d (%d prompt tokens) finds %d cached tokens (%d)", what, t + 1,
              turns[t].n_prompt, want, on.r[t].usage.prompt_tokens_cached);
    }
    run_deinit(&off);
    run_deinit(&on);
}

/* ---- adapters ---------------------------------------------------------------- */

static const char *const adapter_names[] = {NULL, A1, A2, "a1_copy"};
enum { N_ADAPTERS = sizeof adapter_names / sizeof adapter_names[0] };

static void adapter_prompt(const ml_rt_fixture *f, preq *q, int i)
{
    memset(q, 0, sizeof q[0]);
    add_text(q, 500, 4);
    add_image(f, q, 0);
    add_text(q, 501, 60);
    q->adapter = adapter_names[i];
    q->max_tokens = 16;
}

/* Each adapter (and the base model) once, one after the other, then all
 * again at once: a mixed batch. */
static void scenario_adapters(ml_rt_fixture *f, ml_runtime *rt, run *u)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N_ADAPTERS; i++) {
            preq q;
            adapter_prompt(f, &q, i);
            submit(f, rt, &q, 90 + (uint64_t)i, &u->r[u->n++]);
            if (pass == 0)
                drain(rt);
        }
        drain(rt);
    }
}

static void test_adapters(ml_rt_fixture *f)
{
    run off, on;
    run_both(f, scenario_adapters, KV_BLOCKS, &off, &on, "adapters");
    for (int i = 0; i < N_ADAPTERS; i++) {
        preq q;
        adapter_prompt(f, &q, i);
        const char *name = adapter_names[i] ? adapter_names[i] : "base";
        check(on.r[i].usage.prompt_tokens_cached == 0,
              "adapters: %s shares nothing with the others", name);
        int want = expect_hit(f, q.n_prompt, computed_blocks_tokens(f, &q, &on.r[i]));
        check(on.r[N_ADAPTERS + i].usage.prompt_tokens_cached == want,
              "adapters: %s finds its own %d tokens again (%d)", name, want,
              on.r[N_ADAPTERS + i].usage.prompt_tokens_cached);
    }
    run_deinit(&off);
    run_deinit(&on);
}

/* ---- eviction under pressure ----------------------------------------------------- */

enum { PRESSURE_BLOCKS = 24, PRESSURE_PROMPTS = 5 };

static void pressure_prompt(preq *q, int which)
{
    memset(q, 0, sizeof *q);
    add_text(q, 600 + (uint32_t)which, 120);
    q->max_tokens = 16;
}

/* Prompts 0..4 one after the other (each ~8 blocks: the pool holds three),
 * then 4 again (still cached) and 0 (evicted long ago). */
static void scenario_pressure(ml_rt_fixture *f, ml_runtime *rt, run *u)
{
    static const int order[] = {0, 1, 2, 3, 4, 4, 0};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        preq q;
        pressure_prompt(&q, order[i]);
        submit(f, rt, &q, 30 + (uint64_t)i, &u->r[u->n++]);
        drain(rt);
    }
}

static void test_pressure(ml_rt_fixture *f)
{
    run off, on;
    run_both(f, scenario_pressure, PRESSURE_BLOCKS, &off, &on, "eviction");
    preq q;
    pressure_prompt(&q, 4);
    check(on.stats.kv_blocks_evicted > 0, "eviction: %llu idle blocks evicted",
          (unsigned long long)on.stats.kv_blocks_evicted);
    check(on.r[5].usage.prompt_tokens_cached ==
              expect_hit(f, q.n_prompt, computed_blocks_tokens(f, &q, &on.r[4])),
          "eviction: the latest prompt is still cached (%d)",
          on.r[5].usage.prompt_tokens_cached);
    check(on.r[6].usage.prompt_tokens_cached == 0, "eviction: the oldest was evicted (%d)",
          on.r[6].usage.prompt_tokens_cached);
    run_deinit(&off);
    run_deinit(&on);
}

/* ---- preemption ------------------------------------------------------------------- */

enum { PREEMPT_BLOCKS = 20, PREEMPT_SEQS = 4, PREEMPT_SYS = 64 };

/* A 64-token system prompt alone (its blocks then cached), then four
 * requests on it at once, each needing 8 blocks of a pool of 20: the newest
 * are preempted while holding the shared blocks, and readmitted. */
static void scenario_preempt(ml_rt_fixture *f, ml_runtime *rt, run *u)
{
    for (int i = 0; i <= PREEMPT_SEQS; i++) {
        preq q;
        memset(&q, 0, sizeof q);
        add_text(&q, 700, PREEMPT_SYS);
        if (i > 0)
            add_text(&q, 710 + (uint32_t)i, 8);
        q.max_tokens = i == 0 ? 4 : ML_RT_MAX_OUT;
        submit(f, rt, &q, 60 + (uint64_t)i, &u->r[u->n++]);
        if (i == 0)
            drain(rt);
    }
}

static void test_preempt(ml_rt_fixture *f)
{
    run off, on;
    run_both(f, scenario_preempt, PREEMPT_BLOCKS, &off, &on, "preemption");
    int preempted_sharing = 0;
    for (int i = 1; i <= PREEMPT_SEQS; i++)
        preempted_sharing += on.r[i].usage.preemptions > 0 &&
                             on.r[i].usage.prompt_tokens_cached == PREEMPT_SYS;
    check(on.stats.preemptions > 0 && preempted_sharing > 0,
          "preemption: %llu preemptions, %d of sequences holding the shared blocks",
          (unsigned long long)on.stats.preemptions, preempted_sharing);
    run_deinit(&off);
    run_deinit(&on);
}

/* ---- cache partitions -------------------------------------------------------------- */

enum { SALTED_REQS = 4, SALT_A = 1, SALT_B = 2 };

/* The system prompt, an image and a question: one prompt, sent under salts
 * A, B, A, B one after the other, the same seed every time. */
static void salted_prompt(const ml_rt_fixture *f, preq *q, int i)
{
    sys_prompt(q);
    add_image(f, q, 0);
    add_text(q, 800, 12);
    q->salt = i % 2 ? SALT_B : SALT_A;
}

static void scenario_salts(ml_rt_fixture *f, ml_runtime *rt, run *u)
{
    for (int i = 0; i < SALTED_REQS; i++) {
        preq q;
        salted_prompt(f, &q, i);
        submit(f, rt, &q, 90, &u->r[u->n++]);
        drain(rt);
    }
}

static void test_salts(ml_rt_fixture *f)
{
    run off, on;
    run_both(f, scenario_salts, KV_BLOCKS, &off, &on, "cache salts");
    preq q;
    salted_prompt(f, &q, 0);
    int full = expect_hit(f, q.n_prompt, q.n_prompt);
    for (int i = 0; i < SALTED_REQS; i++) {
        const ml_usage *u = &on.r[i].usage;
        int first_of_salt = i < 2;
        check(u->prompt_tokens_cached == (first_of_salt ? 0 : full) &&
                  u->images_cached == !first_of_salt,
              "cache salts: request %d (salt %d) finds %d tokens and %d images of its own "
              "salt only (%d, %d)",
              i, i % 2 ? SALT_B : SALT_A, first_of_salt ? 0 : full, !first_of_salt,
              u->prompt_tokens_cached, u->images_cached);
        check(ml_rt_same_output(&on.r[i], &on.r[0]), "cache salts: request %d: same output", i);
    }
    run_deinit(&off);
    run_deinit(&on);
}

/* ---- main ----------------------------------------------------------------------- */

static void open_fixture(ml_rt_fixture *f, ml_row_mask_mode mode)
{
    ml_model_limits lim = ml_rt_limits();
    lim.max_lora_rank = MAX_LORA_RANK;
    lim.row_mask = mode;
    ml_rt_fixture_open_lora(f, &lim);
}

static void test_tensor_parallel(ml_rt_fixture *whole)
{
    ml_rt_tp tp;
    if (ml_rt_tp_open(&tp, whole, WORLD, MAX_LORA_RANK)) {
        test_system_prompt(&tp.f, "system prompt, 2 ranks");
        test_chat(&tp.f, "chat, 2 ranks");
    }
    ml_rt_tp_close(&tp);
}

int main(void)
{
    ml_rt_fixture f;
    open_fixture(&f, ML_ROW_MASK_REFERENCE);
    test_system_prompt(&f, "system prompt");
    test_chat(&f, "chat");
    test_adapters(&f);
    test_pressure(&f);
    test_preempt(&f);
    test_salts(&f);
    test_tensor_parallel(&f);
    ml_rt_fixture_close(&f);

    open_fixture(&f, ML_ROW_MASK_TRANSFORMERS);
    test_chat(&f, "chat, transformers mode");
    ml_rt_fixture_close(&f);
    return check_done();
}
