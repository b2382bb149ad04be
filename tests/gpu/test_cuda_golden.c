/* The whole model on the CUDA backend against transformers, on every golden
 * fixture model (tests/golden/fixtures/models): vision and projector
 * outputs, every decoder hidden state and the prompt's logits, then 32
 * greedy decode steps fed the reference tokens (as tests/engine/
 * test_model_golden.c does on the CPU), in both cross-attention row-mask
 * modes, each against its own expectations (fixture_util.h
 * ml_fx_expected_path). Skipped (77) without a device.
 *
 * Tolerances. The reference is a float32 forward; the GPU rounds matmul
 * inputs (M > 4), the K/V caches and the vision attention's Q/K/V/P to
 * bf16, a subset of what a full bf16 forward rounds. The fixtures carry
 * that full bf16 forward's logits (logits_bf16): their NMSE against the
 * f32 logits is 6e-5 .. 9e-5 and their largest error 0.07 .. 0.10 over
 * the seven fixtures. So:
 * - every compared tensor must have NMSE <= NMSE_LIMIT = 3e-4, 3-5x what a
 *   full bf16 forward reaches, while a semantic error (a wrong mask row,
 *   gate or index) costs 1e-2 and more;
 * - a greedy token must equal the f32 reference wherever the reference's
 *   top-1/top-2 margin exceeds MARGIN_REQUIRED = 0.25 (2.5x the largest
 *   bf16 logit error); closer calls are counted and reported, against
 *   both greedy_tokens and greedy_tokens_bf16, not required. The bf16
 *   references exist for the transformers mode only; the reference mode's
 *   agreement is counted against f32 alone.
 * The FP8 fixture (m8_fp8_sharded, compressed-tensors E4M3 weights) runs
 * through matmul_f8's W8A16 path, whose weights widen exactly: it is held
 * to the same limits, against transformers' decompressed forward. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "engine/fixture_util.h"
#include "mlk_backend.h"
#include "mlk_device.h"
#include "model/mllama.h"
#include "checkpoint/safetensors.h"

#define GREEDY_STEPS 32
#define KV_BLOCK 16
#define NMSE_LIMIT 3e-4
#define MARGIN_REQUIRED 0.25
#define POOL_BYTES ((size_t)4 << 30)
#define MAX_TILES 16

static double max_diff(const float *got, const float *want, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        m = d > m || d != d ? d : m;
    }
    return m;
}

static void compare(const float *got, const float *want, size_t n, const char *what)
{
    const double e = tensor_nmse(got, want, n);
    check(e <= NMSE_LIMIT, "%s: NMSE %.3g above %.1g", what, e, NMSE_LIMIT);
    fprintf(stderr, "  %-44s NMSE %.2e max|diff| %.3g\n", what, e, max_diff(got, want, n));
}

/* Top-1 minus top-2 of a row. */
static double margin(const float *x, int n)
{
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) {
            b = a;
            a = x[i];
        } else if (x[i] > b) {
            b = x[i];
        }
    }
    return a - b;
}

static void encode_images(ml_backend *be, ml_model *m, ml_safetensors *ref, const char *name,
                          int n_states, void **states)
{
    const ml_config *cfg = ml_model_config(m);
    const int T = cfg->vision.max_num_tiles, D = cfg->text.hidden_size;
    float *pixels = ml_fx_f32(ref, "pixel_values", NULL);
    float *ar_ids = ml_fx_f32(ref, "aspect_ratio_ids", NULL);
    float *ar_mask = ml_fx_f32(ref, "aspect_ratio_mask", NULL);
    float *vout = ml_fx_f32(ref, "vision_output", NULL);
    float *proj = ml_fx_f32(ref, "projector_output", NULL);
    const ml_tensor_view *vo = ml_safetensors_find(ref, "vision_output");
    const int P = (int)vo->shape[3];
    const size_t slot = (size_t)T * 3 * cfg->vision.image_size * cfg->vision.image_size;
    const size_t vsz = (size_t)T * P * cfg->vision.vision_output_dim, psz = (size_t)T * P * D;
    float *got_v = malloc(vsz * sizeof *got_v), *got_p = malloc(psz * sizeof *got_p);
    char err[512];
    for (int i = 0; i < n_states; i++) {
        uint8_t mask[MAX_TILES];
        for (int t = 0; t < T && t < MAX_TILES; t++)
            mask[t] = ar_mask[i * T + t] != 0;
        states[i] = be->ops->alloc(be, ml_model_image_state_bytes(m));
        check(states[i] != NULL, "%s: image state %d: pool exhausted", name, i);
        ml_vision_taps taps = {got_v, got_p};
        ml_status st = ml_model_encode_image(m, pixels + i * slot, (int)ar_ids[i], mask, NULL,
                                             states[i], &taps, err, sizeof err);
        check(st == ML_OK, "%s: encode %d: %s", name, i, err);
        char what[128];
        snprintf(what, sizeof what, "%s image %d vision_output", name, i);
        compare(got_v, vout + i * vsz, vsz, what);
        snprintf(what, sizeof what, "%s image %d projector_output", name, i);
        compare(got_p, proj + i * psz, psz, what);
    }
    free(got_v);
    free(got_p);
    free(pixels);
    free(ar_ids);
    free(ar_mask);
    free(vout);
    free(proj);
}

/* The modes every fixture runs in. */
static const ml_row_mask_mode MODES[] = {ML_ROW_MASK_TRANSFORMERS, ML_ROW_MASK_REFERENCE};

static void run_fixture(ml_backend *be, const char *fixture, ml_row_mask_mode mode)
{
    char dir[1024], err[512], name[80];
    snprintf(dir, sizeof dir, "%s/%s", ML_FX_DIR, fixture);
    snprintf(name, sizeof name, "%s (%s)", fixture, ml_row_mask_mode_name(mode));
    fprintf(stderr, "== %s\n", name);
    ml_safetensors *ref, *expect;
    if (ml_fx_open_pair(fixture, mode, &ref, &expect, err, sizeof err) != 0) {
        check(0, "%s: %s", name, err);
        return;
    }
    const ml_tensor_view *ids_v = ml_safetensors_find(ref, "input_ids");
    const int B = (int)ids_v->shape[0], S = (int)ids_v->shape[1];
    const ml_tensor_view *pix_v = ml_safetensors_find(ref, "pixel_values");
    const int N = pix_v ? (int)pix_v->shape[1] : 0;

    const ml_model_limits lim =
        ml_fx_limits(ml_model_limits_default(), mode, B, S, N, KV_BLOCK);
    ml_model *m;
    ml_status load = ml_model_load(&m, dir, be, &lim, err, sizeof err);
    if (load != ML_OK) {
        check(0, "%s: load: %s", name, err);
        ml_fx_close_pair(ref, expect);
        return;
    }
    const ml_config *cfg = ml_model_config(m);
    const int V = cfg->text.vocab_size, D = cfg->text.hidden_size, L = cfg->text.num_hidden_layers;
    const int T = cfg->vision.max_num_tiles;
    void **states = calloc((size_t)B * N + 1, sizeof *states);
    if (N)
        encode_images(be, m, ref, name, B * N, states);

    /* ---- prefill: all rows in one step */
    float *ids_f = ml_fx_f32(ref, "input_ids", NULL);
    float *xmask = N ? ml_fx_f32(ref, "cross_attention_mask", NULL) : NULL; /* (B, S, N, T) */
    const int ctx = S + GREEDY_STEPS, blocks_per_seq = (ctx + KV_BLOCK - 1) / KV_BLOCK;
    const int n_self = L - cfg->text.n_cross_layers;
    ml_kv_cache *kv;
    ml_status st = ml_kv_cache_create(&kv, be, n_self, B * blocks_per_seq, KV_BLOCK,
                                      cfg->text.num_key_value_heads, cfg->text.head_dim, err,
                                      sizeof err);
    check(st == ML_OK, "kv cache: %s", err);
    int32_t *tokens = malloc((size_t)B * ctx * sizeof *tokens);
    int32_t *tables = malloc((size_t)B * blocks_per_seq * sizeof *tables);
    uint8_t *allowed = calloc((size_t)B * ctx * (N ? N : 1) * T, 1);
    ml_step_seq *seqs = calloc((size_t)B, sizeof *seqs);
    for (int b = 0; b < B && st == ML_OK; b++) {
        for (int i = 0; i < blocks_per_seq; i++)
            tables[b * blocks_per_seq + i] = ml_kv_cache_alloc(kv);
        for (int s = 0; s < S; s++)
            tokens[b * ctx + s] = (int32_t)ids_f[b * S + s];
        for (int s = 0; s < ctx; s++)
            for (int c = 0; c < N * T; c++)
                allowed[((size_t)b * ctx + s) * N * T + c] =
                    xmask[((size_t)b * S + (s < S ? s : S - 1)) * N * T + c] != 0;
        seqs[b] = (ml_step_seq){
            .tokens = tokens + b * ctx, .n_tokens = S, .pos0 = 0,
            .block_table = tables + b * blocks_per_seq, .n_images = N,
            .image_states = (const void *const *)states + b * N,
            .cross_allowed = N ? allowed + (size_t)b * ctx * N * T : NULL, .logits = 2,
        };
    }
    float *logits = malloc((size_t)B * S * V * sizeof *logits);
    float *hidden = malloc((size_t)(L + 1) * B * S * D * sizeof *hidden);
    ml_text_taps taps = {hidden};
    if (st == ML_OK) {
        st = ml_model_forward(m, kv, seqs, B, logits, &taps, err, sizeof err);
        check(st == ML_OK, "%s: prefill: %s", name, err);
    }
    float *ref_hidden = ml_fx_f32(expect, "text_hidden_states", NULL);
    for (int l = 0; l <= L && st == ML_OK; l++) {
        char what[128];
        snprintf(what, sizeof what, "%s hidden_states[%d]", name, l);
        const size_t layer = (size_t)B * S * D;
        compare(hidden + l * layer, ref_hidden + l * layer, layer, what);
    }
    size_t nl;
    float *ref_logits = ml_fx_f32(expect, "logits", &nl);
    float *ref_logits_bf16 = ml_fx_f32(ref, "logits_bf16", NULL);
    if (st == ML_OK)
        compare(logits, ref_logits, nl, "prefill logits");
    if (mode == ML_ROW_MASK_TRANSFORMERS)
        fprintf(stderr, "  %-44s NMSE %.2e max|diff| %.3g (full bf16 forward, for scale)\n",
                "reference logits_bf16", tensor_nmse(ref_logits_bf16, ref_logits, nl),
                max_diff(ref_logits_bf16, ref_logits, nl));

    /* ---- greedy decode, all rows together, fed the reference tokens */
    float *greedy = ml_fx_f32(expect, "greedy_tokens", NULL);           /* (B, 32) */
    /* (B, 32), transformers mode only */
    float *greedy_bf16 =
        mode == ML_ROW_MASK_TRANSFORMERS ? ml_fx_f32(ref, "greedy_tokens_bf16", NULL) : NULL;
    float *step_ref = ml_fx_f32(expect, "step_logits", NULL);           /* (B, 32, V) */
    float *step_got = malloc((size_t)B * GREEDY_STEPS * V * sizeof *step_got);
    float *row_logits = malloc((size_t)B * V * sizeof *row_logits);
    for (int b = 0; b < B; b++)
        memcpy(row_logits + (size_t)b * V, logits + ((size_t)b * S + S - 1) * V,
               (size_t)V * sizeof(float));
    int required = 0, required_ok = 0, agree_f32 = 0, agree_bf16 = 0, steps_done = 0;
    for (int step = 0; step < GREEDY_STEPS && st == ML_OK; step++) {
        for (int b = 0; b < B; b++) {
            const float *want = step_ref + ((size_t)b * GREEDY_STEPS + step) * V;
            const float *got = row_logits + (size_t)b * V;
            memcpy(step_got + ((size_t)b * GREEDY_STEPS + step) * V, got, (size_t)V * 4);
            const int tok = ml_fx_argmax(got, V), ref_tok = (int)greedy[b * GREEDY_STEPS + step];
            agree_f32 += tok == ref_tok;
            agree_bf16 += greedy_bf16 &&
                          tok == (int)greedy_bf16[b * GREEDY_STEPS + step];
            if (margin(want, V) > MARGIN_REQUIRED) {
                required++;
                required_ok += tok == ref_tok;
                check(tok == ref_tok, "%s: row %d step %d: token %d, reference %d (margin %.3f)",
                      name, b, step, tok, ref_tok, margin(want, V));
            }
            tokens[b * ctx + S + step] = ref_tok;
            seqs[b].tokens = tokens + b * ctx + S + step;
            seqs[b].n_tokens = 1;
            seqs[b].pos0 = S + step;
            seqs[b].cross_allowed = N ? allowed + ((size_t)b * ctx + S + step) * N * T : NULL;
            seqs[b].logits = 1;
        }
        steps_done++;
        if (step + 1 < GREEDY_STEPS) {
            st = ml_model_forward(m, kv, seqs, B, row_logits, NULL, err, sizeof err);
            check(st == ML_OK, "%s: decode step %d: %s", name, step, err);
        }
    }
    if (steps_done == GREEDY_STEPS) {
        /* step_got is (B, 32, V) like step_ref. */
        compare(step_got, step_ref, (size_t)B * GREEDY_STEPS * V, "decode step logits");
    }
    fprintf(stderr,
            "  greedy: %d/%d tokens agree with f32 generate(), %d/%d with bf16 generate() "
            "(transformers mode only); %d/%d required (margin > %.2f) agree\n",
            agree_f32, B * steps_done, agree_bf16, greedy_bf16 ? B * steps_done : 0, required_ok,
            required, MARGIN_REQUIRED);

    free(greedy);
    free(greedy_bf16);
    free(step_ref);
    free(step_got);
    free(row_logits);
    free(ref_logits);
    free(ref_logits_bf16);
    free(ref_hidden);
    free(logits);
    free(hidden);
    free(seqs);
    free(allowed);
    free(tables);
    free(tokens);
    free(ids_f);
    free(xmask);
    for (int i = 0; i < B * N; i++)
        if (states[i])
            be->ops->free(be, states[i]);
    free(states);
    ml_kv_cache_destroy(kv);
    ml_model_destroy(m);
    ml_fx_close_pair(ref, expect);
}

int main(void)
{
    if (mlk_device_count() == 0)
        ml_test_skip("no CUDA device");
    const cJSON *models, *it;
    cJSON *index = ml_fx_index(&models);
    char err[512];
    ml_backend *be = ml_backend_cuda_create(0, POOL_BYTES, 0, err, sizeof err);
    check(be != NULL, "cuda backend: %s", err);
    int n = 0;
    cJSON_ArrayForEach(it, models)
    {
        if (be && cJSON_IsString(it)) {
            for (size_t k = 0; k < sizeof MODES / sizeof MODES[0]; k++)
                run_fixture(be, it->valuestring, MODES[k]);
            n++;
        }
    }
    check(n > 0, "no models listed in index.json");
    if (be)
        be->ops->destroy(be);
    cJSON_Delete(index);
    return check_done();
}
