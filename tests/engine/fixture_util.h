/* Reading the golden fixture models (tests/golden/fixtures/models, made by
 * gen_fixtures.py) for the tests that run them end to end: the index, the
 * reference tensors, and each batch row's prompt, cross-attention mask and
 * greedy continuation laid out as ml_step_seq inputs. Header-only, test
 * code only; include after harness.h. */
#ifndef ML_TEST_FIXTURE_UTIL_H
#define ML_TEST_FIXTURE_UTIL_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_backend.h"
#include "model/mllama.h"
#include "checkpoint/safetensors.h"

#define ML_FX_DIR ML_SOURCE_DIR "/tests/golden/fixtures/models"
/* The same models' expected outputs under Meta's cross-attention row mask
 * (ML_ROW_MASK_REFERENCE; tests/golden/README.md "reference_mode/"). */
#define ML_FX_REFERENCE_DIR ML_SOURCE_DIR "/tests/golden/fixtures/reference_mode/models"
/* Largest index.json read. */
#define ML_FX_INDEX_MAX (1 << 16)

/* The JSON file at path, parsed (owned by the caller: cJSON_Delete); NULL
 * when it cannot be read. */
static inline cJSON *ml_fx_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[ML_FX_INDEX_MAX];
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return cJSON_ParseWithLength(buf, len);
}

/* The "models" array of index.json: an owned cJSON tree (cJSON_Delete) whose
 * string items name fixture directories under ML_FX_DIR, in *models. Skips
 * the test (exit 77) when there are no fixtures. */
static inline cJSON *ml_fx_index(const cJSON **models)
{
    cJSON *index = ml_fx_json(ML_FX_DIR "/index.json");
    if (!index)
        ml_test_skip("no fixture models (tests/golden/fixtures/models/index.json)");
    *models = cJSON_GetObjectItemCaseSensitive(index, "models");
    return index;
}

/* Whether the string array `key` of json lists name. */
static inline int ml_fx_lists(const cJSON *json, const char *key, const char *name)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(json, key))
    {
        if (cJSON_IsString(it) && !strcmp(it->valuestring, name))
            return 1;
    }
    return 0;
}

/* Into buf: the reference.safetensors that holds fixture `name`'s expected
 * text-side outputs (text_hidden_states, logits, greedy_tokens, step_logits)
 * under `mode`. The transformers mode's are the fixture's own. The reference
 * mode's are under ML_FX_REFERENCE_DIR for the models its index.json lists
 * in "models", and the fixture's own for those in "unchanged" (every row
 * sees a tile or there is no image: both modes agree, gen_fixtures.py checks
 * it bit for bit). Inputs, vision and projector outputs are always the
 * fixture's own. 0, or -1 when the reference index lists name nowhere. */
static inline int ml_fx_expected_path(char *buf, size_t len, const char *name,
                                      ml_row_mask_mode mode)
{
    int own = mode == ML_ROW_MASK_TRANSFORMERS, found = own;
    if (!own) {
        cJSON *index = ml_fx_json(ML_FX_REFERENCE_DIR "/index.json");
        own = ml_fx_lists(index, "unchanged", name);
        found = own || ml_fx_lists(index, "models", name);
        cJSON_Delete(index);
    }
    snprintf(buf, len, "%s/%s/reference.safetensors", own ? ML_FX_DIR : ML_FX_REFERENCE_DIR,
             name);
    return found ? 0 : -1;
}

/* Fixture `name`'s reference.safetensors into *ref and its `mode`
 * expectations (ml_fx_expected_path) into *expect: *ref itself when they are
 * one file, else a second file (close both with ml_fx_close_pair). 0, or -1
 * with the reason in err and nothing open. */
static inline int ml_fx_open_pair(const char *name, ml_row_mask_mode mode, ml_safetensors **ref,
                                  ml_safetensors **expect, char *err, size_t errlen)
{
    char path[1200], want_path[1200];
    snprintf(path, sizeof path, "%s/%s/reference.safetensors", ML_FX_DIR, name);
    *ref = *expect = NULL;
    if (ml_fx_expected_path(want_path, sizeof want_path, name, mode) != 0) {
        snprintf(err, errlen, "no %s-mode expectations (rerun gen_fixtures.py --only reference)",
                 ml_row_mask_mode_name(mode));
        return -1;
    }
    if (ml_safetensors_open(ref, path, err, errlen) != ML_OK)
        return -1;
    if (!strcmp(path, want_path)) {
        *expect = *ref;
        return 0;
    }
    if (ml_safetensors_open(expect, want_path, err, errlen) != ML_OK) {
        ml_safetensors_destroy(*ref);
        *ref = NULL;
        return -1;
    }
    return 0;
}

/* base with room for a fixture's whole batch in one step (B sequences of S
 * prompt tokens and N images each, every row's logits kept), K/V blocks of
 * kv_block tokens, in row-mask mode `mode`. */
static inline ml_model_limits ml_fx_limits(ml_model_limits base, ml_row_mask_mode mode, int B,
                                           int S, int N, int kv_block)
{
    base.row_mask = mode;
    base.max_step_tokens = B * S;
    base.max_step_seqs = B;
    base.max_logit_rows = B * S;
    base.max_seq_images = N;
    base.kv_block_size = kv_block;
    return base;
}

static inline void ml_fx_close_pair(ml_safetensors *ref, ml_safetensors *expect)
{
    if (expect != ref)
        ml_safetensors_destroy(expect);
    ml_safetensors_destroy(ref);
}

/* A reference tensor as f32 (ints converted), malloc'd; numel in *n when n
 * is not NULL. NULL (and *n 0) when absent. */
static inline float *ml_fx_f32(ml_safetensors *st, const char *name, size_t *n)
{
    const ml_tensor_view *t = ml_safetensors_find(st, name);
    if (n)
        *n = 0;
    if (!t)
        return NULL;
    size_t numel = (size_t)ml_tensor_view_numel(t);
    float *out = malloc(numel * sizeof *out + 1);
    char err[256];
    if (t->dtype == ML_DTYPE_I64) {
        int64_t *tmp = malloc(numel * sizeof *tmp + 1);
        ml_tensor_view_read_i64(t, tmp, err, sizeof err);
        for (size_t i = 0; i < numel; i++)
            out[i] = (float)tmp[i];
        free(tmp);
    } else {
        ml_tensor_view_read_f32(t, out, err, sizeof err);
    }
    if (n)
        *n = numel;
    return out;
}

static inline float ml_fx_max_abs(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* Compare with a tolerance scaled by the reference's largest magnitude. */
static inline void ml_fx_compare(const float *got, const float *want, size_t n, double tol,
                                 const char *what)
{
    check_tensor(got, want, n, tol * ml_fx_max_abs(want, n), 0, what);
}

static inline int ml_fx_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The text side of a fixture: B rows of an S-token prompt with N image
 * slots of T tiles each, and `steps` reference greedy tokens per row. */
typedef struct ml_fx_prompt {
    int B, S, N, T, steps, ctx; /* ctx = S + steps */
    int32_t *tokens;   /* (B, ctx): the prompt, then the greedy tokens as fed */
    uint8_t *allowed;  /* (B, ctx, N·T): cross_attention_mask rows */
    float *greedy;     /* (B, steps) generate()'s tokens */
} ml_fx_prompt;

/* Replace p's greedy tokens by the first p->steps of each row of st's
 * greedy_tokens (another mode's expectations for the same prompt). */
static inline void ml_fx_prompt_greedy(ml_fx_prompt *p, ml_safetensors *st)
{
    const ml_tensor_view *greedy_v = ml_safetensors_find(st, "greedy_tokens");
    int ref_steps = (int)greedy_v->shape[1];
    float *greedy = ml_fx_f32(st, "greedy_tokens", NULL);
    for (int b = 0; b < p->B; b++)
        for (int i = 0; i < p->steps; i++)
            p->greedy[b * p->steps + i] = greedy[b * ref_steps + i];
    free(greedy);
}

/* Read input_ids, cross_attention_mask and greedy_tokens (the first
 * `steps` of each row) from the reference. */
static inline void ml_fx_prompt_load(ml_fx_prompt *p, ml_safetensors *st, int T, int steps)
{
    const ml_tensor_view *ids_v = ml_safetensors_find(st, "input_ids");
    const ml_tensor_view *pix_v = ml_safetensors_find(st, "pixel_values");
    p->B = (int)ids_v->shape[0];
    p->S = (int)ids_v->shape[1];
    p->N = pix_v ? (int)pix_v->shape[1] : 0;
    p->T = T;
    p->steps = steps;
    p->ctx = p->S + steps;
    int B = p->B, S = p->S, N = p->N, ctx = p->ctx;
    float *ids = ml_fx_f32(st, "input_ids", NULL);
    float *xmask = N ? ml_fx_f32(st, "cross_attention_mask", NULL) : NULL; /* (B, S, N, T) */
    p->tokens = malloc((size_t)B * ctx * sizeof *p->tokens);
    p->allowed = calloc((size_t)B * ctx * (N ? N : 1) * T, 1);
    p->greedy = malloc((size_t)B * steps * sizeof *p->greedy);
    for (int b = 0; b < B; b++) {
        for (int s = 0; s < S; s++)
            p->tokens[b * ctx + s] = (int32_t)ids[b * S + s];
        /* cross_attention_mask rows, then the last row repeated for decode
         * tokens (_update_model_kwargs_for_generation, engine/model/README.md §8). */
        for (int s = 0; s < ctx; s++)
            for (int c = 0; c < N * T; c++)
                p->allowed[((size_t)b * ctx + s) * N * T + c] =
                    xmask[((size_t)b * S + (s < S ? s : S - 1)) * N * T + c] != 0;
    }
    free(ids);
    free(xmask);
    ml_fx_prompt_greedy(p, st);
}

static inline void ml_fx_prompt_free(ml_fx_prompt *p)
{
    free(p->tokens);
    free(p->allowed);
    free(p->greedy);
}

/* Row b's whole prompt, every position's logits, attending to `states`
 * (its N image states) through `table` (its block table). */
static inline ml_step_seq ml_fx_prefill_seq(const ml_fx_prompt *p, int b,
                                            const int32_t *table, void *const *states)
{
    int NT = p->N * p->T;
    return (ml_step_seq){
        .tokens = p->tokens + b * p->ctx, .n_tokens = p->S, .pos0 = 0,
        .block_table = table, .n_images = p->N, .image_states = (const void *const *)states,
        .cross_allowed = p->N ? p->allowed + (size_t)b * p->ctx * NT : NULL, .logits = 2,
    };
}

/* Turn row b's sequence into decode step `step` (0 .. steps-1) feeding
 * `token` at position S + step, last-token logits. */
static inline void ml_fx_decode_seq_token(ml_fx_prompt *p, int b, int step, int32_t token,
                                          ml_step_seq *q)
{
    int at = p->S + step, NT = p->N * p->T;
    p->tokens[b * p->ctx + at] = token;
    q->tokens = p->tokens + b * p->ctx + at;
    q->n_tokens = 1;
    q->pos0 = at;
    q->cross_allowed = p->N ? p->allowed + ((size_t)b * p->ctx + at) * NT : NULL;
    q->logits = 1;
}

/* Decode step `step` of row b feeding the reference greedy token (so one
 * divergence does not cascade). */
static inline void ml_fx_decode_seq(ml_fx_prompt *p, int b, int step, ml_step_seq *q)
{
    ml_fx_decode_seq_token(p, b, step, (int32_t)p->greedy[b * p->steps + step], q);
}

/* Encode every image slot of the reference (B·N, in pixel_values order)
 * into states[i], allocated here with ml_model_image_state_alloc(m) and
 * owned by the caller (ml_model_image_state_free; entries past a failure
 * stay NULL). Returns ML_OK (also for a text-only fixture) or the first
 * error, err filled. */
static inline ml_status ml_fx_encode_images(ml_model *m, ml_safetensors *ref, void **states,
                                            char *err, size_t errlen)
{
    const ml_tensor_view *pix_v = ml_safetensors_find(ref, "pixel_values");
    if (!pix_v)
        return ML_OK;
    const ml_config *cfg = ml_model_config(m);
    int n = (int)(pix_v->shape[0] * pix_v->shape[1]), T = cfg->vision.max_num_tiles;
    size_t slot = (size_t)T * cfg->vision.num_channels * cfg->vision.image_size *
                  cfg->vision.image_size;
    float *pixels = ml_fx_f32(ref, "pixel_values", NULL);
    float *ar_ids = ml_fx_f32(ref, "aspect_ratio_ids", NULL);
    float *ar_mask = ml_fx_f32(ref, "aspect_ratio_mask", NULL); /* (B·N, T) */
    uint8_t *mask = malloc((size_t)T);
    ml_status st = ML_OK;
    for (int i = 0; i < n && st == ML_OK; i++) {
        for (int t = 0; t < T; t++)
            mask[t] = ar_mask[i * T + t] != 0;
        states[i] = ml_model_image_state_alloc(m);
        if (!states[i])
            st = ml_fail(err, errlen, ML_ERR_NOMEM, "image state %d", i);
        else
            st = ml_model_encode_image(m, pixels + i * slot, (int)ar_ids[i], mask, NULL,
                                       states[i], NULL, err, errlen);
    }
    free(mask);
    free(pixels);
    free(ar_ids);
    free(ar_mask);
    return st;
}

#endif
