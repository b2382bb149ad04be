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
 * whatever K is. tests/gpu/test_cuda_ops_matmul.c holds it to 2e-5. */
#include "mlk_internal.cuh"

#define GEMV_MAX_M 4
#define GEMV_ROWS 4
#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
/* bf16 per 16-byte load. */
#define GEMV_CHUNK 8
#define CONVERT_THREADS 256
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

/* Σ over 8 elements of w (8 bf16 in a uint4) times x (two float4). */
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b, float acc)
{
    acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
    acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
    acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
    acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
    acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
    acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
    acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
    acc = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
    return acc;
}

/* Block b computes y[m, n] for n in [b·GEMV_ROWS, +GEMV_ROWS), every m < M.
 * The K/8 chunks of a row are spread over the block's threads, so each
 * weight byte is loaded once; partial sums meet in a block reduction. */
template <int MAXM>
__global__ void __launch_bounds__(GEMV_THREADS)
    gemv_kernel(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int M, int K,
                int N, int accumulate)
{
    __shared__ float partial[GEMV_WARPS][GEMV_ROWS * MAXM];
    const int n0 = blockIdx.x * GEMV_ROWS;
    const int chunks = K / GEMV_CHUNK;
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
            const float4 *xm = (const float4 *)(x + (size_t)m * K) + 2 * c;
            const float4 xa = __ldg(xm), xb = __ldg(xm + 1);
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++)
                acc[r][m] = dot8(wv[r], xa, xb, acc[r][m]);
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
        const float v = dot + (bias ? mlk_bf16(bias[n0 + r]) : 0.0f);
        float *yp = &y[(size_t)m * N + n0 + r];
        *yp = accumulate ? *yp + v : v;
    }
}

/* GEMV needs 16-byte aligned rows of w and x. */
static bool gemv_fits(const float *x, const uint16_t *w, int M, int K)
{
    return M <= GEMV_MAX_M && K % GEMV_CHUNK == 0 && (uintptr_t)x % 16 == 0 &&
           (uintptr_t)w % 16 == 0;
}

static void gemv(mlk_backend *b, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                 int M, int K, int N, int accumulate)
{
    const unsigned blocks = (unsigned)((N + GEMV_ROWS - 1) / GEMV_ROWS);
    if (M == 1)
        mlk_launch(gemv_kernel<1>, blocks, GEMV_THREADS, 0,
                   b->stream, y, x, w, bias, M, K, N, accumulate);
    else if (M == 2)
        mlk_launch(gemv_kernel<2>, blocks, GEMV_THREADS, 0,
                   b->stream, y, x, w, bias, M, K, N, accumulate);
    else
        mlk_launch(gemv_kernel<GEMV_MAX_M>, blocks, GEMV_THREADS, 0,
                   b->stream, y, x, w, bias, M, K, N, accumulate);
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
static int invariant_algo_check(mlk_backend *b, mlk_gemm_plan *p, const cublasLtMatmulAlgo_t *algo,
                                int rows, int K, int N)
{
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

/* Build plan p in place for yᵀ (N, rows) = w (K, N)ᵀ · xᵀ (K, rows) in
 * cuBLASLt's column-major view of the row-major tensors: w (N, K) is a
 * column-major (K, N) matrix with ld K used transposed, x (rows, K) the
 * staged bf16 activations as (K, rows), y (rows, N) as (N, rows) with ld N.
 * The same product as cublasGemmEx(OP_T, OP_N, N, rows, K, w, K, x, K, y, N).
 * Returns 0, or 1 with the error latched and p left empty. */
static int plan_build(mlk_backend *b, mlk_gemm_plan *p, int rows, int K, int N, int bias,
                      uint32_t align_w, uint32_t align_y)
{
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

    p->rows = 0;
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
        st = cublasLtMatrixLayoutInit(&p->w_layout, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->x_layout, CUDA_R_16BF, (uint64_t)K, (uint64_t)rows, K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->y_layout, CUDA_R_32F, (uint64_t)N, (uint64_t)rows, N);
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
        st = cublasLtMatrixLayoutInit(&x_ref, CUDA_R_16BF, (uint64_t)K, BI_REFERENCE_ROWS, K);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutInit(&y_ref, CUDA_R_32F, (uint64_t)N, BI_REFERENCE_ROWS, N);
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
    if (b->batch_invariant && invariant_algo_check(b, p, &found.algo, rows, K, N))
        return 1;

    p->algo = found.algo;
    p->K = K;
    p->N = N;
    p->bias = bias;
    p->align_w = align_w;
    p->align_y = align_y;
    p->rows = rows;
    return 0;
}

/* The plan for this GEMM: a cached one, else a new one in place of the
 * least recently used (empty slots first). NULL with the error latched
 * when cuBLASLt cannot plan it. */
static mlk_gemm_plan *plan_for(mlk_backend *b, int rows, int K, int N, int bias, uint32_t align_w,
                               uint32_t align_y)
{
    mlk_gemm_plan *victim = &b->gemm_plans[0];
    const uint64_t now = ++b->gemm_clock;
    for (int i = 0; i < MLK_GEMM_PLANS; i++) {
        mlk_gemm_plan *p = &b->gemm_plans[i];
        if (p->rows == rows && p->K == K && p->N == N && p->bias == bias &&
            p->align_w == align_w && p->align_y == align_y) {
            p->last_use = now;
            return p;
        }
        if (p->last_use < victim->last_use)
            victim = p;
    }
    if (plan_build(b, victim, rows, K, N, bias, align_w, align_y))
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
        mlk_gemm_plan *p = plan_for(b, rows, K, N, bias != NULL, align_w, alignment(y_tile, cap));
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

void mlk_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                int M, int K, int N, int accumulate)
{
    mlk_backend *b = mlk_of(be);
    if (M <= 0 || N <= 0 || mlk_enter(b))
        return;
    if (K <= 0) { /* an empty sum: y = (accumulate ? y : 0) + bias */
        if (bias) {
            mlk_launch(bias_kernel, mlk_blocks((size_t)M * N, CONVERT_THREADS), CONVERT_THREADS, 0,
                       b->stream, y, bias, M, N, accumulate);
            mlk_launched(b, "matmul (bias)");
        } else if (!accumulate) {
            mlk_cuda_failed(b, cudaMemsetAsync(y, 0, (size_t)M * N * sizeof *y, b->stream),
                            "matmul");
        }
        return;
    }
    if (!b->batch_invariant && gemv_fits(x, w, M, K))
        gemv(b, y, x, w, bias, M, K, N, accumulate);
    else
        gemm(b, y, x, w, bias, M, K, N, accumulate);
}
