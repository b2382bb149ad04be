/* The three attentions of backend.h in one kind-neutral parameter block,
 * shared by attention.cu (the op entry points: validation and launch
 * shape), attn_simt.cu (the f32 CUDA-core kernel every kind can use) and
 * attn_mma.cu (the tensor-core kernel for the vision tower).
 *
 * Rows. As on the CPU, the query rows of a (sequence, kv head) pair are
 * r = token·group + j for the group = n_heads / n_kv_heads query heads
 * that share the kv head (head kv_head·group + j), so GQA heads read each
 * key once. A block of rows is one CTA's share of a sequence. */
#ifndef MLK_ATTENTION_CUH
#define MLK_ATTENTION_CUH

#include "mlk_internal.cuh"

enum mlk_attn_kind {
    MLK_ATTN_VISION,
    MLK_ATTN_CAUSAL,
    MLK_ATTN_CROSS,
};

/* Passed by value (__grid_constant__). Only scalars and pointers live
 * here; every per-step value (lengths, images, masks) is read from device
 * memory by the kernels, so a recorded launch replays for new steps. */
typedef struct mlk_attn_args {
    int kind;
    float *out;              /* (tokens, n_heads, head_dim) */
    const float *q;          /* (tokens, n_heads, head_dim) */
    const void *k, *v;       /* vision: f32 (n_seqs·seq_len, n_heads, hd); causal: bf16 paged cache */
    int n_seqs, n_heads, n_kv_heads, group, head_dim;
    float scale;
    /* vision */
    const uint8_t *valid;    /* (n_seqs, seq_len) */
    int seq_len;
    /* causal, cross */
    const int32_t *seq_start; /* (n_seqs + 1): token rows of each sequence */
    /* causal */
    const int32_t *block_table, *pos0;
    int max_blocks, block_size;
    /* cross: image i of sequence s has its bf16 keys (image_keys, n_kv_heads,
     * head_dim) k_offset bytes into states[s * max_images + i], its values
     * v_offset bytes into it */
    const void *const *states; /* (n_seqs, max_images) */
    size_t k_offset, v_offset;
    const int32_t *n_images;   /* (n_seqs) */
    const uint8_t *allowed;    /* (tokens, n_chunks = max_images · max_tiles) */
    int max_images, max_tiles, n_chunks, chunk_len, image_keys;
    /* Launch shape: gridDim.z CTAs per (kv head, sequence). A sequence
     * with more row blocks than that strides over them; with split set, a
     * sequence of a single row block instead splits its keys over the z
     * CTAs, which leave partial results in `partial` for attn_combine.
     * A launch covers sequences seq0 .. seq0 + n_seqs - 1 (gridDim.y =
     * n_seqs; seq0 > 0 when a step's sequences take several launches so
     * that their partials fit the workspace, attention.cu). */
    int split;
    int seq0;
    float *partial;          /* (gridDim.y, n_kv_heads, gridDim.z, rows, head_dim + 2) */
} mlk_attn_args;

/* Flash-style attention on CUDA cores, any kind, head_dim % 8 == 0 and
 * <= MLK_MAX_HEAD_DIM. rows_per_warp is 4 or 8 (see attn_simt.cu);
 * z_slots is gridDim.z. Latches errors under `op`. */
void mlk_attn_simt(mlk_backend *b, const mlk_attn_args *a, int rows_per_warp, int z_slots,
                   const char *op);

/* Largest rows_per_warp of mlk_attn_simt, for sizing split-K partials. */
#define MLK_ATTN_SIMT_MAX_ROWS 8
/* Most CTAs one sequence's keys are split over (attn_combine_kernel's
 * shared weights). */
#define MLK_ATTN_MAX_SPLITS 64

/* Tensor-core vision attention; returns 0 when it took the call, -1 when
 * the head_dim has no instantiation (the caller falls back to SIMT). */
int mlk_attn_vision_mma(mlk_backend *b, const mlk_attn_args *a, const char *op);

/* Set the kernels' shared-memory limits once per device (create time, so
 * nothing of the kind happens during graph capture). */
void mlk_attn_simt_init(void);
void mlk_attn_mma_init(void);

#endif
