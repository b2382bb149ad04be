/* The core of the CPU backend, shared by its files: the backend object, the
 * per-thread scratch, the latched error, and the op implementations the op
 * table points to. Nothing outside engine/cpu (and its tests) includes this.
 *
 * The files layer one way, each including only the ones below it:
 *
 *   cpu_backend.c   the op table, create and destroy, and the group
 *                   constructor: the one file that includes graph.h and
 *                   group.h; it fills the table from the core's ops, the
 *                   graph entries and, for a group member, the collective.
 *   graph.c         graph recording, a layer over the op table: graph_begin
 *                   points base.ops at a table that records (graph.h).
 *   group.c         a tensor-parallel group of backends and its
 *                   all_reduce_sum (group.h).
 *   the core        this header: memory.c (memory entries, the latched
 *                   error, synchronize) and the compute ops (matmul.c,
 *                   lora.c, elementwise.c, attention.c), which call
 *                   nothing above them.
 *   below           cpu_kernels.h (the ISA's kernels), cpu_features.h (the
 *                   ISA choice), threadpool.h (the pool).
 *
 * The object carries each upper layer's state behind an opaque pointer
 * (graphs, group) that only that layer reads; the core counts latched
 * errors (n_latched) so that graph.c can tell a failed recording without
 * the latch knowing graphs exist. */
#ifndef ML_CPU_INTERNAL_H
#define ML_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cpu/cpu_kernels.h"
#include "dtype.h"
#include "cpu/threadpool.h"

/* Largest head_dim the attention ops accept (the per-thread scratch is sized
 * for it; Llama 3.2 Vision uses 80 and 128). */
#define ML_CPU_MAX_HEAD_DIM 256

/* Minimum work (multiply-adds or element operations) worth handing to one
 * more thread: below it the wake-up costs more than it saves. */
#define ML_CPU_MIN_WORK_PER_THREAD 32768

/* Room for a latched error message. */
#define ML_CPU_ERR_LEN 256

/* Alignment of alloc and of the per-thread scratch. */
#define ML_CPU_ALIGN 64

/* One Linear's packed weights: where and how many bytes. */
typedef struct ml_cpu_packed {
    const void *p;
    size_t bytes;
} ml_cpu_packed;

typedef struct ml_cpu_backend {
    ml_backend base;          /* first: an ml_backend * is an ml_cpu_backend * */
    ml_backend_ops ops;       /* the op table, named after the selected ISA */
    char name[32];
    const ml_cpu_kernels *kern; /* borrowed: a static table */
    ml_cpu_pool *pool;        /* owned */
    float *scratch;           /* owned: one region of scratch_floats per thread */
    size_t scratch_floats;
    /* owned (ml_cpu_act_buffer): one op's converted inputs: W8A8's
     * quantized activations and their row scales, bf16 activations' rounded
     * rows (matmul.c), the vision attention's bf16 K and V (attention.c);
     * grown to the largest call (the first step of each shape), so
     * steady-state calls allocate nothing. */
    float *act;
    size_t act_floats;
    /* 1: bf16 Linears multiply activations rounded to bf16 with the ISA's
     * bf16 dot product, their weights packed in the pair layout
     * (ml_backend_cpu_bf16_activations; matmul.c). Fixed before the first
     * Linear is packed (n_packed below). */
    int bf16_x;
    /* 1: FP8 Linears are packed in the pair layout (a CPU with
     * AVX512_VBMI), for gemm_packed_f8_pairs or with bf16_x
     * gemm_tile_f8_pairs; 0: the strip layout, f32 activations (with
     * bf16_x too). */
    int f8_pairs;
    /* 1: with bf16_x, bf16 Linears run gemm_tile_amx (ml_cpu_amx_select);
     * 0: gemm_tile_bf16. */
    int amx;
    /* owned: the packed weights of the Linears alive (ml_cpu_linear_weight),
     * in no order; ml_backend_cpu_weights_read streams them. */
    struct ml_cpu_packed *packed;
    size_t n_packed, cap_packed;

    /* The first error since the last synchronize (ML_OK: none), and how
     * many were latched since create, the first or not. */
    ml_status err_status;
    char err[ML_CPU_ERR_LEN];
    unsigned n_latched;

    /* The layers above the core (read only by their own files): */
    struct ml_cpu_graphs *graphs; /* owned (graph.h): the slots and a recording under way */
    struct ml_cpu_group *group;   /* shared by the group's members (group.h); NULL alone */
    int rank;                     /* this backend's index in its group */
} ml_cpu_backend;

static inline ml_cpu_backend *ml_cpu_of(ml_backend *be)
{
    return (ml_cpu_backend *)be;
}

/* Whether the K/V caches and cross-attention states hold bf16
 * (ml_backend_cpu_bf16_kv_cache made ops.kv_elem_size 2 before a model was
 * loaded): the kv ops round to it, the attention widens it (attention.c). */
static inline int ml_cpu_kv16(const ml_cpu_backend *cb)
{
    return cb->ops.kv_elem_size == sizeof(uint16_t);
}

/* Thread tid's scratch region (64-byte aligned, scratch_floats long). */
static inline float *ml_cpu_scratch(const ml_cpu_backend *cb, int tid)
{
    return cb->scratch + (size_t)tid * cb->scratch_floats;
}

/* Items per thread so that each thread gets at least
 * ML_CPU_MIN_WORK_PER_THREAD of work, given the work of one item. */
static inline int64_t ml_cpu_grain(double work_per_item)
{
    double g = ML_CPU_MIN_WORK_PER_THREAD / (work_per_item > 1.0 ? work_per_item : 1.0);
    return g < 1.0 ? 1 : (int64_t)g;
}

/* Per-thread scratch each op family needs, in floats (multiples of 16). */
size_t ml_cpu_matmul_scratch_floats(void);
size_t ml_cpu_attn_scratch_floats(void);

/* cb->act with room for floats (or as many dwords), grown if needed; NULL
 * (latched against op) when it cannot be. Its contents are one op's, for
 * the length of that op. */
float *ml_cpu_act_buffer(ml_cpu_backend *cb, size_t floats, const char *op);

/* A pair of f32 rounded to bf16 (RNE, as torch's .to(torch.bfloat16)) in
 * one dword, lo in the low half: the operand of gemm_tile_bf16. */
static inline uint32_t ml_cpu_bf16_pair(float lo, float hi)
{
    return ml_f32_to_bf16(lo) | (uint32_t)ml_f32_to_bf16(hi) << 16;
}

/* Latch an error for synchronize: "cpu <op>: <detail>". The first error
 * since the last synchronize wins; later ones are dropped, but every one
 * counts in n_latched (a graph being recorded is discarded at graph_end,
 * whichever error it was). */
void ml_cpu_latch(ml_cpu_backend *cb, ml_status st, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ml_cpu_alloc for a buffer every decode step streams whole and its
 * writer fills at once (the packed weights): on huge pages where the kernel
 * lends them, but not faulted in by the allocation as ml_cpu_alloc's pools
 * are (memory.c); freed with ml_cpu_free. */
void *ml_cpu_alloc_streamed(ml_backend *be, size_t bytes);

/* The bytes ml_cpu_stream_sum reads at a time: a 64-byte vector in each of
 * its four streams. */
#define ML_CPU_STREAM_GRAIN 256

/* The sum of the 64-bit words of the first bytes - bytes % ML_CPU_STREAM_GRAIN
 * bytes at p (64-byte aligned), read as four streams of 64-byte vectors: a
 * streaming read at the memory's rate (read_rate.c; bench_read_bw uses it too). */
uint64_t ml_cpu_stream_sum(const void *p, size_t bytes);

/* ---- op implementations (contracts in backend.h) ---------------------------- */
void *ml_cpu_alloc(ml_backend *be, size_t bytes);
void ml_cpu_free(ml_backend *be, void *p);
void ml_cpu_copy(ml_backend *be, void *dst, const void *src, size_t bytes); /* upload, download */
const void *ml_cpu_weight(ml_backend *be, const void *host, size_t bytes);
void ml_cpu_weight_free(ml_backend *be, const void *w);
const void *ml_cpu_linear_weight(ml_backend *be, const void *host, int rows, int cols,
                                 size_t elem_size);
void ml_cpu_linear_weight_free(ml_backend *be, const void *w);
ml_status ml_cpu_synchronize(ml_backend *be, char *err, size_t errlen);

void ml_cpu_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w,
                   const uint16_t *bias, int M, int K, int N, int accumulate);
void ml_cpu_matmul_f8(ml_backend *be, float *y, const float *x, const uint8_t *w,
                      const float *scale, const uint16_t *bias, int M, int K, int N,
                      int quant_x);
/* W8A8's activation quantizer (backend.h matmul_f8 with quant_x), rows
 * [m0, m1) of x (M, K): sx[m] = absmax_k |x[m][k]| / 448, 1 for a zero
 * row, and qx[m][k] = the E4M3 value nearest x[m][k] / sx[m] (ties to
 * even, saturated at ±448) as an f32. No NaN in x. */
void ml_cpu_quantize_rows(float *qx, float *sx, const float *x, int m0, int m1, int K);
void ml_cpu_lora(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs,
                 int n_segs, int K, int N, float *scratch, int max_rank);

void ml_cpu_rmsnorm(ml_backend *be, float *y, const float *x, const uint16_t *w, int rows,
                    int dim, float eps);
void ml_cpu_layernorm(ml_backend *be, float *y, const float *x, const uint16_t *w,
                      const uint16_t *b, int rows, int dim, float eps);
void ml_cpu_gelu(ml_backend *be, float *x, size_t n);
void ml_cpu_silu_mul(ml_backend *be, float *y, const float *gate, const float *up, size_t n);
void ml_cpu_rope(ml_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                 int n_tokens, int n_heads, int head_dim);
void ml_cpu_add_rows(ml_backend *be, float *y, const float *x, const float *row_scale, float gate,
                     int rows, int dim);
void ml_cpu_add_bf16(ml_backend *be, float *y, const uint16_t *w, float alpha, int rows,
                     int period, int dim);
void ml_cpu_zero(ml_backend *be, float *y, size_t n);
void ml_cpu_copy_2d(ml_backend *be, float *dst, const float *src, int rows, int cols,
                    size_t dst_row, size_t dst_col, size_t src_row);
void ml_cpu_embed(ml_backend *be, float *y, const uint16_t *table, const int32_t *ids, int n,
                  int dim);
void ml_cpu_patchify(ml_backend *be, float *patches, const float *pixels, int n_img, int side,
                     int patch);
void ml_cpu_kv_write(ml_backend *be, void *k_cache, void *v_cache, const float *k,
                     const float *v, const int32_t *slot, int n_tokens, int n_kv_heads,
                     int head_dim);
void ml_cpu_kv_store(ml_backend *be, void *dst, const float *src, size_t n);
void ml_cpu_kv_store_keys(ml_backend *be, void *dst, const float *src, int n_keys,
                          int n_kv_heads, int head_dim);
void ml_cpu_sample(ml_backend *be, const ml_sample_params *p);
size_t ml_cpu_sample_scratch_bytes(ml_backend *be, int rows, int vocab);

void ml_cpu_attn_vision(ml_backend *be, const ml_attn_vision_params *p);
void ml_cpu_attn_causal(ml_backend *be, const ml_attn_causal_params *p);
void ml_cpu_attn_cross(ml_backend *be, const ml_attn_cross_params *p);

#endif
