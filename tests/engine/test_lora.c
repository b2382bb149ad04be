/* LoRA in the model (engine/model/lora.*, the CPU lora op):
 * - the segmented lora op against a double-precision reference: several
 *   segments of different ranks, gaps between them, decode- and
 *   prefill-sized row counts; rows outside every segment stay untouched;
 * - adapter_config.json: PEFT's target matching (suffixes, regular
 *   expressions, all-linear, exclude_modules), scales, refused features
 *   (test_lora_config.c, linked into this test);
 * - adapter loading errors on adapters derived from the fixture's (missing
 *   tensor, wrong shape, rank_pattern, untargeted or unknown modules, ...),
 *   the newer key layout and F16 weights loading to the same slot;
 * - golden: the base model and the two fixture adapters (every kind of
 *   Linear, r=8; text-only rsLoRA, r=4, by regex) against PEFT +
 *   transformers: prompt logits and 16 greedy tokens, in both cross-attention
 *   row-mask modes (transformers' own outputs; the same with Meta's row mask
 *   patched in, tests/golden/fixtures/reference_mode/lora);
 * - both adapters on an FP8 base (quantized at load): their effect on the
 *   logits against PEFT's on the bf16 model (test_fp8_base).
 *
 * Tolerances as in test_model_golden: the reference is a float32 forward of
 * the same bf16 weights, so the two differ by summation order only. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "dtype.h"
#include "harness.h"
#include "fixture_util.h" /* after harness.h */
#include "model/lora.h"
#include "model/mllama.h"
#include "checkpoint/safetensors.h"
#include "runtime_test_util.h"
#include "test_lora.h"
#include "test_rand.h"

#define FIXTURE ML_SOURCE_DIR "/tests/golden/fixtures/lora"
#define REFERENCE_FIXTURE ML_SOURCE_DIR "/tests/golden/fixtures/reference_mode/lora"
#define MODEL_DIR FIXTURE "/model"
#define A1 "a1_all_r8"
#define A2 "a2_text_rslora_r4"
#define GREEDY_STEPS 16
#define KV_BLOCK 16
#define TOL_LOGITS 2e-5
#define MAX_PROMPT 64
#define MAX_IMAGES 2
#define MAX_TILES 4

/* ---- the lora op ------------------------------------------------------- */

/* y += segments, in double, as the contract of backend.h states. */
static void lora_reference(float *y, const float *x, const ml_lora_segment *segs, int n_segs,
                           int K, int N)
{
    for (int s = 0; s < n_segs; s++) {
        const ml_lora_segment *g = &segs[s];
        for (int r = g->row_start; r < g->row_start + g->n_rows; r++) {
            double t[64];
            for (int j = 0; j < g->rank; j++) {
                t[j] = 0;
                for (int k = 0; k < K; k++)
                    t[j] += (double)x[(size_t)r * K + k] * ml_bf16_to_f32(g->a[(size_t)j * K + k]);
            }
            for (int n = 0; n < N; n++) {
                double u = 0;
                for (int j = 0; j < g->rank; j++)
                    u += t[j] * ml_bf16_to_f32(g->b[(size_t)n * g->rank + j]);
                y[(size_t)r * N + n] += (float)(g->scale * u);
            }
        }
    }
}

/* rows of x, segments {start, rows, rank} given as triples. */
static void op_case(ml_backend *be, int M, int K, int N, const int (*layout)[3], int n_segs,
                    const char *what)
{
    const int max_rank = 16;
    float *x = be->ops->alloc(be, (size_t)M * K * sizeof(float));
    float *y = be->ops->alloc(be, (size_t)M * N * sizeof(float));
    float *want = xmalloc((size_t)M * N * sizeof(float));
    float *scratch = be->ops->alloc(be, (size_t)M * max_rank * sizeof(float));
    uint16_t *w = xmalloc((size_t)n_segs * max_rank * (K + N) * sizeof *w);
    ml_lora_segment segs[8];
    fill(x, (size_t)M * K, -1, 1);
    fill(y, (size_t)M * N, -1, 1);
    memcpy(want, y, (size_t)M * N * sizeof *want);
    const float a_scale = 1.0f / sqrtf((float)K); /* x·A stays O(1) */
    for (int s = 0; s < n_segs; s++) {
        uint16_t *a = w + (size_t)s * max_rank * (K + N), *b = a + (size_t)max_rank * K;
        fill_bf16(a, (size_t)layout[s][2] * K, -a_scale, a_scale);
        fill_bf16(b, (size_t)N * layout[s][2], -1, 1);
        segs[s] = (ml_lora_segment){layout[s][0], layout[s][1], layout[s][2],
                                    0.75f + 0.5f * (float)s, a, b};
    }
    be->ops->lora(be, y, x, segs, n_segs, K, N, scratch, max_rank);
    lora_reference(want, x, segs, n_segs, K, N);
    /* Rows outside the segments keep their exact value (the reference adds
     * nothing there), so a stray write fails at any tolerance. */
    check_tensor(y, want, (size_t)M * N, 1e-5, 1e-5, what);
    be->ops->free(be, x);
    be->ops->free(be, y);
    be->ops->free(be, scratch);
    free(want);
    free(w);
}

static void test_op(ml_backend *be)
{
    static const int decode[][3] = {{0, 1, 8}, {1, 2, 16}, {4, 1, 4}, {6, 1, 1}};
    op_case(be, 8, 96, 200, decode, 4, "lora op, decode rows, 4 adapters, gaps");
    static const int prefill[][3] = {{3, 40, 16}, {43, 17, 5}, {70, 30, 8}};
    op_case(be, 100, 64, 130, prefill, 3, "lora op, prefill rows, 3 adapters");
    static const int one[][3] = {{0, 37, 3}};
    op_case(be, 37, 33, 1, one, 1, "lora op, N = 1, odd K");
}

/* ---- files ------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    check(f != NULL, "write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* An adapter directory derived from a fixture adapter: its config as JSON
 * and its tensors as views to edit, then written to dir. */
typedef struct scratch {
    char dir[256];
    cJSON *config;         /* owned */
    ml_safetensors *src;   /* owned: the fixture's tensors */
    ml_tensor_view *views; /* owned (n) */
    char (*names)[256];    /* owned (n) */
    size_t n;
    void *extra;           /* owned: data of an added or converted tensor, or NULL */
} scratch;

static void scratch_open(scratch *s, const char *dir, const char *fixture)
{
    char path[512], err[256];
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    snprintf(path, sizeof path, FIXTURE "/%s/" ML_LORA_CONFIG_FILE, fixture);
    size_t len;
    char *text = ml_tok_read_file(path, &len);
    s->config = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    snprintf(path, sizeof path, FIXTURE "/%s/" ML_LORA_WEIGHTS_FILE, fixture);
    if (!s->config || ml_safetensors_open(&s->src, path, err, sizeof err) != ML_OK) {
        fprintf(stderr, "fixture adapter %s unreadable: %s\n", fixture, err);
        exit(1);
    }
    s->n = ml_safetensors_count(s->src);
    s->views = calloc(s->n + 1, sizeof *s->views); /* + 1: room to add one */
    s->names = calloc(s->n + 1, sizeof *s->names);
    for (size_t i = 0; i < s->n; i++) {
        s->views[i] = *ml_safetensors_tensor(s->src, i);
        snprintf(s->names[i], sizeof s->names[i], "%s", s->views[i].name);
        s->views[i].name = s->names[i];
    }
}

/* The view whose name ends with suffix (the first), or NULL. */
static ml_tensor_view *scratch_find(scratch *s, const char *suffix)
{
    for (size_t i = 0; i < s->n; i++) {
        size_t n = strlen(s->names[i]), k = strlen(suffix);
        if (n >= k && !strcmp(s->names[i] + n - k, suffix))
            return &s->views[i];
    }
    return NULL;
}

/* Give view t (one of s's) a new name. */
static void scratch_rename(scratch *s, ml_tensor_view *t, const char *name)
{
    snprintf(s->names[t - s->views], sizeof s->names[0], "%s", name);
}

static void scratch_write(scratch *s)
{
    char path[512], err[256];
    char *text = cJSON_Print(s->config);
    snprintf(path, sizeof path, "%s/" ML_LORA_CONFIG_FILE, s->dir);
    write_text(path, text);
    free(text);
    snprintf(path, sizeof path, "%s/" ML_LORA_WEIGHTS_FILE, s->dir);
    check(ml_safetensors_write(path, s->views, s->n, err, sizeof err) == ML_OK, "write: %s",
          err);
}

static void scratch_close(scratch *s)
{
    char path[512];
    snprintf(path, sizeof path, "%s/" ML_LORA_CONFIG_FILE, s->dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/" ML_LORA_WEIGHTS_FILE, s->dir);
    unlink(path);
    cJSON_Delete(s->config);
    ml_safetensors_destroy(s->src);
    free(s->views);
    free(s->names);
    free(s->extra);
}

/* Write s and load it for cfg: the status, and the adapter when it loads. */
static ml_lora_adapter *scratch_load(scratch *s, const ml_config *cfg, ml_status want,
                                     const char *needle, const char *what)
{
    char err[512] = "";
    ml_lora_adapter *a = NULL;
    scratch_write(s);
    ml_status st = ml_lora_adapter_load(&a, s->dir, cfg, err, sizeof err);
    check(st == want, "%s: status %s, want %s (%s)", what, ml_status_name(st),
          ml_status_name(want), err);
    if (needle)
        check(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
    if (st != ML_OK) {
        fprintf(stderr, "  %-40s %s\n", what, err);
        return NULL;
    }
    return a;
}

/* ---- the model --------------------------------------------------------- */

typedef struct fixture {
    ml_backend *be;
    ml_model *m;
    ml_row_mask_mode mode;                  /* the model's, set at load */
    int S, N, T, V;
    int32_t ids[MAX_PROMPT];
    float *pixels;                          /* (N, T, 3, side, side) */
    int ar_ids[MAX_IMAGES];
    uint8_t ar_mask[MAX_IMAGES][MAX_TILES];
    uint8_t allowed[MAX_PROMPT * MAX_IMAGES * MAX_TILES]; /* (S, N·T) */
} fixture;

/* Each row-mask mode and the folder of its expected outputs (one
 * <case>/reference.safetensors per adapter case). */
static const struct {
    ml_row_mask_mode mode;
    const char *dir;
} MODES[] = {
    {ML_ROW_MASK_REFERENCE, REFERENCE_FIXTURE},
    {ML_ROW_MASK_TRANSFORMERS, FIXTURE},
};

/* fp8: the base's text Linears quantized to FP8 at load (model.weights =
 * "fp8"). */
static void load_fixture(fixture *f, ml_row_mask_mode mode, int fp8)
{
    char err[512];
    memset(f, 0, sizeof *f);
    f->mode = mode;
    f->be = ml_backend_cpu_create(2, err, sizeof err);
    if (!f->be) {
        fprintf(stderr, "cpu backend: %s\n", err);
        exit(1);
    }
    ml_safetensors *in = ml_rt_safetensors_open(FIXTURE "/inputs.safetensors");
    size_t n;
    int64_t *ids = ml_rt_read_i64(in, "input_ids", &n);
    f->S = (int)n;
    for (int i = 0; i < f->S; i++)
        f->ids[i] = (int32_t)ids[i];
    int64_t *ar = ml_rt_read_i64(in, "aspect_ratio_ids", &n);
    f->N = (int)n;
    int64_t *mask = ml_rt_read_i64(in, "aspect_ratio_mask", &n);
    f->T = (int)(n / (size_t)f->N);
    int64_t *xmask = ml_rt_read_i64(in, "cross_attention_mask", &n);
    for (size_t i = 0; i < n; i++)
        f->allowed[i] = xmask[i] != 0;

    ml_model_limits lim = ml_model_limits_default();
    lim.row_mask = mode;
    lim.max_step_tokens = f->S;
    lim.max_step_seqs = 1;
    lim.max_logit_rows = f->S;
    lim.max_seq_images = f->N;
    lim.kv_block_size = KV_BLOCK;
    lim.quantize_fp8 = fp8;
    if (ml_model_load(&f->m, MODEL_DIR, f->be, &lim, err, sizeof err) != ML_OK) {
        fprintf(stderr, "model: %s\n", err);
        exit(1);
    }
    const ml_config *cfg = ml_model_config(f->m);
    f->V = cfg->text.vocab_size;
    /* pixel_values_real_tiles back into their slots; the rest are zeros. */
    size_t tile = 3 * (size_t)cfg->vision.image_size * cfg->vision.image_size;
    const ml_tensor_view *real = ml_safetensors_find(in, "pixel_values_real_tiles");
    float *tiles = malloc((size_t)ml_tensor_view_numel(real) * sizeof *tiles);
    ml_tensor_view_read_f32(real, tiles, err, sizeof err);
    f->pixels = calloc((size_t)f->N * f->T * tile, sizeof *f->pixels);
    size_t next = 0;
    for (int i = 0; i < f->N; i++) {
        f->ar_ids[i] = (int)ar[i];
        for (int t = 0; t < f->T; t++) {
            f->ar_mask[i][t] = mask[i * f->T + t] != 0;
            if (f->ar_mask[i][t])
                memcpy(f->pixels + ((size_t)i * f->T + t) * tile, tiles + tile * next++,
                       tile * sizeof *tiles);
        }
    }
    free(tiles);
    free(ids);
    free(ar);
    free(mask);
    free(xmask);
    ml_safetensors_destroy(in);
}

static void free_fixture(fixture *f)
{
    free(f->pixels);
    ml_model_destroy(f->m);
    f->be->ops->destroy(f->be);
}

/* Load a fixture adapter (NULL name: none) into a new slot of rank 8. */
static ml_lora *slot_for(fixture *f, const char *name)
{
    if (!name)
        return NULL;
    char dir[512], err[512];
    snprintf(dir, sizeof dir, FIXTURE "/%s", name);
    ml_lora_adapter *a = NULL;
    ml_lora *l = NULL;
    if (ml_lora_adapter_load(&a, dir, ml_model_config(f->m), err, sizeof err) != ML_OK ||
        ml_lora_create(&l, f->m, 8, err, sizeof err) != ML_OK ||
        ml_lora_set(l, a, err, sizeof err) != ML_OK) {
        check(0, "adapter %s: %s", name, err);
        ml_lora_destroy(l);
        l = NULL;
    }
    ml_lora_adapter_destroy(a);
    return l;
}

/* Prompt logits (S, V) of the fixture prompt with adapter lora, and with
 * greedy != NULL the reference tokens fed back for GREEDY_STEPS steps,
 * counting argmax mismatches in *mismatches. */
static float *run_model(fixture *f, const ml_lora *lora, const int64_t *greedy, int *mismatches)
{
    char err[512];
    const ml_config *cfg = ml_model_config(f->m);
    size_t state_bytes = ml_model_image_state_bytes(f->m);
    void *states[MAX_IMAGES];
    for (int i = 0; i < f->N; i++) {
        size_t tile = 3 * (size_t)cfg->vision.image_size * cfg->vision.image_size;
        states[i] = f->be->ops->alloc(f->be, state_bytes);
        check(ml_model_encode_image(f->m, f->pixels + (size_t)i * f->T * tile, f->ar_ids[i],
                                    f->ar_mask[i], lora, states[i], NULL, err,
                                    sizeof err) == ML_OK,
              "encode %d: %s", i, err);
    }
    int ctx = f->S + GREEDY_STEPS, n_blocks = (ctx + KV_BLOCK - 1) / KV_BLOCK;
    ml_kv_cache *kv;
    check(ml_kv_cache_create(&kv, f->be, cfg->text.num_hidden_layers - cfg->text.n_cross_layers,
                             n_blocks, KV_BLOCK, cfg->text.num_key_value_heads,
                             cfg->text.head_dim, err, sizeof err) == ML_OK,
          "kv: %s", err);
    int32_t table[64], tokens[MAX_PROMPT + GREEDY_STEPS];
    for (int i = 0; i < n_blocks; i++)
        table[i] = ml_kv_cache_alloc(kv);
    memcpy(tokens, f->ids, (size_t)f->S * sizeof *tokens);
    int chunks = f->N * f->T;
    ml_step_seq q = {.tokens = tokens, .n_tokens = f->S, .pos0 = 0, .block_table = table,
                     .n_images = f->N, .image_states = (const void *const *)states,
                     .cross_allowed = f->allowed, .logits = 2, .lora = lora};
    float *logits = malloc((size_t)f->S * f->V * sizeof *logits);
    check(ml_model_forward(f->m, kv, &q, 1, logits, NULL, err, sizeof err) == ML_OK,
          "prefill: %s", err);
    float *row = malloc((size_t)f->V * sizeof *row);
    memcpy(row, logits + (size_t)(f->S - 1) * f->V, (size_t)f->V * sizeof *row);
    for (int step = 0; greedy && step < GREEDY_STEPS; step++) {
        *mismatches += ml_fx_argmax(row, f->V) != (int)greedy[step];
        if (step + 1 == GREEDY_STEPS)
            break;
        /* Feed the reference token so one divergence does not cascade; decode
         * rows reuse the last prompt row of the cross-attention mask. */
        tokens[f->S + step] = (int32_t)greedy[step];
        q = (ml_step_seq){.tokens = tokens + f->S + step, .n_tokens = 1, .pos0 = f->S + step,
                          .block_table = table, .n_images = f->N,
                          .image_states = (const void *const *)states,
                          .cross_allowed = f->allowed + (size_t)(f->S - 1) * chunks, .logits = 1,
                          .lora = lora};
        check(ml_model_forward(f->m, kv, &q, 1, row, NULL, err, sizeof err) == ML_OK,
              "decode %d: %s", step, err);
    }
    free(row);
    ml_kv_cache_destroy(kv);
    for (int i = 0; i < f->N; i++)
        f->be->ops->free(f->be, states[i]);
    return logits;
}

/* One golden case: `name` is the adapter (NULL: base), `ref` its folder
 * under `dir` (MODES). */
static void golden_case(fixture *f, const char *name, const char *dir, const char *ref)
{
    char path[512], err[512], label[128];
    snprintf(path, sizeof path, "%s/%s/reference.safetensors", dir, ref);
    snprintf(label, sizeof label, "%s (%s)", ref, ml_row_mask_mode_name(f->mode));
    ml_safetensors *st;
    if (ml_safetensors_open(&st, path, err, sizeof err) != ML_OK) {
        check(0, "%s", err);
        return;
    }
    size_t n_logits = (size_t)f->S * f->V, n_greedy;
    float *want = malloc(n_logits * sizeof *want);
    ml_tensor_view_read_f32(ml_safetensors_find(st, "logits"), want, err, sizeof err);
    int64_t *greedy = ml_rt_read_i64(st, "greedy_tokens", &n_greedy);
    check(n_greedy == GREEDY_STEPS, "%s: %zu greedy tokens", ref, n_greedy);

    ml_lora *lora = slot_for(f, name);
    int mismatches = 0;
    float *got = run_model(f, lora, greedy, &mismatches);
    char what[160];
    snprintf(what, sizeof what, "%s prompt logits", label);
    ml_fx_compare(got, want, n_logits, TOL_LOGITS, what);
    check(mismatches == 0, "%s: %d of %d greedy tokens differ from PEFT generate()", label,
          mismatches, GREEDY_STEPS);
    free(got);
    free(want);
    free(greedy);
    ml_lora_destroy(lora);
    ml_safetensors_destroy(st);
}

/* Prompt logits (S, V) of a golden reference case under dir. */
static float *reference_logits(const char *dir, const char *ref, size_t n)
{
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/%s/reference.safetensors", dir, ref);
    ml_safetensors *st;
    float *want = malloc(n * sizeof *want);
    if (ml_safetensors_open(&st, path, err, sizeof err) != ML_OK) {
        check(0, "%s", err);
        memset(want, 0, n * sizeof *want);
        return want;
    }
    ml_tensor_view_read_f32(ml_safetensors_find(st, "logits"), want, err, sizeof err);
    ml_safetensors_destroy(st);
    return want;
}

/* LoRA on an FP8 base (model.weights = "fp8": the text decoder's Linears
 * quantized at load; adapters stay bf16, their delta added by the segmented
 * op after matmul_f8). An adapter's effect, prompt logits with it minus
 * without, must be PEFT's effect on the bf16 model to within
 * TOL_FP8_DELTA of that effect's largest value. Both of our runs share the
 * base's quantization, so what is left is the quantization's perturbation
 * of the adapter's own path, of the size FP8 costs the logits themselves
 * (0.06-0.10 of their scale on the fixtures, test_precision_fixtures); an
 * adapter dropped on the FP8 Linears would leave the whole of a text
 * adapter's effect (1.0) or most of an all-Linear one's. */
#define TOL_FP8_DELTA 0.25
static void test_fp8_base(void)
{
    fixture f;
    load_fixture(&f, ML_ROW_MASK_REFERENCE, 1);
    const size_t n = (size_t)f.S * f.V;
    float *base = run_model(&f, NULL, NULL, NULL);
    float *ref_base = reference_logits(REFERENCE_FIXTURE, "base", n);
    const char *const adapters[] = {A1, A2};
    for (size_t a = 0; a < sizeof adapters / sizeof adapters[0]; a++) {
        ml_lora *lora = slot_for(&f, adapters[a]);
        float *got = run_model(&f, lora, NULL, NULL);
        float *want = reference_logits(REFERENCE_FIXTURE, adapters[a], n);
        double scale = 0, err = 0;
        for (size_t i = 0; i < n; i++) {
            const double d_want = (double)want[i] - ref_base[i];
            const double d_got = (double)got[i] - base[i];
            scale = fmax(scale, fabs(d_want));
            err = fmax(err, fabs(d_got - d_want));
        }
        printf("  fp8 base + %-20s effect %.4g, off by %.4g (%.3g of it)\n", adapters[a], scale,
               err, err / scale);
        check(scale > 0 && err <= TOL_FP8_DELTA * scale,
              "fp8 base + %s: the adapter's effect is off by %.3g of its size", adapters[a],
              err / scale);
        free(got);
        free(want);
        ml_lora_destroy(lora);
    }
    free(base);
    free(ref_base);
    free_fixture(&f);
}

/* Logits of adapter a (host) through a fresh slot. */
static float *logits_with(fixture *f, const ml_lora_adapter *a)
{
    char err[512];
    ml_lora *l = NULL;
    check(ml_lora_create(&l, f->m, 8, err, sizeof err) == ML_OK &&
              ml_lora_set(l, a, err, sizeof err) == ML_OK,
          "slot: %s", err);
    float *logits = run_model(f, l, NULL, NULL);
    ml_lora_destroy(l);
    return logits;
}

/* ---- loading errors and variants --------------------------------------- */

/* Rename every key to the transformers >= 4.52 layout. */
static void to_new_layout(scratch *s)
{
    static const struct {
        const char *from, *to;
    } map[] = {
        {"base_model.model.language_model.model.", "base_model.model.model.language_model."},
        {"base_model.model.vision_model.", "base_model.model.model.vision_model."},
        {"base_model.model.multi_modal_projector.",
         "base_model.model.model.multi_modal_projector."},
        {"base_model.model.language_model.lm_head.", "base_model.model.lm_head."},
    };
    for (size_t i = 0; i < s->n; i++) {
        for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
            size_t len = strlen(map[k].from);
            if (strncmp(s->names[i], map[k].from, len))
                continue;
            char renamed[256];
            snprintf(renamed, sizeof renamed, "%s%s", map[k].to, s->names[i] + len);
            snprintf(s->names[i], sizeof s->names[i], "%s", renamed);
            break;
        }
    }
}

/* Loads the adapter in s, which must give the logits want (S, V) bit for
 * bit (no comparison when want is NULL), then closes s. */
static void expect_same_logits(fixture *f, scratch *s, const float *want, const char *what)
{
    ml_lora_adapter *a = scratch_load(s, ml_model_config(f->m), ML_OK, NULL, what);
    if (a && want) {
        float *got = logits_with(f, a);
        check(!memcmp(got, want, (size_t)f->S * f->V * sizeof *got),
              "%s: bit-identical logits", what);
        free(got);
    }
    ml_lora_adapter_destroy(a);
    scratch_close(s);
}

static void test_loading(fixture *f, const char *tmp)
{
    const ml_config *cfg = ml_model_config(f->m);
    char err[512];
    scratch s;
    ml_lora_adapter *a;

    /* As written by PEFT, through the scratch path: every module kind. */
    scratch_open(&s, tmp, A1);
    a = scratch_load(&s, cfg, ML_OK, NULL, "a1 rewritten");
    int n_vision = cfg->vision.num_hidden_layers + cfg->vision.num_global_layers;
    check(a && ml_lora_adapter_n_modules(a) == n_vision * 6 + 2 + cfg->text.num_hidden_layers * 7,
          "a1 adapts every Linear");
    check(a && ml_lora_adapter_touches_images(a) && ml_lora_adapter_rank(a) == 8 &&
              ml_lora_adapter_scale(a) == 2.0f,
          "a1 rank, scale, images");
    float *want = a ? logits_with(f, a) : NULL;
    ml_lora_adapter_destroy(a);
    scratch_close(&s);

    /* The newer key layout gives the same adapter. */
    scratch_open(&s, tmp, A1);
    to_new_layout(&s);
    expect_same_logits(f, &s, want, "new key layout");

    /* F32 weights (the same bf16 values) give the same adapter too. */
    scratch_open(&s, tmp, A1);
    size_t total = 0;
    for (size_t i = 0; i < s.n; i++)
        total += (size_t)ml_tensor_view_numel(&s.views[i]);
    float *f32 = s.extra = malloc(total * sizeof *f32);
    for (size_t i = 0; i < s.n; i++) {
        ml_tensor_view_read_f32(&s.views[i], f32, err, sizeof err);
        s.views[i].data = f32;
        s.views[i].dtype = ML_DTYPE_F32;
        s.views[i].nbytes *= 2;
        f32 += ml_tensor_view_numel(&s.views[i]);
    }
    expect_same_logits(f, &s, want, "f32 weights");
    free(want);

    /* PEFT's frozen lm_head copy (save_embedding_layers) is accepted when it
     * has the base layer's shape. */
    scratch_open(&s, tmp, A1);
    size_t head = (size_t)cfg->text.vocab_size * cfg->text.hidden_size;
    s.extra = calloc(head, sizeof(uint16_t));
    s.views[s.n] = (ml_tensor_view){.name = s.names[s.n], .dtype = ML_DTYPE_BF16, .ndim = 2,
                                    .shape = {cfg->text.vocab_size, cfg->text.hidden_size},
                                    .data = s.extra, .nbytes = head * sizeof(uint16_t)};
    s.n++;
    scratch_rename(&s, &s.views[s.n - 1],
                   "base_model.model.language_model.lm_head.base_layer.weight");
    ml_lora_adapter_destroy(scratch_load(&s, cfg, ML_OK, NULL, "lm_head base_layer copy"));
    s.views[s.n - 1].shape[0] = cfg->text.vocab_size / 2;
    s.views[s.n - 1].shape[1] = cfg->text.hidden_size * 2;
    scratch_load(&s, cfg, ML_ERR_FORMAT, "base_layer.weight has shape", "base_layer shape");
    scratch_close(&s);

    /* A missing tensor of a targeted module. */
    scratch_open(&s, tmp, A1);
    ml_tensor_view *t = scratch_find(&s, "layers.2.cross_attn.k_proj.lora_B.weight");
    check(t != NULL, "fixture has cross k lora_B");
    if (t) {
        *t = s.views[--s.n];
        scratch_load(&s, cfg, ML_ERR_NOT_FOUND,
                     "language_model.model.layers.2.cross_attn.k_proj.lora_B.weight",
                     "missing tensor");
    }
    scratch_close(&s);

    /* A wrong shape (same size). */
    scratch_open(&s, tmp, A1);
    t = scratch_find(&s, "transformer.layers.1.mlp.fc1.lora_A.weight");
    if (t) {
        t->shape[0] /= 2;
        t->shape[1] *= 2;
        scratch_load(&s, cfg, ML_ERR_FORMAT, "transformer.layers.1.mlp.fc1.lora_A.weight has shape",
                     "wrong shape");
    }
    scratch_close(&s);

    /* r in the config disagrees with the tensors. */
    scratch_open(&s, tmp, A1);
    cJSON_ReplaceItemInObject(s.config, "r", cJSON_CreateNumber(16));
    scratch_load(&s, cfg, ML_ERR_FORMAT, "expected (16,", "r disagrees");
    scratch_close(&s);

    /* rank_pattern, modules_to_save: refused. */
    scratch_open(&s, tmp, A1);
    cJSON *pattern = cJSON_CreateObject();
    cJSON_AddNumberToObject(pattern, "q_proj", 4);
    cJSON_ReplaceItemInObject(s.config, "rank_pattern", pattern);
    scratch_load(&s, cfg, ML_ERR_UNSUPPORTED, "rank_pattern", "rank_pattern");
    scratch_close(&s);
    scratch_open(&s, tmp, A1);
    const char *save[] = {"lm_head"};
    cJSON_ReplaceItemInObject(s.config, "modules_to_save", cJSON_CreateStringArray(save, 1));
    scratch_load(&s, cfg, ML_ERR_UNSUPPORTED, "modules_to_save", "modules_to_save");
    scratch_close(&s);

    /* A tensor of a module target_modules does not name. */
    scratch_open(&s, tmp, A1);
    const char *fewer[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj", "fc1", "fc2", "multi_modal_projector"};
    cJSON_ReplaceItemInObject(s.config, "target_modules", cJSON_CreateStringArray(fewer, 10));
    scratch_load(&s, cfg, ML_ERR_FORMAT, "which target_modules does not name", "untargeted");
    scratch_close(&s);

    /* Tensors of modules that are no adaptable Linear, or not LoRA A/B. */
    scratch_open(&s, tmp, A1);
    t = scratch_find(&s, "lm_head.lora_A.weight");
    check(t != NULL, "fixture has lm_head lora_A");
    if (!t) {
        scratch_close(&s);
        return;
    }
    scratch_rename(&s, t, "base_model.model.language_model.model.embed_tokens.lora_A.weight");
    scratch_load(&s, cfg, ML_ERR_UNSUPPORTED, "not an adaptable Linear", "embedding");
    scratch_rename(&s, t, "base_model.model.language_model.model.layers.9.mlp.up_proj."
                          "lora_A.weight");
    scratch_load(&s, cfg, ML_ERR_UNSUPPORTED, "layers.9.mlp.up_proj", "layer out of range");
    scratch_rename(&s, t, "base_model.model.language_model.lm_head.lora_magnitude_vector");
    scratch_load(&s, cfg, ML_ERR_UNSUPPORTED, "not a LoRA A or B weight", "DoRA magnitude");
    scratch_rename(&s, t, "language_model.lm_head.lora_A.weight");
    scratch_load(&s, cfg, ML_ERR_FORMAT, "not a PEFT adapter key", "no PEFT prefix");
    scratch_close(&s);

    /* Missing files. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/nowhere", tmp);
    a = NULL;
    check(ml_lora_adapter_load(&a, dir, cfg, err, sizeof err) == ML_ERR_NOT_FOUND && !a,
          "no adapter_config.json: %s", err);
    scratch_open(&s, tmp, A2);
    scratch_write(&s);
    char path[600];
    snprintf(path, sizeof path, "%s/" ML_LORA_WEIGHTS_FILE, tmp);
    unlink(path);
    check(ml_lora_adapter_load(&a, tmp, cfg, err, sizeof err) == ML_ERR_NOT_FOUND &&
              strstr(err, "adapter_model.bin is not supported"),
          "no safetensors: %s", err);
    scratch_close(&s);

    /* Slots: the rank bounds. */
    ml_lora *l = NULL;
    check(ml_lora_create(&l, f->m, ml_model_limits_of(f->m)->max_lora_rank + 1, err,
                         sizeof err) == ML_ERR_INVALID_ARG && !l,
          "slot rank above the model limit refused");
    char a1_dir[512];
    snprintf(a1_dir, sizeof a1_dir, FIXTURE "/" A1);
    if (ml_lora_adapter_load(&a, a1_dir, cfg, err, sizeof err) == ML_OK &&
        ml_lora_create(&l, f->m, 4, err, sizeof err) == ML_OK) {
        check(ml_lora_set(l, a, err, sizeof err) == ML_ERR_INVALID_ARG &&
                  !ml_lora_touches_images(l),
              "rank 8 into a rank-4 slot refused, slot empty");
    }
    ml_lora_destroy(l);
    ml_lora_adapter_destroy(a);
}

int main(void)
{
    char err[256];
    ml_backend *be = ml_backend_cpu_create(2, err, sizeof err);
    if (!be) {
        fprintf(stderr, "cpu backend: %s\n", err);
        return 1;
    }
    test_op(be);
    be->ops->destroy(be);
    test_config();

    /* The last mode's model stays loaded for the loading tests. */
    fixture f;
    for (size_t k = 0; k < sizeof MODES / sizeof MODES[0]; k++) {
        if (k)
            free_fixture(&f);
        load_fixture(&f, MODES[k].mode, 0);
        golden_case(&f, NULL, MODES[k].dir, "base");
        golden_case(&f, A1, MODES[k].dir, A1);
        golden_case(&f, A2, MODES[k].dir, A2);
    }

    char tmp[] = "/tmp/ml_test_lora_XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    test_loading(&f, tmp);
    rmdir(tmp);

    free_fixture(&f);
    test_fp8_base();
    return check_done();
}
