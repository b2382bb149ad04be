/* Helpers shared by the tests that drive engine/runtime end to end on a
 * golden fixture model (m3's configuration: one prompt with two images) and
 * the real tokenizer:
 * - ml_rt_fixture: backend, model, tokenizer, and the fixture prompt with
 *   its two images: ml_rt_fixture_open_golden for a golden fixture model
 *   with its reference.safetensors, ml_rt_fixture_open_lora for the LoRA
 *   fixture, or ml_rt_fixture_open and the test's own inputs
 *   (ml_rt_fixture_set_prompt / _set_images, pixels);
 * - ml_rt_result: what one request's callbacks reported;
 * - ml_rt_submit: a request (greedy, or the caller's sampling) of a kind
 *   (both images, the first only, text only) made from the fixture prompt,
 *   images by pixels or by key;
 * - ml_rt_config / ml_rt_runtime_create (ml_rt_runtime_sized: both in one),
 *   ml_rt_steps, ml_rt_drain;
 * - ml_rt_flood: many image requests against a small image budget, none
 *   allocating a state;
 * - ml_rt_same_logprobs: two runs' logprobs alike (bitwise on the CPU,
 *   within the CUDA op's rounding under ML_TEST_CUDA).
 * Setup failures (files, loads, allocation) print the reason and exit the
 * test with 1; what the runtime does with a request is reported through
 * check(). Header-only, test code only; include after harness.h. */
#ifndef ML_TEST_RUNTIME_UTIL_H
#define ML_TEST_RUNTIME_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/mllama.h"
#include "checkpoint/safetensors.h"
#include "runtime/runtime.h"
#include "fixture_util.h"
#include "tokenizer_util.h"
#ifdef ML_TEST_CUDA
#include "harness.h"
#include "mlk_backend.h"
#include "mlk_device.h"
#endif

#define ML_RT_MAX_OUT 64     /* tokens an ml_rt_result keeps */
#define ML_RT_MAX_PROMPT 64  /* tokens of the fixture prompt */
#define ML_RT_IMAGES 2       /* images (and <|image|> tokens) of the fixture prompt */
#define ML_RT_THREADS 2      /* CPU backend threads */
#define ML_RT_CUDA_POOL_BYTES ((size_t)1 << 30) /* the CUDA backend's, ML_TEST_CUDA */
#define ML_RT_STEP_TOKENS 128
#define ML_RT_STEP_SEQS 8
/* Stands in for a removed <|image|>: an ordinary text token of the fixture
 * models' small vocabulary. */
#define ML_RT_FILLER_TOKEN 17

/* ---- results ----------------------------------------------------------- */

typedef struct ml_rt_result {
    int32_t out[ML_RT_MAX_OUT]; /* the first ML_RT_MAX_OUT sampled tokens */
    ml_sample_out lp[ML_RT_MAX_OUT]; /* their logprobs, when the request asked */
    int n_out;
    int done;                   /* on_finish calls: exactly 1 once it ended */
    ml_finish_reason reason;
    ml_request_error error;
    char message[256];          /* on_finish's message; "" when none */
    ml_usage usage;
    float *first_logits;        /* owned: (vocab) the first step's logits, when
                                   asked for (ml_rt_request.keep_logits) */
    int vocab;
} ml_rt_result;

static inline void ml_rt_on_logits(void *ctx, const float *logits, int vocab)
{
    ml_rt_result *r = ctx;
    if (r->first_logits)
        return;
    r->first_logits = malloc((size_t)vocab * sizeof *r->first_logits);
    if (!r->first_logits) {
        fprintf(stderr, "runtime test: out of memory for %d logits\n", vocab);
        exit(1);
    }
    memcpy(r->first_logits, logits, (size_t)vocab * sizeof *r->first_logits);
    r->vocab = vocab;
}

static inline void ml_rt_on_token(void *ctx, int32_t id, const char *text, size_t len,
                                  const ml_sample_out *lp)
{
    ml_rt_result *r = ctx;
    if (r->n_out == ML_RT_MAX_OUT)
        return;
    if (lp)
        r->lp[r->n_out] = *lp;
    r->out[r->n_out++] = id;
}

static inline void ml_rt_on_finish(void *ctx, const char *tail, size_t tail_len,
                                   ml_finish_reason reason, ml_request_error error,
                                   const char *message, const ml_usage *usage)
{
    ml_rt_result *r = ctx;
    r->done++;
    r->reason = reason;
    r->error = error;
    snprintf(r->message, sizeof r->message, "%s", message ? message : "");
    r->usage = *usage;
}

/* Callbacks that fill r (borrowed: it must outlive the request); with
 * keep_logits the first step's logits are copied into r->first_logits. */
static inline ml_request_callbacks ml_rt_callbacks(ml_rt_result *r, int keep_logits)
{
    return (ml_request_callbacks){
        .on_logits = keep_logits ? ml_rt_on_logits : NULL,
        .on_token = ml_rt_on_token,
        .on_finish = ml_rt_on_finish,
        .ctx = r,
    };
}

/* Frees what r owns; r stays readable but for first_logits (NULL). */
static inline void ml_rt_result_deinit(ml_rt_result *r)
{
    free(r->first_logits);
    r->first_logits = NULL;
}

/* 1 when both requests ended once, for the same reason, with the same tokens. */
static inline int ml_rt_same_output(const ml_rt_result *a, const ml_rt_result *b)
{
    return a->done == 1 && b->done == 1 && a->reason == b->reason && a->n_out == b->n_out &&
           !memcmp(a->out, b->out, (size_t)a->n_out * sizeof a->out[0]);
}

#ifdef ML_TEST_CUDA
/* ml_rt_same_logprobs: the logprobs of n tokens alike. The CUDA sample op's
 * against the host sampler's: the ids exactly,
 * the values to the float rounding of log-sums taken in another order with
 * CUDA's expf (the bound tests/gpu/test_cuda_ops_sample.c argues). */
#define ML_RT_LOGPROB_ATOL 5e-7
#define ML_RT_LOGPROB_RTOL 2.4e-7

static inline int ml_rt_logprob_close(ml_token_logprob got, ml_token_logprob want)
{
    if (got.id != want.id)
        return 0;
    if (isinf(want.logprob) || isinf(got.logprob))
        return got.logprob == want.logprob;
    return fabsf(got.logprob - want.logprob) <=
           ML_RT_LOGPROB_ATOL + ML_RT_LOGPROB_RTOL * fabsf(want.logprob);
}

static inline int ml_rt_same_logprobs(const ml_sample_out *a, const ml_sample_out *b, int n)
{
    for (int i = 0; i < n; i++) {
        if (a[i].n_top != b[i].n_top || !ml_rt_logprob_close(a[i].chosen, b[i].chosen))
            return 0;
        for (uint32_t j = 0; j < a[i].n_top; j++)
            if (!ml_rt_logprob_close(a[i].top[j], b[i].top[j]))
                return 0;
    }
    return 1;
}
#else
/* The CPU sample op is the host sampler's arithmetic: bit for bit. */
static inline int ml_rt_same_logprobs(const ml_sample_out *a, const ml_sample_out *b, int n)
{
    return !memcmp(a, b, (size_t)n * sizeof *a);
}
#endif

/* ---- fixture ----------------------------------------------------------- */

typedef struct ml_rt_fixture {
    ml_backend *be;                  /* owned */
    ml_model *model;                 /* owned */
    ml_tokenizer *tok;               /* owned: the real tokenizer */
    int T;                           /* max_num_tiles */
    int slot_floats;                 /* floats of one image slot (T, 3, S, S) */
    int32_t prompt[ML_RT_MAX_PROMPT];
    int n_prompt;
    float *pixels;                   /* owned: (ML_RT_IMAGES, T, 3, S, S), zeroed at open */
    int ar_ids[ML_RT_IMAGES], n_tiles[ML_RT_IMAGES];
    uint8_t ar_mask[ML_RT_IMAGES][ML_RUNTIME_MAX_TILES];
} ml_rt_fixture;

/* The model limits every runtime test starts from (a caller may raise
 * others, e.g. max_lora_rank). */
static inline ml_model_limits ml_rt_limits(void)
{
    ml_model_limits lim = ml_model_limits_default();
    lim.max_step_tokens = ML_RT_STEP_TOKENS;
    lim.max_step_seqs = ML_RT_STEP_SEQS;
    lim.max_logit_rows = ML_RT_STEP_SEQS;
    lim.max_seq_images = ML_RT_IMAGES;
    return lim;
}

#if defined(ML_TEST_CUDA) && !defined(ML_TEST_CUDA_BATCH_INVARIANT)
#define ML_TEST_CUDA_BATCH_INVARIANT 0
#endif

/* Zeroes *f, then opens the model in model_dir with lim on a CPU backend
 * (a CUDA one, device 0, when built with ML_TEST_CUDA; batch-invariant with
 * ML_TEST_CUDA_BATCH_INVARIANT=1) and the real
 * tokenizer, and allocates f->pixels (zeroed). The prompt and the images
 * are the caller's to set. */
static inline void ml_rt_fixture_open(ml_rt_fixture *f, const char *model_dir,
                                      const ml_model_limits *lim)
{
    char err[512];
    memset(f, 0, sizeof *f);
#ifdef ML_TEST_CUDA
    if (mlk_device_count() == 0)
        ml_test_skip("no CUDA device");
    f->be = ml_backend_cuda_create(0, ML_RT_CUDA_POOL_BYTES, ML_TEST_CUDA_BATCH_INVARIANT, err,
                                   sizeof err);
#else
    f->be = ml_backend_cpu_create(ML_RT_THREADS, err, sizeof err);
#endif
    if (!f->be || ml_model_load(&f->model, model_dir, f->be, lim, err, sizeof err) != ML_OK) {
        fprintf(stderr, "fixture %s: %s\n", model_dir, err);
        exit(1);
    }
    f->tok = ml_tok_load(ML_TOK_REAL_PATH, NULL);
    const ml_config *cfg = ml_model_config(f->model);
    f->T = cfg->vision.max_num_tiles;
    f->slot_floats = f->T * 3 * cfg->vision.image_size * cfg->vision.image_size;
    f->pixels = calloc(ML_RT_IMAGES * (size_t)f->slot_floats, sizeof *f->pixels);
    if (f->T > ML_RUNTIME_MAX_TILES || !f->pixels) {
        fprintf(stderr, "fixture %s: %d tiles, or out of memory\n", model_dir, f->T);
        exit(1);
    }
}

/* Frees what f owns (a zeroed f too). */
static inline void ml_rt_fixture_close(ml_rt_fixture *f)
{
    free(f->pixels);
    ml_tokenizer_destroy(f->tok);
    ml_model_destroy(f->model);
    if (f->be)
        f->be->ops->destroy(f->be);
    memset(f, 0, sizeof *f);
}

/* The safetensors file at path, owned by the caller (ml_safetensors_destroy). */
static inline ml_safetensors *ml_rt_safetensors_open(const char *path)
{
    ml_safetensors *st;
    char err[256] = "";
    if (ml_safetensors_open(&st, path, err, sizeof err) != ML_OK) {
        fprintf(stderr, "%s: %s\n", path, err);
        exit(1);
    }
    return st;
}

/* Tensor name of st as int64, owned by the caller (free); numel in *n. */
static inline int64_t *ml_rt_read_i64(ml_safetensors *st, const char *name, size_t *n)
{
    char err[256] = "";
    const ml_tensor_view *t = ml_safetensors_find(st, name);
    *n = t ? (size_t)ml_tensor_view_numel(t) : 0;
    int64_t *v = t ? malloc(*n * sizeof *v + 1) : NULL;
    if (!v || ml_tensor_view_read_i64(t, v, err, sizeof err) != ML_OK) {
        fprintf(stderr, "tensor %s: %s\n", name, t ? (v ? err : "out of memory") : "absent");
        exit(1);
    }
    return v;
}

/* The fixture prompt: n token ids, exactly ML_RT_IMAGES of them <|image|>. */
static inline void ml_rt_fixture_set_prompt(ml_rt_fixture *f, const int64_t *ids, size_t n)
{
    const int32_t image_token = ml_model_config(f->model)->image_token_index;
    int images = 0;
    for (size_t i = 0; i < n && i < ML_RT_MAX_PROMPT; i++) {
        f->prompt[i] = (int32_t)ids[i];
        images += f->prompt[i] == image_token;
    }
    if (n > ML_RT_MAX_PROMPT || images != ML_RT_IMAGES) {
        fprintf(stderr, "fixture prompt: %zu tokens (at most %d), %d images (want %d)\n", n,
                ML_RT_MAX_PROMPT, images, ML_RT_IMAGES);
        exit(1);
    }
    f->n_prompt = (int)n;
}

/* The images' aspect ratios: ar_ids (ML_RT_IMAGES), ar_mask (ML_RT_IMAGES, T)
 * nonzero for a real tile; n_tiles counts those. */
static inline void ml_rt_fixture_set_images(ml_rt_fixture *f, const int64_t *ar_ids,
                                            const int64_t *ar_mask)
{
    for (int i = 0; i < ML_RT_IMAGES; i++) {
        f->ar_ids[i] = (int)ar_ids[i];
        f->n_tiles[i] = 0;
        for (int t = 0; t < f->T; t++) {
            f->ar_mask[i][t] = ar_mask[i * f->T + t] != 0;
            f->n_tiles[i] += f->ar_mask[i][t];
        }
    }
}

/* A golden fixture model (model_dir: tests/golden/fixtures/models/<name>,
 * written by gen_fixtures.py) opened as ml_rt_fixture_open does, with the
 * prompt, images and pixels of its reference.safetensors, and in greedy the
 * first n_greedy tokens of the greedy continuation in lim's row-mask mode
 * (fixture_util.h ml_fx_expected_path). */
static inline void ml_rt_fixture_open_golden(ml_rt_fixture *f, const char *model_dir,
                                             const ml_model_limits *lim, int32_t *greedy,
                                             int n_greedy)
{
    char path[512];
    snprintf(path, sizeof path, "%s/reference.safetensors", model_dir);
    ml_rt_fixture_open(f, model_dir, lim);
    ml_safetensors *ref = ml_rt_safetensors_open(path);
    size_t n, n_tokens, n_ar;
    int64_t *ids = ml_rt_read_i64(ref, "input_ids", &n);
    ml_rt_fixture_set_prompt(f, ids, n);
    const char *name = strrchr(model_dir, '/');
    char want_path[1200];
    if (ml_fx_expected_path(want_path, sizeof want_path, name ? name + 1 : model_dir,
                            lim->row_mask) != 0) {
        fprintf(stderr, "%s: no %s-mode expectations\n", model_dir,
                ml_row_mask_mode_name(lim->row_mask));
        exit(1);
    }
    ml_safetensors *want = ml_rt_safetensors_open(want_path);
    int64_t *tokens = ml_rt_read_i64(want, "greedy_tokens", &n_tokens);
    ml_safetensors_destroy(want);
    int64_t *ar_ids = ml_rt_read_i64(ref, "aspect_ratio_ids", &n_ar);
    int64_t *ar_mask = ml_rt_read_i64(ref, "aspect_ratio_mask", &n);
    const ml_tensor_view *pixels = ml_safetensors_find(ref, "pixel_values");
    char err[256] = "";
    if (n_tokens < (size_t)n_greedy || n_ar != ML_RT_IMAGES ||
        n != ML_RT_IMAGES * (size_t)f->T || !pixels ||
        ml_tensor_view_numel(pixels) != ML_RT_IMAGES * (int64_t)f->slot_floats ||
        ml_tensor_view_read_f32(pixels, f->pixels, err, sizeof err) != ML_OK) {
        fprintf(stderr, "%s: shapes do not fit the model %s\n", path, err);
        exit(1);
    }
    for (int i = 0; i < n_greedy; i++)
        greedy[i] = (int32_t)tokens[i];
    ml_rt_fixture_set_images(f, ar_ids, ar_mask);
    free(ids);
    free(tokens);
    free(ar_ids);
    free(ar_mask);
    ml_safetensors_destroy(ref);
}

/* The LoRA golden fixture (gen_fixtures.py --only lora): m3's
 * configuration, adapters in subdirectories, references of PEFT +
 * transformers beside them. */
#define ML_RT_LORA_FIXTURE ML_SOURCE_DIR "/tests/golden/fixtures/lora"
/* The same cases with Meta's row mask patched in (gen_fixtures.py --only reference). */
#define ML_RT_LORA_REFERENCE_FIXTURE ML_SOURCE_DIR "/tests/golden/fixtures/reference_mode/lora"

/* Into buf: the reference.safetensors of LoRA fixture case `name` (base,
 * a1_all_r8, ...) in row-mask mode `mode`. */
static inline void ml_rt_lora_expected_path(char *buf, size_t len, const char *name,
                                            ml_row_mask_mode mode)
{
    snprintf(buf, len, "%s/%s/reference.safetensors",
             mode == ML_ROW_MASK_REFERENCE ? ML_RT_LORA_REFERENCE_FIXTURE : ML_RT_LORA_FIXTURE,
             name);
}

/* The LoRA fixture's model opened as ml_rt_fixture_open does with lim, and
 * the prompt and images of its inputs.safetensors, which holds the real
 * tiles only, packed (n_real_tiles, 3, S, S): each goes to its slot. */
static inline void ml_rt_fixture_open_lora(ml_rt_fixture *f, const ml_model_limits *lim)
{
    ml_rt_fixture_open(f, ML_RT_LORA_FIXTURE "/model", lim);
    ml_safetensors *in = ml_rt_safetensors_open(ML_RT_LORA_FIXTURE "/inputs.safetensors");
    size_t n, n_ar, n_mask;
    int64_t *ids = ml_rt_read_i64(in, "input_ids", &n);
    int64_t *ar = ml_rt_read_i64(in, "aspect_ratio_ids", &n_ar);
    int64_t *mask = ml_rt_read_i64(in, "aspect_ratio_mask", &n_mask);
    if (n_ar != ML_RT_IMAGES || n_mask != ML_RT_IMAGES * (size_t)f->T) {
        fprintf(stderr, "inputs.safetensors: aspect ratios do not fit the model\n");
        exit(1);
    }
    ml_rt_fixture_set_prompt(f, ids, n);
    ml_rt_fixture_set_images(f, ar, mask);
    const ml_tensor_view *real = ml_safetensors_find(in, "pixel_values_real_tiles");
    size_t tile = (size_t)f->slot_floats / (size_t)f->T;
    size_t n_real = (size_t)f->n_tiles[0] + (size_t)f->n_tiles[1];
    float *tiles = real ? malloc(n_real * tile * sizeof *tiles) : NULL;
    char err[256] = "";
    if (!tiles || (size_t)ml_tensor_view_numel(real) != n_real * tile ||
        ml_tensor_view_read_f32(real, tiles, err, sizeof err) != ML_OK) {
        fprintf(stderr, "pixel_values_real_tiles: absent, not %zu tiles, or %s\n", n_real, err);
        exit(1);
    }
    size_t next = 0;
    for (int i = 0; i < ML_RT_IMAGES; i++)
        for (int t = 0; t < f->T; t++)
            if (f->ar_mask[i][t])
                memcpy(f->pixels + (size_t)i * f->slot_floats + (size_t)t * tile,
                       tiles + tile * next++, tile * sizeof *tiles);
    free(tiles);
    free(ids);
    free(ar);
    free(mask);
    ml_safetensors_destroy(in);
}

/* ---- runtime ----------------------------------------------------------- */

/* A runtime configuration for f: a KV pool of kv_blocks blocks, room for
 * image_slots resident image states, ML_RT_STEP_SEQS running, no adapters.
 * Blocks and image states are the model's per-device ones, so a
 * tensor-parallel model gets the same counts as the whole model. */
static inline ml_runtime_config ml_rt_config(const ml_rt_fixture *f, size_t kv_blocks,
                                             int image_slots)
{
    return (ml_runtime_config){
        .kv_bytes = kv_blocks * ml_model_kv_block_bytes(f->model),
        .image_bytes = (size_t)image_slots * ml_model_image_state_bytes(f->model),
        .max_running = ML_RT_STEP_SEQS,
        .max_step_tokens = ML_RT_STEP_TOKENS,
    };
}

/* A runtime over f's model and tokenizer; the caller destroys it before f. */
static inline ml_runtime *ml_rt_runtime_create(ml_rt_fixture *f, const ml_runtime_config *rc)
{
    ml_runtime *rt;
    char err[256] = "";
    if (ml_runtime_create(&rt, f->model, f->tok, rc, err, sizeof err) != ML_OK) {
        fprintf(stderr, "runtime: %s\n", err);
        exit(1);
    }
    return rt;
}

/* ml_rt_runtime_create with ml_rt_config(f, kv_blocks, image_slots). */
static inline ml_runtime *ml_rt_runtime_sized(ml_rt_fixture *f, size_t kv_blocks,
                                              int image_slots)
{
    ml_runtime_config rc = ml_rt_config(f, kv_blocks, image_slots);
    return ml_rt_runtime_create(f, &rc);
}

/* Requests made from the fixture prompt. */
typedef enum ml_rt_kind {
    ML_RT_TWO_IMAGES, /* the fixture prompt as is */
    ML_RT_ONE_IMAGE,  /* its second <|image|> replaced by ML_RT_FILLER_TOKEN */
    ML_RT_TEXT_ONLY,  /* both replaced */
} ml_rt_kind;

typedef struct ml_rt_request {
    ml_rt_kind kind;
    int max_tokens;
    int resident;        /* images named by key only (no pixels) */
    int at_caller;       /* with resident: ml_request_image.at_caller */
    int key_salt;        /* second key byte: another value is another image */
    /* Image i's content digest instead of (i + 1, key_salt, 0...); NULL = that. */
    const uint8_t (*keys)[ML_IMAGE_KEY_BYTES];
    int cache_salt;      /* ml_request.cache_salt's first byte: another partition */
    const char *adapter; /* borrowed; NULL = the base model */
    int64_t deadline_ms; /* 0 = none */
    int keep_logits;     /* copy the first step's logits into the result */
    int claim_tiles;     /* every image's n_tiles instead of its mask's count; 0 = that */
    const ml_sampling_params *sampling; /* borrowed; NULL = greedy (max_tokens applies) */
    const ml_request_callbacks *cb; /* borrowed; NULL = callbacks that fill the result */
} ml_rt_request;

/* Submit q as a request (greedy unless q->sampling) whose callbacks fill r
 * (borrowed until it ends; unused with q->cb). Image i's key is q->keys[i], or
 * (i + 1, key_salt, 0...), and the cache salt (cache_salt, 0...). Returns the handle;
 * ml_runtime_submit's own failure is a check failure (handle 0). */
static inline uint64_t ml_rt_submit(const ml_rt_fixture *f, ml_runtime *rt,
                                    const ml_rt_request *q, ml_rt_result *r)
{
    const int32_t image_token = ml_model_config(f->model)->image_token_index;
    int32_t prompt[ML_RT_MAX_PROMPT];
    ml_request_image images[ML_RT_IMAGES];
    int n_images = 0, seen = 0;
    for (int i = 0; i < f->n_prompt; i++) {
        prompt[i] = f->prompt[i];
        if (prompt[i] != image_token)
            continue;
        int keep = q->kind == ML_RT_TWO_IMAGES || (q->kind == ML_RT_ONE_IMAGE && seen == 0);
        if (!keep) {
            prompt[i] = ML_RT_FILLER_TOKEN;
            seen++;
            continue;
        }
        ml_request_image *im = &images[n_images++];
        memset(im, 0, sizeof *im);
        if (q->keys) {
            memcpy(im->key, q->keys[n_images - 1], ML_IMAGE_KEY_BYTES);
        } else {
            im->key[0] = (uint8_t)(seen + 1);
            im->key[1] = (uint8_t)q->key_salt;
        }
        im->aspect_ratio_id = f->ar_ids[seen];
        im->n_tiles = q->claim_tiles ? q->claim_tiles : f->n_tiles[seen];
        memcpy(im->aspect_ratio_mask, f->ar_mask[seen], sizeof im->aspect_ratio_mask);
        im->at_caller = q->at_caller;
        if (!q->resident) {
            /* Transferred to the runtime, which frees it. */
            im->pixels = malloc((size_t)f->slot_floats * sizeof *im->pixels);
            if (!im->pixels) {
                fprintf(stderr, "runtime test: out of memory for pixels\n");
                exit(1);
            }
            memcpy(im->pixels, f->pixels + (size_t)seen * f->slot_floats,
                   (size_t)f->slot_floats * sizeof *im->pixels);
        }
        seen++;
    }
    ml_request req = {
        .prompt = prompt,
        .n_prompt = f->n_prompt,
        .images = images,
        .n_images = n_images,
        .deadline_ms = q->deadline_ms,
        .adapter = q->adapter,
        .cache_salt = {(uint8_t)q->cache_salt},
        .cb = q->cb ? *q->cb : ml_rt_callbacks(r, q->keep_logits),
    };
    if (q->sampling) {
        req.sampling = *q->sampling;
    } else {
        ml_sampling_params_default(&req.sampling);
        req.sampling.temperature = 0;
    }
    req.sampling.max_tokens = (uint32_t)q->max_tokens;
    uint64_t h = 0;
    char err[256] = "";
    check(ml_runtime_submit(rt, &req, &h, err, sizeof err) == ML_OK, "submit: %s", err);
    return h;
}

/* n scheduling steps, each one checked. */
static inline void ml_rt_steps(ml_runtime *rt, int n)
{
    char err[256] = "";
    for (int s = 0; s < n; s++)
        check(ml_runtime_step(rt, err, sizeof err) == ML_OK, "step: %s", err);
}

/* Steps until no request is left (a bounded number of steps). With
 * image_budget > 0, checks after every step that the resident image states
 * stay within it. */
static inline void ml_rt_drain(ml_runtime *rt, size_t image_budget)
{
    enum { MAX_STEPS = 10000 };
    char err[256] = "";
    for (int guard = 0; ml_runtime_active(rt) > 0 && guard < MAX_STEPS; guard++) {
        check(ml_runtime_step(rt, err, sizeof err) == ML_OK, "step: %s", err);
        if (image_budget) {
            ml_runtime_stats st;
            ml_runtime_get_stats(rt, &st);
            check(st.image_bytes_used <= image_budget, "image memory %zu over budget %zu",
                  st.image_bytes_used, image_budget);
        }
    }
    check(ml_runtime_active(rt) == 0, "runtime drained");
}

/* Counts a backend's allocations of one size while installed (one watch at
 * a time). The alloc entry of the table be->ops points at is patched in
 * place rather than the pointer swapped: the CPU backend points be->ops
 * back at its own table whenever a graph recording ends (engine/cpu/graph.c),
 * and both backends keep that table, writable, in the backend object. */
typedef struct ml_rt_alloc_watch {
    ml_backend_ops *table;
    void *(*alloc)(ml_backend *be, size_t bytes);
    size_t bytes;
    int n;
} ml_rt_alloc_watch;

static ml_rt_alloc_watch ml_rt_watch;

static inline void *ml_rt_counting_alloc(ml_backend *be, size_t bytes)
{
    if (bytes == ml_rt_watch.bytes)
        ml_rt_watch.n++;
    return ml_rt_watch.alloc(be, bytes);
}

static inline void ml_rt_watch_allocs(ml_backend *be, size_t bytes)
{
    ml_backend_ops *table = (ml_backend_ops *)be->ops;
    ml_rt_watch = (ml_rt_alloc_watch){.table = table, .alloc = table->alloc, .bytes = bytes};
    table->alloc = ml_rt_counting_alloc;
}

/* The allocations counted since ml_rt_watch_allocs; the table restored. */
static inline int ml_rt_unwatch_allocs(void)
{
    ml_rt_watch.table->alloc = ml_rt_watch.alloc;
    return ml_rt_watch.n;
}

/* A fresh runtime over f (kv_blocks KV blocks, room for image_slots image
 * states) flooded with n two-image requests of max_tokens tokens, each
 * with image keys of its own: checks that the resident states never exceed
 * the image budget, that no miss allocates a state (the image cache made
 * every one when it was created, so that none is faulted in on a request's
 * first token) and that every request ends by length. `what` starts the
 * check messages. */
static inline void ml_rt_flood(ml_rt_fixture *f, size_t kv_blocks, int image_slots, int n,
                               int max_tokens, const char *what)
{
    /* Request i's keys carry salt FLOOD_KEY_SALT + i: each brings two new
     * image states, so the budget must evict to admit it. */
    enum { FLOOD_KEY_SALT = 100 };
    ml_rt_result *r = calloc((size_t)n, sizeof *r);
    if (!r) {
        fprintf(stderr, "runtime test: out of memory for %d results\n", n);
        exit(1);
    }
    ml_runtime *rt = ml_rt_runtime_sized(f, kv_blocks, image_slots);
    const size_t state_bytes = ml_model_image_state_bytes(f->model);
    ml_rt_watch_allocs(f->be, state_bytes);
    for (int i = 0; i < n; i++)
        ml_rt_submit(f, rt,
                     &(ml_rt_request){.kind = ML_RT_TWO_IMAGES, .max_tokens = max_tokens,
                                      .key_salt = FLOOD_KEY_SALT + i},
                     &r[i]);
    ml_rt_drain(rt, (size_t)image_slots * state_bytes);
    const int allocated = ml_rt_unwatch_allocs();
    check(allocated == 0, "%s: %d image misses allocated a state", what, allocated);
    for (int i = 0; i < n; i++) {
        check(r[i].done == 1 && r[i].reason == ML_FINISH_REASON_LENGTH,
              "%s: flood request %d done", what, i);
        ml_rt_result_deinit(&r[i]);
    }
    ml_runtime_destroy(rt);
    free(r);
}

/* The most ranks ml_rt_tp_open splits the LoRA fixture over. */
#define ML_RT_TP_MAX 4

/* `whole` with its model split over a CPU group of `world` ranks
 * (model.tensor_parallel): the LoRA fixture's model loaded on the group
 * with adapter slots of max_lora_rank, rank 0 the fixture's backend. */
typedef struct ml_rt_tp {
    ml_rt_fixture f;
    ml_backend *group[ML_RT_TP_MAX];
    ml_model *split;
    int world;
} ml_rt_tp;

/* False after a failed check (tp is then still to be closed). */
static inline bool ml_rt_tp_open(ml_rt_tp *tp, const ml_rt_fixture *whole, int world,
                                 int max_lora_rank)
{
    char err[512] = "";
    *tp = (ml_rt_tp){.f = *whole, .world = world};
    ml_model_limits lim = ml_rt_limits();
    lim.max_lora_rank = max_lora_rank;
    check(world <= ML_RT_TP_MAX &&
              ml_backend_cpu_create_group(world, 1, tp->group, err, sizeof err) == ML_OK &&
              ml_model_load_tp(&tp->split, ML_RT_LORA_FIXTURE "/model", tp->group, world, &lim,
                               err, sizeof err) == ML_OK,
          "the LoRA fixture on a CPU group of %d: %s", world, err);
    tp->f.be = tp->group[0];
    tp->f.model = tp->split;
    return tp->split != NULL;
}

static inline void ml_rt_tp_close(ml_rt_tp *tp)
{
    ml_model_destroy(tp->split);
    for (int r = 0; r < tp->world && r < ML_RT_TP_MAX; r++)
        if (tp->group[r])
            tp->group[r]->ops->destroy(tp->group[r]);
}

#endif
