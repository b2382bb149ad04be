/* The whole model against transformers on every golden fixture model
 * (tests/golden/fixtures/models, made by gen_fixtures.py): vision output,
 * projector output, every decoder hidden state and the logits of the prompt,
 * then 32 greedy tokens decoded step by step against generate() and its
 * per-step logits. All batch rows of a fixture run in one batched step.
 * Each fixture runs in both cross-attention row-mask modes: the transformers
 * mode against transformers 4.47's own outputs, the reference mode (the
 * default) against the same transformers with Meta's row mask patched in
 * (fixtures/reference_mode); inputs, vision and projector outputs are common.
 *
 * Tolerances. The reference is a float32 forward of the same bf16 weights;
 * ours is float32 with another summation order (blocked, vectorised,
 * multithreaded), so the two differ by rounding only: about K·2^-24 relative
 * per dot product of length K, compounded over a dozen layers. Measured
 * worst cases over the fixtures are ~1e-6 relative to each tensor's scale;
 * the bounds below (TOL_*) give 20x headroom over that, while a real
 * semantic error (a wrong mask row, gate or index) moves values by 1e-2 or
 * more. The greedy tokens must be identical: the fixtures record their
 * smallest top-1/top-2 logit margin (>= 1e-2), far above the logit error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "fixture_util.h"

#define GREEDY_STEPS 32
#define KV_BLOCK 16
/* Tolerance relative to the reference tensor's largest magnitude. */
#define TOL_VISION 2e-5
#define TOL_HIDDEN 2e-5
#define TOL_LOGITS 2e-5

/* The modes every fixture runs in. */
static const ml_row_mask_mode MODES[] = {ML_ROW_MASK_TRANSFORMERS, ML_ROW_MASK_REFERENCE};

/* The reference mode's encode (`state`, of model m) against the
 * transformers mode's, which keeps every tile (the fixture in dir loaded
 * again under lim in that mode): each element of the state is the other's
 * or, in the slots of the tiles after the last real one (mask), zero, and
 * those are the only ones that differ. */
static void check_skipped_tiles(ml_backend *be, ml_model *m, const char *dir,
                                const ml_model_limits *lim, const float *pixels, int ar_id,
                                const uint8_t *mask, const void *state, const char *label,
                                int image)
{
    const int T = ml_model_config(m)->vision.max_num_tiles;
    const size_t bytes = ml_model_image_state_bytes(m), elem = be->ops->kv_elem_size;
    const size_t n = bytes / elem;
    int tiles = 1;
    for (int t = 1; t < T; t++)
        if (mask[t])
            tiles = t + 1;
    ml_model_limits all_tiles = *lim;
    all_tiles.row_mask = ML_ROW_MASK_TRANSFORMERS;
    ml_model *every;
    char err[256];
    if (ml_model_load(&every, dir, be, &all_tiles, err, sizeof err) != ML_OK) {
        check(0, "%s: load in the transformers mode: %s", label, err);
        return;
    }
    void *full = be->ops->alloc(be, bytes);
    check(ml_model_encode_image(every, pixels, ar_id, mask, NULL, full, NULL, err, sizeof err) ==
              ML_OK,
          "%s: encode %d in the transformers mode: %s", label, image, err);
    unsigned char *got = malloc(bytes), *want = malloc(bytes);
    be->ops->download(be, got, state, bytes);
    be->ops->download(be, want, full, bytes);
    size_t differ = 0, nonzero = 0;
    for (size_t e = 0; e < n; e++) {
        if (memcmp(got + e * elem, want + e * elem, elem) == 0)
            continue;
        differ++;
        for (size_t b = 0; b < elem; b++)
            nonzero += got[e * elem + b] != 0;
    }
    /* every cross layer's K and V planes hold (T - tiles) / T of their keys
     * in the skipped slots */
    const size_t skipped = n / (size_t)T * (size_t)(T - tiles);
    check(nonzero == 0 && differ == skipped,
          "%s image %d: %zu elements differ from the transformers mode's (%zu in the %d skipped "
          "tiles expected), %zu nonzero bytes among them",
          label, image, differ, skipped, T - tiles, nonzero);
    free(got);
    free(want);
    be->ops->free(be, full);
    ml_model_destroy(every);
}

/* Fixture `name` in row-mask mode `mode`: inputs, vision and projector
 * outputs from its reference.safetensors (ref), the text side from the
 * mode's expectations (expect, ml_fx_expected_path; ref itself when they are
 * the same file). */
static void run_fixture(ml_backend *be, const char *name, ml_row_mask_mode mode)
{
    char dir[1024], err[512], label[256];
    snprintf(dir, sizeof dir, "%s/%s", ML_FX_DIR, name);
    snprintf(label, sizeof label, "%s (%s)", name, ml_row_mask_mode_name(mode));
    fprintf(stderr, "== %s\n", label);
    ml_safetensors *ref, *expect;
    if (ml_fx_open_pair(name, mode, &ref, &expect, err, sizeof err) != 0) {
        check(0, "%s: %s", label, err);
        return;
    }
    const ml_tensor_view *ids_v = ml_safetensors_find(ref, "input_ids");
    int B = (int)ids_v->shape[0], S = (int)ids_v->shape[1];
    const ml_tensor_view *pix_v = ml_safetensors_find(ref, "pixel_values");
    int N = pix_v ? (int)pix_v->shape[1] : 0;

    ml_model_limits lim = ml_fx_limits(ml_model_limits_default(), mode, B, S, N, KV_BLOCK);
    ml_model *m;
    if (ml_model_load(&m, dir, be, &lim, err, sizeof err) != ML_OK) {
        check(0, "%s: load: %s", label, err);
        ml_fx_close_pair(ref, expect);
        return;
    }
    const ml_config *cfg = ml_model_config(m);
    int V = cfg->text.vocab_size, D = cfg->text.hidden_size, L = cfg->text.num_hidden_layers;
    int T = cfg->vision.max_num_tiles, P = 0;

    /* ---- vision: every image slot of every row, as transformers runs them */
    void **states = calloc((size_t)B * N + 1, sizeof *states);
    if (N) {
        float *pixels = ml_fx_f32(ref, "pixel_values", NULL);
        float *ar_ids = ml_fx_f32(ref, "aspect_ratio_ids", NULL);
        float *ar_mask = ml_fx_f32(ref, "aspect_ratio_mask", NULL);
        float *vout = ml_fx_f32(ref, "vision_output", NULL);
        float *proj = ml_fx_f32(ref, "projector_output", NULL);
        const ml_tensor_view *vo = ml_safetensors_find(ref, "vision_output");
        P = (int)vo->shape[3];
        size_t slot = (size_t)T * 3 * cfg->vision.image_size * cfg->vision.image_size;
        size_t vsz = (size_t)T * P * cfg->vision.vision_output_dim, psz = (size_t)T * P * D;
        float *got_v = malloc(vsz * sizeof *got_v), *got_p = malloc(psz * sizeof *got_p);
        for (int i = 0; i < B * N; i++) {
            uint8_t mask[16];
            for (int t = 0; t < T; t++)
                mask[t] = ar_mask[i * T + t] != 0;
            states[i] = be->ops->alloc(be, ml_model_image_state_bytes(m));
            /* The reference mode's encode without a projector tap, which
             * skips the padding tiles: the text side below runs on those
             * states. Its projector output is the other mode's. */
            ml_vision_taps taps = {got_v, mode == ML_ROW_MASK_REFERENCE ? NULL : got_p};
            ml_status st = ml_model_encode_image(m, pixels + i * slot, (int)ar_ids[i], mask,
                                                 NULL, states[i], &taps, err, sizeof err);
            check(st == ML_OK, "%s: encode %d: %s", label, i, err);
            char what[320];
            snprintf(what, sizeof what, "%s image %d vision_output", label, i);
            ml_fx_compare(got_v, vout + i * vsz, vsz, TOL_VISION, what);
            if (taps.projector_output) {
                snprintf(what, sizeof what, "%s image %d projector_output", label, i);
                ml_fx_compare(got_p, proj + i * psz, psz, TOL_VISION, what);
            } else {
                check_skipped_tiles(be, m, dir, &lim, pixels + i * slot, (int)ar_ids[i], mask,
                                    states[i], label, i);
            }
        }
        free(got_v);
        free(got_p);
        free(pixels);
        free(ar_ids);
        free(ar_mask);
        free(vout);
        free(proj);
    }

    /* ---- prefill: all rows in one step ---------------------------------- */
    ml_fx_prompt pr;
    ml_fx_prompt_load(&pr, ref, T, GREEDY_STEPS);
    ml_fx_prompt_greedy(&pr, expect);
    int blocks_per_seq = (pr.ctx + KV_BLOCK - 1) / KV_BLOCK;
    ml_kv_cache *kv;
    int n_self = L - cfg->text.n_cross_layers;
    check(ml_kv_cache_create(&kv, be, n_self, B * blocks_per_seq, KV_BLOCK, ml_model_kv_heads(m),
                             cfg->text.head_dim, err, sizeof err) == ML_OK,
          "kv cache: %s", err);
    int32_t *tables = malloc((size_t)B * blocks_per_seq * sizeof *tables);
    ml_step_seq *seqs = calloc((size_t)B, sizeof *seqs);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < blocks_per_seq; i++)
            tables[b * blocks_per_seq + i] = ml_kv_cache_alloc(kv);
        seqs[b] = ml_fx_prefill_seq(&pr, b, tables + b * blocks_per_seq, states + b * N);
    }
    float *logits = malloc((size_t)B * S * V * sizeof *logits);
    float *hidden = malloc((size_t)(L + 1) * B * S * D * sizeof *hidden);
    ml_text_taps taps = {hidden};
    ml_status st = ml_model_forward(m, kv, seqs, B, logits, &taps, err, sizeof err);
    check(st == ML_OK, "%s: prefill: %s", label, err);
    size_t nh;
    float *ref_hidden = ml_fx_f32(expect, "text_hidden_states", &nh);
    for (int l = 0; l <= L; l++) {
        char what[320];
        snprintf(what, sizeof what, "%s hidden_states[%d]", label, l);
        size_t layer = (size_t)B * S * D;
        ml_fx_compare(hidden + l * layer, ref_hidden + l * layer, layer, TOL_HIDDEN, what);
    }
    size_t nl;
    float *ref_logits = ml_fx_f32(expect, "logits", &nl);
    char what[320];
    snprintf(what, sizeof what, "%s prefill logits", label);
    ml_fx_compare(logits, ref_logits, nl, TOL_LOGITS, what);

    /* ---- greedy decode, all rows together -------------------------------- */
    float *step_ref = ml_fx_f32(expect, "step_logits", NULL);   /* (B, 32, V) */
    float *row_logits = malloc((size_t)B * V * sizeof *row_logits);
    for (int b = 0; b < B; b++)
        memcpy(row_logits + (size_t)b * V, logits + ((size_t)b * S + S - 1) * V,
               (size_t)V * sizeof(float));
    int mismatches = 0;
    double worst = 0;
    for (int step = 0; step < GREEDY_STEPS && st == ML_OK; step++) {
        for (int b = 0; b < B; b++) {
            const float *want = step_ref + ((size_t)b * GREEDY_STEPS + step) * V;
            float scale = ml_fx_max_abs(want, (size_t)V);
            for (int v = 0; v < V; v++)
                worst = fmax(worst, fabs(row_logits[(size_t)b * V + v] - want[v]) / scale);
            int tok = ml_fx_argmax(row_logits + (size_t)b * V, V);
            mismatches += tok != (int)pr.greedy[b * GREEDY_STEPS + step];
            ml_fx_decode_seq(&pr, b, step, &seqs[b]);
        }
        if (step + 1 < GREEDY_STEPS)
            st = ml_model_forward(m, kv, seqs, B, row_logits, NULL, err, sizeof err);
        check(st == ML_OK, "%s: decode step %d: %s", label, step, err);
    }
    fprintf(stderr, "  %-40s max step-logit error %.3g of scale\n", "greedy decode", worst);
    check(worst <= TOL_LOGITS, "%s: step logits off by %.3g of their scale", label, worst);
    check(mismatches == 0, "%s: %d of %d greedy tokens differ from generate()", label, mismatches,
          B * GREEDY_STEPS);

    free(step_ref);
    free(row_logits);
    free(ref_logits);
    free(ref_hidden);
    free(logits);
    free(hidden);
    free(seqs);
    free(tables);
    ml_fx_prompt_free(&pr);
    for (int i = 0; i < B * N; i++)
        be->ops->free(be, states[i]);
    free(states);
    ml_kv_cache_destroy(kv);
    ml_model_destroy(m);
    ml_fx_close_pair(ref, expect);
}

int main(void)
{
    char err[256];
    const cJSON *models, *it;
    cJSON *index = ml_fx_index(&models);
    ml_backend *be = ml_backend_cpu_create(2, err, sizeof err);
    check(be != NULL, "cpu backend: %s", err);
    int n = 0;
    for (size_t k = 0; k < sizeof MODES / sizeof MODES[0]; k++) {
        cJSON_ArrayForEach(it, models)
        {
            if (be && cJSON_IsString(it)) {
                run_fixture(be, it->valuestring, MODES[k]);
                n++;
            }
        }
    }
    check(n > 0, "no models listed in index.json");
    if (be)
        be->ops->destroy(be);
    cJSON_Delete(index);
    return check_done();
}
