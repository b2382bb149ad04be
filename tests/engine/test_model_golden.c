/* The whole model against transformers on every golden fixture model
 * (tests/golden/fixtures/models, made by gen_fixtures.py): vision output,
 * projector output, every decoder hidden state and the logits of the prompt,
 * then 32 greedy tokens decoded step by step against generate() and its
 * per-step logits. All batch rows of a fixture run in one batched step.
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
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "harness.h"
#include "model/mllama.h"
#include "model/safetensors.h"

#define FIXTURES ML_SOURCE_DIR "/tests/golden/fixtures/models"
#define GREEDY_STEPS 32
#define KV_BLOCK 16
/* Tolerance relative to the reference tensor's largest magnitude. */
#define TOL_VISION 2e-5
#define TOL_HIDDEN 2e-5
#define TOL_LOGITS 2e-5

typedef struct ref_file {
    ml_safetensors *st;
} ref_file;

/* A reference tensor as f32 (ints converted), malloc'd; numel in *n. */
static float *ref_f32(ref_file *r, const char *name, size_t *n)
{
    const ml_tensor_view *t = ml_safetensors_find(r->st, name);
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

static const ml_tensor_view *ref_view(ref_file *r, const char *name)
{
    return ml_safetensors_find(r->st, name);
}

static float max_abs(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* Compare with a tolerance scaled by the reference's largest magnitude. */
static void compare(const float *got, const float *want, size_t n, double tol, const char *what)
{
    check_tensor(got, want, n, tol * max_abs(want, n), 0, what);
}

static int argmax_row(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static void run_fixture(ml_backend *be, const char *name)
{
    char dir[1024], path[1200], err[512];
    snprintf(dir, sizeof dir, "%s/%s", FIXTURES, name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    fprintf(stderr, "== %s\n", name);
    ref_file ref;
    if (ml_safetensors_open(&ref.st, path, err, sizeof err) != ML_OK) {
        check(0, "%s: %s", name, err);
        return;
    }
    const ml_tensor_view *ids_v = ref_view(&ref, "input_ids");
    int B = (int)ids_v->shape[0], S = (int)ids_v->shape[1];
    const ml_tensor_view *pix_v = ref_view(&ref, "pixel_values");
    int N = pix_v ? (int)pix_v->shape[1] : 0;

    ml_model_limits lim = ml_model_limits_default();
    lim.max_step_tokens = B * S;
    lim.max_step_seqs = B;
    lim.max_logit_rows = B * S;
    lim.max_seq_images = N;
    lim.kv_block_size = KV_BLOCK;
    ml_model *m;
    if (ml_model_load(&m, dir, be, &lim, err, sizeof err) != ML_OK) {
        check(0, "%s: load: %s", name, err);
        ml_safetensors_destroy(ref.st);
        return;
    }
    const ml_config *cfg = ml_model_config(m);
    int V = cfg->text.vocab_size, D = cfg->text.hidden_size, L = cfg->text.num_hidden_layers;
    int T = cfg->vision.max_num_tiles, P = 0;

    /* ---- vision: every image slot of every row, as transformers runs them */
    void **states = calloc((size_t)B * N + 1, sizeof *states);
    if (N) {
        float *pixels = ref_f32(&ref, "pixel_values", NULL);
        float *ar_ids = ref_f32(&ref, "aspect_ratio_ids", NULL);
        float *ar_mask = ref_f32(&ref, "aspect_ratio_mask", NULL);
        float *vout = ref_f32(&ref, "vision_output", NULL);
        float *proj = ref_f32(&ref, "projector_output", NULL);
        const ml_tensor_view *vo = ref_view(&ref, "vision_output");
        P = (int)vo->shape[3];
        size_t slot = (size_t)T * 3 * cfg->vision.image_size * cfg->vision.image_size;
        size_t vsz = (size_t)T * P * cfg->vision.vision_output_dim, psz = (size_t)T * P * D;
        float *got_v = malloc(vsz * sizeof *got_v), *got_p = malloc(psz * sizeof *got_p);
        for (int i = 0; i < B * N; i++) {
            uint8_t mask[16];
            for (int t = 0; t < T; t++)
                mask[t] = ar_mask[i * T + t] != 0;
            states[i] = be->ops->alloc(be, ml_model_image_state_bytes(m));
            ml_vision_taps taps = {got_v, got_p};
            ml_status st = ml_model_encode_image(m, pixels + i * slot, (int)ar_ids[i], mask,
                                                 NULL, states[i], &taps, err, sizeof err);
            check(st == ML_OK, "%s: encode %d: %s", name, i, err);
            char what[128];
            snprintf(what, sizeof what, "%s image %d vision_output", name, i);
            compare(got_v, vout + i * vsz, vsz, TOL_VISION, what);
            snprintf(what, sizeof what, "%s image %d projector_output", name, i);
            compare(got_p, proj + i * psz, psz, TOL_VISION, what);
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
    float *ids_f = ref_f32(&ref, "input_ids", NULL);
    float *xmask = N ? ref_f32(&ref, "cross_attention_mask", NULL) : NULL; /* (B, S, N, T) */
    int ctx = S + GREEDY_STEPS;
    int blocks_per_seq = (ctx + KV_BLOCK - 1) / KV_BLOCK;
    ml_kv_cache *kv;
    int n_self = L - cfg->text.n_cross_layers;
    check(ml_kv_cache_create(&kv, be, n_self, B * blocks_per_seq, KV_BLOCK,
                             cfg->text.num_key_value_heads, cfg->text.head_dim, err,
                             sizeof err) == ML_OK,
          "kv cache: %s", err);
    int32_t *tokens = malloc((size_t)B * ctx * sizeof *tokens);
    int32_t *tables = malloc((size_t)B * blocks_per_seq * sizeof *tables);
    uint8_t *allowed = calloc((size_t)B * ctx * (N ? N : 1) * T, 1);
    ml_step_seq *seqs = calloc((size_t)B, sizeof *seqs);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < blocks_per_seq; i++)
            tables[b * blocks_per_seq + i] = ml_kv_cache_alloc(kv);
        for (int s = 0; s < S; s++)
            tokens[b * ctx + s] = (int32_t)ids_f[b * S + s];
        /* cross_attention_mask rows, then the last row repeated for decode
         * tokens (_update_model_kwargs_for_generation, spec §8). */
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
    ml_status st = ml_model_forward(m, kv, seqs, B, logits, &taps, err, sizeof err);
    check(st == ML_OK, "%s: prefill: %s", name, err);
    size_t nh;
    float *ref_hidden = ref_f32(&ref, "text_hidden_states", &nh);
    for (int l = 0; l <= L; l++) {
        char what[128];
        snprintf(what, sizeof what, "%s hidden_states[%d]", name, l);
        size_t layer = (size_t)B * S * D;
        compare(hidden + l * layer, ref_hidden + l * layer, layer, TOL_HIDDEN, what);
    }
    size_t nl;
    float *ref_logits = ref_f32(&ref, "logits", &nl);
    compare(logits, ref_logits, nl, TOL_LOGITS, "prefill logits");

    /* ---- greedy decode, all rows together -------------------------------- */
    float *greedy = ref_f32(&ref, "greedy_tokens", NULL);    /* (B, 32) */
    float *step_ref = ref_f32(&ref, "step_logits", NULL);    /* (B, 32, V) */
    float *row_logits = malloc((size_t)B * V * sizeof *row_logits);
    for (int b = 0; b < B; b++)
        memcpy(row_logits + (size_t)b * V, logits + ((size_t)b * S + S - 1) * V,
               (size_t)V * sizeof(float));
    int mismatches = 0;
    double worst = 0;
    for (int step = 0; step < GREEDY_STEPS && st == ML_OK; step++) {
        for (int b = 0; b < B; b++) {
            const float *want = step_ref + ((size_t)b * GREEDY_STEPS + step) * V;
            float scale = max_abs(want, (size_t)V);
            for (int v = 0; v < V; v++)
                worst = fmax(worst, fabs(row_logits[(size_t)b * V + v] - want[v]) / scale);
            int tok = argmax_row(row_logits + (size_t)b * V, V);
            mismatches += tok != (int)greedy[b * GREEDY_STEPS + step];
            /* Feed the reference token, so one divergence does not cascade. */
            tokens[b * ctx + S + step] = (int32_t)greedy[b * GREEDY_STEPS + step];
            seqs[b].tokens = tokens + b * ctx + S + step;
            seqs[b].n_tokens = 1;
            seqs[b].pos0 = S + step;
            seqs[b].cross_allowed = N ? allowed + ((size_t)b * ctx + S + step) * N * T : NULL;
            seqs[b].logits = 1;
        }
        if (step + 1 < GREEDY_STEPS)
            st = ml_model_forward(m, kv, seqs, B, row_logits, NULL, err, sizeof err);
        check(st == ML_OK, "%s: decode step %d: %s", name, step, err);
    }
    fprintf(stderr, "  %-40s max step-logit error %.3g of scale\n", "greedy decode", worst);
    check(worst <= TOL_LOGITS, "%s: step logits off by %.3g of their scale", name, worst);
    check(mismatches == 0, "%s: %d of %d greedy tokens differ from generate()", name, mismatches,
          B * GREEDY_STEPS);

    free(greedy);
    free(step_ref);
    free(row_logits);
    free(ref_logits);
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
        be->ops->free(be, states[i]);
    free(states);
    ml_kv_cache_destroy(kv);
    ml_model_destroy(m);
    ml_safetensors_destroy(ref.st);
}

int main(void)
{
    char err[256];
    size_t len;
    FILE *f = fopen(FIXTURES "/index.json", "rb");
    if (!f)
        ml_test_skip("no fixture models (tests/golden/fixtures/models/index.json)");
    static char buf[1 << 16];
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    cJSON *index = cJSON_ParseWithLength(buf, len);
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(index, "models"), *it;
    ml_backend *be = ml_backend_cpu_create(2, err, sizeof err);
    check(be != NULL, "cpu backend: %s", err);
    int n = 0;
    cJSON_ArrayForEach(it, models)
    {
        if (be && cJSON_IsString(it)) {
            run_fixture(be, it->valuestring);
            n++;
        }
    }
    check(n > 0, "no models listed in index.json");
    if (be)
        be->ops->destroy(be);
    cJSON_Delete(index);
    return check_done();
}
