/* The memory plan of one device (memory_plan.h): the loader's tensor
 * manifest counted by resident dtype and shard, and the runtime's budgets
 * cut into the blocks and image states it allocates. */
#include "model/memory_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/weights.h"
#include "dtype.h"
#include "model/kv_cache.h"
#include "model/shard.h"

/* Hub-name pieces of a layer's Linears (weights.c binds these names). */
#define VISION_LAYERS_INFIX ".layers."
#define TEXT_LAYER_PREFIX "language_model.model.layers."
#define VISION_PREFIX "vision_model."
#define WEIGHT_LEAF ".weight"
#define SCALE_LEAF ".weight_scale"
#define BIAS_LEAF ".bias"
#define SELF_ATTN "self_attn."
#define CROSS_ATTN "cross_attn."
#define BYTES_PER_KIB 1024.0

static const char *const DTYPE_NAMES[ML_PLAN_DTYPES] = {
    [ML_PLAN_FP8] = "fp8",
    [ML_PLAN_BF16] = "bf16",
    [ML_PLAN_SCALES] = "scales",
};

const char *ml_plan_dtype_name(ml_plan_dtype d)
{
    return (unsigned)d < ML_PLAN_DTYPES ? DTYPE_NAMES[d] : "?";
}

/* ---- which shard of a tensor a device keeps ---------------------------- */

/* The module paths of a layer, in the enums' order, as lora.c names them. */
static const char *const vision_modules[ML_LORA_VISION_MODULES] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "mlp.fc1",          "mlp.fc2",
};
static const char *const text_modules[ML_LORA_TEXT_MODULES] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
};

/* The tensor `leaf` of a layer ("self_attn.q_proj.weight") is module
 * `module` followed by `suffix`. */
static int is_leaf(const char *leaf, const char *module, const char *suffix)
{
    size_t n = strlen(module);
    return !strncmp(leaf, module, n) && !strcmp(leaf + n, suffix);
}

/* How a shard keeps manifest tensor `name` (shard.c slice_*_layer, by way
 * of the split tables of shard.h): a Linear's weight and scale as its
 * module splits (a row-parallel Linear's scales are per output row: every
 * shard keeps them all), vision fc1's bias with its rows; the rest whole.
 * Vision fc2's bias, which only rank 0 adds, is counted on every device
 * (2.5 KiB a layer). */
static ml_shard_split split_of(const char *name, int *is_scale)
{
    *is_scale = 0;
    const char *at;
    if (!strncmp(name, TEXT_LAYER_PREFIX, strlen(TEXT_LAYER_PREFIX))) {
        const char *leaf = strchr(name + strlen(TEXT_LAYER_PREFIX), '.');
        if (!leaf)
            return ML_SHARD_WHOLE;
        leaf++;
        /* q/k/v/o are self_attn's or cross_attn's alike. */
        if (!strncmp(leaf, SELF_ATTN, strlen(SELF_ATTN)))
            leaf += strlen(SELF_ATTN);
        else if (!strncmp(leaf, CROSS_ATTN, strlen(CROSS_ATTN)))
            leaf += strlen(CROSS_ATTN);
        for (int i = 0; i < ML_LORA_TEXT_MODULES; i++) {
            ml_shard_split s = ml_shard_split_text((ml_lora_text_module)i);
            if (is_leaf(leaf, text_modules[i], WEIGHT_LEAF))
                return s;
            if (is_leaf(leaf, text_modules[i], SCALE_LEAF)) {
                *is_scale = 1;
                return s;
            }
        }
        return ML_SHARD_WHOLE;
    }
    if (!strncmp(name, VISION_PREFIX, strlen(VISION_PREFIX)) &&
        (at = strstr(name, VISION_LAYERS_INFIX)) &&
        (at = strchr(at + strlen(VISION_LAYERS_INFIX), '.'))) {
        const char *leaf = at + 1;
        for (int i = 0; i < ML_LORA_VISION_MODULES; i++) {
            ml_shard_split s = ml_shard_split_vision((ml_lora_vision_module)i);
            if (is_leaf(leaf, vision_modules[i], WEIGHT_LEAF))
                return s;
            if (is_leaf(leaf, vision_modules[i], SCALE_LEAF)) {
                *is_scale = 1;
                return s;
            }
            if (i == ML_LORA_VISION_FC1 && is_leaf(leaf, vision_modules[i], BIAS_LEAF))
                return ML_SHARD_OUT;
        }
    }
    return ML_SHARD_WHOLE;
}

/* ---- sizes the runtime allocates --------------------------------------- */

uint64_t ml_memory_plan_kv_block_bytes(const ml_config *cfg, int world, int block_size,
                                       size_t elem_size)
{
    const ml_text_config *tc = &cfg->text;
    return ml_kv_cache_block_bytes(ml_config_n_self_layers(cfg), block_size,
                                   tc->num_key_value_heads / world, tc->head_dim, elem_size);
}

uint64_t ml_memory_plan_image_state_bytes(const ml_config *cfg, int world, size_t elem_size)
{
    const ml_text_config *tc = &cfg->text;
    const uint64_t kv_width = (uint64_t)(tc->num_key_value_heads / world) * (uint64_t)tc->head_dim;
    return 2 * (uint64_t)tc->n_cross_layers * (uint64_t)cfg->vision.max_num_tiles *
           (uint64_t)ml_config_num_patches(cfg) * kv_width * elem_size;
}

/* ---- the plan ------------------------------------------------------------ */

static ml_status count_weights(const ml_config *cfg, int world, ml_memory_plan *p, char *err,
                               size_t errlen)
{
    ml_manifest_entry *m;
    size_t n;
    ml_status rc = ml_weights_manifest(cfg, &m, &n, err, errlen);
    if (rc != ML_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (m[i].is_gate) /* read into a float of the weight tables, never resident */
            continue;
        uint64_t numel = 1;
        for (int d = 0; d < m[i].ndim; d++)
            numel *= (uint64_t)m[i].shape[d];
        int is_scale;
        const ml_shard_split split = split_of(m[i].name, &is_scale);
        const uint64_t div = split == ML_SHARD_WHOLE ? 1 : (uint64_t)world;
        /* Scales follow the output rows: split only with them. */
        const uint64_t rows = (uint64_t)m[i].shape[0] / (split == ML_SHARD_OUT ? world : 1);
        if (is_scale) {
            p->weight_bytes[ML_PLAN_SCALES] += rows * sizeof(float);
        } else if (m[i].dtype == ML_DTYPE_F8_E4M3 || m[i].quantized_at_load) {
            p->weight_bytes[ML_PLAN_FP8] += numel / div;
            if (m[i].quantized_at_load) /* its scales are made at load: no manifest entry */
                p->weight_bytes[ML_PLAN_SCALES] += rows * sizeof(float);
        } else {
            p->weight_bytes[ML_PLAN_BF16] += numel / div * sizeof(uint16_t);
        }
    }
    free(m);
    for (int d = 0; d < ML_PLAN_DTYPES; d++)
        p->weights += p->weight_bytes[d];
    return ML_OK;
}

static int64_t floor_div(int64_t a, uint64_t b)
{
    return a <= 0 || b == 0 ? 0 : (int64_t)((uint64_t)a / b);
}

ml_status ml_memory_plan_compute(const ml_config *cfg, const ml_memory_plan_spec *spec,
                                 ml_memory_plan *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (spec->kv_block_size <= 0 || spec->kv_elem_size == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                       "memory plan: block size %d and element size %zu must be positive",
                       spec->kv_block_size, spec->kv_elem_size);
    ml_status rc = ml_shard_check_config(cfg, spec->world, err, errlen);
    if (rc == ML_ERR_UNSUPPORTED)
        rc = ML_ERR_INVALID_ARG;
    if (rc != ML_OK || (rc = count_weights(cfg, spec->world, out, err, errlen)) != ML_OK)
        return rc;
    ml_memory_plan *p = out;
    p->kv_block_bytes = ml_memory_plan_kv_block_bytes(cfg, spec->world, spec->kv_block_size,
                                                      spec->kv_elem_size);
    /* runtime.c: kv_bytes / block bytes blocks; image_cache.c: whole states. */
    p->kv_blocks = (int64_t)(spec->kv_bytes / p->kv_block_bytes);
    p->kv_tokens = p->kv_blocks * spec->kv_block_size;
    p->kv_pool_bytes = (uint64_t)p->kv_blocks * p->kv_block_bytes;
    p->image_state_bytes = ml_memory_plan_image_state_bytes(cfg, spec->world, spec->kv_elem_size);
    p->images = (int64_t)(spec->image_bytes / p->image_state_bytes);
    p->image_pool_bytes = (uint64_t)p->images * p->image_state_bytes;
    p->workspace = spec->backend_bytes + spec->workspace_bytes;
    p->used = p->weights + p->kv_pool_bytes + p->image_pool_bytes + spec->adapter_bytes +
              p->workspace;
    p->left = (int64_t)spec->device_bytes - (int64_t)p->used;
    p->fits = p->left >= 0;
    const int64_t rest =
        (int64_t)spec->device_bytes - (int64_t)(p->weights + spec->adapter_bytes + p->workspace);
    p->kv_blocks_max = floor_div(rest - (int64_t)p->image_pool_bytes, p->kv_block_bytes);
    p->kv_tokens_max = p->kv_blocks_max * spec->kv_block_size;
    p->images_max = floor_div(rest - (int64_t)p->kv_pool_bytes, p->image_state_bytes);
    return ML_OK;
}

const char *ml_memory_plan_format(const ml_memory_plan *p, const ml_memory_plan_spec *spec,
                                  char *buf, size_t n)
{
    snprintf(buf, n,
             "device %.2f GiB (world %d): weights %.2f GiB (fp8 %.2f, bf16 %.2f, scales %.3f); "
             "kv pool %.2f GiB = %lld blocks of %d tokens (%lld tokens, %.1f KiB/token); "
             "image states %.2f GiB = %lld images of %.1f MiB; adapter slots %.2f GiB; "
             "workspace %.2f GiB (backend %.2f, model %.2f); left %.2f GiB%s; at most %lld kv tokens or %lld images",
             ml_plan_gib(spec->device_bytes), spec->world, ml_plan_gib(p->weights),
             ml_plan_gib(p->weight_bytes[ML_PLAN_FP8]),
             ml_plan_gib(p->weight_bytes[ML_PLAN_BF16]),
             ml_plan_gib(p->weight_bytes[ML_PLAN_SCALES]), ml_plan_gib(p->kv_pool_bytes),
             (long long)p->kv_blocks, spec->kv_block_size, (long long)p->kv_tokens,
             (double)p->kv_block_bytes / spec->kv_block_size / BYTES_PER_KIB,
             ml_plan_gib(p->image_pool_bytes), (long long)p->images,
             (double)p->image_state_bytes / (double)ML_PLAN_MIB, ml_plan_gib(spec->adapter_bytes),
             ml_plan_gib(p->workspace), ml_plan_gib(spec->backend_bytes),
             ml_plan_gib(spec->workspace_bytes),
             p->left >= 0 ? ml_plan_gib((uint64_t)p->left) : -ml_plan_gib((uint64_t)-p->left),
             p->fits ? "" : " (DOES NOT FIT)", (long long)p->kv_tokens_max,
             (long long)p->images_max);
    return buf;
}
