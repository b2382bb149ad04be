/* Tensor parallelism on the CPU (engine/model/README.md §11): every golden fixture model
 * whose heads and MLP widths divide by 2 is loaded as 2 shards on a CPU
 * group, each driven by its own thread, and must reproduce transformers as
 * the whole model does (test_model_golden): projector output, prompt logits
 * and per-step logits within the same tolerance, identical greedy tokens.
 * The two shards' logits must be bit-identical (the all-reduce gives every
 * rank the same sums). A model on a group of one must equal the model on a
 * plain backend bit for bit, and a world that does not divide a fixture's
 * dimensions is refused at load. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "fixture_util.h"
#include "model/lora.h"

#define WORLD 2
#define GREEDY_STEPS 8
#define KV_BLOCK 16
/* test_model_golden's tolerances, relative to the reference's scale. */
#define TOL_VISION 2e-5
#define TOL_LOGITS 2e-5

/* One shard's run of a fixture, on its own thread; results in host memory. */
typedef struct shard_run {
    ml_model *m;              /* borrowed */
    ml_safetensors *ref;      /* borrowed */
    ml_kv_cache *kv;          /* borrowed: the group's cache, a pool set per rank */
    const int32_t *tables;    /* borrowed (B, blocks_per_seq): the same block ids on every rank */
    ml_fx_prompt pr;          /* owned: each shard feeds its own token copy */
    float *proj;              /* (B·N, T·P·D) projector outputs */
    float *logits;            /* (B·S, V) prompt logits */
    float *steps;             /* (B, GREEDY_STEPS, V) decode logits */
    ml_status st;
    char err[512];
} shard_run;

/* Encode every image slot, prefill all rows in one step, then decode
 * GREEDY_STEPS steps feeding the reference tokens, as test_model_golden. */
static void *shard_main(void *arg)
{
    shard_run *r = arg;
    ml_model *m = r->m;
    ml_backend *be = ml_model_backend(m);
    const ml_config *cfg = ml_model_config(m);
    ml_fx_prompt *pr = &r->pr;
    int B = pr->B, S = pr->S, N = pr->N, T = pr->T, V = cfg->text.vocab_size;
    int P = ml_config_num_patches(cfg);
    size_t psz = (size_t)T * P * cfg->text.hidden_size;
    void **states = calloc((size_t)B * N + 1, sizeof *states);
    float *pixels = N ? ml_fx_f32(r->ref, "pixel_values", NULL) : NULL;
    float *ar_ids = N ? ml_fx_f32(r->ref, "aspect_ratio_ids", NULL) : NULL;
    float *ar_mask = N ? ml_fx_f32(r->ref, "aspect_ratio_mask", NULL) : NULL;
    size_t slot = (size_t)T * cfg->vision.num_channels * cfg->vision.image_size *
                  cfg->vision.image_size;
    r->st = ML_OK;
    for (int i = 0; i < B * N && r->st == ML_OK; i++) {
        uint8_t mask[ML_CONFIG_MAX_ASPECT_RATIOS];
        for (int t = 0; t < T; t++)
            mask[t] = ar_mask[i * T + t] != 0;
        states[i] = be->ops->alloc(be, ml_model_image_state_bytes(m));
        ml_vision_taps taps = {.projector_output = r->proj + i * psz};
        r->st = ml_model_encode_image(m, pixels + i * slot, (int)ar_ids[i], mask, NULL, states[i],
                                      &taps, r->err, sizeof r->err);
    }

    int blocks_per_seq = (pr->ctx + KV_BLOCK - 1) / KV_BLOCK;
    ml_step_seq *seqs = calloc((size_t)B, sizeof *seqs);
    float *row_logits = malloc((size_t)B * V * sizeof *row_logits);
    if (r->st == ML_OK) {
        for (int b = 0; b < B; b++)
            seqs[b] = ml_fx_prefill_seq(pr, b, r->tables + b * blocks_per_seq, states + b * N);
        r->st = ml_model_forward(m, r->kv, seqs, B, r->logits, NULL, r->err, sizeof r->err);
        for (int b = 0; b < B; b++)
            memcpy(row_logits + (size_t)b * V, r->logits + ((size_t)b * S + S - 1) * V,
                   (size_t)V * sizeof(float));
    }
    for (int step = 0; step < GREEDY_STEPS && r->st == ML_OK; step++) {
        for (int b = 0; b < B; b++) {
            memcpy(r->steps + ((size_t)b * GREEDY_STEPS + step) * V, row_logits + (size_t)b * V,
                   (size_t)V * sizeof(float));
            ml_fx_decode_seq(pr, b, step, &seqs[b]);
        }
        if (step + 1 < GREEDY_STEPS)
            r->st = ml_model_forward(m, r->kv, seqs, B, row_logits, NULL, r->err, sizeof r->err);
    }

    free(row_logits);
    free(seqs);
    for (int i = 0; i < B * N; i++)
        be->ops->free(be, states[i]);
    free(states);
    free(pixels);
    free(ar_ids);
    free(ar_mask);
    return NULL;
}

/* Load `world` shards of fixture dir on bes (one group) and run them, one
 * thread each, into runs[0 .. world) (free_runs). Returns the first load
 * status (nothing run, runs untouched unless ML_OK), err filled. */
static ml_status run_shards(const char *dir, ml_safetensors *ref, ml_backend **bes, int world,
                            shard_run *runs, char *err, size_t errlen)
{
    char path[1200];
    ml_config cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ml_status st = ml_config_load(&cfg, path, err, errlen);
    if (st != ML_OK)
        return st;
    ml_fx_prompt probe;
    ml_fx_prompt_load(&probe, ref, cfg.vision.max_num_tiles, GREEDY_STEPS);
    ml_model_limits lim = ml_model_limits_default();
    lim.row_mask = ML_ROW_MASK_TRANSFORMERS; /* the fixtures are transformers 4.47's */
    lim.max_step_tokens = probe.B * probe.S;
    lim.max_step_seqs = probe.B;
    lim.max_logit_rows = probe.B * probe.S;
    lim.max_seq_images = probe.N;
    lim.kv_block_size = KV_BLOCK;
    size_t psz = (size_t)probe.T * ml_config_num_patches(&cfg) * cfg.text.hidden_size;
    size_t V = (size_t)cfg.text.vocab_size;

    ml_model *models[WORLD] = {0};
    for (int r = 0; r < world && st == ML_OK; r++)
        st = ml_model_load_shard(&models[r], dir, bes[r], &lim, r, world, err, errlen);
    /* One cache for the group, its blocks taken before the shards run. */
    int blocks_per_seq = (probe.ctx + KV_BLOCK - 1) / KV_BLOCK;
    ml_kv_cache *kv = NULL;
    int32_t *tables = malloc((size_t)probe.B * blocks_per_seq * sizeof *tables);
    if (st == ML_OK)
        st = ml_kv_cache_create_group(&kv, bes, world,
                                      cfg.text.num_hidden_layers - cfg.text.n_cross_layers,
                                      probe.B * blocks_per_seq, KV_BLOCK,
                                      ml_model_kv_heads(models[0]), cfg.text.head_dim, err,
                                      errlen);
    for (int i = 0; st == ML_OK && i < probe.B * blocks_per_seq; i++)
        tables[i] = ml_kv_cache_alloc(kv);
    pthread_t th[WORLD];
    int started = 0;
    for (int r = 0; r < world && st == ML_OK; r++) {
        runs[r] = (shard_run){.m = models[r], .ref = ref, .kv = kv, .tables = tables};
        ml_fx_prompt_load(&runs[r].pr, ref, probe.T, GREEDY_STEPS);
        runs[r].proj = malloc(((size_t)probe.B * probe.N * psz + 1) * sizeof(float));
        runs[r].logits = malloc((size_t)probe.B * probe.S * V * sizeof(float));
        runs[r].steps = malloc((size_t)probe.B * GREEDY_STEPS * V * sizeof(float));
    }
    for (int r = 0; r < world && st == ML_OK; r++, started++)
        if (pthread_create(&th[r], NULL, shard_main, &runs[r]) != 0) {
            /* The started shards would wait for this one at the first collective. */
            fprintf(stderr, "pthread_create failed\n");
            exit(2);
        }
    for (int r = 0; r < started; r++) {
        pthread_join(th[r], NULL);
        check(runs[r].st == ML_OK, "shard %d of %d: %s", r, world, runs[r].err);
    }
    ml_kv_cache_destroy(kv);
    free(tables);
    for (int r = 0; r < world; r++)
        ml_model_destroy(models[r]);
    ml_fx_prompt_free(&probe);
    return st;
}

static void free_runs(shard_run *runs, int world)
{
    for (int r = 0; r < world; r++) {
        ml_fx_prompt_free(&runs[r].pr);
        free(runs[r].proj);
        free(runs[r].logits);
        free(runs[r].steps);
    }
}

/* Shard 0's results against transformers; every shard's logits against
 * shard 0's, bit for bit. */
static void check_against_reference(const char *name, ml_safetensors *ref, const shard_run *runs,
                                    int world)
{
    const ml_fx_prompt *pr = &runs[0].pr;
    int B = pr->B, S = pr->S, N = pr->N;
    size_t nl, np = 0;
    float *ref_logits = ml_fx_f32(ref, "logits", &nl);
    float *ref_proj = N ? ml_fx_f32(ref, "projector_output", &np) : NULL;
    float *step_ref = ml_fx_f32(ref, "step_logits", NULL); /* (B, ref steps, V) */
    int ref_steps = (int)ml_safetensors_find(ref, "greedy_tokens")->shape[1];
    int V = (int)(nl / ((size_t)B * S));
    char what[160];
    if (N) {
        snprintf(what, sizeof what, "%s world %d projector_output", name, world);
        ml_fx_compare(runs[0].proj, ref_proj, np, TOL_VISION, what);
    }
    snprintf(what, sizeof what, "%s world %d prefill logits", name, world);
    ml_fx_compare(runs[0].logits, ref_logits, nl, TOL_LOGITS, what);

    int mismatches = 0;
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int step = 0; step < GREEDY_STEPS; step++) {
            const float *got = runs[0].steps + ((size_t)b * GREEDY_STEPS + step) * V;
            const float *want = step_ref + ((size_t)b * ref_steps + step) * V;
            float scale = ml_fx_max_abs(want, (size_t)V);
            for (int v = 0; v < V; v++)
                worst = fmax(worst, fabs(got[v] - want[v]) / scale);
            mismatches += ml_fx_argmax(got, V) != (int)pr->greedy[b * GREEDY_STEPS + step];
        }
    check(worst <= TOL_LOGITS, "%s world %d: step logits off by %.3g of their scale", name,
          world, worst);
    check(mismatches == 0, "%s world %d: %d of %d greedy tokens differ from generate()", name,
          world, mismatches, B * GREEDY_STEPS);
    fprintf(stderr, "  %-40s max step-logit error %.3g of scale\n", "greedy decode", worst);

    for (int r = 1; r < world; r++) {
        check(memcmp(runs[r].logits, runs[0].logits, nl * sizeof(float)) == 0,
              "%s: shard %d prefill logits differ from shard 0's", name, r);
        check(memcmp(runs[r].steps, runs[0].steps,
                     (size_t)B * GREEDY_STEPS * V * sizeof(float)) == 0,
              "%s: shard %d decode logits differ from shard 0's", name, r);
    }
    free(ref_logits);
    free(ref_proj);
    free(step_ref);
}

/* The fixture on `world` shards against the reference; with world 1 also
 * on a plain backend, bit for bit. Returns 0 when world does not divide
 * the model (checked to be refused as unsupported). */
static int run_fixture(const char *name, ml_backend **group, int world, ml_backend *plain)
{
    char dir[1024], path[1200], err[512];
    snprintf(dir, sizeof dir, "%s/%s", ML_FX_DIR, name);
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ml_safetensors *ref;
    if (ml_safetensors_open(&ref, path, err, sizeof err) != ML_OK) {
        check(0, "%s: %s", name, err);
        return 0;
    }
    shard_run runs[WORLD];
    ml_status st = run_shards(dir, ref, group, world, runs, err, sizeof err);
    if (st == ML_ERR_UNSUPPORTED) {
        fprintf(stderr, "== %s: not split into %d (%s)\n", name, world, err);
        check(strstr(err, "does not divide") != NULL, "%s: refused for another reason: %s",
              name, err);
        ml_safetensors_destroy(ref);
        return 0;
    }
    check(st == ML_OK, "%s: load %d shards: %s", name, world, err);
    if (st == ML_OK) {
        fprintf(stderr, "== %s on a group of %d\n", name, world);
        check_against_reference(name, ref, runs, world);
        if (plain) {
            shard_run whole[1];
            st = run_shards(dir, ref, &plain, 1, whole, err, sizeof err);
            check(st == ML_OK, "%s: plain load: %s", name, err);
            if (st == ML_OK) {
                size_t nl = (size_t)runs[0].pr.B * runs[0].pr.S *
                            (size_t)ml_safetensors_find(ref, "logits")->shape[2];
                size_t ns = (size_t)runs[0].pr.B * GREEDY_STEPS * (nl / runs[0].pr.B / runs[0].pr.S);
                check(memcmp(whole[0].logits, runs[0].logits, nl * sizeof(float)) == 0 &&
                          memcmp(whole[0].steps, runs[0].steps, ns * sizeof(float)) == 0,
                      "%s: a group of one differs from the plain backend", name);
                free_runs(whole, 1);
            }
        }
        free_runs(runs, world);
    }
    ml_safetensors_destroy(ref);
    return st == ML_OK;
}

int main(void)
{
    char err[256];
    const cJSON *models, *it;
    cJSON *index = ml_fx_index(&models);
    ml_backend *pair[WORLD], *single[1];
    ml_backend *plain = ml_backend_cpu_create(1, err, sizeof err);
    check(plain != NULL, "cpu backend: %s", err);
    check(ml_backend_cpu_create_group(WORLD, 1, pair, err, sizeof err) == ML_OK,
          "cpu group of %d: %s", WORLD, err);
    check(ml_backend_cpu_create_group(1, 1, single, err, sizeof err) == ML_OK,
          "cpu group of 1: %s", err);
    check(ml_backend_cpu_create_group(0, 1, pair, err, sizeof err) == ML_ERR_INVALID_ARG,
          "a group of 0 is refused");

    int split = 0, whole = 0;
    char dir[1024] = ""; /* a fixture that splits */
    if (plain && pair[0] && single[0]) {
        cJSON_ArrayForEach(it, models)
        {
            if (!cJSON_IsString(it))
                continue;
            if (run_fixture(it->valuestring, pair, WORLD, NULL) && !split++)
                snprintf(dir, sizeof dir, "%s/%s", ML_FX_DIR, it->valuestring);
            whole += run_fixture(it->valuestring, single, 1, plain);
        }
    }
    check(split > 0, "no fixture model splits into %d shards", WORLD);
    check(whole > 0, "no fixture model ran on a group of one");

    /* A shard refuses LoRA, and a lone backend refuses world > 1. */
    if (plain && dir[0]) {
        ml_model *m = NULL;
        check(ml_model_load_shard(&m, dir, plain, NULL, 0, WORLD, err, sizeof err) ==
                  ML_ERR_UNSUPPORTED,
              "world %d on a backend without all_reduce_sum is refused", WORLD);
        check(ml_model_load_shard(&m, dir, plain, NULL, WORLD, WORLD, err, sizeof err) ==
                  ML_ERR_INVALID_ARG,
              "rank == world is refused");
    }
    if (pair[0] && plain && dir[0]) {
        ml_model *m = NULL;
        ml_lora *slot = NULL;
        ml_status st = ml_model_load_shard(&m, dir, pair[0], NULL, 0, WORLD, err, sizeof err);
        check(st == ML_OK, "shard 0 of %s: %s", dir, err);
        ml_model *unsplit = NULL;
        if (st == ML_OK)
            st = ml_model_load(&unsplit, dir, plain, NULL, err, sizeof err);
        check(st == ML_OK, "%s: %s", dir, err);
        if (st == ML_OK) {
            check(ml_lora_create(&slot, m, 8, err, sizeof err) == ML_ERR_UNSUPPORTED,
                  "a LoRA slot on a shard is refused");
            check(ml_model_kv_heads(m) * WORLD == ml_model_kv_heads(unsplit) &&
                      ml_model_image_state_bytes(m) * WORLD == ml_model_image_state_bytes(unsplit),
                  "a shard caches 1/%d of the K/V heads and image state", WORLD);
        }
        ml_model_destroy(unsplit);
        ml_model_destroy(m);
    }

    for (int r = 0; r < WORLD; r++)
        if (pair[r])
            pair[r]->ops->destroy(pair[r]);
    if (single[0])
        single[0]->ops->destroy(single[0]);
    if (plain)
        plain->ops->destroy(plain);
    cJSON_Delete(index);
    return check_done();
}
