/* matmul: y (M, N) = x (M, K) · wᵀ + bias, w bf16 (N, K) row-major, x and y
 * f32, f32 accumulation (backend.h). Two regimes, as on the CPU:
 *
 * - M <= GEMV_MAX_M (decode): memory-bound on the weights. gemv_kernel
 *   streams GEMV_ROWS weight rows per block once, 16 bytes per thread per
 *   load, against f32 x read through L1; no rounding of x, so these rows
 *   match the CPU to f32 summation order.
 * - larger M (prefill, the vision tower): cuBLAS on the tensor cores. x is
 *   rounded to bf16 into the backend's workspace (tiled over M when
 *   M·K exceeds it), then cublasGemmEx with bf16 A/B, f32 C and
 *   CUBLAS_COMPUTE_32F. The bias (bf16) is first added into y by a small
 *   kernel, so the GEMM always runs with beta = 1 when there is one.
 *
 * Accuracy of the GEMM regime: rounding x to bf16 (unit roundoff 2^-8)
 * gives each product a relative error δ with E[δ²] ≈ 2^-16·0.54/3 ≈ 2.8e-6
 * (uniform rounding error within a binade, averaged over the significand);
 * summed over K independent terms the output's NMSE is the same 2.8e-6
 * whatever K is. tests/gpu/test_cuda_ops.c holds it to 2e-5.
 * Compiled, not yet run on a GPU. */
#include "mlk_internal.cuh"

#define GEMV_MAX_M 4
#define GEMV_ROWS 4
#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
/* bf16 per 16-byte load. */
#define GEMV_CHUNK 8
#define CONVERT_THREADS 256

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
        gemv_kernel<1><<<blocks, GEMV_THREADS, 0, b->stream>>>(y, x, w, bias, M, K, N, accumulate);
    else if (M == 2)
        gemv_kernel<2><<<blocks, GEMV_THREADS, 0, b->stream>>>(y, x, w, bias, M, K, N, accumulate);
    else
        gemv_kernel<GEMV_MAX_M><<<blocks, GEMV_THREADS, 0, b->stream>>>(y, x, w, bias, M, K, N,
                                                                        accumulate);
    mlk_launched(b, "matmul (gemv)");
}

/* ---- GEMM regime ---------------------------------------------------------------------- */

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

/* y[m, n] = (accumulate ? y[m, n] : 0) + bias[n]. */
__global__ void bias_kernel(float *y, const uint16_t *bias, int M, int N, int accumulate)
{
    const size_t total = (size_t)M * N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const float bv = mlk_bf16(bias[e % N]);
        y[e] = accumulate ? y[e] + bv : bv;
    }
}

static void gemm(mlk_backend *b, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                 int M, int K, int N, int accumulate)
{
    if (bias) {
        const size_t total = (size_t)M * N;
        bias_kernel<<<mlk_blocks(total, CONVERT_THREADS), CONVERT_THREADS, 0, b->stream>>>(
            y, bias, M, N, accumulate);
        mlk_launched(b, "matmul (bias)");
    }
    const float alpha = 1.0f, beta = bias || accumulate ? 1.0f : 0.0f;
    const size_t ws_elems = MLK_XBF16_BYTES / sizeof(__nv_bfloat16);
    const int tile_m = (size_t)M * K <= ws_elems ? M : (int)(ws_elems / (size_t)K);
    if (tile_m < 1) {
        mlk_latch(b, ML_ERR_UNSUPPORTED, "matmul", "K = %d exceeds the conversion workspace", K);
        return;
    }
    for (int m0 = 0; m0 < M && b->err_status == ML_OK; m0 += tile_m) {
        const int rows = M - m0 < tile_m ? M - m0 : tile_m;
        const size_t n = (size_t)rows * K;
        to_bf16_kernel<<<mlk_blocks(n, CONVERT_THREADS), CONVERT_THREADS, 0, b->stream>>>(
            b->xbf16, x + (size_t)m0 * K, n);
        mlk_launched(b, "matmul (convert)");
        /* Column-major view: yᵀ (N, rows) = w (K, N)ᵀ · xᵀ (K, rows). */
        cublasStatus_t st = cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, &alpha, w,
                                         CUDA_R_16BF, K, b->xbf16, CUDA_R_16BF, K, &beta,
                                         y + (size_t)m0 * N, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            mlk_latch(b, ML_ERR_IO, "matmul", "cublasGemmEx (%d x %d x %d): %s", rows, K, N,
                      cublasGetStatusString(st));
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
            bias_kernel<<<mlk_blocks((size_t)M * N, CONVERT_THREADS), CONVERT_THREADS, 0,
                          b->stream>>>(y, bias, M, N, accumulate);
            mlk_launched(b, "matmul (bias)");
        } else if (!accumulate) {
            mlk_cuda_failed(b, cudaMemsetAsync(y, 0, (size_t)M * N * sizeof *y, b->stream),
                            "matmul");
        }
        return;
    }
    if (gemv_fits(x, w, M, K))
        gemv(b, y, x, w, bias, M, K, N, accumulate);
    else
        gemm(b, y, x, w, bias, M, K, N, accumulate);
}
