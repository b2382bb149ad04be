/* FP8 numerics against the golden fixtures' float32 references
 * (tests/golden/fixtures, reference row-mask mode), the prompt's logits and
 * 32 decode steps fed the reference's greedy tokens (so one divergence does
 * not cascade): the largest |Δlogit|, its ratio to the reference's logit
 * scale, and how many of our greedy tokens agree with generate()'s.
 *
 * 1. W8A8 (model.fp8_activations = "fp8", backend.h matmul_f8 quant_x) on
 *    m8_fp8_sharded, the compressed-tensors FP8 fixture, whose reference is
 *    transformers' decompressed W8A16. W8A8 rounds every activation element
 *    entering an FP8 Linear to E4M3: a relative error of at most 2^-4 (half
 *    an ulp of a 3-bit significand; the subnormals of a row scaled to
 *    absmax 448 err by 2^-10·s_x at most, 2^-19 of the absmax). That is the
 *    same per-element bound as the weights' own E4M3 rounding, whose effect
 *    on the logits part 2 measures on every bf16 fixture (at most 0.10 of
 *    the logit scale, these fixtures' width 64 averaging little). The bound
 *    does not carry through the layers as a strict one, so the test holds
 *    W8A8 to TOL_FP8 = 2^-3 of the logit scale, two E4M3 roundings, with
 *    the measured error (0.07) under it; a wrong scale (s_x or scale[n]
 *    dropped, squared or per the wrong row) moves the logits by O(1) of
 *    their scale or more. Greedy tokens are reported, not required: the
 *    fixture's smallest top-1/top-2 margin (1e-2) is below the W8A8 error.
 * 2. W8A16 quantized at load (model.weights = "fp8") on every bf16 fixture
 *    against its bf16 reference: the FP8-vs-bf16 difference of issue 17,
 *    reported (tests/golden/README.md) and held to the same TOL_FP8.
 * 3. W8A8 decoded by graph replay equals W8A8 op by op (the replay
 *    carries quant_x), and W8A8 on bf16 weights is refused at load. Run in reference row-mask
 *    mode; the float32 references are the fixtures' (gen_fixtures.py).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "fixture_util.h"

#define GREEDY_STEPS 32
#define KV_BLOCK 16
#define FP8_FIXTURE "m8_fp8_sharded"
/* Logit error bound relative to the reference's largest |logit| (above). */
#define TOL_FP8 0x1p-3

typedef struct fx_result {
    double max_abs, max_rel; /* |Δlogit|, and over the logit scale, prefill and steps */
    int agree, total;        /* greedy tokens equal to generate()'s, of B·GREEDY_STEPS */
} fx_result;

static void note(fx_result *r, const float *got, const float *want, size_t n)
{
    const float scale = ml_fx_max_abs(want, n);
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        r->max_abs = fmax(r->max_abs, d);
        r->max_rel = fmax(r->max_rel, d / scale);
    }
}

/* Fixture `name` run with `lim_in`'s quantization options; 0 and *r, or -1
 * (failed: reported). */
static int run(ml_backend *be, const char *name, const ml_model_limits *lim_in, fx_result *r)
{
    char dir[1024], err[512];
    snprintf(dir, sizeof dir, "%s/%s", ML_FX_DIR, name);
    memset(r, 0, sizeof *r);
    ml_safetensors *ref, *expect;
    if (ml_fx_open_pair(name, ML_ROW_MASK_REFERENCE, &ref, &expect, err, sizeof err) != 0) {
        check(0, "%s: %s", name, err);
        return -1;
    }
    const ml_tensor_view *ids_v = ml_safetensors_find(ref, "input_ids");
    const ml_tensor_view *pix_v = ml_safetensors_find(ref, "pixel_values");
    const int B = (int)ids_v->shape[0], S = (int)ids_v->shape[1];
    const int N = pix_v ? (int)pix_v->shape[1] : 0;
    ml_model_limits lim = ml_fx_limits(*lim_in, ML_ROW_MASK_REFERENCE, B, S, N, KV_BLOCK);
    ml_model *m;
    if (ml_model_load(&m, dir, be, &lim, err, sizeof err) != ML_OK) {
        check(0, "%s: load: %s", name, err);
        ml_fx_close_pair(ref, expect);
        return -1;
    }
    const ml_config *cfg = ml_model_config(m);
    const int V = cfg->text.vocab_size;
    void **states = calloc((size_t)B * N + 1, sizeof *states);
    ml_status st = ml_fx_encode_images(m, ref, states, err, sizeof err);
    check(st == ML_OK, "%s: encode: %s", name, err);

    ml_fx_prompt pr;
    ml_fx_prompt_load(&pr, ref, cfg->vision.max_num_tiles, GREEDY_STEPS);
    ml_fx_prompt_greedy(&pr, expect);
    const int blocks = (pr.ctx + KV_BLOCK - 1) / KV_BLOCK;
    ml_kv_cache *kv = NULL;
    const int n_self = cfg->text.num_hidden_layers - cfg->text.n_cross_layers;
    if (st == ML_OK)
        st = ml_kv_cache_create(&kv, be, n_self, B * blocks, KV_BLOCK, ml_model_kv_heads(m),
                                cfg->text.head_dim, err, sizeof err);
    int32_t *tables = malloc((size_t)B * blocks * sizeof *tables);
    ml_step_seq *seqs = calloc((size_t)B, sizeof *seqs);
    float *logits = malloc((size_t)B * S * V * sizeof *logits);
    float *ref_logits = ml_fx_f32(expect, "logits", NULL);
    float *step_ref = ml_fx_f32(expect, "step_logits", NULL); /* (B, 32, V) */
    if (st == ML_OK) {
        for (int b = 0; b < B; b++) {
            for (int i = 0; i < blocks; i++)
                tables[b * blocks + i] = ml_kv_cache_alloc(kv);
            seqs[b] = ml_fx_prefill_seq(&pr, b, tables + b * blocks, states + b * N);
        }
        st = ml_model_forward(m, kv, seqs, B, logits, NULL, err, sizeof err);
        check(st == ML_OK, "%s: prefill: %s", name, err);
    }
    if (st == ML_OK) {
        note(r, logits, ref_logits, (size_t)B * S * V);
        for (int b = 0; b < B; b++)
            memmove(logits + (size_t)b * V, logits + ((size_t)b * S + S - 1) * V,
                    (size_t)V * sizeof *logits);
    }
    for (int step = 0; step < GREEDY_STEPS && st == ML_OK; step++) {
        for (int b = 0; b < B; b++) {
            note(r, logits + (size_t)b * V, step_ref + ((size_t)b * GREEDY_STEPS + step) * V,
                 (size_t)V);
            r->agree += ml_fx_argmax(logits + (size_t)b * V, V) ==
                        (int)pr.greedy[b * GREEDY_STEPS + step];
            r->total++;
            ml_fx_decode_seq(&pr, b, step, &seqs[b]);
        }
        if (step + 1 < GREEDY_STEPS) {
            st = ml_model_forward(m, kv, seqs, B, logits, NULL, err, sizeof err);
            check(st == ML_OK, "%s: decode step %d: %s", name, step, err);
        }
    }
    free(step_ref);
    free(ref_logits);
    free(logits);
    free(seqs);
    free(tables);
    ml_fx_prompt_free(&pr);
    for (int i = 0; i < B * N; i++)
        ml_model_image_state_free(m, states[i]);
    free(states);
    ml_kv_cache_destroy(kv);
    ml_model_destroy(m);
    ml_fx_close_pair(ref, expect);
    return st == ML_OK ? 0 : -1;
}

static void print_result(const char *what, const char *name, const fx_result *r)
{
    printf("  %-10s %-28s max |dlogit| %.4g (%.3g of scale), greedy %d/%d\n", what, name,
           r->max_abs, r->max_rel, r->agree, r->total);
}

int main(void)
{
    char err[256];
    const cJSON *models, *it;
    cJSON *index = ml_fx_index(&models);
    ml_backend *be = ml_backend_cpu_create(2, err, sizeof err);
    check(be != NULL, "cpu backend: %s", err);
    if (!be) {
        cJSON_Delete(index);
        return check_done();
    }
    ml_model_limits lim = ml_model_limits_default();
    fx_result r;
    if (run(be, FP8_FIXTURE, &lim, &r) == 0)
        print_result("W8A16", FP8_FIXTURE, &r);
    lim.fp8_activations = 1;
    if (run(be, FP8_FIXTURE, &lim, &r) == 0) {
        print_result("W8A8", FP8_FIXTURE, &r);
        check(r.max_rel <= TOL_FP8, "W8A8 %s: logits off by %.3g of their scale (> 2^-3)",
              FP8_FIXTURE, r.max_rel);
        /* the decode steps above replayed graphs (the default): op by op
         * they give the same logits, so the replay carries quant_x */
        fx_result eager;
        lim.decode_graphs = 0;
        if (run(be, FP8_FIXTURE, &lim, &eager) == 0)
            check(eager.max_abs == r.max_abs && eager.agree == r.agree,
                  "W8A8 %s: graph replay (%.6g, %d) differs from op by op (%.6g, %d)",
                  FP8_FIXTURE, r.max_abs, r.agree, eager.max_abs, eager.agree);
    }
    lim = ml_model_limits_default();
    lim.quantize_fp8 = 1;
    int n = 0;
    cJSON_ArrayForEach(it, models)
    {
        if (!cJSON_IsString(it) || !strcmp(it->valuestring, FP8_FIXTURE))
            continue;
        if (run(be, it->valuestring, &lim, &r) == 0) {
            print_result("fp8 load", it->valuestring, &r);
            check(isfinite(r.max_rel) && r.max_rel <= TOL_FP8,
                  "fp8 at load %s: logits off by %.3g of their scale", it->valuestring,
                  r.max_rel);
        }
        n++;
    }
    check(n > 0, "no bf16 fixtures listed in index.json");
    /* W8A8 needs FP8 weights: a bf16 fixture as stored is refused at load */
    lim = ml_model_limits_default();
    lim.fp8_activations = 1;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", ML_FX_DIR, "m5_text_only");
    ml_model *m = NULL;
    const ml_status st = ml_model_load(&m, dir, be, &lim, err, sizeof err);
    check(st == ML_ERR_INVALID_ARG && strstr(err, "fp8 activations need FP8 weights"),
          "W8A8 on bf16 weights refused at load: %s", st == ML_OK ? "loaded" : err);
    ml_model_destroy(m);
    be->ops->destroy(be);
    cJSON_Delete(index);
    return check_done();
}
