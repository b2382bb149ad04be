/* The runtime on a golden fixture model (m3: two images, GQA, cross layers
 * [1, 2]) and the real tokenizer:
 * - one request through the runtime reproduces the 32 greedy tokens of
 *   transformers with Meta's row mask patched in (the default reference
 *   mode; the cross-attention mask is derived from the prompt's image
 *   tokens);
 * - requests batched together and joining at different steps (text-only,
 *   one image, two images) give exactly what each gives alone;
 * - a KV pool too small for all of them forces preemptions, and the outputs
 *   are unchanged;
 * - a second request naming a resident image (no pixels) gives bit-identical
 *   logits to the first, and is counted as a cache hit;
 * - a flood of image requests never holds more resident state than the
 *   budget;
 * - cancellation, deadlines and invalid requests end with the right reason. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "grammar/json_mode.h"
#include "runtime_test_util.h"

#define MODEL ML_SOURCE_DIR "/tests/golden/fixtures/models/m3_two_images_interleaved"
#define GREEDY_STEPS 32
#define FLOOD_REQUESTS 12
#define FLOOD_IMAGE_SLOTS 3 /* fewer than two requests' images */
#define FLOOD_TOKENS 3

/* The reference-mode greedy continuation of the fixture prompt. */
static int32_t greedy[GREEDY_STEPS];

/* The outputs of a request run alone. */
static void run_alone(ml_rt_fixture *f, ml_rt_kind k, int max_tokens, ml_rt_result *out)
{
    ml_runtime *rt = ml_rt_runtime_sized(f, 64, 2);
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = k, .max_tokens = max_tokens}, out);
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
}

static void test_matches_golden(ml_rt_fixture *f)
{
    ml_rt_result r = {0};
    run_alone(f, ML_RT_TWO_IMAGES, GREEDY_STEPS, &r);
    check(r.done == 1 && r.reason == ML_FINISH_REASON_LENGTH, "one length finish");
    check(r.n_out == GREEDY_STEPS && !memcmp(r.out, greedy, sizeof greedy),
          "runtime greedy tokens equal the fixture's generate() (%d tokens)", r.n_out);
    check(r.usage.images == 2 && r.usage.images_cached == 0, "usage images");
}

static void test_batching(ml_rt_fixture *f, size_t kv_blocks, const char *what)
{
    static const ml_rt_kind kinds[] = {ML_RT_TWO_IMAGES, ML_RT_TEXT_ONLY, ML_RT_ONE_IMAGE,
                                       ML_RT_TWO_IMAGES, ML_RT_ONE_IMAGE, ML_RT_TEXT_ONLY};
    enum { N = sizeof kinds / sizeof kinds[0] };
    const int max_tokens[N] = {20, 12, 24, 8, 16, 20};
    ml_rt_result alone[N], together[N];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < N; i++)
        run_alone(f, kinds[i], max_tokens[i], &alone[i]);

    /* Two images' states for four image keys in flight: admission waits. */
    ml_runtime *rt = ml_rt_runtime_sized(f, kv_blocks, 4);
    for (int i = 0; i < N; i++) {
        ml_rt_submit(f, rt, &(ml_rt_request){.kind = kinds[i], .max_tokens = max_tokens[i]},
                     &together[i]);
        /* Requests join while others decode. */
        ml_rt_steps(rt, 3);
    }
    ml_rt_drain(rt, 0);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    fprintf(stderr, "  %s: %llu steps, %llu preemptions\n", what, (unsigned long long)st.steps,
            (unsigned long long)st.preemptions);
    for (int i = 0; i < N; i++)
        check(ml_rt_same_output(&together[i], &alone[i]),
              "%s request %d (kind %d): batched output equals alone", what, i, kinds[i]);
    if (kv_blocks < 16)
        check(st.preemptions > 0, "%s: the small pool forced preemptions", what);
    ml_runtime_destroy(rt);
}

static void test_cache_hit(ml_rt_fixture *f)
{
    ml_runtime *rt = ml_rt_runtime_sized(f, 64, 2);
    ml_rt_result miss = {0}, hit = {0};
    ml_rt_request q = {.kind = ML_RT_TWO_IMAGES, .max_tokens = 4, .key_salt = 7, .keep_logits = 1};
    ml_rt_submit(f, rt, &q, &miss);
    ml_rt_drain(rt, 0);
    check(ml_image_cache_count(ml_runtime_image_cache(rt)) == 2, "both images resident");
    q.resident = 1;
    ml_rt_submit(f, rt, &q, &hit);
    ml_rt_drain(rt, 0);
    check(hit.done == 1 && hit.reason == ML_FINISH_REASON_LENGTH, "hit finished");
    check(hit.usage.images_cached == 2 && miss.usage.images_cached == 0, "usage counts the hits");
    check(miss.first_logits && hit.first_logits && miss.vocab == hit.vocab &&
              !memcmp(miss.first_logits, hit.first_logits, (size_t)hit.vocab * sizeof(float)),
          "a cache hit gives bit-identical logits to a miss");
    check(hit.usage.vision_ms == 0, "no vision work on a hit");
    ml_rt_result_deinit(&miss);
    ml_rt_result_deinit(&hit);

    /* A key that is not resident and has no pixels is refused at submit. */
    ml_rt_result bad = {0};
    ml_rt_submit(f, rt,
                 &(ml_rt_request){.kind = ML_RT_ONE_IMAGE, .max_tokens = 4, .resident = 1,
                                  .key_salt = 99},
                 &bad);
    check(bad.done == 1 && bad.reason == ML_FINISH_REASON_ERROR &&
              bad.error == ML_REQERR_INVALID_IMAGE,
          "unknown resident image refused");

    /* Rows that would see a tile the aspect ratio mask leaves out, whose
     * K/V the encode skips: refused at submit. */
    ml_rt_result unflagged = {0};
    ml_rt_submit(f, rt,
                 &(ml_rt_request){.kind = ML_RT_ONE_IMAGE, .max_tokens = 4, .key_salt = 98,
                                  .claim_tiles = f->T},
                 &unflagged);
    check(f->n_tiles[0] < f->T && unflagged.done == 1 &&
              unflagged.error == ML_REQERR_INVALID_IMAGE,
          "an image claiming tiles its mask does not flag refused");
    ml_runtime_destroy(rt);
}

static void test_endings(ml_rt_fixture *f)
{
    ml_runtime *rt = ml_rt_runtime_sized(f, 64, 2);
    ml_rt_result cancelled = {0}, late = {0}, refused = {0};
    uint64_t h = ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TEXT_ONLY, .max_tokens = 30},
                              &cancelled);
    ml_rt_steps(rt, 3);
    ml_runtime_cancel(rt, h);
    check(cancelled.done == 1 && cancelled.reason == ML_FINISH_REASON_CANCELLED, "cancelled");
    ml_runtime_cancel(rt, h); /* a finished handle is ignored */
    check(cancelled.done == 1, "cancel twice reports once");

    ml_rt_submit(f, rt,
                 &(ml_rt_request){.kind = ML_RT_TEXT_ONLY, .max_tokens = 30,
                                  .deadline_ms = 1 /* 1970 */},
                 &late);
    ml_rt_drain(rt, 0);
    check(late.done == 1 && late.reason == ML_FINISH_REASON_DEADLINE, "deadline exceeded");

    /* An image token without an image. */
    ml_request req = {.prompt = f->prompt, .n_prompt = f->n_prompt,
                      .cb = ml_rt_callbacks(&refused, 0)};
    ml_sampling_params_default(&req.sampling);
    uint64_t h2;
    char err[256] = "";
    check(ml_runtime_submit(rt, &req, &h2, err, sizeof err) == ML_OK, "submit returns ok: %s",
          err);
    check(refused.done == 1 && refused.error == ML_REQERR_INVALID_REQUEST,
          "image tokens without images refused");
    ml_runtime_destroy(rt);
}

/* Images named by key that the caller can give (ml_request_image.at_caller):
 * not resident at admission, the request ends with ML_REQERR_IMAGE_EVICTED
 * before generating anything and the runtime makes no pixels (it has no way
 * to: the caller decodes, off the stepping thread, and submits again);
 * resident, they are served from the cache with the output of pixels given.
 * Without at_caller a missing image stays INVALID_IMAGE (test_resident). */
static void test_image_evicted(ml_rt_fixture *f)
{
    enum { TOKENS = 8 };
    ml_rt_result ref = {0}, evicted = {0}, again = {0}, cached = {0};
    run_alone(f, ML_RT_TWO_IMAGES, TOKENS, &ref);
    ml_runtime *rt = ml_rt_runtime_sized(f, 64, 2);
    ml_rt_submit(f, rt,
                 &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = TOKENS, .resident = 1,
                                  .at_caller = 1},
                 &evicted);
    ml_rt_drain(rt, 0);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    check(evicted.done == 1 && evicted.error == ML_REQERR_IMAGE_EVICTED &&
              evicted.usage.completion_tokens == 0 && st.images_encoded == 0 &&
              st.images_evicted == 1 && strstr(evicted.message, "evicted"),
          "at_caller, not resident: error %d, %d tokens, %llu encoded '%s'", (int)evicted.error,
          evicted.usage.completion_tokens, (unsigned long long)st.images_encoded,
          evicted.message);
    /* The caller's second submit, with pixels: the reference output. */
    ml_rt_submit(f, rt, &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = TOKENS}, &again);
    ml_rt_drain(rt, 0);
    ml_rt_submit(f, rt,
                 &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = TOKENS, .resident = 1,
                                  .at_caller = 1},
                 &cached);
    ml_rt_drain(rt, 0);
    check(ml_rt_same_output(&ref, &again), "resubmitted with pixels: the reference output");
    check(ml_rt_same_output(&ref, &cached) && cached.usage.images_cached == 2,
          "at_caller, resident: from the cache (%d cached), the reference output",
          cached.usage.images_cached);
    ml_runtime_destroy(rt);
    ml_rt_result_deinit(&ref);
    ml_rt_result_deinit(&evicted);
    ml_rt_result_deinit(&again);
    ml_rt_result_deinit(&cached);
}

/* JSON mode on the fixture model (random weights, so the grammar does all
 * the work): every seeded request's tokens stay a prefix of one JSON object
 * (each accepted by a fresh grammar state); one that stops ended its object
 * there, and its text parses as one; max_tokens may cut one short. */
static void test_json_mode(ml_rt_fixture *f)
{
    enum { N = 4, TOKENS = ML_RT_MAX_OUT };
    char err[256] = "";
    ml_json_vocab *vocab = NULL;
    check(ml_json_vocab_create(f->tok, (size_t)ml_model_config(f->model)->text.vocab_size,
                               &vocab, err, sizeof err) == ML_OK,
          "json vocab: %s", err);
    ml_sampling_params p;
    ml_sampling_params_default(&p);
    p.json_object = true;
    p.logprobs = true;
    ml_rt_result r[N];
    memset(r, 0, sizeof r);
    ml_runtime *rt = ml_rt_runtime_sized(f, 64, 2);
    for (int i = 0; i < N; i++) {
        p.seed = 77 + (uint64_t)i;
        p.temperature = i == 0 ? 0.0f : 1.5f;
        ml_rt_submit(f, rt,
                     &(ml_rt_request){.kind = i % 2 ? ML_RT_TEXT_ONLY : ML_RT_TWO_IMAGES,
                                      .max_tokens = TOKENS, .sampling = &p},
                     &r[i]);
    }
    ml_rt_drain(rt, 0);
    ml_runtime_destroy(rt);
    int stopped = 0;
    for (int i = 0; i < N && vocab; i++) {
        ml_json_state *js = NULL;
        check(r[i].done == 1 && r[i].error == ML_REQERR_NONE &&
                  ml_json_state_create(vocab, &js, err, sizeof err) == ML_OK,
              "json request %d: ended '%s'", i, r[i].message);
        int ok = js != NULL;
        for (int t = 0; ok && t < r[i].n_out; t++)
            ok = ml_json_state_accept(js, r[i].out[t], err, sizeof err) == ML_OK;
        check(ok, "json request %d: token outside the grammar: %s", i, err);
        if (r[i].reason == ML_FINISH_REASON_STOP) {
            char *text = NULL;
            size_t len = 0;
            stopped++;
            check(js && ml_json_state_complete(js) &&
                      ml_tokenizer_decode(f->tok, r[i].out, (size_t)r[i].n_out, 0, &text, &len,
                                          err, sizeof err) == ML_OK,
                  "json request %d: stopped on an incomplete object", i);
            cJSON *doc = text ? cJSON_ParseWithLength(text, len) : NULL;
            check(cJSON_IsObject(doc), "json request %d: '%s' is not one JSON object", i,
                  text ? text : "");
            cJSON_Delete(doc);
            free(text);
        } else {
            check(r[i].reason == ML_FINISH_REASON_LENGTH && r[i].n_out == TOKENS,
                  "json request %d: finish %d after %d tokens", i, (int)r[i].reason, r[i].n_out);
        }
        ml_json_state_destroy(js);
        ml_rt_result_deinit(&r[i]);
    }
    fprintf(stderr, "  json mode: %d of %d requests completed their object\n", stopped, N);
    ml_json_vocab_destroy(vocab);
}


/* The runtime samples where the logits are (the model's sample op) unless a
 * logits callback must see them (then the host sampler does): the same
 * seeds give the same tokens and logprobs both ways, for batched requests
 * with every filter, penalty and a logit bias on: +100 forces its token at
 * every step, whatever the penalties, and -100 on the 300 ids OpenAI
 * allows keeps greedy off all of them. */
static void test_sampling_paths(ml_rt_fixture *f)
{
    enum { N = 3, TOKENS = 12, FORCED = 77 };
    const ml_rt_kind kinds[N] = {ML_RT_TWO_IMAGES, ML_RT_ONE_IMAGE, ML_RT_TEXT_ONLY};
    ml_sampling_params p[N];
    for (int i = 0; i < N; i++) {
        ml_sampling_params_default(&p[i]);
        p[i].seed = 1000 + (uint64_t)i;
        p[i].logprobs = true;
        p[i].top_logprobs = 3;
    }
    p[0].temperature = 0.9f;
    p[0].top_k = 30;
    p[0].top_p = 0.92f;
    p[0].repetition_penalty = 1.3f;
    p[1].temperature = 1.3f;
    p[1].min_p = 0.02f;
    p[1].presence_penalty = 0.5f;
    p[1].frequency_penalty = 0.7f;
    p[2].temperature = 0.0f; /* greedy among sampled requests, with a penalty */
    p[2].repetition_penalty = 1.5f;
    const ml_logit_bias force[] = {{FORCED, ML_SAMPLE_MAX_ABS_BIAS}};
    p[1].logit_bias = force;
    p[1].n_logit_bias = 1;
    ml_logit_bias ban[ML_SAMPLE_MAX_BIAS];
    for (int id = 0; id < ML_SAMPLE_MAX_BIAS; id++)
        ban[id] = (ml_logit_bias){id, -ML_SAMPLE_MAX_ABS_BIAS};
    p[2].logit_bias = ban;
    p[2].n_logit_bias = ML_SAMPLE_MAX_BIAS;
    ml_rt_result r[2][N];
    memset(r, 0, sizeof r);
    for (int host = 0; host < 2; host++) {
        ml_runtime *rt = ml_rt_runtime_sized(f, 64, 2);
        for (int i = 0; i < N; i++)
            ml_rt_submit(f, rt,
                         &(ml_rt_request){.kind = kinds[i], .max_tokens = TOKENS,
                                          .keep_logits = host, .sampling = &p[i]},
                         &r[host][i]);
        ml_rt_drain(rt, 0);
        ml_runtime_destroy(rt);
    }
    for (int i = 0; i < N; i++) {
        check(r[0][i].n_out == TOKENS && ml_rt_same_output(&r[0][i], &r[1][i]),
              "request %d: the model's sample op and the host sampler give the same %d tokens",
              i, r[0][i].n_out);
        check(ml_rt_same_logprobs(r[0][i].lp, r[1][i].lp, r[0][i].n_out) && r[0][i].lp[0].n_top == 3,
              "request %d: the same logprobs", i);
    }
    int forced = 0, banned = 0;
    for (int t = 0; t < r[0][1].n_out; t++)
        forced += r[0][1].out[t] == FORCED;
    for (int t = 0; t < r[0][2].n_out; t++)
        banned += r[0][2].out[t] < ML_SAMPLE_MAX_BIAS;
    check(forced == TOKENS && banned == 0,
          "logit bias: %d of %d tokens forced, %d banned ones drawn", forced, TOKENS, banned);
    for (int i = 0; i < N; i++) {
        ml_rt_result_deinit(&r[0][i]);
        ml_rt_result_deinit(&r[1][i]);
    }
}

int main(void)
{
    ml_rt_fixture f;
    ml_model_limits lim = ml_rt_limits();
    ml_rt_fixture_open_golden(&f, MODEL, &lim, greedy, GREEDY_STEPS);
    test_matches_golden(&f);
    test_batching(&f, 64, "ample KV pool");
    test_batching(&f, 6, "small KV pool");
    test_cache_hit(&f);
    ml_rt_flood(&f, 64, FLOOD_IMAGE_SLOTS, FLOOD_REQUESTS, FLOOD_TOKENS, "m3");
    test_endings(&f);
    test_sampling_paths(&f);
    test_image_evicted(&f);
    test_json_mode(&f);
    ml_rt_fixture_close(&f);
    return check_done();
}
