/* matmul: y (M, N) = x (M, K) · wᵀ + bias, w bf16 (N, K) row-major, x and y
 * f32, f32 accumulation (backend.h). Two regimes, as on the CPU:
 *
 * - M <= GEMV_MAX_M (decode): memory-bound on the weights. gemv_kernel
 *   streams GEMV_ROWS weight rows per block once, 16 bytes per thread per
 *   load, against f32 x read through L1; no rounding of x, so these rows
 *   match the CPU to f32 summation order.
 * - larger M (prefill, the vision tower): cuBLASLt on the tensor cores. x
 *   is rounded to bf16 into the backend's workspace (tiled over M when
 *   M·K exceeds it), then cublasLtMatmul with bf16 A/B, f32 C/D and
 *   CUBLAS_COMPUTE_32F; accumulate is beta = 1 with C = D = y. The bias
 *   goes through the BIAS epilogue (D = A·B + beta·C + bias), in f32:
 *   cuBLASLt takes the bias in D's type for bf16 inputs (only IMMA and FP8
 *   kernels accept another, cublasLt.h on CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE),
 *   so the bf16 bias is first widened into a workspace of N floats, exactly.
 *   No activation epilogue: cuBLASLt's GELU is the tanh approximation and
 *   the vision MLP needs exact erf GELU (engine/model/README.md §1.1, hidden_act).
 *   Descriptors, layouts and the heuristic's algorithm are planned once per
 *   shape (mlk_gemm_plan), so after warm-up a GEMM only launches: nothing
 *   is allocated or synchronised, and graph capture records it.
 *
 * Batch-invariant backends (mlk_backend.batch_invariant) give a row the
 * same bits whatever M is, which the two regimes above do not: a decode
 * row is f32 in the GEMV and bf16-rounded in the GEMM, and the heuristic
 * picks another tile shape, and split-K or not, as M changes. So there:
 * - every M, 1 included, takes the GEMM regime;
 * - the algorithm of a weight shape (K, N, bias, alignments) is the
 *   heuristic's first answer for BI_REFERENCE_ROWS rows, asked with
 *   CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = CUBLASLT_REDUCTION_SCHEME_NONE
 *   (one CTA sums all of K for an output tile: no split-K, no reduction
 *   whose order depends on the grid) and alignments capped at
 *   BI_MAX_ALIGN (so the tiles of a tiled call, whose y rows start at
 *   other offsets, keep the key). The heuristic is a function of the
 *   descriptors and the device, so every plan of that shape, whatever its
 *   rows, gets the same algorithm and configuration; each is checked at
 *   its own rows with cublasLtMatmulAlgoCheck and must report SPLITK_NUM 1.
 *   A shape the algorithm cannot run is ML_ERR_UNSUPPORTED, latched, rather
 *   than a silent change of numerics. A row's sum over K is then the same
 *   kernel's on the same tile of K, whichever M-tile holds the row.
 *   Not covered by cuBLASLt's documentation: a stream-K kernel (work split
 *   by the tile count, hence by M) reported as SPLITK_NUM 1; the
 *   invariance test (tests/gpu/test_cuda_ops_invariance.c) would see one.
 *
 * Accuracy of the GEMM regime: rounding x to bf16 (unit roundoff 2^-8)
 * gives each product a relative error δ with E[δ²] ≈ 2^-16·0.54/3 ≈ 2.8e-6
 * (uniform rounding error within a binade, averaged over the significand);
 * summed over K independent terms the output's NMSE is the same 2.8e-6
 * whatever K is. tests/gpu/test_cuda_ops_matmul.c holds it to 2e-5.
 *
 * FP8 weights (matmul_f8): w is E4M3 (N, K), one f32 scale per output row;
 * y = scale[n]·Σ x·q + bias[n] (W8A16, quant_x == 0) or, with quant_x, the
 * W8A8 dynamic per-token contract of backend.h: each row of x quantized to
 * E4M3 with s_x[m] = absmax/448 (quant_rows_kernel), y = Σ qx·q ·
 * (s_x[m]·scale[n]) + bias[n]. Every E4M3 value is exactly a bf16 (and an
 * f32) value, and a product of two is exact in f32, so:
 * - GEMV (M <= GEMV_MAX_M): the bf16 kernel's twin reading 16 weights per
 *   16-byte load, widened exactly; scale (and s_x) multiply the f32 sum.
 *   W8A8 first writes qx as f32 values (exact) and s_x to the workspace.
 *   The op reads 1 byte per weight instead of 2: the decode gain.
 * - GEMM, W8A16 and W8A8 without FP8 tensor cores (sm_80-sm_88): each
 *   column tile of w is expanded exactly to bf16 in the workspace
 *   (to_bf16_f8_kernel) and the bf16 GEMM above runs on it with beta = 0;
 *   x is rounded to bf16 (W8A16: the bf16 GEMM's accuracy, NMSE ~2.8e-6)
 *   or quantized to qx, exact in bf16 (W8A8: f32 summation error only).
 * - GEMM, W8A8 on sm_89+ (mlk_backend.fp8_mma): cublasLtMatmul with A = w
 *   and B = qx both CUDA_R_8F_E4M3, CUBLAS_COMPUTE_32F, C = D f32, in the
 *   TN form FP8 requires (w transposed, x not) with K % 16 == 0 (lda, ldb)
 *   and N % 4 == 0 (ldd: 16 bytes); shapes outside take the bf16 path.
 *   Products exact, but not summed in f32: Hopper's FP8 MMA accumulates in
 *   fewer bits before the partial sums are promoted to f32, even with
 *   FAST_ACCUM off (which keeps fewer still). Measured on an H200: NMSE
 *   ~5e-8 against the exact sum at K = 4096, 50x under the bf16 GEMM's
 *   error (tests/gpu/cuda_ops_harness.h, NMSE_F8_MMA).
 * - then f8_epilogue_kernel: y = y·(s_x[m]·scale[n] or scale[n]) + bias[n].
 *   cuBLASLt could fold this (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for
 *   A and B, the BIAS epilogue), but cublasLt.h does not say on which
 *   devices that scale mode runs, so the extra pass over y (M·N·8 bytes
 *   against a GEMM of 2·M·N·K flops) stays until a GPU has priced both.
 * Batch invariance: as for bf16, every M takes the GEMM path with the
 * shape's one algorithm; the column tiles depend on K and N only, and the
 * quantization and the epilogue are per row, so a row's bits do not depend
 * on the other rows. */
#include "mlk_internal.cuh"

#define GEMV_MAX_M 4
#define GEMV_ROWS 4
#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_LOAD_BYTES 16
#define CONVERT_THREADS 256
#define QUANT_THREADS 256
#define QUANT_WARPS (QUANT_THREADS / 32)
/* E4M3's largest finite magnitude (float8_e4m3fn: 0x7e; 0x7f is NaN). */
#define E4M3_MAX 448.0f
#define E4M3_MAX_CODE 0x7e
/* E4M3's smallest normal, 2^-6, and its subnormal step, 2^-9. */
#define E4M3_MIN_NORMAL 0x1p-6f
#define E4M3_SUBNORMAL_STEPS 0x1p9f
/* f32 exponent bias minus E4M3's (127 - 7), and the f32 mantissa bits
 * below E4M3's three. */
#define E4M3_EXP_REBIAS 120
#define E4M3_REBIAS_SCALE 0x1p120f /* 2^E4M3_EXP_REBIAS */
#define E4M3_DROPPED_BITS 20
#define E4M3_SIGN 0x80u
#define E4M3_MAGNITUDE 0x7fu
/* FP8 matmuls carve the conversion workspace (b->xbf16, MLK_XBF16_BYTES):
 * [0, F8_W_STAGE_BYTES) a column tile of w widened to bf16, then the
 * staged x (bf16, E4M3 or f32), then F8_SX_ROWS f32 row scales s_x. */
#define F8_W_STAGE_BYTES (MLK_XBF16_BYTES / 2)
#define F8_SX_ROWS 16384
#define F8_X_STAGE_BYTES (MLK_XBF16_BYTES - F8_W_STAGE_BYTES - F8_SX_ROWS * sizeof(float))
/* Column tiles of w start every F8_TILE_N_STEP rows (256 bytes of f32 y). */
#define F8_TILE_N_STEP 64
/* cuBLASLt's FP8 kernels: lda, ldb (bytes of E4M3) and ldd (bytes of f32)
 * multiples of 16, operands 16-byte aligned. */
#define FP8_LD_BYTES 16
/* cuBLASLt's default (and largest) alignment assumption for its operands. */
#define LT_MAX_ALIGN 256u
/* Batch-invariant GEMMs: the rows the algorithm of a weight shape is chosen
 * for (a decode batch of the larger deployments, a small prefill chunk:
 * tiles sized for it waste little at M = 1 and stay reasonable at M =
 * 2048), and the largest operand alignment assumed (16 bytes, the vector
 * load every tensor-core kernel needs). */
#define BI_REFERENCE_ROWS 64
#define BI_MAX_ALIGN 16u

/* ---- GEMV regime ---------------------------------------------------------------------- */

/* ---- E4M3 ------------------------------------------------------------------------------ */

/* The exact f32 value of a finite E4M3 code: its seven magnitude bits put
 * under an f32 exponent field (a subnormal f32 for E4M3's subnormals),
 * scaled by 2^120, exact because kernels keep f32 denormals (no
 * --use_fast_math, kernels/CMakeLists.txt). Five integer/float operations,
 * no branch: the GEMV's decode cost per weight. */
__device__ __forceinline__ float e4m3_to_f32(uint32_t c)
{
    const uint32_t bits = ((c & E4M3_SIGN) << 24) | ((c & E4M3_MAGNITUDE) << E4M3_DROPPED_BITS);
    return __uint_as_float(bits) * E4M3_REBIAS_SCALE;
}

/* |v| (finite, not NaN) to the nearest E4M3 magnitude code, ties to even,
 * saturating at E4M3_MAX: the W8A8 contract's rounding (backend.h). */
__device__ __forceinline__ uint32_t e4m3_magnitude_code(float a)
{
    if (a < E4M3_MIN_NORMAL) /* subnormal steps of 2^-9, exact in f32 */
        return (uint32_t)rintf(a * E4M3_SUBNORMAL_STEPS);
    /* Round the f32 mantissa to three bits in place (a carry moves into the
     * exponent, as it must), then rebias the exponent. */
    const uint32_t u = __float_as_uint(a);
    const uint32_t round_bias =
        (1u << (E4M3_DROPPED_BITS - 1)) - 1u + ((u >> E4M3_DROPPED_BITS) & 1u);
    const uint32_t code = ((u + round_bias) >> E4M3_DROPPED_BITS) - (E4M3_EXP_REBIAS << 3);
    return code < E4M3_MAX_CODE ? code : E4M3_MAX_CODE;
}

/* ---- GEMV regime ---------------------------------------------------------------------- */

/* The weight formats of gemv_kernel: PER_LOAD weights in one 16-byte load,
 * dot() their sum of products with x (PER_LOAD / 4 float4), widened exactly. */
struct Bf16Weights {
    typedef uint16_t elem;
    static constexpr int PER_LOAD = GEMV_LOAD_BYTES / sizeof(uint16_t);
    __device__ static __forceinline__ float widen(uint32_t word, int high)
    {
        return __uint_as_float(high ? word & 0xffff0000u : word << 16);
    }
    __device__ static __forceinline__ float dot(uint4 w, const float4 *x, float acc)
    {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float4 a = x[i];
            acc = fmaf(widen(words[2 * i], 0), a.x, acc);
            acc = fmaf(widen(words[2 * i], 1), a.y, acc);
            acc = fmaf(widen(words[2 * i + 1], 0), a.z, acc);
            acc = fmaf(widen(words[2 * i + 1], 1), a.w, acc);
        }
        return acc;
    }
};

struct F8Weights {
    typedef uint8_t elem;
    static constexpr int PER_LOAD = GEMV_LOAD_BYTES;
    __device__ static __forceinline__ float dot(uint4 w, const float4 *x, float acc)
    {
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 a = x[i];
            acc = fmaf(e4m3_to_f32(words[i] & 0xffu), a.x, acc);
            acc = fmaf(e4m3_to_f32((words[i] >> 8) & 0xffu), a.y, acc);
            acc = fmaf(e4m3_to_f32((words[i] >> 16) & 0xffu), a.z, acc);
            acc = fmaf(e4m3_to_f32(words[i] >> 24), a.w, acc);
        }
        return acc;
    }
};

/* Block b computes y[m, n] for n in [b·GEMV_ROWS, +GEMV_ROWS), every m < M.
 * The K/PER_LOAD chunks of a row are spread over the block's threads, so
 * each weight byte is loaded once; partial sums meet in a block reduction.
 * scale (N) f32 or NULL multiplies each sum (FP8 weights), and xscale (M)
 * f32 or NULL with it (W8A8: s_x[m]·scale[n]), before the bias. */
template <int MAXM, class W>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(float *y, const float *x, const typename W::elem *w, const float *scale,
                const float *xscale, const uint16_t *bias, int M, int K, int N, int accumulate)
{
    constexpr int X_LOADS = W::PER_LOAD / 4; /* float4 of x per chunk */
    __shared__ float partial[GEMV_WARPS][GEMV_ROWS * MAXM];
    const int n0 = blockIdx.x * GEMV_ROWS;
    const int chunks = K / W::PER_LOAD;
    float acc[GEMV_ROWS][MAXM];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < MAXM; m++)
            acc[r][m] = 0.0f;

#pragma unroll 2
    for (int c = threadIdx.x; c < chunks; c += GEMV_THREADS) {
        uint4 wv[GEMV_ROWS];
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++)
            wv[r] = n0 + r < N ? __ldg((const uint4 *)(w + (size_t)(n0 + r) * K) + c)
                               : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int m = 0; m < MAXM; m++) {
            if (m >= M)
                break;
            const float4 *xm = (const float4 *)(x + (size_t)m * K) + X_LOADS * c;
            float4 xv[X_LOADS];
#pragma unroll
            for (int i = 0; i < X_LOADS; i++)
                xv[i] = __ldg(xm + i);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
                acc[r][m] = W::dot(wv[r], xv, acc[r][m]);
        }
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++)
#pragma unroll
        for (int m = 0; m < MAXM; m++) {
            const float s = mlk_warp_sum(acc[r][m]);
            if (lane == 0)
                partial[warp][r * MAXM + m] = s;
        }
    __syncthreads();
    const int r = threadIdx.x / MAXM, m = threadIdx.x % MAXM;
    if (threadIdx.x < GEMV_ROWS * MAXM && m < M && n0 + r < N) {
        float dot = 0.0f;
        for (int wi = 0; wi < GEMV_WARPS; wi++)
            dot += partial[wi][r * MAXM + m];
        if (scale)
            dot *= xscale ? xscale[m] * scale[n0 + r] : scale[n0 + r];
        const float v = dot + (bias ? mlk_bf16(bias[n0 + r]) : 0.0f);
        float *yp = &y[(size_t)m * N + n0 + r];
        *yp = accumulate ? *yp + v : v;
    }
}

/* GEMV needs 16-byte aligned rows of w and x. */
template <class W> static bool gemv_fits(const float *x, const void *w, int M, int K)
{
    return M <= GEMV_MAX_M && K % W::PER_LOAD == 0 && (uintptr_t)x % GEMV_LOAD_BYTES == 0 &&
           (uintptr_t)w % GEMV_LOAD_BYTES == 0;
}

template <class W>
static void gemv(mlk_backend *b, float *y, const float *x, const typename W::elem *w,
                 const float *scale, const float *xscale, const uint16_t *bias, int M, int K,
                 int N, int accumulate)
{
    const unsigned blocks = (unsigned)((N + GEMV_ROWS - 1) / GEMV_ROWS);
    if (M == 1)
        mlk_launch(gemv_kernel<1, W>, blocks, GEMV_THREADS, 0,
                   b->stream, y, x, w, scale, xscale, bias, M, K, N, accumulate);
    else if (M == 2)
        mlk_launch(gemv_kernel<2, W>, blocks, GEMV_THREADS, 0,
                   b->stream, y, x, w, scale, xscale, bias, M, K, N, accumulate);
    else
        mlk_launch(gemv_kernel<GEMV_MAX_M, W>, blocks, GEMV_THREADS, 0,
                   b->stream, y, x, w, scale, xscale, bias, M, K, N, accumulate);
    mlk_launched(b, "matmul (gemv)");
}

/* ---- GEMM regime ---------------------------------------------------------------------- */

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* dst[n] = bias[n] in f32: exact, bf16 being a truncated f32. */
__global__ void widen_bias_kernel(float *dst, const uint16_t *bias, int N)
{
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x)
        dst[n] = mlk_bf16(bias[n]);
}

/* y[m, n] = (accumulate ? y[m, n] : 0) + bias[n]: the K = 0 case. */
__global__ void bias_kernel(float *y, const uint16_t *bias, int M, int N, int accumulate)
{
    const size_t total = (size_t)M * N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const float bv = mlk_bf16(bias[e % N]);
        y[e] = accumulate ? y[e] + bv : bv;
    }
}

/* Largest power of two dividing the address, capped at `cap` (at most
 * LT_MAX_ALIGN): what the heuristic may assume of an operand. */
static uint32_t alignment(const void *p, uint32_t cap)
{
    const uintptr_t v = (uintptr_t)p;
    uint32_t a = 1;
    while (a < cap && (v & a) == 0)
        a <<= 1;
    return a;
}

/* Latch a cuBLASLt failure; returns 1 when st is one. */
static int lt_failed(mlk_backend *b, cublasStatus_t st, const char *call, int rows, int K, int N)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 0;
    mlk_latch(b, ML_ERR_IO, "matmul", "%s (%d x %d x %d): %s", call, rows, K, N,
              cublasLtGetStatusString(st));
    return 1;
}

/* The batch-invariant contract for algo, chosen at BI_REFERENCE_ROWS, on
 * plan p's own rows: cuBLASLt accepts it there and it sums K in one pass.
 * Returns 0, or 1 with ML_ERR_UNSUPPORTED latched. */
static int invariant_algo_check(mlk_backend *b, mlk_gemm_plan *p, const cublasLtMatmulAlgo_t *algo)
{
    const int rows = p->key.rows, K = p->key.K, N = p->key.N;
    cublasLtMatmulHeuristicResult_t checked;
    int32_t splits = 0;
    size_t written = 0;
    cublasStatus_t st = cublasLtMatmulAlgoConfigGetAttribute(
        algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoCheck(b->lt, &p->desc, &p->w_layout, &p->x_layout, &p->y_layout,
                                     &p->y_layout, algo, &checked);
    if (st == CUBLAS_STATUS_SUCCESS && checked.workspaceSize > MLK_LT_WS_BYTES)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS && splits == 1)
        return 0;
    mlk_latch(b, ML_ERR_UNSUPPORTED, "matmul",
              "batch-invariant GEMM %d x %d x %d: the algorithm chosen at %d rows %s (turn "
              "batch invariance off to run this shape)",
              rows, K, N, BI_REFERENCE_ROWS,
              st != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(st) : "splits K");
    return 1;
}

/* Build plan p in place for key k: yᵀ (N, rows) = w (K, N)ᵀ · xᵀ (K, rows)
 * in cuBLASLt's column-major view of the row-major tensors: w (N, K) is a
 * column-major (K, N) matrix with ld K used transposed, x (rows, K) the
 * staged activations (bf16 or E4M3, as w) as (K, rows), y (rows, N) as
 * (N, rows) with ld ldy. The same product as cublasGemmEx(OP_T, OP_N, N,
 * rows, K, w, K, x, K, y, ldy): the TN form FP8 kernels require.
 * Returns 0, or 1 with the error latched and p left empty. */
static int plan_build(mlk_backend *b, mlk_gemm_plan *p, const mlk_gemm_key *k)
{
    const int rows = k->rows, K = k->K, N = k->N, bias = k->bias;
    const cudaDataType_t ab = (cudaDataType_t)k->ab_type;
    const uint32_t align_w = k->align_w, align_y = k->align_y;
    const int32_t trans_w = CUBLAS_OP_T;
    const uint32_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    /* Fixed for the backend's life, so it belongs to the plan. Its type is
     * left at the default: D's, f32. */
    const float *bias_ptr = b->bias_f32;
    const uint64_t ws_bytes = MLK_LT_WS_BYTES;
    const uint32_t align_x = MLK_POOL_ALIGN; /* the staging is a pool block */
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t found;
    int n_found = 0;

    p->key.rows = 0;
    p->last_use = 0;
    cublasStatus_t st = cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w,
                                            sizeof trans_w);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                            sizeof epilogue);
    if (st == CUBLAS_STATUS_SUCCESS && bias)
        st = cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                            &bias_ptr, sizeof bias_ptr);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->w_layout, ab, (uint64_t)K, (uint64_t)N, K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->x_layout, ab, (uint64_t)K, (uint64_t)rows, K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->y_layout, CUDA_R_32F, (uint64_t)N, (uint64_t)rows,
                                      k->ldy);
    if (lt_failed(b, st, "cuBLASLt descriptors", rows, K, N))
        return 1;

    st = cublasLtMatmulPreferenceInit(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof ws_bytes);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof align_w);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof align_x);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_y, sizeof align_y);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(
            &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_y, sizeof align_y);
    if (st == CUBLAS_STATUS_SUCCESS && b->batch_invariant)
        st = cublasLtMatmulPreferenceSetAttribute(
            &pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_reduction, sizeof no_reduction);
    /* Batch-invariant: ask for the reference rows, whatever this plan's. */
    cublasLtMatrixLayoutOpaque_t x_ref, y_ref;
    cublasLtMatrixLayout_t x_ask = &p->x_layout, y_ask = &p->y_layout;
    if (st == CUBLAS_STATUS_SUCCESS && b->batch_invariant) {
        st = cublasLtMatrixLayoutInit(&x_ref, ab, (uint64_t)K, BI_REFERENCE_ROWS, K);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutInit(&y_ref, CUDA_R_32F, (uint64_t)N, BI_REFERENCE_ROWS,
                                          k->ldy);
        x_ask = &x_ref;
        y_ask = &y_ref;
    }
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(b->lt, &p->desc, &p->w_layout, x_ask, y_ask, y_ask,
                                            &pref, 1, &found, &n_found);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = n_found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : found.state;
    if (lt_failed(b, st, "cublasLtMatmulAlgoGetHeuristic", rows, K, N))
        return 1;
    p->key = *k; /* the layouts are the key's; invariant_algo_check reads its shape */
    if (b->batch_invariant && invariant_algo_check(b, p, &found.algo)) {
        p->key.rows = 0;
        return 1;
    }
    p->algo = found.algo;
    return 0;
}

static bool key_equal(const mlk_gemm_key *a, const mlk_gemm_key *b)
{
    return a->rows == b->rows && a->K == b->K && a->N == b->N && a->ldy == b->ldy &&
           a->bias == b->bias && a->ab_type == b->ab_type && a->align_w == b->align_w &&
           a->align_y == b->align_y;
}

/* The plan for this GEMM: a cached one, else a new one in place of the
 * least recently used (empty slots first). NULL with the error latched
 * when cuBLASLt cannot plan it. */
static mlk_gemm_plan *plan_for(mlk_backend *b, const mlk_gemm_key *k)
{
    mlk_gemm_plan *victim = &b->gemm_plans[0];
    const uint64_t now = ++b->gemm_clock;
    for (int i = 0; i < MLK_GEMM_PLANS; i++) {
        mlk_gemm_plan *p = &b->gemm_plans[i];
        if (p->key.rows != 0 && key_equal(&p->key, k)) {
            p->last_use = now;
            return p;
        }
        if (p->last_use < victim->last_use)
            victim = p;
    }
    if (plan_build(b, victim, k))
        return NULL;
    victim->last_use = now;
    return victim;
}

static void gemm(mlk_backend *b, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                 int M, int K, int N, int accumulate)
{
    const size_t ws_elems = MLK_XBF16_BYTES / sizeof(__nv_bfloat16);
    const int tile_m = (size_t)M * K <= ws_elems ? M : (int)(ws_elems / (size_t)K);
    if (tile_m < 1) {
        mlk_latch(b, ML_ERR_UNSUPPORTED, "matmul", "K = %d exceeds the conversion workspace", K);
        return;
    }
    if (bias) {
        if ((size_t)N > MLK_BIAS_F32_BYTES / sizeof(float)) {
            mlk_latch(b, ML_ERR_UNSUPPORTED, "matmul", "N = %d exceeds the bias workspace", N);
            return;
        }
        mlk_launch(widen_bias_kernel, mlk_blocks((size_t)N, CONVERT_THREADS), CONVERT_THREADS, 0,
                   b->stream, b->bias_f32, bias, N);
        mlk_launched(b, "matmul (bias)");
    }
    /* Read by cublasLtMatmul at the call (host pointer mode), so a graph
     * records the values. */
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const uint32_t cap = b->batch_invariant ? BI_MAX_ALIGN : LT_MAX_ALIGN;
    const uint32_t align_w = alignment(w, cap);
    for (int m0 = 0; m0 < M && b->err_status == ML_OK; m0 += tile_m) {
        const int rows = M - m0 < tile_m ? M - m0 : tile_m;
        float *y_tile = y + (size_t)m0 * N; /* (rows, N) */
        const mlk_gemm_key key = {rows, K, N, N, bias != NULL, CUDA_R_16BF, align_w,
                                  alignment(y_tile, cap)};
        mlk_gemm_plan *p = plan_for(b, &key);
        if (!p)
            return;
        const size_t n = (size_t)rows * K;
        mlk_launch(to_bf16_kernel, mlk_blocks(n, CONVERT_THREADS), CONVERT_THREADS, 0,
                   b->stream, b->xbf16, x + (size_t)m0 * K, n);
        mlk_launched(b, "matmul (convert)");
        cublasStatus_t st = cublasLtMatmul(b->lt, &p->desc, &alpha, w, &p->w_layout, b->xbf16,
                                           &p->x_layout, &beta, y_tile, &p->y_layout, y_tile,
                                           &p->y_layout, &p->algo, b->lt_ws, MLK_LT_WS_BYTES,
                                           b->stream);
        lt_failed(b, st, "cublasLtMatmul", rows, K, N);
    }
}

/* y = (accumulate ? y : 0) + bias: a matmul with K = 0, an empty sum. */
static void empty_sum(mlk_backend *b, float *y, const uint16_t *bias, int M, int N, int accumulate)
{
    if (bias) {
        mlk_launch(bias_kernel, mlk_blocks((size_t)M * N, CONVERT_THREADS), CONVERT_THREADS, 0,
                   b->stream, y, bias, M, N, accumulate);
        mlk_launched(b, "matmul (bias)");
    } else if (!accumulate) {
        mlk_cuda_failed(b, cudaMemsetAsync(y, 0, (size_t)M * N * sizeof *y, b->stream), "matmul");
    }
}

void mlk_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                int M, int K, int N, int accumulate)
{
    mlk_backend *b = mlk_of(be);
    if (M <= 0 || N <= 0 || mlk_enter(b))
        return;
    if (K <= 0)
        empty_sum(b, y, bias, M, N, accumulate);
    else if (!b->batch_invariant && gemv_fits<Bf16Weights>(x, w, M, K))
        gemv<Bf16Weights>(b, y, x, w, NULL, NULL, bias, M, K, N, accumulate);
    else
        gemm(b, y, x, w, bias, M, K, N, accumulate);
}

/* ---- FP8 weights ---------------------------------------------------------------------- */

/* How quant_rows_kernel stores qx: E4M3 codes for the FP8 GEMM, their
 * exact bf16 for the bf16 GEMM, their exact f32 for the GEMV. */
__device__ __forceinline__ void store_q(uint8_t *dst, uint32_t code) { *dst = (uint8_t)code; }
__device__ __forceinline__ void store_q(__nv_bfloat16 *dst, uint32_t code)
{
    *dst = __float2bfloat16_rn(e4m3_to_f32(code)); /* exact: E4M3 is a subset of bf16 */
}
__device__ __forceinline__ void store_q(float *dst, uint32_t code) { *dst = e4m3_to_f32(code); }

/* Block m quantizes row m of x (rows, K), the W8A8 contract (backend.h):
 * sx[m] = absmax / 448 (1 for a zero row), qx[m][k] = E4M3(x / sx[m]),
 * both divisions f32 (IEEE: no --use_fast_math). */
template <class Q>
__global__ void __launch_bounds__(QUANT_THREADS)
    quant_rows_kernel(Q *qx, float *sx, const float *x, int K)
{
    __shared__ float partial[QUANT_WARPS];
    const float *row = x + (size_t)blockIdx.x * K;
    float amax = 0.0f;
    for (int k = threadIdx.x; k < K; k += QUANT_THREADS)
        amax = fmaxf(amax, fabsf(row[k]));
    amax = mlk_warp_max(amax);
    if (threadIdx.x % 32 == 0)
        partial[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < QUANT_WARPS; i++)
        amax = fmaxf(amax, partial[i]);
    const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
    if (threadIdx.x == 0)
        sx[blockIdx.x] = s;
    Q *out = qx + (size_t)blockIdx.x * K;
    for (int k = threadIdx.x; k < K; k += QUANT_THREADS) {
        const float v = row[k] / s;
        store_q(&out[k], e4m3_magnitude_code(fabsf(v)) | (v < 0.0f ? E4M3_SIGN : 0u));
    }
}

/* dst[i] = the bf16 of E4M3 code src[i], exactly (a column tile of w). */
__global__ void to_bf16_f8_kernel(__nv_bfloat16 *dst, const uint8_t *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        store_q(&dst[i], src[i]);
}

/* y[m, n] = y[m, n] · (sx[m] · scale[n], or scale[n] without sx) + bias[n]
 * over y (rows, N): the scales of an FP8 GEMM's raw sums. */
__global__ void f8_epilogue_kernel(float *y, const float *scale, const float *sx,
                                   const uint16_t *bias, int rows, int N)
{
    const size_t total = (size_t)rows * N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const int n = (int)(e % N);
        const float s = sx ? sx[e / N] * scale[n] : scale[n];
        y[e] = y[e] * s + (bias ? mlk_bf16(bias[n]) : 0.0f);
    }
}

/* The FP8 regions of the conversion workspace (F8_W_STAGE_BYTES above). */
static unsigned char *f8_w_stage(mlk_backend *b) { return (unsigned char *)b->xbf16; }
static unsigned char *f8_x_stage(mlk_backend *b) { return f8_w_stage(b) + F8_W_STAGE_BYTES; }
static float *f8_sx(mlk_backend *b) { return (float *)(f8_x_stage(b) + F8_X_STAGE_BYTES); }

/* The raw sums of rows x rows of staged x for every column of y (rows, N):
 * one bf16 GEMM per column tile of w, each tile widened to bf16 first
 * (again for every M tile unless w is one tile, staged at m0 == 0). */
static void gemm_f8_widened(mlk_backend *b, float *y_tile, const uint8_t *w, int m0, int rows,
                            int K, int N, uint32_t cap)
{
    const size_t stage_elems = F8_W_STAGE_BYTES / sizeof(__nv_bfloat16);
    int tile_n = (int)(stage_elems / (size_t)K);
    tile_n = tile_n >= N ? N : tile_n - tile_n % F8_TILE_N_STEP;
    if (tile_n < 1) {
        mlk_latch(b, ML_ERR_UNSUPPORTED, "matmul_f8", "K = %d exceeds the weight workspace", K);
        return;
    }
    __nv_bfloat16 *w_bf16 = (__nv_bfloat16 *)f8_w_stage(b);
    const float alpha = 1.0f, beta = 0.0f;
    const uint32_t align_w = alignment(w_bf16, cap);
    for (int n0 = 0; n0 < N && b->err_status == ML_OK; n0 += tile_n) {
        const int cols = N - n0 < tile_n ? N - n0 : tile_n;
        if (tile_n < N || m0 == 0) {
            const size_t n = (size_t)cols * K;
            mlk_launch(to_bf16_f8_kernel, mlk_blocks(n, CONVERT_THREADS), CONVERT_THREADS, 0,
                       b->stream, w_bf16, w + (size_t)n0 * K, n);
            mlk_launched(b, "matmul_f8 (widen)");
        }
        float *y_cols = y_tile + n0; /* (rows, cols) of ld N */
        const mlk_gemm_key key = {rows, K, cols, N, 0, CUDA_R_16BF, align_w,
                                  alignment(y_cols, cap)};
        mlk_gemm_plan *p = plan_for(b, &key);
        if (!p)
            return;
        cublasStatus_t st = cublasLtMatmul(b->lt, &p->desc, &alpha, w_bf16, &p->w_layout,
                                           f8_x_stage(b), &p->x_layout, &beta, y_cols,
                                           &p->y_layout, y_cols, &p->y_layout, &p->algo, b->lt_ws,
                                           MLK_LT_WS_BYTES, b->stream);
        lt_failed(b, st, "cublasLtMatmul", rows, K, cols);
    }
}

/* The FP8 GEMM's layout rules (FP8_LD_BYTES), met by the shape and the
 * pointers; otherwise W8A8 takes the bf16 path. */
static bool fp8_gemm_fits(const uint8_t *w, const float *y, int K, int N)
{
    return K % FP8_LD_BYTES == 0 && ((size_t)N * sizeof(float)) % FP8_LD_BYTES == 0 &&
           (uintptr_t)w % FP8_LD_BYTES == 0 && (uintptr_t)y % FP8_LD_BYTES == 0;
}

static void gemm_f8(mlk_backend *b, float *y, const float *x, const uint8_t *w,
                    const float *scale, const uint16_t *bias, int M, int K, int N, int quant_x)
{
    const bool fp8 = quant_x && b->fp8_mma && fp8_gemm_fits(w, y, K, N);
    const size_t x_elem = fp8 ? 1 : sizeof(__nv_bfloat16);
    size_t tile_m = F8_X_STAGE_BYTES / (x_elem * (size_t)K);
    tile_m = tile_m < F8_SX_ROWS ? tile_m : F8_SX_ROWS;
    if (tile_m < 1) {
        mlk_latch(b, ML_ERR_UNSUPPORTED, "matmul_f8", "K = %d exceeds the conversion workspace", K);
        return;
    }
    const uint32_t cap = b->batch_invariant ? BI_MAX_ALIGN : LT_MAX_ALIGN;
    const float alpha = 1.0f, beta = 0.0f;
    float *sx = quant_x ? f8_sx(b) : NULL;
    for (int m0 = 0; m0 < M && b->err_status == ML_OK; m0 += (int)tile_m) {
        const int rows = (size_t)(M - m0) < tile_m ? M - m0 : (int)tile_m;
        const float *x_tile = x + (size_t)m0 * K; /* (rows, K) */
        float *y_tile = y + (size_t)m0 * N;       /* (rows, N) */
        const size_t n = (size_t)rows * K;
        if (fp8)
            mlk_launch(quant_rows_kernel<uint8_t>, rows, QUANT_THREADS, 0, b->stream,
                       f8_x_stage(b), sx, x_tile, K);
        else if (quant_x)
            mlk_launch(quant_rows_kernel<__nv_bfloat16>, rows, QUANT_THREADS, 0, b->stream,
                       (__nv_bfloat16 *)f8_x_stage(b), sx, x_tile, K);
        else
            mlk_launch(to_bf16_kernel, mlk_blocks(n, CONVERT_THREADS), CONVERT_THREADS, 0,
                       b->stream, (__nv_bfloat16 *)f8_x_stage(b), x_tile, n);
        mlk_launched(b, "matmul_f8 (stage x)");
        if (fp8) {
            const mlk_gemm_key key = {rows, K, N, N, 0, CUDA_R_8F_E4M3, alignment(w, cap),
                                      alignment(y_tile, cap)};
            mlk_gemm_plan *p = plan_for(b, &key);
            if (!p)
                return;
            lt_failed(b,
                      cublasLtMatmul(b->lt, &p->desc, &alpha, w, &p->w_layout, f8_x_stage(b),
                                     &p->x_layout, &beta, y_tile, &p->y_layout, y_tile,
                                     &p->y_layout, &p->algo, b->lt_ws, MLK_LT_WS_BYTES, b->stream),
                      "cublasLtMatmul (FP8)", rows, K, N);
        } else {
            gemm_f8_widened(b, y_tile, w, m0, rows, K, N, cap);
        }
        if (b->err_status != ML_OK)
            return;
        mlk_launch(f8_epilogue_kernel, mlk_blocks((size_t)rows * N, CONVERT_THREADS),
                   CONVERT_THREADS, 0, b->stream, y_tile, scale, sx, bias, rows, N);
        mlk_launched(b, "matmul_f8 (epilogue)");
    }
}

void mlk_matmul_f8(ml_backend *be, float *y, const float *x, const uint8_t *w, const float *scale,
                   const uint16_t *bias, int M, int K, int N, int quant_x)
{
    mlk_backend *b = mlk_of(be);
    if (M <= 0 || N <= 0 || mlk_enter(b))
        return;
    if (K <= 0) {
        empty_sum(b, y, bias, M, N, 0);
        return;
    }
    if (b->batch_invariant || !gemv_fits<F8Weights>(x, w, M, K) ||
        (size_t)M * K * sizeof(float) > F8_X_STAGE_BYTES) {
        gemm_f8(b, y, x, w, scale, bias, M, K, N, quant_x);
        return;
    }
    const float *xg = x, *sx = NULL;
    if (quant_x) { /* qx (M, K) as exact f32 values, and s_x (M) */
        float *qx = (float *)f8_x_stage(b);
        mlk_launch(quant_rows_kernel<float>, M, QUANT_THREADS, 0, b->stream, qx, f8_sx(b), x, K);
        mlk_launched(b, "matmul_f8 (quantize x)");
        xg = qx;
        sx = f8_sx(b);
    }
    gemv<F8Weights>(b, y, xg, w, scale, sx, bias, M, K, N, 0);
}
