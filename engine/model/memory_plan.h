/* The memory plan of one device: what a model config, its weights' dtype
 * and the runtime's budgets take of a device's usable bytes, and what is
 * left. A pure function of the config (the tensor manifest the loader
 * binds, weights.h; the K/V block and image-state sizes the runtime
 * allocates, kv_cache.h and mllama.h), so a plan is computed and checked
 * before any device exists; the loader prints the plan of what it loaded
 * (ml_model_memory_plan) on its backend.
 *
 * Weights are counted as resident on one device: F8_E4M3 Linears at 1 byte
 * an element, their weight_scale as the f32 the backends hold (one per
 * output row), everything else bf16 but the shape-(1) gates (floats in
 * the weight tables, not in device memory). Under tensor parallelism a device
 * holds its shard (shard.h: column-parallel Linears' rows with their
 * scales, row-parallel Linears' columns with all their scales, the rest
 * replicated), 1/world of each K/V block and image state.
 * @locality: any thread; no state. */
#ifndef ML_MODEL_MEMORY_PLAN_H
#define ML_MODEL_MEMORY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h" /* the CUDA backend's sizes: ML_PLAN_CUDA_* */
#include "checkpoint/config.h"
#include "status.h"

#define ML_PLAN_MIB ((uint64_t)1 << 20)
#define ML_PLAN_GIB ((uint64_t)1 << 30)

/* bytes in GiB, for the plan's messages. */
static inline double ml_plan_gib(uint64_t bytes)
{
    return (double)bytes / (double)ML_PLAN_GIB;
}

/* Usable bytes of one H200 (141 GB of HBM3e on NVIDIA's datasheet, which
 * nvidia-smi shows as about 140.4 GiB): the CUDA runtime leaves about
 * 139 GiB to allocations once a context exists (the project's H200 device
 * machine reports "about 139 GiB of GPU memory"). Not measured by this
 * code: the loader plans with what the backend really got. */
#define ML_PLAN_H200_BYTES (139 * ML_PLAN_GIB)
/* Weight bytes by resident dtype. */
typedef enum ml_plan_dtype {
    ML_PLAN_FP8,    /* F8_E4M3 Linear weights */
    ML_PLAN_BF16,   /* every other weight */
    ML_PLAN_SCALES, /* the FP8 weights' scales, f32 */
    ML_PLAN_DTYPES,
} ml_plan_dtype;

/* "fp8", "bf16", "scales": the /metrics label values. */
const char *ml_plan_dtype_name(ml_plan_dtype d);

/* What a plan is computed for; budgets are per device, as the runtime's. */
typedef struct ml_memory_plan_spec {
    int world;                /* tensor-parallel devices (1: the whole model) */
    uint64_t device_bytes;    /* usable bytes of one device (its pool) */
    uint64_t backend_bytes;   /* the backend's own workspaces on it */
    uint64_t workspace_bytes; /* the model's activation workspace (ml_model_workspace_bytes) */
    size_t kv_elem_size;      /* the backend's kv_elem_size */
    int kv_block_size;        /* tokens a K/V block (model limits' kv_block_size) */
    uint64_t kv_bytes;        /* the K/V pool (runtime.kv_mib) */
    uint64_t image_bytes;     /* resident image states (runtime.image_mib), at their budget */
    uint64_t adapter_bytes;   /* every LoRA slot (runtime.max_adapters · ml_lora_slot_bytes) */
} ml_memory_plan_spec;

/* One device's plan. Counts are what the runtime makes of the budgets
 * (runtime.c: kv_bytes / block bytes blocks; images of image_bytes). */
typedef struct ml_memory_plan {
    uint64_t weight_bytes[ML_PLAN_DTYPES];
    uint64_t weights;          /* their sum */
    uint64_t kv_block_bytes;   /* one block, every self-attention layer, K and V */
    int64_t kv_blocks;         /* in kv_bytes */
    int64_t kv_tokens;         /* kv_blocks · block size, across the group */
    uint64_t kv_pool_bytes;    /* kv_blocks · kv_block_bytes */
    uint64_t image_state_bytes; /* one image's cross-attention K/V */
    int64_t images;            /* in image_bytes */
    uint64_t image_pool_bytes; /* images · image_state_bytes */
    uint64_t workspace;        /* backend + model workspaces */
    uint64_t used;             /* weights + pools + adapter slots + workspace */
    int64_t left;              /* device_bytes - used; < 0: does not fit */
    int fits;                  /* left >= 0 */
    /* With everything left after the weights, adapter slots and workspaces
     * given to one pool, the other as configured: the largest K/V pool (blocks, tokens)
     * and image count the device could hold; 0 when the rest is negative. */
    int64_t kv_blocks_max, kv_tokens_max, images_max;
} ml_memory_plan;

/* The plan of cfg (validated; cfg->quant as the model loads it:
 * ml_quant_config_fp8_at_load applied for model.weights = "fp8") on
 * spec's device. Returns ML_OK and *out, or ML_ERR_INVALID_ARG (world < 1
 * or not dividing the split dimensions, a non-positive block size or
 * element size), ML_ERR_NOMEM. */
ml_status ml_memory_plan_compute(const ml_config *cfg, const ml_memory_plan_spec *spec,
                                 ml_memory_plan *out, char *err, size_t errlen);

/* One device's self-attention K/V block of cfg: the size the runtime's
 * cache allocates (ml_kv_cache_block_bytes, 1/world of the K/V heads). */
uint64_t ml_memory_plan_kv_block_bytes(const ml_config *cfg, int world, int block_size,
                                       size_t elem_size);

/* One device's resident image state of cfg: every cross layer's K and V of
 * (max_tiles · num_patches, K/V heads / world, head_dim) elements. */
uint64_t ml_memory_plan_image_state_bytes(const ml_config *cfg, int world, size_t elem_size);

/* The plan as log lines ("weights: ...\nkv: ...\n..."), GiB and counts.
 * Returns buf. */
const char *ml_memory_plan_format(const ml_memory_plan *p, const ml_memory_plan_spec *spec,
                                  char *buf, size_t n);

#endif
