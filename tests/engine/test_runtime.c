/* The runtime on a golden fixture model (m3: two images, GQA, cross layers
 * [1, 2]) and the real tokenizer:
 * - one request through the runtime reproduces transformers' 32 greedy tokens
 *   (the cross-attention mask is derived from the prompt's image tokens);
 * - requests batched together and joining at different steps (text-only,
 *   one image, two images) give exactly what each gives alone;
 * - a KV pool too small for all of them forces preemptions, and the outputs
 *   are unchanged;
 * - a second request naming a resident image (no pixels) gives bit-identical
 *   logits to the first, and is counted as a cache hit;
 * - a flood of image requests never holds more resident state than the
 *   budget;
 * - cancellation, deadlines and invalid requests end with the right reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/mllama.h"
#include "model/safetensors.h"
#include "runtime/runtime.h"

#define MODEL ML_SOURCE_DIR "/tests/golden/fixtures/models/m3_two_images_interleaved"
#define TOKENIZER ML_SOURCE_DIR "/config/tokenizer/tokenizer.json"
#define GREEDY_STEPS 32
#define MAX_OUT 64
#define MAX_REQ 16

typedef struct fixture {
    ml_backend *be;
    ml_model *model;
    ml_tokenizer *tok;
    int vocab, T, slot_floats;
    int32_t prompt[64];
    int n_prompt;
    float *pixels;      /* (2, T, 3, S, S) */
    int ar_ids[2], n_tiles[2];
    uint8_t ar_mask[2][ML_RUNTIME_MAX_TILES];
    int32_t greedy[GREEDY_STEPS];
} fixture;

typedef struct result {
    int32_t out[MAX_OUT];
    int n_out;
    int done;
    ml_finish_reason reason;
    ml_request_error error;
    ml_usage usage;
    float *first_logits; /* (vocab) copy of the first step's logits */
    int vocab;
} result;

static void on_logits(void *ctx, const float *logits, int vocab)
{
    result *r = ctx;
    if (!r->first_logits) {
        r->first_logits = malloc((size_t)vocab * sizeof(float));
        memcpy(r->first_logits, logits, (size_t)vocab * sizeof(float));
        r->vocab = vocab;
    }
}

static void on_token(void *ctx, int32_t id, const char *text, size_t len, const ml_logprobs *lp)
{
    result *r = ctx;
    if (r->n_out < MAX_OUT)
        r->out[r->n_out++] = id;
}

static void on_finish(void *ctx, const char *tail, size_t tail_len, ml_finish_reason reason,
                      ml_request_error error, const char *message, const ml_usage *usage)
{
    result *r = ctx;
    r->done++;
    r->reason = reason;
    r->error = error;
    r->usage = *usage;
}

static void load_fixture(fixture *f)
{
    char err[512];
    f->be = ml_backend_cpu_create(2, err, sizeof err);
    ml_model_limits lim = ml_model_limits_default();
    lim.max_step_tokens = 128;
    lim.max_step_seqs = 8;
    lim.max_logit_rows = 8;
    lim.max_seq_images = 2;
    if (!f->be || ml_model_load(&f->model, MODEL, f->be, &lim, err, sizeof err) != ML_OK ||
        ml_tokenizer_load(TOKENIZER, &f->tok, err, sizeof err) != ML_OK) {
        fprintf(stderr, "fixture: %s\n", err);
        exit(1);
    }
    const ml_config *cfg = ml_model_config(f->model);
    f->vocab = cfg->text.vocab_size;
    f->T = cfg->vision.max_num_tiles;
    f->slot_floats = f->T * 3 * cfg->vision.image_size * cfg->vision.image_size;

    ml_safetensors *ref;
    if (ml_safetensors_open(&ref, MODEL "/reference.safetensors", err, sizeof err) != ML_OK) {
        fprintf(stderr, "reference: %s\n", err);
        exit(1);
    }
    int64_t ids[64], tmp[64];
    const ml_tensor_view *v = ml_safetensors_find(ref, "input_ids");
    f->n_prompt = (int)v->shape[1];
    ml_tensor_view_read_i64(v, ids, err, sizeof err);
    for (int i = 0; i < f->n_prompt; i++)
        f->prompt[i] = (int32_t)ids[i];
    ml_tensor_view_read_i64(ml_safetensors_find(ref, "greedy_tokens"), tmp, err, sizeof err);
    for (int i = 0; i < GREEDY_STEPS; i++)
        f->greedy[i] = (int32_t)tmp[i];
    ml_tensor_view_read_i64(ml_safetensors_find(ref, "aspect_ratio_ids"), tmp, err, sizeof err);
    int64_t mask[2 * ML_RUNTIME_MAX_TILES];
    ml_tensor_view_read_i64(ml_safetensors_find(ref, "aspect_ratio_mask"), mask, err, sizeof err);
    for (int i = 0; i < 2; i++) {
        f->ar_ids[i] = (int)tmp[i];
        f->n_tiles[i] = 0;
        for (int t = 0; t < f->T; t++) {
            f->ar_mask[i][t] = mask[i * f->T + t] != 0;
            f->n_tiles[i] += f->ar_mask[i][t];
        }
    }
    f->pixels = malloc(2 * (size_t)f->slot_floats * sizeof(float));
    ml_tensor_view_read_f32(ml_safetensors_find(ref, "pixel_values"), f->pixels, err, sizeof err);
    ml_safetensors_destroy(ref);
}

static ml_runtime *runtime(fixture *f, size_t kv_blocks, int image_slots)
{
    const ml_config *cfg = ml_model_config(f->model);
    int n_self = cfg->text.num_hidden_layers - cfg->text.n_cross_layers;
    size_t block = ml_kv_cache_block_bytes(n_self, ml_model_limits_of(f->model)->kv_block_size,
                                           cfg->text.num_key_value_heads, cfg->text.head_dim,
                                           f->be->ops->kv_elem_size);
    ml_runtime_config rc = {
        .kv_bytes = kv_blocks * block,
        .image_bytes = (size_t)image_slots * ml_model_image_state_bytes(f->model),
        .max_running = 8,
        .max_step_tokens = 128,
    };
    ml_runtime *rt;
    char err[256];
    if (ml_runtime_create(&rt, f->model, f->tok, &rc, err, sizeof err) != ML_OK) {
        fprintf(stderr, "runtime: %s\n", err);
        exit(1);
    }
    return rt;
}

/* Kinds of request built from the fixture prompt. */
typedef enum req_kind {
    REQ_TWO_IMAGES, /* the fixture prompt as is */
    REQ_ONE_IMAGE,  /* the second <|image|> replaced by a text token */
    REQ_TEXT_ONLY,  /* both replaced */
} req_kind;

/* Submit a request of kind k; with resident != 0 the images are named by
 * key only. image_salt varies the keys (a different image identity). */
static uint64_t submit(fixture *f, ml_runtime *rt, req_kind k, int max_tokens, int resident,
                       int image_salt, result *r, int64_t deadline_ms)
{
    const int32_t image_token = ml_model_config(f->model)->image_token_index;
    const int32_t filler = 17; /* an ordinary text token of the small vocabulary */
    int32_t prompt[64];
    ml_request_image images[2];
    int n_images = 0, seen = 0;
    for (int i = 0; i < f->n_prompt; i++) {
        prompt[i] = f->prompt[i];
        if (prompt[i] != image_token)
            continue;
        int keep = k == REQ_TWO_IMAGES || (k == REQ_ONE_IMAGE && seen == 0);
        if (!keep) {
            prompt[i] = filler;
            seen++;
            continue;
        }
        ml_request_image *im = &images[n_images++];
        memset(im, 0, sizeof *im);
        im->key[0] = (uint8_t)seen;
        im->key[1] = (uint8_t)image_salt;
        im->aspect_ratio_id = f->ar_ids[seen];
        im->n_tiles = f->n_tiles[seen];
        memcpy(im->aspect_ratio_mask, f->ar_mask[seen], sizeof im->aspect_ratio_mask);
        if (!resident) {
            im->pixels = malloc((size_t)f->slot_floats * sizeof(float));
            memcpy(im->pixels, f->pixels + (size_t)seen * f->slot_floats,
                   (size_t)f->slot_floats * sizeof(float));
        }
        seen++;
    }
    ml_request req = {
        .prompt = prompt, .n_prompt = f->n_prompt, .images = images, .n_images = n_images,
        .deadline_ms = deadline_ms,
        .cb = {.on_logits = on_logits, .on_token = on_token, .on_finish = on_finish, .ctx = r},
    };
    ml_sampling_params_default(&req.sampling);
    req.sampling.temperature = 0;
    req.sampling.max_tokens = (uint32_t)max_tokens;
    uint64_t h = 0;
    char err[256];
    check(ml_runtime_submit(rt, &req, &h, err, sizeof err) == ML_OK, "submit: %s", err);
    return h;
}

static void drain(ml_runtime *rt, fixture *f, size_t image_budget_check)
{
    char err[256];
    for (int guard = 0; ml_runtime_active(rt) > 0 && guard < 10000; guard++) {
        check(ml_runtime_step(rt, err, sizeof err) == ML_OK, "step: %s", err);
        if (image_budget_check) {
            ml_runtime_stats st;
            ml_runtime_get_stats(rt, &st);
            check(st.image_bytes_used <= image_budget_check, "image memory %zu over budget %zu",
                  st.image_bytes_used, image_budget_check);
        }
    }
    check(ml_runtime_active(rt) == 0, "runtime drained");
}

static void free_result(result *r) { free(r->first_logits); }

static void test_matches_transformers(fixture *f)
{
    ml_runtime *rt = runtime(f, 64, 2);
    result r = {0};
    submit(f, rt, REQ_TWO_IMAGES, GREEDY_STEPS, 0, 0, &r, 0);
    drain(rt, f, 0);
    check(r.done == 1 && r.reason == ML_FINISH_REASON_LENGTH, "one length finish");
    check(r.n_out == GREEDY_STEPS && !memcmp(r.out, f->greedy, sizeof f->greedy),
          "runtime greedy tokens equal generate() (%d tokens)", r.n_out);
    check(r.usage.images == 2 && r.usage.images_cached == 0, "usage images");
    free_result(&r);
    ml_runtime_destroy(rt);
}

/* The reference outputs of each kind, run alone. */
static void run_alone(fixture *f, req_kind k, int max_tokens, result *out)
{
    ml_runtime *rt = runtime(f, 64, 2);
    submit(f, rt, k, max_tokens, 0, 0, out, 0);
    drain(rt, f, 0);
    ml_runtime_destroy(rt);
}

static void test_batching(fixture *f, size_t kv_blocks, const char *what)
{
    static const req_kind kinds[] = {REQ_TWO_IMAGES, REQ_TEXT_ONLY, REQ_ONE_IMAGE,
                                     REQ_TWO_IMAGES, REQ_ONE_IMAGE, REQ_TEXT_ONLY};
    enum { N = sizeof kinds / sizeof kinds[0] };
    const int max_tokens[N] = {20, 12, 24, 8, 16, 20};
    result alone[N], together[N];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < N; i++)
        run_alone(f, kinds[i], max_tokens[i], &alone[i]);

    /* Two images' states for four image keys in flight: admission waits. */
    ml_runtime *rt = runtime(f, kv_blocks, 4);
    char err[256];
    for (int i = 0; i < N; i++) {
        submit(f, rt, kinds[i], max_tokens[i], 0, 0, &together[i], 0);
        /* Requests join while others decode. */
        for (int s = 0; s < 3; s++)
            check(ml_runtime_step(rt, err, sizeof err) == ML_OK, "step: %s", err);
    }
    drain(rt, f, 0);
    ml_runtime_stats st;
    ml_runtime_get_stats(rt, &st);
    fprintf(stderr, "  %s: %llu steps, %llu preemptions\n", what, (unsigned long long)st.steps,
            (unsigned long long)st.preemptions);
    for (int i = 0; i < N; i++) {
        check(together[i].done == 1 && together[i].reason == alone[i].reason,
              "%s request %d: finish reason", what, i);
        check(together[i].n_out == alone[i].n_out &&
                  !memcmp(together[i].out, alone[i].out, sizeof(int32_t) * (size_t)alone[i].n_out),
              "%s request %d (kind %d): batched output equals alone", what, i, kinds[i]);
        free_result(&alone[i]);
        free_result(&together[i]);
    }
    if (kv_blocks < 16)
        check(st.preemptions > 0, "%s: the small pool forced preemptions", what);
    ml_runtime_destroy(rt);
}

static void test_cache_hit(fixture *f)
{
    ml_runtime *rt = runtime(f, 64, 2);
    result miss = {0}, hit = {0};
    submit(f, rt, REQ_TWO_IMAGES, 4, 0, 7, &miss, 0);
    drain(rt, f, 0);
    check(ml_image_cache_count(ml_runtime_image_cache(rt)) == 2, "both images resident");
    submit(f, rt, REQ_TWO_IMAGES, 4, 1, 7, &hit, 0);
    drain(rt, f, 0);
    check(hit.done == 1 && hit.reason == ML_FINISH_REASON_LENGTH, "hit finished");
    check(hit.usage.images_cached == 2 && miss.usage.images_cached == 0, "usage counts the hits");
    check(miss.first_logits && hit.first_logits &&
              !memcmp(miss.first_logits, hit.first_logits, (size_t)f->vocab * sizeof(float)),
          "a cache hit gives bit-identical logits to a miss");
    check(hit.usage.vision_ms == 0, "no vision work on a hit");
    free_result(&miss);
    free_result(&hit);

    /* A key that is not resident and has no pixels is refused at submit. */
    result bad = {0};
    submit(f, rt, REQ_ONE_IMAGE, 4, 1, 99, &bad, 0);
    check(bad.done == 1 && bad.reason == ML_FINISH_REASON_ERROR &&
              bad.error == ML_REQERR_INVALID_IMAGE,
          "unknown resident image refused");
    ml_runtime_destroy(rt);
}

static void test_flood(fixture *f)
{
    enum { N = 12 };
    const int slots = 3;
    ml_runtime *rt = runtime(f, 64, slots);
    result r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++)
        submit(f, rt, REQ_TWO_IMAGES, 3, 0, 100 + i, &r[i], 0);
    drain(rt, f, (size_t)slots * ml_model_image_state_bytes(f->model));
    for (int i = 0; i < N; i++) {
        check(r[i].done == 1 && r[i].reason == ML_FINISH_REASON_LENGTH, "flood request %d done", i);
        free_result(&r[i]);
    }
    ml_runtime_destroy(rt);
}

static void test_endings(fixture *f)
{
    ml_runtime *rt = runtime(f, 64, 2);
    char err[256];
    result cancelled = {0}, late = {0}, refused = {0};
    uint64_t h = submit(f, rt, REQ_TEXT_ONLY, 30, 0, 0, &cancelled, 0);
    for (int s = 0; s < 3; s++)
        ml_runtime_step(rt, err, sizeof err);
    ml_runtime_cancel(rt, h);
    check(cancelled.done == 1 && cancelled.reason == ML_FINISH_REASON_CANCELLED, "cancelled");
    ml_runtime_cancel(rt, h); /* a finished handle is ignored */
    check(cancelled.done == 1, "cancel twice reports once");

    submit(f, rt, REQ_TEXT_ONLY, 30, 0, 0, &late, 1 /* 1970 */);
    drain(rt, f, 0);
    check(late.done == 1 && late.reason == ML_FINISH_REASON_DEADLINE, "deadline exceeded");

    /* An image token without an image. */
    ml_request req = {.prompt = f->prompt, .n_prompt = f->n_prompt,
                      .cb = {.on_token = on_token, .on_finish = on_finish, .ctx = &refused}};
    ml_sampling_params_default(&req.sampling);
    uint64_t h2;
    check(ml_runtime_submit(rt, &req, &h2, err, sizeof err) == ML_OK, "submit returns ok");
    check(refused.done == 1 && refused.error == ML_REQERR_INVALID_REQUEST,
          "image tokens without images refused");
    free_result(&cancelled);
    free_result(&late);
    free_result(&refused);
    ml_runtime_destroy(rt);
}

int main(void)
{
    fixture f = {0};
    load_fixture(&f);
    test_matches_transformers(&f);
    test_batching(&f, 64, "ample KV pool");
    test_batching(&f, 6, "small KV pool");
    test_cache_hit(&f);
    test_flood(&f);
    test_endings(&f);
    free(f.pixels);
    ml_tokenizer_destroy(f.tok);
    ml_model_destroy(f.model);
    f.be->ops->destroy(f.be);
    return check_done();
}
