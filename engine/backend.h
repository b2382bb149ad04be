/* The backend interface: the small operation table the Mllama graph is written
 * against (engine/model/README.md §11). engine/cpu implements it as the reference for every
 * op; kernels/ implements it on CUDA and is tested op by op against the CPU.
 *
 * Conventions shared by every op:
 * - Pointers are backend memory (host memory for the CPU backend, device
 *   memory for CUDA) obtained from `alloc`, `weight` or `linear_weight`; they
 *   are borrowed for the duration of the call.
 * - Weights are bf16 (uint16_t) exactly as in the checkpoint (a Linear's
 *   in the layout linear_weight gives it, its values unchanged); activations
 *   are f32; all accumulation is f32.
 * - Matrices are row-major. A Linear weight is (out_features, in_features),
 *   as PyTorch stores it, so matmul computes y = x · Wᵀ.
 * - Ops are asynchronous on devices: errors are latched and reported by
 *   `synchronize` (README.md "Contributing", Errors). The CPU backend is synchronous, but
 *   latches the misuse errors of the graph ops the same way.
 * - Ops never allocate; the caller owns all memory.
 * @locality: a backend is driven by one thread at a time (the step loop). */
#ifndef ML_BACKEND_H
#define ML_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "sample.h"
#include "status.h"

typedef struct ml_backend ml_backend;

/* Flat parameters of the vision tower's bidirectional attention
 * (MllamaVisionSdpaAttention with the mask of
 * _prepare_aspect_ratio_attention_mask, engine/model/README.md §3.6): the additive mask
 * is finfo.min exactly where both the query and the key are invalid, so a
 * valid query attends to every key and an invalid one to the valid keys. */
typedef struct ml_attn_vision_params {
    float *out;             /* (n_seq, seq_len, n_heads, head_dim) */
    const float *q;         /* (n_seq, seq_len, n_heads, head_dim) */
    const float *k;         /* (n_seq, seq_len, n_heads, head_dim) */
    const float *v;         /* (n_seq, seq_len, n_heads, head_dim) */
    const uint8_t *valid;   /* (n_seq, seq_len): 1 = real token of a real tile */
    int n_seq, seq_len, n_heads, head_dim;
    float scale;            /* 1/sqrt(head_dim) */
} ml_attn_vision_params;

/* Causal self-attention of new tokens over a paged K/V cache
 * (MllamaTextSelfSdpaAttention, GQA). Every sequence's cache holds its
 * earlier tokens followed by the new ones, already written with kv_write.
 * Token t of sequence s sits at position pos0[s] + t and attends to cache
 * positions 0 .. pos0[s] + t. Query head h reads kv head h / (n_heads/n_kv_heads). */
typedef struct ml_attn_causal_params {
    float *out;                 /* (n_tokens, n_heads, head_dim) */
    const float *q;             /* (n_tokens, n_heads, head_dim), RoPE applied */
    const void *k_cache;        /* (n_blocks, block_size, n_kv_heads, head_dim) in the backend's kv type */
    const void *v_cache;        /* same layout */
    const int32_t *block_table; /* (n_seqs, max_blocks_per_seq): physical block ids */
    const int32_t *seq_start;   /* (n_seqs + 1): token offsets of each sequence in q/out */
    const int32_t *pos0;        /* (n_seqs): cache length before the new tokens */
    int n_seqs, max_blocks_per_seq, block_size;
    int n_heads, n_kv_heads, head_dim;
    float scale;
} ml_attn_causal_params;

/* Cross-attention of a batch's text tokens over each sequence's resident
 * vision K/V (MllamaTextCrossSdpaAttention with
 * _prepare_cross_attention_mask, engine/model/README.md §5), one call for every
 * sequence of a step. Sequence s owns the token rows [seq_start[s],
 * seq_start[s + 1]) of q and out, and its keys are the concatenation, in
 * image order, of its n_images[s] resident image states (each
 * max_tiles·chunk_len keys: a tile's 1601 tokens are one chunk), so states
 * are shared between sequences without copying. A state is one backend
 * allocation holding every cross layer's K and V planes; the call reads the
 * planes at k_offset and v_offset bytes from each state's base.
 * allowed[t * max_images * max_tiles + i * max_tiles + c] says whether token
 * t may see tile c of its sequence's image i; entries past the sequence's
 * images are ignored. A token that may see no chunk attends to every key
 * of its sequence unmasked, as HF does (its additive mask row is zeroed by
 * full_text_row_mask). Rows of a sequence with n_images[s] == 0 (text only)
 * get out = 0 exactly; rows in no sequence are not written.
 * Everything behind a pointer is backend memory read when the op runs, not
 * when it is issued, and the work a backend queues depends only on the
 * scalar fields: a recorded call (graph_begin) replays correctly for new
 * contents of the same buffers (other images, lengths, masks). */
typedef struct ml_attn_cross_params {
    float *out;                /* (n_tokens, n_heads, head_dim) */
    const float *q;            /* (n_tokens, n_heads, head_dim), q_norm applied */
    const void *const *states; /* (n_seqs, max_images): base pointers of each sequence's image
                                  states in image order; entries past n_images[s] are ignored */
    size_t k_offset, v_offset; /* bytes from a state's base to this layer's K and V planes
                                  of max_tiles * chunk_len keys in the kv type, k_norm applied:
                                  K as kv_store_keys lays it out, V (keys, n_kv_heads,
                                  head_dim) as kv_store does */
    const int32_t *n_images;   /* (n_seqs): 0 .. max_images; 0 = text only */
    const int32_t *seq_start;  /* (n_seqs + 1): non-decreasing, within [0, n_tokens] */
    const uint8_t *allowed;    /* (n_tokens, max_images * max_tiles) */
    int n_seqs, n_tokens, max_images, max_tiles, chunk_len;
    int n_heads, n_kv_heads, head_dim;
    float scale;
} ml_attn_cross_params;

/* One adapter's share of a segmented LoRA op (Punica's SGMV): the rows
 * [row_start, row_start + n_rows) of x and y, with that adapter's A and B
 * of one Linear (PEFT lora_A.weight, lora_B.weight). */
typedef struct ml_lora_segment {
    int row_start, n_rows;
    int rank;             /* r >= 1 */
    float scale;          /* lora_alpha / r (lora_alpha / sqrt(r) with rsLoRA) */
    const uint16_t *a;    /* (rank, K) bf16, backend memory */
    const uint16_t *b;    /* (N, rank) bf16, backend memory */
} ml_lora_segment;

/* One sample op over a step's logit rows. Row r is sampled by the pipeline
 * of sample.h with the controls row[r], the penalty entries
 * [row[r].pen_start, + row[r].n_pen) of pen_id / pen_count and the bias
 * entries [row[r].bias_start, + row[r].n_bias) of bias, and the result
 * goes to out[r]. A row the caller does not need is given the greedy
 * controls without penalties or logprobs (the cheapest: one maximum).
 * Everything behind a pointer is backend memory, read when the op runs: a
 * recorded call (graph_begin) replays with new controls, penalties, biases
 * and draws in the same buffers, as long as the entries stay within the
 * capacity the pointers had when recorded. A row with row[r].mask = k >= 1
 * draws only among the tokens whose bit is set in slice k - 1 of `mask`
 * (structured outputs; its logprobs stay the raw model's); the masks are
 * data like the rest, read when the op runs. */
typedef struct ml_sample_params {
    ml_sample_out *out;         /* (rows) */
    const float *logits;        /* (rows, vocab), not modified */
    const ml_sample_row *row;   /* (rows) */
    const int32_t *pen_id;      /* penalty entries: ids distinct within a row, in [0, vocab) */
    const uint32_t *pen_count;  /*   the id's count in the output so far; 0 = prompt only */
    const ml_logit_bias *bias;  /* bias entries: ids distinct within a row, in [0, vocab);
                                   NULL when no row has one */
    const uint64_t *mask;       /* (slices, (vocab + 63) / 64); NULL when no row has one */
    void *scratch;              /* sample_scratch_bytes(be, rows, vocab) bytes, overwritten */
    int rows, vocab;
} ml_sample_params;

/* Graph slots of a backend with the graph ops (n_graph_slots of the CPU and
 * CUDA backends): one per decode batch-size bucket. */
#define ML_GRAPH_SLOTS 64

typedef struct ml_backend_ops {
    const char *name;
    void (*destroy)(ml_backend *be);

    /* ---- memory ---------------------------------------------------------- */
    /* Backend memory of `bytes` bytes, 64-byte aligned, or NULL. Owned by the caller. */
    void *(*alloc)(ml_backend *be, size_t bytes);
    void (*free)(ml_backend *be, void *p);
    void (*upload)(ml_backend *be, void *dst, const void *src_host, size_t bytes);
    void (*download)(ml_backend *be, void *dst_host, const void *src, size_t bytes);
    /* Make a checkpoint tensor usable by ops. The CPU backend returns `host`
     * itself (weights stay in the mmap); CUDA uploads a copy into its pool
     * at every call: no cache keyed by the host address, which a later
     * mapping or malloc may reuse for other bytes. The result is owned by
     * the caller, given back with weight_free before destroy; NULL on error
     * (latched). */
    const void *(*weight)(ml_backend *be, const void *host, size_t bytes);
    /* Give back a result of weight; NULL is a no-op. */
    void (*weight_free)(ml_backend *be, const void *w);
    /* Make the weight of a Linear, host (rows, cols) row-major of elem_size
     * bytes per element (2: bf16, 1: F8_E4M3), usable by matmul and
     * matmul_f8, in the layout they read: the CPU backend packs a copy for
     * its kernel (engine/cpu/matmul.c), CUDA uploads a copy as weight
     * does. A result other than host no longer reads host, which the
     * caller may then give back; a backend whose matmul read the
     * checkpoint's layout could return host itself. Owned by the caller,
     * given back with linear_weight_free; NULL on error (latched). */
    const void *(*linear_weight)(ml_backend *be, const void *host, int rows, int cols,
                                 size_t elem_size);
    void (*linear_weight_free)(ml_backend *be, const void *w);
    /* Bytes per element of the K/V caches used by kv_write and attention. */
    size_t kv_elem_size;
    /* Wait for queued work; report the first latched error. */
    ml_status (*synchronize)(ml_backend *be, char *err, size_t errlen);

    /* ---- linear algebra -------------------------------------------------- */
    /* y (M, N) = x (M, K) · wᵀ + bias;  w (N, K) bf16 from linear_weight,
     * bias (N) bf16 or NULL. With accumulate != 0, y += instead of y =. */
    void (*matmul)(ml_backend *be, float *y, const float *x, const uint16_t *w,
                   const uint16_t *bias, int M, int K, int N, int accumulate);
    /* quant_x == 0 (W8A16): y (M, N) = scale[n] · (x · wᵀ)[m][n] + bias[n],
     * w (N, K) F8_E4M3 from linear_weight, widened exactly, scale (N) f32: the weight q · scale
     * of compressed-tensors' decompression, its scale applied to each sum.
     * quant_x != 0: W8A8 dynamic per token (vLLM's numerics for the
     * "FP8-dynamic" checkpoints): each row of x is quantized to E4M3 with
     * s_x[m] = absmax_k |x[m][k]| / 448 (1 for a zero row), qx = E4M3(x /
     * s_x) rounded to nearest even and saturated at ±448, and y = Σ qx·q ·
     * (s_x[m]·scale[n]) + bias[n], summed in f32 (qx·q is exact). A row's
     * result depends on that row alone. NULL where the backend has no FP8
     * path (the model refuses FP8 weights on it at load). */
    void (*matmul_f8)(ml_backend *be, float *y, const float *x, const uint8_t *w,
                      const float *scale, const uint16_t *bias, int M, int K, int N,
                      int quant_x);
    /* Segmented LoRA after a matmul (PEFT LoraLayer.forward, one adapter per
     * segment): y[rows] += scale · ((x[rows] · aᵀ) · bᵀ) for each of the
     * n_segs segments (a host array borrowed for the call; rows of different
     * segments are disjoint; rows in no segment are untouched). x (rows, K)
     * and y (rows, N) f32 must not overlap. scratch is backend memory of
     * (rows, max_rank) f32 for x · aᵀ, overwritten; max_rank >= every rank. */
    void (*lora)(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs,
                 int n_segs, int K, int N, float *scratch, int max_rank);

    /* ---- normalisation and activations ------------------------------------ */
    /* MllamaTextRMSNorm: y = x · rsqrt(mean(x²) + eps) · w, per row of dim. */
    void (*rmsnorm)(ml_backend *be, float *y, const float *x, const uint16_t *w,
                    int rows, int dim, float eps);
    /* nn.LayerNorm with weight and bias, per row of dim. */
    void (*layernorm)(ml_backend *be, float *y, const float *x, const uint16_t *w,
                      const uint16_t *b, int rows, int dim, float eps);
    /* Exact erf GELU in place. */
    void (*gelu)(ml_backend *be, float *x, size_t n);
    /* y = silu(gate) * up, elementwise over n. y may alias gate. */
    void (*silu_mul)(ml_backend *be, float *y, const float *gate, const float *up, size_t n);
    /* Half-split RoPE in place on x (n_tokens, n_heads, head_dim):
     * angle[i] = pos[t] * inv_freq[i] in f32, i < head_dim/2; inv_freq is
     * backend memory (head_dim/2 floats). */
    void (*rope)(ml_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                 int n_tokens, int n_heads, int head_dim);

    /* ---- elementwise ------------------------------------------------------ */
    /* y[r, :] += gate * (row_scale ? row_scale[r] : 1) * x[r, :] for r < rows. */
    void (*add_rows)(ml_backend *be, float *y, const float *x, const float *row_scale,
                     float gate, int rows, int dim);
    /* y[r, :] += alpha * w[r % period, :] with w bf16 (period rows of dim):
     * position and tile embedding tables broadcast over tokens or tiles. */
    void (*add_bf16)(ml_backend *be, float *y, const uint16_t *w, float alpha, int rows,
                     int period, int dim);
    /* y[0 .. n) = 0. */
    void (*zero)(ml_backend *be, float *y, size_t n);
    /* dst[r*dst_row + c*dst_col] = src[r*src_row + c] for r < rows, c < cols. */
    void (*copy_2d)(ml_backend *be, float *dst, const float *src, int rows, int cols,
                    size_t dst_row, size_t dst_col, size_t src_row);
    /* y (n, dim) = table[ids[i]] as f32. */
    void (*embed)(ml_backend *be, float *y, const uint16_t *table, const int32_t *ids, int n,
                  int dim);
    /* im2col for the 14×14 stride-14 patch conv: pixels (n_img, 3, side, side)
     * → patches (n_img, (side/patch)², 3·patch·patch) in (c, ky, kx) order. */
    void (*patchify)(ml_backend *be, float *patches, const float *pixels, int n_img, int side,
                     int patch);

    /* ---- attention -------------------------------------------------------- */
    void (*attn_vision)(ml_backend *be, const ml_attn_vision_params *p);
    void (*attn_causal)(ml_backend *be, const ml_attn_causal_params *p);
    void (*attn_cross)(ml_backend *be, const ml_attn_cross_params *p);
    /* Write n_tokens of K and V (n_tokens, n_kv_heads, head_dim) f32 into the
     * paged caches at the slots slot[t] = block * block_size + offset. A
     * negative slot marks a padding row of a fixed-shape (graph) batch:
     * nothing is written for it (vLLM's PAD_SLOT_ID). */
    void (*kv_write)(ml_backend *be, void *k_cache, void *v_cache, const float *k, const float *v,
                     const int32_t *slot, int n_tokens, int n_kv_heads, int head_dim);
    /* Convert f32 (n, dim) into the kv type (resident cross-attention V). */
    void (*kv_store)(ml_backend *be, void *dst, const float *src, size_t n);
    /* Convert a cross layer's f32 K (n_keys, n_kv_heads, head_dim) into the
     * kv type, in the layout this backend's attn_cross reads: the CUDA
     * backend keeps it (kv_store's); the CPU backend stores it transposed,
     * (n_kv_heads, head_dim, n_keys), so that the few query rows of a decode
     * step multiply a vector of keys at a time instead of a vector of query
     * rows (engine/cpu/attention.c). */
    void (*kv_store_keys)(ml_backend *be, void *dst, const float *src, int n_keys,
                          int n_kv_heads, int head_dim);

    /* ---- sampling --------------------------------------------------------- */
    /* The next token of each row of a step's logits (sample.h's pipeline);
     * see ml_sample_params. */
    void (*sample)(ml_backend *be, const ml_sample_params *p);
    /* Bytes of backend memory the sample op needs as scratch for up to
     * `rows` rows of `vocab` logits. */
    size_t (*sample_scratch_bytes)(ml_backend *be, int rows, int vocab);

    /* ---- optional: NULL (0) on backends without them ---------------------- */
    /* Tensor parallelism: x[0 .. n) = the sum of x over every backend of
     * the group the backend was created in (ml_backend_cuda_create_group,
     * ml_backend_cpu_create_group; NULL on a backend made alone),
     * in place. Every member calls it with the same n in the same order,
     * each from the thread that drives it; it is queued like any op. */
    void (*all_reduce_sum)(ml_backend *be, float *x, size_t n);
    /* Recorded op sequences (CUDA graphs), to launch a decode step's ~10^3
     * kernels at once; the CPU backend records and replays the same calls,
     * so that the recording logic runs without a GPU. graph_begin(slot)
     * starts recording: ops issued until graph_end(slot) are recorded, not
     * run, and graph_end stores them in slot (0 .. n_graph_slots-1),
     * replacing what it held. graph_replay(slot) queues the recorded ops
     * again with the arguments they had when recorded: pointers and scalars
     * are fixed (host arrays such as lora's segs are copied when recorded),
     * device memory is read when the replay runs (so per-step inputs are
     * uploaded before the replay to the same buffers). alloc, free, weight,
     * weight_free, linear_weight, linear_weight_free, upload, download,
     * synchronize, graph_begin and
     * graph_replay are not allowed while recording; nor are a slot outside
     * the range, graph_end of a slot not being recorded, or the replay of a
     * slot that holds no graph. Each is a latched error and does nothing
     * else. A recording during which an error is latched leaves its slot
     * empty. */
    void (*graph_begin)(ml_backend *be, int slot);
    void (*graph_end)(ml_backend *be, int slot);
    void (*graph_replay)(ml_backend *be, int slot);
    int n_graph_slots;
} ml_backend_ops;

struct ml_backend {
    const ml_backend_ops *ops;
};

/* ---- the CUDA backend's sizes, restated ---- */
/* The engine plans device memory (model/memory_plan.h) without CUDA headers,
 * and kernels/ sees the engine only through this interface, so the CUDA
 * backend's own numbers the plan needs are written here, once;
 * kernels/backend.cu asserts at compile time that they agree with its own. */

/* Its own workspaces on each device: kernels/mlk_internal.cuh
 * MLK_WORKSPACE_BYTES = bf16 activation staging 128 MiB + bias staging
 * 1 MiB + cuBLASLt workspace 32 MiB + attention split-K 16 MiB. */
#define ML_PLAN_CUDA_WORKSPACE_BYTES ((uint64_t)(128 + 1 + 32 + 16) << 20)
/* Its K/V and image-state element (bf16; mlk_backend.h). */
#define ML_PLAN_CUDA_KV_ELEM_SIZE 2
/* Its pool when the worker does not size it: 90% of the free memory
 * (kernels/backend.cu's POOL_DEFAULT_SHARE is this), the rest left to the
 * CUDA context, cuBLASLt and NCCL. In tenths, to stay integral. */
#define ML_PLAN_CUDA_POOL_SHARE_TENTHS 9

#endif
