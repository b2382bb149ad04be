/* Internals of the CUDA backend shared by its .cu files: the backend object,
 * the device pool, error latching, launch helpers, and the op
 * implementations the op table points to. Nothing outside kernels/
 * includes this (it pulls in CUDA headers).
 *
 * Every op follows the same shape (README.md "Contributing", Layout): device helpers, a __global__
 * kernel, and a host launcher named mlk_<op> with the op table's signature
 * that validates, launches on the backend's stream and latches errors.
 * Ops never allocate: the workspaces they need are carved from the pool at
 * create. */
#ifndef MLK_INTERNAL_CUH
#define MLK_INTERNAL_CUH

#include <cstddef>
#include <cstdint>
#include <utility>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#ifdef MLK_HOST
#include "host_exec.h"
#endif

#include "mlk_backend.h"

/* Every pool allocation is aligned to this (cudaMalloc's own alignment, and
 * what 16-byte vector loads and cuBLASLt want). */
#define MLK_POOL_ALIGN 256
/* Activations converted to bf16 for cuBLASLt: the largest M·K done in one
 * GEMM call; larger products are tiled over M (vision fc2 is 6432·5120). */
#define MLK_XBF16_BYTES ((size_t)128 << 20)
/* A matmul bias widened to f32 for cuBLASLt's bias epilogue: N up to 256 Ki
 * (the model's widest biased GEMM is 5120; the vocabulary is 128256). */
#define MLK_BIAS_F32_BYTES ((size_t)1 << 20)
/* cuBLASLt workspace, handed to every cublasLtMatmul so that graph capture
 * never allocates (32 MiB is NVIDIA's recommendation for Hopper). */
#define MLK_LT_WS_BYTES ((size_t)32 << 20)
/* A batch-invariant group's all_reduce_sum: the members' slices of one
 * chunk side by side (chunks of MLK_GATHER_BYTES / world). Carved only for
 * such groups, outside MLK_WORKSPACE_BYTES. */
#define MLK_GATHER_BYTES ((size_t)32 << 20)
/* Attention split-K partial results (decode over long contexts). */
#define MLK_ATTN_WS_BYTES ((size_t)16 << 20)
#define MLK_WORKSPACE_BYTES \
    (MLK_XBF16_BYTES + MLK_BIAS_F32_BYTES + MLK_LT_WS_BYTES + MLK_ATTN_WS_BYTES)
/* Pinned host staging for small transfers (metadata uploads, logits). */
#define MLK_STAGE_UP_BYTES ((size_t)16 << 20)
#define MLK_STAGE_DOWN_BYTES ((size_t)64 << 20)
/* Downloads staged and awaiting synchronize; more go direct (synchronous). */
#define MLK_MAX_PENDING_DOWNLOADS 64
/* Recorded graphs per backend (decode batch-size buckets): the interface's
 * count, shared with the CPU backend. */
#define MLK_GRAPH_SLOTS ML_GRAPH_SLOTS
/* cuBLASLt GEMM plans kept per backend: a step uses a handful of shapes,
 * each repeated in every layer; a new shape replaces the least recently
 * used plan. */
#define MLK_GEMM_PLANS 64
/* Largest head_dim of the attention ops (the CPU backend's limit too). */
#define MLK_MAX_HEAD_DIM 256

/* ---- device pool: first fit over a sorted segment list ------------------------ */

typedef struct mlk_pool_seg {
    size_t off, size;
    int used;
} mlk_pool_seg;

typedef struct mlk_pool {
    char *base;           /* owned: one cudaMalloc */
    size_t capacity;
    mlk_pool_seg *segs;   /* owned: sorted by offset, covering [0, capacity) */
    int n_segs, cap_segs;
    size_t used_bytes;
} mlk_pool;

/* Take `capacity` bytes at base (already cudaMalloc'd; ownership moves to
 * the pool). Returns 0, or -1 when the host bookkeeping cannot be allocated. */
int mlk_pool_init(mlk_pool *p, void *base, size_t capacity);
/* Free the bookkeeping and the device memory; a zeroed pool is a no-op. */
void mlk_pool_deinit(mlk_pool *p);
/* MLK_POOL_ALIGN-aligned block of at least `bytes`, or NULL when no free
 * segment is large enough (the runtime's memory budget). */
void *mlk_pool_alloc(mlk_pool *p, size_t bytes);
/* Return a block from mlk_pool_alloc; neighbours coalesce. Returns 0, or -1
 * when ptr is not a live block of this pool (the pool is unchanged). */
int mlk_pool_free(mlk_pool *p, void *ptr);

/* ---- cuBLASLt GEMM plans (matmul.cu) --------------------------------------------- */

/* What a GEMM plan is for: yᵀ (N, rows) = w (K, N)ᵀ · xᵀ (K, rows) in
 * cuBLASLt's column-major view, y's rows ldy floats apart (N, or the full
 * width when y is a column tile). */
typedef struct mlk_gemm_key {
    int rows, K, N, ldy, bias;   /* rows == 0 marks an empty slot */
    uint32_t ab_type;            /* cudaDataType of w and x: CUDA_R_16BF or CUDA_R_8F_E4M3 */
    uint32_t align_w, align_y;   /* byte alignment of w and y, at most 256 */
} mlk_gemm_key;

/* One GEMM configuration and the algorithm cuBLASLt's heuristic chose for
 * it. The descriptors live in place (the *Init forms of the cuBLASLt API),
 * so building or replacing a plan allocates nothing and needs no destroy.
 * accumulate is not in the key: beta is an argument of each call. */
typedef struct mlk_gemm_plan {
    mlk_gemm_key key;
    uint64_t last_use;           /* mlk_backend.gemm_clock at the last lookup */
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t w_layout, x_layout, y_layout; /* y: C and D */
    cublasLtMatmulAlgo_t algo;
} mlk_gemm_plan;

/* ---- the backend ---------------------------------------------------------------- */

typedef struct mlk_pending_download {
    void *dst_host;       /* borrowed: the caller's buffer */
    size_t stage_off, bytes;
} mlk_pending_download;

typedef struct mlk_backend {
    ml_backend base;          /* first: an ml_backend * is an mlk_backend * */
    ml_backend_ops ops;
    char name[64];
    int device, sm_count, cc_major;
    /* sm_89 or later: FP8 tensor cores, so W8A8 GEMMs take cuBLASLt's E4M3
     * kernels (matmul.cu). */
    int fp8_mma;
    /* ml_backend_cuda_create's batch_invariant, fixed for the backend's
     * life: matmul and attention make shape choices that do not depend on
     * the other rows of the call (README.md in this directory). */
    int batch_invariant;
    cudaStream_t stream;      /* owned: every op is queued here */
    cublasLtHandle_t lt;      /* owned */
    void *nccl;               /* owned ncclComm_t of a group, or NULL */
    int world;                /* members of the group (1 alone) */
    /* Batch-invariant groups of two or more: all_reduce_sum's all-gather
     * staging, MLK_GATHER_BYTES from the pool (collective.cu); else NULL. */
    float *gather;

    mlk_pool pool;
    /* Workspaces carved from the pool at create. */
    __nv_bfloat16 *xbf16;     /* MLK_XBF16_BYTES: matmul activations in bf16 (FP8
                                 matmuls carve it otherwise: matmul.cu) */
    float *bias_f32;          /* MLK_BIAS_F32_BYTES: matmul bias for the epilogue */
    void *lt_ws;              /* MLK_LT_WS_BYTES */
    float *attn_ws;           /* MLK_ATTN_WS_BYTES: attention partials */
    mlk_gemm_plan gemm_plans[MLK_GEMM_PLANS];
    uint64_t gemm_clock;      /* plan lookups so far: the LRU order */

    /* Pinned staging: regions are handed out in order and recycled at
     * synchronize, after the stream has drained. */
    unsigned char *stage_up;  /* owned (cudaHostAlloc), MLK_STAGE_UP_BYTES */
    size_t stage_up_used;
    unsigned char *stage_down; /* owned, MLK_STAGE_DOWN_BYTES */
    size_t stage_down_used;
    mlk_pending_download pending[MLK_MAX_PENDING_DOWNLOADS];
    int n_pending;

    /* The first error since the last synchronize. fatal: the CUDA context
     * itself failed (a kernel fault), so every later call fails too. */
    ml_status err_status;
    char err[256];
    int fatal;

    /* Graph capture. */
    int capture_slot;         /* slot being recorded, or -1 */
    cudaGraphExec_t graphs[MLK_GRAPH_SLOTS];
} mlk_backend;

static inline mlk_backend *mlk_of(ml_backend *be)
{
    return (mlk_backend *)be;
}

/* Record the first error (op name and detail) for synchronize. */
void mlk_latch(mlk_backend *b, ml_status st, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Latch `rc` if it is an error; returns 1 when it was. */
int mlk_cuda_failed(mlk_backend *b, cudaError_t rc, const char *op);
/* Make the backend's device current; returns 0 when ops may be queued
 * (no earlier fatal error), 1 when the op must be skipped. */
int mlk_enter(mlk_backend *b);
/* After a launch: latch a launch error under the op's name. */
void mlk_launched(mlk_backend *b, const char *op);

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned mlk_blocks(size_t n, unsigned threads)
{
    const size_t max_blocks = 1u << 20;
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > max_blocks ? max_blocks : b);
}

/* Every kernel launch, kernel<<<grid, block, smem, stream>>>(args...), in one
 * form that both builds share: the HOST build (MLK_HOST) runs the grid by
 * the host execution model (kernels/host/host_exec.h) instead. Launch
 * errors surface through cudaGetLastError (mlk_launched) in both. */
template <class... P, class... A>
static inline void mlk_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, A &&...args)
{
#ifdef MLK_HOST
    mlk_host::launch(kernel, grid, block, smem, stream, std::forward<A>(args)...);
#else
    kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
#endif
}

/* extern __shared__ type name[]: the launch's dynamic shared memory, 16-byte
 * aligned (host_exec.h defines the HOST form). */
#ifndef MLK_HOST
#define MLK_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#endif

/* ---- device helpers ------------------------------------------------------------- */

__device__ __forceinline__ float mlk_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even, NaN kept quiet: engine/dtype.h's ml_f32_to_bf16. */
__device__ __forceinline__ uint16_t mlk_to_bf16(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* v = op(v, the v of lane ^ o) for each offset o in turn, every lane of
 * the warp taking part: the butterfly that every warp reduction here is.
 * The HOST build computes it as one warp collective giving each lane the
 * same value (host_exec.h): emulated, a collective costs a context switch
 * per lane, and a reduction's five shuffles would be five. */
template <int... Offsets, typename T, typename Op>
__device__ __forceinline__ T mlk_warp_xor_reduce(T v, Op op)
{
#ifdef MLK_HOST
    return mlk_host_warp_xor_reduce<Offsets...>(v, op);
#else
    ((v = op(v, __shfl_xor_sync(0xffffffffu, v, Offsets))), ...);
    return v;
#endif
}

struct mlk_op_add {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct mlk_op_fmax {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Over all 32 lanes, every lane getting the result. */
__device__ __forceinline__ float mlk_warp_sum(float v)
{
    return mlk_warp_xor_reduce<16, 8, 4, 2, 1>(v, mlk_op_add());
}

__device__ __forceinline__ float mlk_warp_max(float v)
{
    return mlk_warp_xor_reduce<16, 8, 4, 2, 1>(v, mlk_op_fmax());
}

/* ---- op implementations (contracts in backend.h) --------------------------------- */

void mlk_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                int M, int K, int N, int accumulate);
void mlk_matmul_f8(ml_backend *be, float *y, const float *x, const uint8_t *w, const float *scale,
                   const uint16_t *bias, int M, int K, int N, int quant_x);
void mlk_lora(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs, int n_segs,
              int K, int N, float *scratch, int max_rank);
void mlk_rmsnorm(ml_backend *be, float *y, const float *x, const uint16_t *w, int rows, int dim,
                 float eps);
void mlk_layernorm(ml_backend *be, float *y, const float *x, const uint16_t *w, const uint16_t *b,
                   int rows, int dim, float eps);
void mlk_gelu(ml_backend *be, float *x, size_t n);
void mlk_silu_mul(ml_backend *be, float *y, const float *gate, const float *up, size_t n);
void mlk_rope(ml_backend *be, float *x, const int32_t *pos, const float *inv_freq, int n_tokens,
              int n_heads, int head_dim);
void mlk_add_rows(ml_backend *be, float *y, const float *x, const float *row_scale, float gate,
                  int rows, int dim);
void mlk_add_bf16(ml_backend *be, float *y, const uint16_t *w, float alpha, int rows, int period,
                  int dim);
void mlk_zero(ml_backend *be, float *y, size_t n);
void mlk_copy_2d(ml_backend *be, float *dst, const float *src, int rows, int cols, size_t dst_row,
                 size_t dst_col, size_t src_row);
void mlk_embed(ml_backend *be, float *y, const uint16_t *table, const int32_t *ids, int n, int dim);
void mlk_patchify(ml_backend *be, float *patches, const float *pixels, int n_img, int side,
                  int patch);
void mlk_kv_write(ml_backend *be, void *k_cache, void *v_cache, const float *k, const float *v,
                  const int32_t *slot, int n_tokens, int n_kv_heads, int head_dim);
void mlk_kv_store(ml_backend *be, void *dst, const float *src, size_t n);
void mlk_kv_store_keys(ml_backend *be, void *dst, const float *src, int n_keys, int n_kv_heads,
                       int head_dim);
void mlk_sample(ml_backend *be, const ml_sample_params *p);
size_t mlk_sample_scratch_bytes(ml_backend *be, int rows, int vocab);
void mlk_attn_vision(ml_backend *be, const ml_attn_vision_params *p);
void mlk_attn_causal(ml_backend *be, const ml_attn_causal_params *p);
void mlk_attn_cross(ml_backend *be, const ml_attn_cross_params *p);
/* collective.cu: NULL in the op table unless the backend is in a group. */
void mlk_all_reduce_sum(ml_backend *be, float *x, size_t n);
void mlk_nccl_destroy(mlk_backend *b);

/* attention.cu: kernel attributes, once per backend at create. */
void mlk_attn_init(mlk_backend *b);

/* backend.cu: the constructor shared by create and create_group; on error
 * NULL with *st and err set. */
mlk_backend *mlk_backend_new(int device, size_t pool_bytes, int batch_invariant, ml_status *st,
                             char *err, size_t errlen);
void mlk_backend_free(ml_backend *be);

#endif
