/* Tensor parallelism as a configuration of the runtime (ml_model_load_tp):
 * the golden fixture m3 (two images, GQA) split over a CPU group of 2, and
 * of 3 where its dimensions divide, served by the unchanged runtime:
 * - every kind of request alone (two images, one, text only) gives the
 *   whole model's greedy tokens, and two images transformers' 32;
 * - six requests joining at different steps, with an ample KV pool and
 *   with one small enough to force preemptions, each give what they give
 *   alone on the whole model;
 * - a resident image named by key is a cache hit with logits bit-identical
 *   to its miss, and the output of the whole model;
 * - the budgets are per device: the same kv_bytes holds world times the
 *   blocks, and a flood of images never holds more than image_bytes;
 * - ml_model_load_tp with world 1 is ml_model_load, bit for bit;
 * - refusals: world 0, a world that does not divide the heads, backends
 *   that are not one group, one backend twice; bad calls come back as
 *   errors from the shards and the model keeps serving (adapters on a split
 *   model: test_tp_lora). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime_test_util.h"

#define MODEL ML_SOURCE_DIR "/tests/golden/fixtures/models/m3_two_images_interleaved"
#define GREEDY_STEPS 32
#define MAX_WORLD 3
#define KV_AMPLE 64
#define KV_SMALL 6    /* blocks: too few for the batch below, so it preempts */
#define IMAGE_SLOTS 2
#define FLOOD_REQUESTS 6
#define FLOOD_IMAGE_SLOTS 3 /* fewer than two requests' images */
#define FLOOD_TOKENS 2

/* transformers' greedy continuation of the fixture prompt. */
static int32_t greedy[GREEDY_STEPS];

static void run_alone(ml_rt_fixture *f, const ml_rt_request *q, ml_rt_result *out)
{
    ml_runtime *rt = ml_rt_runtime_sized(f, KV_AMPLE, IMAGE_SLOTS);
    ml_rt_submit(f, rt, q, out);
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
}

/* ---- the runtime on a split model --------------------------------------------------- */

static const ml_rt_kind kinds[] = {ML_RT_TWO_IMAGES, ML_RT_TEXT_ONLY, ML_RT_ONE_IMAGE,
                                   ML_RT_TWO_IMAGES, ML_RT_ONE_IMAGE, ML_RT_TEXT_ONLY};
enum { N_BATCH = sizeof kinds / sizeof kinds[0] };
static const int batch_tokens[N_BATCH] = {20, 12, 24, 8, 16, 20};

static void test_alone(ml_rt_fixture *whole, ml_rt_fixture *tp, int world)
{
    for (int k = ML_RT_TWO_IMAGES; k <= ML_RT_TEXT_ONLY; k++) {
        ml_rt_request q = {.kind = (ml_rt_kind)k, .max_tokens = GREEDY_STEPS};
        ml_rt_result a = {0}, b = {0};
        run_alone(whole, &q, &a);
        run_alone(tp, &q, &b);
        check(ml_rt_same_output(&b, &a), "world %d, kind %d alone: %d tokens, whole model %d",
              world, k, b.n_out, a.n_out);
        if (k == ML_RT_TWO_IMAGES)
            check(b.n_out == GREEDY_STEPS && !memcmp(b.out, greedy, sizeof greedy),
                  "world %d: greedy tokens equal generate()", world);
    }
}

/* The whole model's outputs of the batch, each request alone. */
static void batch_reference(ml_rt_fixture *whole, ml_rt_result *alone)
{
    for (int i = 0; i < N_BATCH; i++)
        run_alone(whole,
                  &(ml_rt_request){.kind = kinds[i], .max_tokens = batch_tokens[i]},
                  &alone[i]);
}

static void test_batching(ml_rt_fixture *tp, int world, const ml_rt_result *alone,
                          size_t kv_blocks)
{
    ml_rt_result together[N_BATCH];
    memset(together, 0, sizeof together);
    /* Two images' states for four image keys in flight: admission waits. */
    ml_runtime *rt = ml_rt_runtime_sized(tp, kv_blocks, 4);
    for (int i = 0; i < N_BATCH; i++) {
        ml_rt_submit(tp, rt, &(ml_rt_request){.kind = kinds[i], .max_tokens = batch_tokens[i]},
                     &together[i]);
        ml_rt_steps(rt, 3); /* requests join while others decode */
    }
    ml_rt_drain(rt, 0);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    fprintf(stderr, "  world %d, %zu KV blocks: %llu steps, %llu preemptions\n", world,
            kv_blocks, (unsigned long long)st.steps, (unsigned long long)st.preemptions);
    for (int i = 0; i < N_BATCH; i++)
        check(ml_rt_same_output(&together[i], &alone[i]),
              "world %d, %zu blocks, request %d (kind %d): batched output equals the whole "
              "model's alone",
              world, kv_blocks, i, kinds[i]);
    if (kv_blocks == KV_SMALL)
        check(st.preemptions > 0, "world %d: the small pool forced preemptions", world);
    ml_runtime_destroy(rt);
}

static void test_cache_hit(ml_rt_fixture *whole, ml_rt_fixture *tp, int world)
{
    ml_rt_request q = {.kind = ML_RT_TWO_IMAGES, .max_tokens = 6, .key_salt = 7,
                       .keep_logits = 1};
    ml_rt_result want = {0}, miss = {0}, hit = {0};
    run_alone(whole, &q, &want);
    ml_runtime *rt = ml_rt_runtime_sized(tp, KV_AMPLE, IMAGE_SLOTS);
    ml_rt_submit(tp, rt, &q, &miss);
    ml_rt_drain(rt, 0);
    check(ml_image_cache_count(ml_runtime_image_cache(rt)) == 2, "world %d: images resident",
          world);
    q.resident = 1;
    ml_rt_submit(tp, rt, &q, &hit);
    ml_rt_drain(rt, 0);
    check(hit.usage.images_cached == 2 && miss.usage.images_cached == 0,
          "world %d: usage counts the hits", world);
    check(miss.first_logits && hit.first_logits && miss.vocab == hit.vocab &&
              !memcmp(miss.first_logits, hit.first_logits, (size_t)hit.vocab * sizeof(float)),
          "world %d: a cache hit gives bit-identical logits to the miss", world);
    check(ml_rt_same_output(&miss, &want) && ml_rt_same_output(&hit, &want),
          "world %d: miss and hit give the whole model's tokens", world);
    ml_runtime_destroy(rt);
    ml_rt_result_deinit(&want);
    ml_rt_result_deinit(&miss);
    ml_rt_result_deinit(&hit);
}

/* Per-device budgets: the same bytes hold world times the blocks, and the
 * resident states never exceed the image budget. */
static void test_budgets(ml_rt_fixture *whole, ml_rt_fixture *tp, int world)
{
    check(ml_model_kv_block_bytes(tp->model) * world == ml_model_kv_block_bytes(whole->model) &&
              ml_model_image_state_bytes(tp->model) * world ==
                  ml_model_image_state_bytes(whole->model),
          "world %d: a device holds 1/world of each block and image state", world);
    /* The whole model's budget, given to both. */
    ml_runtime_config rc = ml_rt_config(whole, KV_AMPLE, IMAGE_SLOTS);
    ml_runtime *a = ml_rt_runtime_create(whole, &rc), *b = ml_rt_runtime_create(tp, &rc);
    ml_runtime_stats sa, sb;
    ml_runtime_get_stats(a, &sa);
    ml_runtime_get_stats(b, &sb);
    check(sb.kv_blocks_total == world * sa.kv_blocks_total,
          "world %d: %d blocks in the budget of %d whole-model blocks", world,
          sb.kv_blocks_total, sa.kv_blocks_total);
    ml_runtime_destroy(a);
    ml_runtime_destroy(b);

    char what[32];
    snprintf(what, sizeof what, "world %d", world);
    ml_rt_flood(tp, KV_AMPLE, FLOOD_IMAGE_SLOTS, FLOOD_REQUESTS, FLOOD_TOKENS, what);
}

/* Errors of the shards come back from the calls, and the model goes on. */
static void test_bad_calls(ml_rt_fixture *tp, int world)
{
    char err[512] = "";
    ml_model *m = tp->model;
    void *state = ml_model_image_state_alloc(m);
    check(state != NULL, "world %d: image state", world);
    check(ml_model_encode_image(m, tp->pixels, 99, tp->ar_mask[0], NULL, state, NULL, err,
                                sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "aspect_ratio_id 99"),
          "world %d: a bad aspect ratio id comes back: %s", world, err);

    ml_kv_cache *kv = NULL, *lone = NULL;
    check(ml_model_kv_cache_create(&kv, m, 4, err, sizeof err) == ML_OK &&
              ml_kv_cache_world(kv) == world,
          "world %d: kv cache: %s", world, err);
    check(ml_kv_cache_create(&lone, ml_model_backend(m), 1, 4, ml_model_limits_of(m)->kv_block_size,
                             ml_model_kv_heads(m), ml_model_config(m)->text.head_dim, err,
                             sizeof err) == ML_OK,
          "a one-rank cache: %s", err);
    int32_t table[1] = {0}, bad_token = 1 << 30, good_token = ML_RT_FILLER_TOKEN;
    ml_step_seq q = {.tokens = &bad_token, .n_tokens = 1, .block_table = table, .logits = 1};
    float *logits = malloc((size_t)ml_model_config(m)->text.vocab_size * sizeof *logits);
    check(ml_model_forward(m, kv, &q, 1, logits, NULL, err, sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "outside the embedding"),
          "world %d: a bad token comes back: %s", world, err);
    q.tokens = &good_token;
    check(ml_model_forward(m, lone, &q, 1, logits, NULL, err, sizeof err) ==
                  ML_ERR_INVALID_ARG &&
              strstr(err, "kv cache of 1 ranks"),
          "world %d: a cache of one rank is refused: %s", world, err);
    check(ml_model_forward(m, kv, &q, 1, logits, NULL, err, sizeof err) == ML_OK,
          "world %d: the model serves after errors: %s", world, err);
    check(ml_model_encode_image(m, tp->pixels, tp->ar_ids[0], tp->ar_mask[0], NULL, state, NULL,
                                err, sizeof err) == ML_OK,
          "world %d: encode after errors: %s", world, err);
    free(logits);
    ml_kv_cache_destroy(lone);
    ml_kv_cache_destroy(kv);
    ml_model_image_state_free(m, state);
}

/* The whole suite on m3 split over a CPU group of `world`; a world that
 * does not divide the fixture must be refused as such. */
static void run_world(ml_rt_fixture *whole, int world, const ml_rt_result *alone)
{
    char err[512] = "";
    ml_backend *group[MAX_WORLD] = {0};
    check(ml_backend_cpu_create_group(world, 1, group, err, sizeof err) == ML_OK,
          "cpu group of %d: %s", world, err);
    if (!group[0])
        return;
    ml_model_limits lim = ml_rt_limits();
    ml_model *m = NULL;
    ml_status st = ml_model_load_tp(&m, MODEL, group, world, &lim, err, sizeof err);
    if (st == ML_ERR_UNSUPPORTED) {
        fprintf(stderr, "== m3 not split into %d: %s\n", world, err);
        check(!m && strstr(err, "does not divide"), "world %d refused for another reason: %s",
              world, err);
    } else {
        check(st == ML_OK && ml_model_world(m) == world, "world %d: load: %s", world, err);
    }
    if (st == ML_OK) {
        fprintf(stderr, "== m3 on a CPU group of %d\n", world);
        /* The split model with the whole model's prompt, images and tokenizer (borrowed). */
        ml_rt_fixture tp = *whole;
        tp.be = group[0];
        tp.model = m;
        test_alone(whole, &tp, world);
        test_batching(&tp, world, alone, KV_AMPLE);
        test_batching(&tp, world, alone, KV_SMALL);
        test_cache_hit(whole, &tp, world);
        test_budgets(whole, &tp, world);
        test_bad_calls(&tp, world);
    }
    ml_model_destroy(m);
    for (int r = 0; r < world; r++)
        if (group[r])
            group[r]->ops->destroy(group[r]);
}

/* ---- loading ------------------------------------------------------------------------- */

static void test_load_refusals(ml_rt_fixture *whole)
{
    char err[512] = "";
    ml_model *m = NULL;
    ml_backend *plain[2] = {0}, *pair[2] = {0};
    plain[0] = ml_backend_cpu_create(1, err, sizeof err);
    plain[1] = ml_backend_cpu_create(1, err, sizeof err);
    check(plain[0] && plain[1] &&
              ml_backend_cpu_create_group(2, 1, pair, err, sizeof err) == ML_OK,
          "backends: %s", err);
    if (!plain[0] || !plain[1] || !pair[0])
        return;
    ml_model_limits lim = ml_rt_limits();
    check(ml_model_load_tp(&m, MODEL, pair, 0, &lim, err, sizeof err) == ML_ERR_INVALID_ARG &&
              !m,
          "world 0 is refused: %s", err);
    check(ml_model_load_tp(&m, MODEL, plain, 2, &lim, err, sizeof err) == ML_ERR_UNSUPPORTED &&
              !m && strstr(err, "all_reduce_sum"),
          "backends outside a group are refused: %s", err);
    ml_backend *twice[2] = {pair[0], pair[0]};
    check(ml_model_load_tp(&m, MODEL, twice, 2, &lim, err, sizeof err) == ML_ERR_INVALID_ARG &&
              !m && strstr(err, "share one backend"),
          "one backend twice is refused: %s", err);
    check(ml_model_load_tp(&m, ML_SOURCE_DIR "/no/such/model", pair, 2, &lim, err, sizeof err) !=
                  ML_OK &&
              !m,
          "a missing directory fails: %s", err);

    /* World 1 is the plain path: the same logits, bit for bit. */
    check(ml_model_load_tp(&m, MODEL, plain, 1, &lim, err, sizeof err) == ML_OK &&
              ml_model_world(m) == 1,
          "world 1: %s", err);
    if (m) {
        ml_rt_fixture one = *whole;
        one.be = plain[0];
        one.model = m;
        ml_rt_request q = {.kind = ML_RT_TWO_IMAGES, .max_tokens = 2, .keep_logits = 1};
        ml_rt_result a = {0}, b = {0};
        run_alone(whole, &q, &a);
        run_alone(&one, &q, &b);
        check(a.first_logits && b.first_logits &&
                  !memcmp(a.first_logits, b.first_logits, (size_t)a.vocab * sizeof(float)),
              "world 1 equals ml_model_load bit for bit");
        ml_rt_result_deinit(&a);
        ml_rt_result_deinit(&b);
        ml_model_destroy(m);
    }
    for (int r = 0; r < 2; r++) {
        plain[r]->ops->destroy(plain[r]);
        pair[r]->ops->destroy(pair[r]);
    }
}

int main(void)
{
    /* The whole model on a plain backend, with m3's prompt, images and
     * transformers' greedy tokens. */
    ml_rt_fixture whole;
    ml_model_limits lim = ml_rt_limits();
    ml_rt_fixture_open_golden(&whole, MODEL, &lim, greedy, GREEDY_STEPS);
    ml_rt_result alone[N_BATCH];
    memset(alone, 0, sizeof alone);
    batch_reference(&whole, alone);
    test_load_refusals(&whole);
    for (int world = 2; world <= MAX_WORLD; world++)
        run_world(&whole, world, alone);
    ml_rt_fixture_close(&whole);
    return check_done();
}
