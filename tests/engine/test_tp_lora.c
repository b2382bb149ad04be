/* Multi-LoRA on a tensor-parallel model (ml_model_load_tp): the LoRA golden
 * fixture (m3's configuration: 8 heads over 2 K/V heads, two images) split
 * over a CPU group of 2, its slots made by the runtime's adapter slots
 * (engine/runtime/adapters.c), against the whole model with the same slots:
 * - images encoded under adapter 1 (which adapts the vision tower, the
 *   projector and the cross-attention k/v) give the whole model's
 *   projector output, and under the base model too;
 * - one batch mixing adapter 1 (two sequences in a row, one group, and a
 *   third later), adapter 2 (text-only rsLoRA) and the base model, with and
 *   without images: every sequence's prompt logits and per-step logits
 *   match the whole model's, and 8 greedy tokens are identical; the
 *   sequences with images match PEFT + transformers' logits and tokens;
 * - the runtime with adapter slots on each model: a mixed batch of
 *   requests joining at different steps gives the same tokens;
 * - the slot API on the split model: per-device slot bytes, a failed set
 *   empties every rank's part (the logits are then the base model's, bit
 *   for bit), and slots of another model are refused by step and encode.
 *
 * Tolerance: TP_TOL (2e-5 of the whole model's largest logit, the golden
 * tolerance of test_tensor_parallel). A shard sums its row-parallel
 * Linears (o_proj, down_proj, vision fc2) and their LoRA (x_shard ·
 * A_shardᵀ) · Bᵀ over its input range before the all-reduce adds the
 * shards, so the sums run in another order than the whole model's: equal
 * up to f32 rounding, not bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "fixture_util.h" /* after harness.h */
#include "model/lora.h"
#include "runtime/adapters.h"
#include "runtime_test_util.h"
#include "test_rand.h"

#define WORLD 2
#define A1 "a1_all_r8"          /* every Linear, r = 8: touches images */
#define A2 "a2_text_rslora_r4"  /* text only, rsLoRA r = 4 */
#define MAX_LORA_RANK 8
#define SLOTS 2
#define DECODE_STEPS 8
#define KV_BLOCK 16
#define TP_TOL 2e-5
#define GOLDEN_TOL 2e-5        /* test_lora's: PEFT's float32 forward of the same weights */
#define MAX_SEQS 8
#define MAX_STEP_TOKENS 256
#define RT_KV_BLOCKS 64
#define RT_IMAGE_SLOTS 4 /* both images, base and under A1 */

/* A sequence of the batch: the fixture prompt under an adapter (NULL: the
 * base model), with both images or none (image tokens replaced by a
 * filler). */
typedef struct seq_spec {
    const char *adapter;
    int images;
    const char *ref; /* the golden case it reproduces, NULL if none */
} seq_spec;

/* Sequences 0 and 1 form one group of every LoRA op, 6 another of A1. */
static const seq_spec batch[] = {
    {A1, 1, A1},
    {A1, 0, NULL},
    {NULL, 1, "base"},
    {A2, 1, A2},
    {NULL, 0, NULL},
    {A2, 0, NULL},
    {A1, 1, A1},
};
enum { N_SEQS = sizeof batch / sizeof batch[0] };

static int resolve(void *ctx, const char *name, char *dir, size_t n)
{
    (void)ctx;
    snprintf(dir, n, ML_RT_LORA_FIXTURE "/%s", name);
    return !strcmp(name, A1) || !strcmp(name, A2);
}

/* ---- running a batch ----------------------------------------------------------------- */

/* The whole model or the split one, with its adapter slots. */
typedef struct served {
    ml_rt_fixture f;         /* f.model, f.be borrowed for the split model */
    ml_adapters *adapters;   /* owned */
    ml_adapter *held[SLOTS]; /* acquired: A1, A2 */
    const char *what;
} served;

static const ml_lora *slot_of(const served *s, const char *adapter)
{
    if (!adapter)
        return NULL;
    return ml_adapter_lora(s->held[!strcmp(adapter, A1) ? 0 : 1]);
}

static void served_open(served *s, const char *what)
{
    char err[512] = "";
    s->what = what;
    check(ml_adapters_create(&s->adapters, s->f.model, SLOTS, MAX_LORA_RANK, resolve, NULL, err,
                             sizeof err) == ML_OK,
          "%s: adapter slots: %s", what, err);
    const char *names[SLOTS] = {A1, A2};
    for (int i = 0; i < SLOTS && s->adapters; i++)
        check(ml_adapters_acquire(s->adapters, names[i], &s->held[i], err, sizeof err) ==
                  ML_ADAPTER_READY,
              "%s: load %s: %s", what, names[i], err);
}

static void served_close(served *s)
{
    for (int i = 0; i < SLOTS; i++)
        if (s->held[i])
            ml_adapters_release(s->adapters, s->held[i]);
    ml_adapters_destroy(s->adapters);
}

/* What one run of the batch gave. */
typedef struct batch_out {
    float *proj;    /* (2 encodes: base then A1, images, T·P, D) projector outputs */
    float *prefill; /* (n · S, V) prompt logits of the n sequences */
    float *steps;   /* (DECODE_STEPS, n, V) decode logits */
    int32_t tokens[N_SEQS][DECODE_STEPS]; /* greedy, each sequence its own */
} batch_out;

static void batch_out_free(batch_out *o)
{
    free(o->proj);
    free(o->prefill);
    free(o->steps);
}

/* Projector outputs of one image, in floats. */
static size_t proj_floats(const ml_model *m)
{
    const ml_config *cfg = ml_model_config(m);
    return (size_t)cfg->vision.max_num_tiles * ml_config_num_patches(cfg) *
           cfg->text.hidden_size;
}

/* Encode both fixture images under lora into states (allocated here). */
static void encode(const served *s, const ml_lora *lora, void **states, float *proj)
{
    char err[512] = "";
    ml_model *m = s->f.model;
    for (int i = 0; i < ML_RT_IMAGES; i++) {
        states[i] = ml_model_image_state_alloc(m);
        ml_vision_taps taps = {.projector_output = proj + (size_t)i * proj_floats(m)};
        check(states[i] &&
                  ml_model_encode_image(m, s->f.pixels + (size_t)i * s->f.slot_floats,
                                        s->f.ar_ids[i], s->f.ar_mask[i], lora, states[i], &taps,
                                        err, sizeof err) == ML_OK,
              "%s: encode image %d: %s", s->what, i, err);
    }
}

/* The fixture's cross_attention_mask (S, images · T), 1 = may attend. */
static uint8_t *fixture_allowed(int S, int T)
{
    ml_safetensors *in = ml_rt_safetensors_open(ML_RT_LORA_FIXTURE "/inputs.safetensors");
    size_t n;
    int64_t *mask = ml_rt_read_i64(in, "cross_attention_mask", &n);
    if (n != (size_t)S * ML_RT_IMAGES * T) {
        fprintf(stderr, "cross_attention_mask: %zu entries, want %d\n", n,
                S * ML_RT_IMAGES * T);
        exit(1);
    }
    uint8_t *allowed = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        allowed[i] = mask[i] != 0;
    free(mask);
    ml_safetensors_destroy(in);
    return allowed;
}

/* Run seqs (n of them) as one prefill step with every prompt logit, then
 * DECODE_STEPS greedy steps; image states are encoded under each
 * sequence's adapter when it touches images, else shared base states. */
static void run_batch(const served *s, const seq_spec *seqs, int n, const ml_lora *const *slots,
                      batch_out *out)
{
    char err[512] = "";
    ml_model *m = s->f.model;
    const ml_config *cfg = ml_model_config(m);
    int S = s->f.n_prompt, V = cfg->text.vocab_size, T = s->f.T, NT = ML_RT_IMAGES * T;
    int ctx = S + DECODE_STEPS, blocks = (ctx + KV_BLOCK - 1) / KV_BLOCK;
    size_t pf = proj_floats(m);
    out->proj = xmalloc(2 * ML_RT_IMAGES * pf * sizeof *out->proj);
    out->prefill = xmalloc((size_t)n * S * V * sizeof *out->prefill);
    out->steps = xmalloc((size_t)DECODE_STEPS * n * V * sizeof *out->steps);

    /* States: base, and under the one adapter that touches images (A1). */
    void *base_states[ML_RT_IMAGES], *a1_states[ML_RT_IMAGES];
    encode(s, NULL, base_states, out->proj);
    encode(s, slot_of(s, A1), a1_states, out->proj + ML_RT_IMAGES * pf);

    uint8_t *mask = fixture_allowed(S, T);
    uint8_t *allowed = xmalloc((size_t)ctx * NT); /* decode rows repeat the last */
    memcpy(allowed, mask, (size_t)S * NT);
    for (int t = S; t < ctx; t++)
        memcpy(allowed + (size_t)t * NT, mask + (size_t)(S - 1) * NT, (size_t)NT);
    ml_kv_cache *kv = NULL;
    check(ml_model_kv_cache_create(&kv, m, n * blocks, err, sizeof err) == ML_OK, "%s: kv: %s",
          s->what, err);
    int32_t *tables = xmalloc((size_t)n * blocks * sizeof *tables);
    int32_t *tokens = xmalloc((size_t)n * ctx * sizeof *tokens);
    ml_step_seq q[MAX_SEQS];
    const int32_t image_token = cfg->image_token_index;
    for (int i = 0; i < n && kv; i++) {
        for (int b = 0; b < blocks; b++)
            tables[i * blocks + b] = ml_kv_cache_alloc(kv);
        for (int t = 0; t < S; t++) {
            int32_t id = s->f.prompt[t];
            tokens[i * ctx + t] = !seqs[i].images && id == image_token ? ML_RT_FILLER_TOKEN : id;
        }
        int own = slots[i] && ml_lora_touches_images(slots[i]);
        q[i] = (ml_step_seq){
            .tokens = tokens + i * ctx, .n_tokens = S, .block_table = tables + i * blocks,
            .n_images = seqs[i].images ? ML_RT_IMAGES : 0,
            .image_states = (const void *const *)(own ? a1_states : base_states),
            .cross_allowed = seqs[i].images ? allowed : NULL, .logits = ML_LOGITS_ALL,
            .lora = slots[i]};
    }
    float *rows = xmalloc((size_t)n * V * sizeof *rows);
    ml_status st = kv ? ml_model_forward(m, kv, q, n, out->prefill, NULL, err, sizeof err)
                      : ML_ERR_NOMEM;
    check(st == ML_OK, "%s: prefill: %s", s->what, err);
    for (int i = 0; i < n; i++)
        memcpy(rows + (size_t)i * V, out->prefill + ((size_t)i * S + S - 1) * V,
               (size_t)V * sizeof *rows);
    for (int step = 0; step < DECODE_STEPS && st == ML_OK; step++) {
        memcpy(out->steps + (size_t)step * n * V, rows, (size_t)n * V * sizeof *rows);
        for (int i = 0; i < n; i++)
            out->tokens[i][step] = ml_fx_argmax(rows + (size_t)i * V, V);
        if (step + 1 == DECODE_STEPS)
            break;
        for (int i = 0; i < n; i++) {
            int at = S + step;
            tokens[i * ctx + at] = out->tokens[i][step];
            q[i].tokens = tokens + i * ctx + at;
            q[i].n_tokens = 1;
            q[i].pos0 = at;
            q[i].cross_allowed = q[i].n_images ? allowed + (size_t)at * NT : NULL;
            q[i].logits = ML_LOGITS_LAST;
        }
        st = ml_model_forward(m, kv, q, n, rows, NULL, err, sizeof err);
        check(st == ML_OK, "%s: decode step %d: %s", s->what, step, err);
    }
    free(rows);
    free(tokens);
    free(tables);
    free(allowed);
    free(mask);
    ml_kv_cache_destroy(kv);
    for (int i = 0; i < ML_RT_IMAGES; i++) {
        ml_model_image_state_free(m, base_states[i]);
        ml_model_image_state_free(m, a1_states[i]);
    }
}

/* ---- checks -------------------------------------------------------------------------- */

/* The largest |got - want| over n values, relative to want's magnitude. */
static double rel_diff(const float *got, const float *want, size_t n)
{
    double worst = 0, scale = ml_fx_max_abs(want, n);
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    return scale > 0 ? worst / scale : worst;
}

/* Sequence i's prompt logits and greedy tokens against PEFT's reference. */
static void check_golden(const served *s, const batch_out *o, int i)
{
    char path[512], err[256] = "";
    ml_rt_lora_expected_path(path, sizeof path, batch[i].ref, ml_rt_limits().row_mask);
    ml_safetensors *ref = ml_rt_safetensors_open(path);
    int S = s->f.n_prompt, V = ml_model_config(s->f.model)->text.vocab_size;
    size_t n_greedy;
    float *want = xmalloc((size_t)S * V * sizeof *want);
    const ml_tensor_view *logits = ml_safetensors_find(ref, "logits");
    int64_t *greedy = ml_rt_read_i64(ref, "greedy_tokens", &n_greedy);
    if (!logits || ml_tensor_view_numel(logits) != (int64_t)S * V ||
        ml_tensor_view_read_f32(logits, want, err, sizeof err) != ML_OK ||
        n_greedy < DECODE_STEPS) {
        fprintf(stderr, "%s: logits (%d, %d) and %d greedy tokens expected %s\n", path, S, V,
                DECODE_STEPS, err);
        exit(1);
    }
    double d = rel_diff(o->prefill + (size_t)i * S * V, want, (size_t)S * V);
    int same = 1;
    for (int t = 0; t < DECODE_STEPS; t++)
        same &= o->tokens[i][t] == (int32_t)greedy[t];
    check(d <= GOLDEN_TOL && same,
          "%s, sequence %d (%s): prompt logits off PEFT by %.3g of scale, greedy tokens %s",
          s->what, i, batch[i].ref, d, same ? "equal" : "differ");
    free(want);
    free(greedy);
    ml_safetensors_destroy(ref);
}

/* The split model against the whole one on the mixed batch. */
static void test_mixed_batch(const served *whole, const served *tp)
{
    const ml_lora *ws[N_SEQS], *ts[N_SEQS];
    for (int i = 0; i < N_SEQS; i++) {
        ws[i] = slot_of(whole, batch[i].adapter);
        ts[i] = slot_of(tp, batch[i].adapter);
    }
    batch_out a = {0}, b = {0};
    run_batch(whole, batch, N_SEQS, ws, &a);
    run_batch(tp, batch, N_SEQS, ts, &b);
    const ml_config *cfg = ml_model_config(whole->f.model);
    int S = whole->f.n_prompt, V = cfg->text.vocab_size;
    size_t pf = proj_floats(whole->f.model);

    double d = rel_diff(b.proj, a.proj, ML_RT_IMAGES * pf);
    check(d <= TP_TOL, "base encode: projector output off the whole model's by %.3g", d);
    fprintf(stderr, "  base images: projector output within %.3g of scale\n", d);
    d = rel_diff(b.proj + ML_RT_IMAGES * pf, a.proj + ML_RT_IMAGES * pf, ML_RT_IMAGES * pf);
    check(d <= TP_TOL, "a1 encode: projector output off the whole model's by %.3g", d);
    check(rel_diff(a.proj + ML_RT_IMAGES * pf, a.proj, ML_RT_IMAGES * pf) > 100 * TP_TOL,
          "a1 changes the projector output (else the comparison proves nothing)");
    fprintf(stderr, "  a1 images: projector output within %.3g of scale\n", d);

    for (int i = 0; i < N_SEQS; i++) {
        const char *name = batch[i].adapter ? batch[i].adapter : "base";
        d = rel_diff(b.prefill + (size_t)i * S * V, a.prefill + (size_t)i * S * V,
                     (size_t)S * V);
        double worst_step = 0;
        for (int step = 0; step < DECODE_STEPS; step++)
            worst_step = fmax(worst_step,
                              rel_diff(b.steps + ((size_t)step * N_SEQS + i) * V,
                                       a.steps + ((size_t)step * N_SEQS + i) * V, (size_t)V));
        int same = !memcmp(a.tokens[i], b.tokens[i], sizeof a.tokens[i]);
        check(d <= TP_TOL && worst_step <= TP_TOL && same,
              "sequence %d (%s, %s): split prompt logits off by %.3g, step logits by %.3g, "
              "greedy tokens %s",
              i, name, batch[i].images ? "images" : "text", d, worst_step,
              same ? "equal" : "differ");
        fprintf(stderr, "  sequence %d %-18s %-6s prompt %.3g, steps %.3g of scale, tokens %s\n",
                i, name, batch[i].images ? "images" : "text", d, worst_step,
                same ? "equal" : "DIFFER");
        if (batch[i].ref) {
            check_golden(whole, &a, i);
            check_golden(tp, &b, i);
        }
    }
    batch_out_free(&a);
    batch_out_free(&b);
}

/* The runtime over each model, adapter slots included: the split model's
 * requests give the whole model's tokens. */
static void test_runtime(served *whole, served *tp)
{
    static const ml_rt_kind kinds[] = {ML_RT_TWO_IMAGES, ML_RT_TWO_IMAGES, ML_RT_TEXT_ONLY,
                                       ML_RT_TWO_IMAGES, ML_RT_ONE_IMAGE,  ML_RT_TEXT_ONLY};
    static const char *const adapters[] = {A1, NULL, A2, A2, A1, NULL};
    static const int max_tokens[] = {10, 8, 12, 9, 7, 6};
    enum { N = sizeof kinds / sizeof kinds[0] };
    served *models[2] = {whole, tp};
    ml_rt_result r[2][N];
    memset(r, 0, sizeof r);
    for (int k = 0; k < 2; k++) {
        ml_runtime_config rc = ml_rt_config(&models[k]->f, RT_KV_BLOCKS, RT_IMAGE_SLOTS);
        rc.max_adapters = SLOTS;
        rc.resolve_adapter = resolve;
        ml_runtime *rt = ml_rt_runtime_create(&models[k]->f, &rc);
        for (int i = 0; i < N; i++) {
            ml_rt_submit(&models[k]->f, rt,
                         &(ml_rt_request){.kind = kinds[i], .max_tokens = max_tokens[i],
                                          .adapter = adapters[i]},
                         &r[k][i]);
            ml_rt_steps(rt, 2); /* requests join while others decode */
        }
        ml_rt_drain(rt, 0);
        ml_runtime_destroy(rt);
    }
    for (int i = 0; i < N; i++)
        check(r[1][i].reason == ML_FINISH_REASON_LENGTH && ml_rt_same_output(&r[1][i], &r[0][i]),
              "runtime request %d (%s, kind %d): split %d tokens equal the whole model's %d (%s)",
              i, adapters[i] ? adapters[i] : "base", kinds[i], r[1][i].n_out, r[0][i].n_out,
              r[1][i].message);
}

/* ml_lora_* directly on the split model. */
static void test_slot_api(const served *whole, const served *tp)
{
    char err[512] = "";
    ml_model *m = tp->f.model;
    size_t per_device = ml_lora_slot_bytes(m, MAX_LORA_RANK);
    size_t all = ml_lora_slot_bytes(whole->f.model, MAX_LORA_RANK);
    /* The split Linears' parts are 1/WORLD, the replicated ones whole. */
    check(per_device < all && per_device * WORLD > all,
          "a device holds %zu of a slot's %zu bytes", per_device, all);
    ml_adapters_stats st;
    ml_adapters_get_stats(tp->adapters, &st);
    check(st.bytes == SLOTS * per_device && st.resident == SLOTS,
          "the adapter slots report %zu bytes per device", st.bytes);

    /* A failed set leaves every rank's part empty: the base model's logits. */
    ml_lora_adapter *a1 = NULL, *a2 = NULL;
    ml_lora *small = NULL;
    const int small_rank = 4; /* A2's rank, below A1's */
    const ml_config *cfg = ml_model_config(m);
    check(ml_lora_adapter_load(&a1, ML_RT_LORA_FIXTURE "/" A1, cfg, err, sizeof err) == ML_OK &&
              ml_lora_adapter_load(&a2, ML_RT_LORA_FIXTURE "/" A2, cfg, err, sizeof err) ==
                  ML_OK &&
              ml_lora_create(&small, m, small_rank, err, sizeof err) == ML_OK,
          "a rank-%d slot on the split model: %s", small_rank, err);
    if (small && a1 && a2) {
        check(ml_lora_set(small, a2, err, sizeof err) == ML_OK, "a2 into it: %s", err);
        check(ml_lora_set(small, a1, err, sizeof err) == ML_ERR_INVALID_ARG &&
                  !ml_lora_touches_images(small) && strstr(err, "exceeds the slot rank"),
              "then a1 (rank 8) is refused: %s", err);
        const seq_spec one[] = {{NULL, 1, NULL}};
        const ml_lora *none[] = {NULL}, *emptied_slot[] = {small};
        batch_out base = {0}, emptied = {0};
        run_batch(tp, one, 1, none, &base);
        run_batch(tp, one, 1, emptied_slot, &emptied);
        size_t n = (size_t)tp->f.n_prompt * cfg->text.vocab_size;
        check(!memcmp(base.prefill, emptied.prefill, n * sizeof *base.prefill),
              "the emptied split slot gives the base model's logits bit for bit");
        batch_out_free(&base);
        batch_out_free(&emptied);
    }
    ml_lora_destroy(small);
    ml_lora_adapter_destroy(a1);
    ml_lora_adapter_destroy(a2);

    /* Slots of another model: refused by the step and the encode, both ways. */
    const served *pair[2][2] = {{tp, whole}, {whole, tp}}; /* model, slot owner */
    for (int k = 0; k < 2; k++) {
        ml_model *mk = pair[k][0]->f.model;
        const char *what = k ? "a split slot in the whole model" : "a whole slot in the split one";
        ml_kv_cache *kv = NULL;
        check(ml_model_kv_cache_create(&kv, mk, 1, err, sizeof err) == ML_OK, "kv: %s", err);
        int32_t token = ML_RT_FILLER_TOKEN, table[1] = {kv ? ml_kv_cache_alloc(kv) : 0};
        float *logits = xmalloc((size_t)cfg->text.vocab_size * sizeof *logits);
        ml_step_seq q = {.tokens = &token, .n_tokens = 1, .block_table = table,
                         .logits = ML_LOGITS_LAST, .lora = slot_of(pair[k][1], A2)};
        check(kv && ml_model_forward(mk, kv, &q, 1, logits, NULL, err, sizeof err) ==
                        ML_ERR_INVALID_ARG &&
                  strstr(err, "another model"),
              "%s's step is refused: %s", what, err);
        void *state = ml_model_image_state_alloc(mk);
        check(state &&
                  ml_model_encode_image(mk, pair[k][0]->f.pixels, pair[k][0]->f.ar_ids[0],
                                        pair[k][0]->f.ar_mask[0], slot_of(pair[k][1], A1),
                                        state, NULL, err, sizeof err) == ML_ERR_INVALID_ARG &&
                  strstr(err, "another model"),
              "%s's encode is refused: %s", what, err);
        q.lora = NULL;
        check(kv && ml_model_forward(mk, kv, &q, 1, logits, NULL, err, sizeof err) == ML_OK,
              "%s: the model serves after the refusals: %s", what, err);
        ml_model_image_state_free(mk, state);
        ml_kv_cache_destroy(kv);
        free(logits);
    }
}

int main(void)
{
    ml_model_limits lim = ml_rt_limits();
    lim.max_lora_rank = MAX_LORA_RANK;
    lim.max_step_seqs = MAX_SEQS;
    lim.max_step_tokens = MAX_STEP_TOKENS;
    lim.max_logit_rows = MAX_STEP_TOKENS;
    lim.kv_block_size = KV_BLOCK;
    served whole = {0}, tp = {0};
    ml_rt_fixture_open_lora(&whole.f, &lim);
    if (whole.f.n_prompt * N_SEQS > MAX_STEP_TOKENS) {
        fprintf(stderr, "the fixture prompt (%d tokens) does not fit %d sequences\n",
                whole.f.n_prompt, N_SEQS);
        return 1;
    }

    char err[512] = "";
    ml_backend *group[WORLD] = {0};
    ml_model *split = NULL;
    check(ml_backend_cpu_create_group(WORLD, 1, group, err, sizeof err) == ML_OK &&
              ml_model_load_tp(&split, ML_RT_LORA_FIXTURE "/model", group, WORLD, &lim, err,
                               sizeof err) == ML_OK,
          "the LoRA fixture on a CPU group of %d: %s", WORLD, err);
    if (split) {
        tp.f = whole.f;
        tp.f.be = group[0];
        tp.f.model = split;
        served_open(&whole, "whole");
        served_open(&tp, "split");
        if (whole.held[1] && tp.held[1]) {
            fprintf(stderr, "== LoRA fixture, whole vs a CPU group of %d\n", WORLD);
            test_mixed_batch(&whole, &tp);
            test_runtime(&whole, &tp);
            test_slot_api(&whole, &tp);
        }
        served_close(&tp);
        served_close(&whole);
    }
    ml_model_destroy(split);
    for (int r = 0; r < WORLD; r++)
        if (group[r])
            group[r]->ops->destroy(group[r]);
    ml_rt_fixture_close(&whole.f);
    return check_done();
}
