/* The memory plan (engine/model/memory_plan.h) on the published 90B
 * shapes: a header-only fake of the Llama-3.2-90B-Vision-Instruct
 * FP8-dynamic checkpoint (mkmodel --preset 90b --fp8 --header-only) loads
 * without reading its weights, its plan on one H200 fits with a stated
 * K/V pool and image states, and the bf16 90B fits one H200 only as two
 * tensor-parallel shards. Every expected number is derived here from the
 * config (not from the manifest the plan counts). */
#include "model_test_util.h" /* first: _GNU_SOURCE */

#include <sys/stat.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "harness.h"
#include "checkpoint/mkmodel.h"
#include "model/mllama.h"
#include "checkpoint/quant_config.h"
#include "checkpoint/weights.h"

#define TOKENIZER_DIR ML_SOURCE_DIR "/config/tokenizer"
#define GIB ML_PLAN_GIB

/* Llama-3.2-90B-Vision config.json (mkmodel.c's 90b preset). */
#define D 8192LL       /* text hidden */
#define I 28672LL      /* text MLP */
#define KVW 1024LL     /* 8 K/V heads x 128 */
#define LAYERS 100LL
#define CROSS 20LL
#define VOCAB 128256LL
#define DV 1280LL      /* vision hidden */
#define IV 5120LL
#define PATCHES 1601LL /* (560/14)^2 + CLS */
#define TILES 4LL
#define ASPECTS 9LL    /* 8 ratios + padding id */
#define VLAYERS 40LL   /* 32 local + 8 global */
#define VOUT 7680LL    /* 1280 x (1 + 5 intermediate layers) */

/* One decoder layer's Linears, self or cross alike: q (D, D), k and v
 * (KVW, D), o (D, D), gate and up (I, D), down (D, I). */
#define LINEAR_PARAMS (2 * D * D + 2 * KVW * D + 3 * I * D)
#define LINEAR_ROWS (2 * D + 2 * KVW + 2 * I + D)
/* FP8: 1 byte a parameter: 85,563,801,600 B. */
#define EXPECT_FP8 (LAYERS * LINEAR_PARAMS)
/* One f32 scale a row: 33,587,200 B. */
#define EXPECT_SCALES (LAYERS * LINEAR_ROWS * 4)
/* bf16, as published: embed_tokens (vocab + 8 rows), lm_head, final norm, two
 * norms a layer, cross q_norm/k_norm (128). The gates (shape (1)) are read
 * into floats at load and are not resident. */
#define TEXT_BF16 ((VOCAB + 8) * D + VOCAB * D + D + 2 * D * LAYERS + CROSS * 2 * 128)
/* A vision layer: q, k, v, o, fc1 + bias, fc2 + bias, two LayerNorms. */
#define VISION_LAYER (4 * DV * DV + IV * DV + IV + DV * IV + DV + 4 * DV)
/* The tower: patch conv, class embedding, position embedding, tile
 * position embedding, pre/post tile embeddings, layernorm_pre/post, the
 * layers. */
#define VISION (DV * 3 * 14 * 14 + DV + PATCHES * DV + ASPECTS * TILES * PATCHES * DV + \
                2 * ASPECTS * TILES * DV + 4 * DV + VLAYERS * VISION_LAYER)
#define PROJECTOR (D * VOUT + D)
/* 6,059,107,328 B. */
#define EXPECT_BF16 (2 * (TEXT_BF16 + VISION + PROJECTOR))

/* The CUDA backend's plan inputs: bf16 K/V, 16-token blocks. A self layer's
 * K and V of one token: 80 layers x 2 x 1024 x 2 B = 320 KiB (performance
 * notes §5); an image: 20 cross layers x 2 x 4 tiles x 1601 x 1024 x 2 B =
 * 500.3 MiB (524.6 MB, the same notes). */
#define BLOCK 16
#define KV_TOKEN_BYTES ((LAYERS - CROSS) * 2 * KVW * 2)
#define IMAGE_BYTES (CROSS * 2 * TILES * PATCHES * KVW * 2)
/* The budgets planned on one H200: runtime.kv_mib = 24 GiB of K/V (78,640
 * tokens in 4,915 blocks), runtime.image_mib = 8 GiB (16 resident images). */
#define KV_BUDGET (24 * GIB)
#define IMAGE_BUDGET (8 * GIB)
/* The pool the CUDA backend takes of an H200: 90% of 139 GiB = 125.1 GiB. */
#define H200_POOL (ML_PLAN_H200_BYTES * ML_PLAN_CUDA_POOL_SHARE_TENTHS / 10)

static ml_config cfg; /* large: the ignore list */

/* Bytes the process holds in memory now (resident set). */
static uint64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Apparent and allocated bytes of every file in dir. */
/* linear_weight that lends the host bytes themselves, as weight does. */
static const void *borrow_linear(ml_backend *be, const void *host, int rows, int cols,
                                 size_t elem_size)
{
    return be->ops->weight(be, host, (size_t)rows * (size_t)cols * elem_size);
}

static void dir_bytes(const char *dir, uint64_t *apparent, uint64_t *allocated)
{
    *apparent = *allocated = 0;
    char path[1024];
    for (int s = 1;; s++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-00019.safetensors", dir, s);
        struct stat st;
        if (stat(path, &st) != 0)
            break;
        *apparent += (uint64_t)st.st_size;
        *allocated += (uint64_t)st.st_blocks * 512;
    }
}

static ml_memory_plan_spec h200_spec(int world, uint64_t workspace)
{
    return (ml_memory_plan_spec){.world = world, .device_bytes = H200_POOL,
                                 .backend_bytes = ML_PLAN_CUDA_WORKSPACE_BYTES,
                                 .workspace_bytes = workspace,
                                 .kv_elem_size = ML_PLAN_CUDA_KV_ELEM_SIZE,
                                 .kv_block_size = BLOCK, .kv_bytes = KV_BUDGET,
                                 .image_bytes = IMAGE_BUDGET};
}

static void print_plan(const char *what, const ml_memory_plan *p, const ml_memory_plan_spec *s)
{
    char line[1024];
    fprintf(stderr, "  %s: %s\n", what, ml_memory_plan_format(p, s, line, sizeof line));
}

/* A tensor-parallel model's plan (two CPU shards of the tiny preset,
 * header-only FP8) is the config's at world 2, with a shard's workspace. */
static void test_loaded_tp(void)
{
    char err[512], dir[512], path[600];
    ml_scratch_subdir("fp8_tiny", dir, sizeof dir);
    check(ml_mkmodel("tiny", dir, TOKENIZER_DIR, 0, ML_MKMODEL_FP8 | ML_MKMODEL_HEADER_ONLY, err,
                     sizeof err) == ML_OK,
          "mkmodel tiny: %s", err);
    snprintf(path, sizeof path, "%s/config.json", dir);
    check(ml_config_load(&cfg, path, err, sizeof err) == ML_OK, "config: %s", err);
    ml_backend *bes[2] = {NULL, NULL};
    check(ml_backend_cpu_create_group(2, 1, bes, err, sizeof err) == ML_OK, "group: %s", err);
    ml_model *m = NULL;
    check(ml_model_load_tp(&m, dir, bes, 2, NULL, err, sizeof err) == ML_OK, "load TP 2: %s",
          err);
    if (!m)
        return;
    ml_memory_plan_spec spec = {.device_bytes = GIB, .kv_bytes = 64 * ML_PLAN_MIB,
                                .image_bytes = 64 * ML_PLAN_MIB};
    ml_memory_plan got, want;
    check(ml_model_memory_plan(m, &spec, &got, err, sizeof err) == ML_OK, "plan: %s", err);
    check(spec.world == 2 && spec.workspace_bytes > 0 && spec.kv_elem_size == sizeof(float),
          "the model fills world 2, a shard's workspace and the CPU's f32 K/V");
    check(ml_memory_plan_compute(&cfg, &spec, &want, err, sizeof err) == ML_OK, "plan: %s", err);
    check(!memcmp(&got, &want, sizeof got), "loaded TP 2 plan == the config's");
    check(got.kv_block_bytes == ml_model_kv_block_bytes(m) &&
              got.image_state_bytes == ml_model_image_state_bytes(m),
          "the plan's block and image sizes are the runtime's");
    check(got.weight_bytes[ML_PLAN_FP8] > 0 && got.weight_bytes[ML_PLAN_SCALES] > 0,
          "tiny FP8: fp8 and scale bytes");
    ml_model_destroy(m);
    for (int r = 0; r < 2; r++)
        bes[r]->ops->destroy(bes[r]);
}

int main(void)
{
    char err[512], dir[512];
    ml_scratch_subdir("fp8_90b", dir, sizeof dir);
    check(ml_mkmodel("90b", dir, TOKENIZER_DIR, 0, ML_MKMODEL_FP8 | ML_MKMODEL_HEADER_ONLY, err,
                     sizeof err) == ML_OK,
          "mkmodel 90b fp8 header-only: %s", err);
    check(ml_mkmodel("90b", dir, TOKENIZER_DIR, 0, ML_MKMODEL_FP8, err, sizeof err) ==
              ML_ERR_INVALID_ARG,
          "the 90b preset refuses random values (they would need 90+ GB)");

    /* The shards are the size of the real weights, and take no disk. */
    uint64_t apparent, allocated;
    dir_bytes(dir, &apparent, &allocated);
    fprintf(stderr, "  19 shards: %.2f GiB apparent, %.2f MiB allocated\n",
            (double)apparent / GIB, (double)allocated / ML_PLAN_MIB);
    check(apparent > (uint64_t)(EXPECT_FP8 + EXPECT_BF16), "shards hold every weight's bytes");
    check(allocated < 64 * ML_PLAN_MIB, "the weights are holes");

    /* Loading binds every tensor and reads only the gates and the scales,
     * on a CPU backend that borrows the Linears as stored (backend.h
     * linear_weight may): the CPU's own packs a copy of each, which would
     * read all 85 GiB. No op runs on it. */
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    check(ml_config_load(&cfg, path, err, sizeof err) == ML_OK, "config: %s", err);
    ml_backend *be = ml_backend_cpu_create(1, err, sizeof err);
    check(be != NULL, "cpu backend: %s", err);
    ml_backend_ops borrowing = *be->ops;
    const ml_backend_ops *own = be->ops;
    borrowing.linear_weight = borrow_linear;
    borrowing.linear_weight_free = be->ops->weight_free;
    be->ops = &borrowing;
    const uint64_t before = resident_bytes();
    ml_model *m = NULL;
    check(ml_model_load(&m, dir, be, NULL, err, sizeof err) == ML_OK, "load the fake: %s", err);
    const uint64_t grew = resident_bytes() - before;
    fprintf(stderr, "  load: resident set grew %.1f MiB\n", (double)grew / ML_PLAN_MIB);

    /* The loaded model's plan is the config's. */
    ml_memory_plan_spec loaded = h200_spec(1, 0);
    ml_memory_plan lp;
    check(ml_model_memory_plan(m, &loaded, &lp, err, sizeof err) == ML_OK, "model plan: %s", err);
    const uint64_t workspace = loaded.workspace_bytes;
    fprintf(stderr, "  model workspace %.1f MiB\n", (double)workspace / ML_PLAN_MIB);
    check(workspace > 0, "the model reports its workspace");
    /* Besides the workspace, which the CPU backend faults in when it is
     * allocated (memory.c), the scales (16.8 MB of bf16 pages read, 33.6 MB
     * of f32 written) and the tables of every bound weight: far from the 85
     * GiB mapped. */
    check(grew < workspace + 256 * ML_PLAN_MIB,
          "the load touched no weight pages (%.1f MiB, %.1f of them the workspace)",
          (double)grew / ML_PLAN_MIB, (double)workspace / ML_PLAN_MIB);
    ml_model_destroy(m);
    be->ops = own;
    be->ops->destroy(be);

    /* ---- FP8 90B on one H200 --------------------------------------------- */
    ml_memory_plan_spec spec = h200_spec(1, workspace);
    ml_memory_plan p;
    check(ml_memory_plan_compute(&cfg, &spec, &p, err, sizeof err) == ML_OK, "plan: %s", err);
    print_plan("90B fp8, one H200", &p, &spec);
    check(p.weight_bytes[ML_PLAN_FP8] == (uint64_t)EXPECT_FP8, "fp8 bytes %llu, expected %lld",
          (unsigned long long)p.weight_bytes[ML_PLAN_FP8], EXPECT_FP8);
    check(p.weight_bytes[ML_PLAN_SCALES] == (uint64_t)EXPECT_SCALES,
          "scale bytes %llu, expected %lld", (unsigned long long)p.weight_bytes[ML_PLAN_SCALES],
          EXPECT_SCALES);
    check(p.weight_bytes[ML_PLAN_BF16] == (uint64_t)EXPECT_BF16, "bf16 bytes %llu, expected %lld",
          (unsigned long long)p.weight_bytes[ML_PLAN_BF16], EXPECT_BF16);
    for (int d = 0; d < ML_PLAN_DTYPES; d++)
        check(lp.weight_bytes[d] == p.weight_bytes[d], "loaded model's %s bytes == config's",
              ml_plan_dtype_name((ml_plan_dtype)d));
    /* ...and what the loader bound from the checkpoint (weights.h counters). */
    ml_checkpoint *ck = NULL;
    ml_weights *w = NULL;
    check(ml_checkpoint_open(&ck, dir, err, sizeof err) == ML_OK &&
              ml_weights_create(&w, ck, &cfg, err, sizeof err) == ML_OK,
          "bind the fake: %s", err);
    if (w) {
        check(w->bytes_f8 == p.weight_bytes[ML_PLAN_FP8] &&
                  w->bytes_scales == p.weight_bytes[ML_PLAN_SCALES] &&
                  w->bytes_borrowed + w->bytes_converted == p.weight_bytes[ML_PLAN_BF16],
              "the plan's bytes are the bound weights' (f8 %zu, scales %zu, bf16 %zu)",
              w->bytes_f8, w->bytes_scales, w->bytes_borrowed + w->bytes_converted);
        check(w->n_unused == 0, "the fake holds exactly the model's tensors");
    }
    ml_weights_destroy(w);
    ml_checkpoint_destroy(ck);
    check(p.kv_block_bytes == (uint64_t)(BLOCK * KV_TOKEN_BYTES), "a block is 16 x 320 KiB");
    check(p.kv_blocks == (int64_t)(KV_BUDGET / (BLOCK * KV_TOKEN_BYTES)) && p.kv_blocks == 4915,
          "24 GiB hold 4915 blocks (%lld)", (long long)p.kv_blocks);
    check(p.kv_tokens == 4915 * BLOCK, "78,640 tokens of K/V");
    check(p.image_state_bytes == (uint64_t)IMAGE_BYTES && p.images == 16,
          "8 GiB hold 16 images of 500.3 MiB (%lld)", (long long)p.images);
    check(p.workspace == ML_PLAN_CUDA_WORKSPACE_BYTES + workspace, "workspace: backend + model");
    check(p.fits && p.left > 0, "90B FP8 fits one H200 with 24 GiB of K/V and 16 images");
    /* What is left goes to more K/V: 125.1 - 85.36 - 8 (images) - 0.17 -
     * the model's workspace ~ 31 GiB, about 100k tokens. */
    check(p.kv_tokens_max > p.kv_tokens && p.images_max > p.images,
          "room left: at most %lld tokens or %lld images", (long long)p.kv_tokens_max,
          (long long)p.images_max);

    /* Adapter slots come out of the same device. */
    ml_memory_plan_spec with_slots = spec;
    with_slots.adapter_bytes = 4 * GIB;
    ml_memory_plan r;
    check(ml_memory_plan_compute(&cfg, &with_slots, &r, err, sizeof err) == ML_OK, "plan: %s",
          err);
    check(r.used == p.used + 4 * GIB && r.left == p.left - (int64_t)(4 * GIB) && r.fits &&
              r.kv_tokens_max < p.kv_tokens_max,
          "4 GiB of adapter slots: 4 GiB less left");

    /* model.weights = "fp8" on the bf16 checkpoint: the same bytes. */
    ml_config at_load = cfg;
    ml_quant_config_fp8_at_load(&at_load.quant);
    ml_memory_plan q;
    check(ml_memory_plan_compute(&at_load, &spec, &q, err, sizeof err) == ML_OK, "plan: %s", err);
    for (int d = 0; d < ML_PLAN_DTYPES; d++)
        check(q.weight_bytes[d] == p.weight_bytes[d], "quantized at load: %s bytes as published",
              ml_plan_dtype_name((ml_plan_dtype)d));

    /* model.fp8_lm_head, on the FP8 checkpoint and quantized at load alike:
     * lm_head's (VOCAB, D) moves from bf16 to one byte a weight and VOCAB
     * f32 scales. */
    ml_config heads[2] = {cfg, at_load};
    for (int h = 0; h < 2; h++) {
        heads[h].quant.lm_head_fp8 = 1;
        check(ml_memory_plan_compute(&heads[h], &spec, &q, err, sizeof err) == ML_OK, "plan: %s",
              err);
        if (!h)
            print_plan("90B fp8, fp8 lm_head, one H200", &q, &spec);
        check(q.weight_bytes[ML_PLAN_FP8] == (uint64_t)(EXPECT_FP8 + VOCAB * D) &&
                  q.weight_bytes[ML_PLAN_BF16] == (uint64_t)(EXPECT_BF16 - 2 * VOCAB * D) &&
                  q.weight_bytes[ML_PLAN_SCALES] == (uint64_t)(EXPECT_SCALES + VOCAB * 4),
              "fp8 lm_head (%s): fp8 %llu, bf16 %llu, scales %llu",
              h ? "at load" : "FP8 checkpoint", (unsigned long long)q.weight_bytes[ML_PLAN_FP8],
              (unsigned long long)q.weight_bytes[ML_PLAN_BF16],
              (unsigned long long)q.weight_bytes[ML_PLAN_SCALES]);
    }

    /* ---- bf16 90B: not one H200, two with TP 2 ----------------------------- */
    ml_config bf16 = cfg;
    memset(&bf16.quant, 0, sizeof bf16.quant);
    check(ml_memory_plan_compute(&bf16, &spec, &p, err, sizeof err) == ML_OK, "plan: %s", err);
    print_plan("90B bf16, one H200", &p, &spec);
    /* 177.2 GB = 165.0 GiB of weights: more than the whole device. */
    check(p.weights == (uint64_t)(2 * EXPECT_FP8 + EXPECT_BF16), "bf16 weights 165.0 GiB");
    check(p.weight_bytes[ML_PLAN_FP8] == 0 && p.weight_bytes[ML_PLAN_SCALES] == 0, "no fp8");
    check(!p.fits && p.weights > ML_PLAN_H200_BYTES, "bf16 90B does not fit one H200");
    check(p.kv_tokens_max == 0 && p.images_max == 0, "no room for any K/V");

    ml_memory_plan_spec tp2 = h200_spec(2, workspace);
    check(ml_memory_plan_compute(&bf16, &tp2, &p, err, sizeof err) == ML_OK, "plan: %s", err);
    print_plan("90B bf16, TP 2, each H200", &p, &tp2);
    /* Each device: half of every layer Linear (and vision fc1's bias), the
     * rest whole: 84.6 GiB. */
    const int64_t vision_split = VLAYERS * (4 * DV * DV + IV * DV + IV + DV * IV);
    const int64_t per_device = (2 * EXPECT_FP8 + 2 * vision_split) / 2 + EXPECT_BF16 -
                               2 * vision_split;
    check(p.weights == (uint64_t)per_device, "TP 2 weights %llu per device, expected %lld",
          (unsigned long long)p.weights, (long long)per_device);
    /* Half the K/V heads a device: the same bytes hold twice the tokens. */
    /* 24 GiB / 2.5 MiB = 9830 blocks, 157,280 tokens. */
    check(p.kv_blocks == 9830 && p.kv_tokens == 9830 * BLOCK,
          "TP 2: 24 GiB a device hold %lld tokens", (long long)p.kv_tokens);
    check(p.images == 32, "TP 2: 8 GiB a device hold 32 images (%lld)", (long long)p.images);
    check(p.fits, "bf16 90B fits two H200s with TP 2");

    /* A world that does not divide the heads is refused. */
    ml_memory_plan_spec tp3 = h200_spec(3, workspace);
    check(ml_memory_plan_compute(&bf16, &tp3, &p, err, sizeof err) == ML_ERR_INVALID_ARG,
          "TP 3 refused: %s", err);

    test_loaded_tp();
    return check_done();
}
