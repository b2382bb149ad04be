/* RMSNorm and LayerNorm, one row per warp (narrow rows: head-dim q/k norms,
 * the vision tower's 1280) or per block of NORM_THREADS (wide rows: the
 * decoder's 4096, where one warp would serialise 128 loads per lane).
 * Sums are f32 in a different order from the CPU's 16-lane sums: results
 * agree to f32 rounding (relative ~1e-7), not bitwise. y may alias x: each
 * row is read completely before any of it is written. */
#include "mlk_internal.cuh"

#define NORM_THREADS 256
#define NORM_WARPS (NORM_THREADS / 32)
/* Rows at least this wide get a whole block. */
#define NORM_WIDE_DIM 1024

/* Σ v over the ROW_WARPS warps that share a row (all threads get it).
 * scratch: NORM_WARPS floats of shared memory. */
template <int ROW_WARPS>
__device__ __forceinline__ float row_sum(float v, float *scratch)
{
    v = mlk_warp_sum(v);
    if (ROW_WARPS == 1)
        return v;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* scratch may still be read from the previous sum */
    if (lane == 0)
        scratch[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < ROW_WARPS; w++)
        s += scratch[warp / ROW_WARPS * ROW_WARPS + w];
    return s;
}

/* Rows handled by a block, and this thread's row and lane within it. */
template <int ROW_WARPS>
struct row_slot {
    int row, lane, width;
    __device__ row_slot()
    {
        const int warp = threadIdx.x / 32;
        row = blockIdx.x * (NORM_WARPS / ROW_WARPS) + warp / ROW_WARPS;
        lane = (warp % ROW_WARPS) * 32 + threadIdx.x % 32;
        width = ROW_WARPS * 32;
    }
};

/* MllamaTextRMSNorm: y = (x · 1/sqrt(mean(x²) + eps)) · w. */
template <int ROW_WARPS>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(float *y, const float *x, const uint16_t *w, int rows, int dim, float eps)
{
    __shared__ float scratch[NORM_WARPS];
    const row_slot<ROW_WARPS> s;
    /* Blocks run whole: a row past the end still joins the block's syncs. */
    const bool live = s.row < rows;
    const float *xr = x + (size_t)(live ? s.row : 0) * dim;
    float acc = 0.0f;
    for (int i = s.lane; live && i < dim; i += s.width)
        acc += xr[i] * xr[i];
    const float ms = row_sum<ROW_WARPS>(acc, scratch) / (float)dim;
    const float inv = 1.0f / sqrtf(ms + eps);
    float *yr = y + (size_t)s.row * dim;
    for (int i = s.lane; live && i < dim; i += s.width)
        yr[i] = (xr[i] * inv) * mlk_bf16(w[i]);
}

/* nn.LayerNorm: biased variance by a second pass, eps inside the root. */
template <int ROW_WARPS>
__global__ void __launch_bounds__(NORM_THREADS)
    layernorm_kernel(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int rows,
                     int dim, float eps)
{
    __shared__ float scratch[NORM_WARPS];
    const row_slot<ROW_WARPS> s;
    const bool live = s.row < rows;
    const float *xr = x + (size_t)(live ? s.row : 0) * dim;
    float acc = 0.0f;
    for (int i = s.lane; live && i < dim; i += s.width)
        acc += xr[i];
    const float mean = row_sum<ROW_WARPS>(acc, scratch) / (float)dim;
    acc = 0.0f;
    for (int i = s.lane; live && i < dim; i += s.width)
        acc += (xr[i] - mean) * (xr[i] - mean);
    const float var = row_sum<ROW_WARPS>(acc, scratch) / (float)dim;
    const float inv = 1.0f / sqrtf(var + eps);
    float *yr = y + (size_t)s.row * dim;
    for (int i = s.lane; live && i < dim; i += s.width)
        yr[i] = (xr[i] - mean) * inv * mlk_bf16(w[i]) + mlk_bf16(bias[i]);
}

static unsigned norm_blocks(int rows, int row_warps)
{
    const int rows_per_block = NORM_WARPS / row_warps;
    return (unsigned)((rows + rows_per_block - 1) / rows_per_block);
}

void mlk_rmsnorm(ml_backend *be, float *y, const float *x, const uint16_t *w, int rows, int dim,
                 float eps)
{
    mlk_backend *b = mlk_of(be);
    if (rows <= 0 || dim <= 0 || mlk_enter(b))
        return;
    if (dim >= NORM_WIDE_DIM)
        mlk_launch(rmsnorm_kernel<NORM_WARPS>, norm_blocks(rows, NORM_WARPS), NORM_THREADS, 0,
                   b->stream, y, x, w, rows, dim, eps);
    else
        mlk_launch(rmsnorm_kernel<1>, norm_blocks(rows, 1), NORM_THREADS, 0,
                   b->stream, y, x, w, rows, dim, eps);
    mlk_launched(b, "rmsnorm");
}

void mlk_layernorm(ml_backend *be, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                   int rows, int dim, float eps)
{
    mlk_backend *b = mlk_of(be);
    if (rows <= 0 || dim <= 0 || mlk_enter(b))
        return;
    if (dim >= NORM_WIDE_DIM)
        mlk_launch(layernorm_kernel<NORM_WARPS>, norm_blocks(rows, NORM_WARPS), NORM_THREADS, 0,
                   b->stream, y, x, w, bias, rows, dim, eps);
    else
        mlk_launch(layernorm_kernel<1>, norm_blocks(rows, 1), NORM_THREADS, 0,
                   b->stream, y, x, w, bias, rows, dim, eps);
    mlk_launched(b, "layernorm");
}
