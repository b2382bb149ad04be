/* Activations, RoPE and the small data-movement ops: one thread per output
 * element in grid-stride loops. All are memory-bound; coalesced scalar
 * accesses already reach the bandwidth they can use.
 *
 * Arithmetic mirrors engine/cpu/elementwise.c expression by expression.
 * Products that the CPU rounds before adding use __fmul_rn/__fadd_rn so
 * that nvcc does not contract them into an FMA: add_rows, add_bf16 and the
 * RoPE rotation then agree with the CPU bitwise, and gelu/silu/rope differ
 * only by the ulps of CUDA's erff/expf/cosf/sinf against libm's. */
#include "mlk_internal.cuh"

#define EW_THREADS 256
/* 1/√2 in f32: (float)M_SQRT1_2 as engine/cpu computes it. */
#define SQRT1_2_F 0.707106781186547524f

/* ---- activations ------------------------------------------------------------------ */

__global__ void gelu_kernel(float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        x[i] = v * 0.5f * (1.0f + erff(v * SQRT1_2_F));
    }
}

void mlk_gelu(ml_backend *be, float *x, size_t n)
{
    mlk_backend *b = mlk_of(be);
    if (!n || mlk_enter(b))
        return;
    mlk_launch(gelu_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0, b->stream, x, n);
    mlk_launched(b, "gelu");
}

__global__ void silu_mul_kernel(float *y, const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void mlk_silu_mul(ml_backend *be, float *y, const float *gate, const float *up, size_t n)
{
    mlk_backend *b = mlk_of(be);
    if (!n || mlk_enter(b))
        return;
    mlk_launch(silu_mul_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0,
               b->stream, y, gate, up, n);
    mlk_launched(b, "silu_mul");
}

/* ---- RoPE ---------------------------------------------------------------------------- */

/* One thread per (token, head, i < half_dim): rotates the pair (i, i + half_dim). */
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int n_tokens,
                            int n_heads, int half_dim)
{
    const size_t n = (size_t)n_tokens * n_heads * half_dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(e % half_dim);
        const size_t th = e / half_dim; /* token * n_heads + head */
        const int t = (int)(th / n_heads);
        const float angle = __fmul_rn((float)pos[t], inv_freq[i]);
        const float c = cosf(angle), s = sinf(angle);
        float *row = x + th * 2 * half_dim;
        const float x0 = row[i], x1 = row[i + half_dim];
        row[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        row[i + half_dim] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

void mlk_rope(ml_backend *be, float *x, const int32_t *pos, const float *inv_freq, int n_tokens,
              int n_heads, int head_dim)
{
    mlk_backend *b = mlk_of(be);
    if (n_tokens <= 0 || mlk_enter(b))
        return;
    if (head_dim % 2 != 0 || head_dim > MLK_MAX_HEAD_DIM) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "rope", "head_dim %d (even, <= %d)", head_dim,
                  MLK_MAX_HEAD_DIM);
        return;
    }
    const size_t n = (size_t)n_tokens * n_heads * (head_dim / 2);
    mlk_launch(rope_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0,
               b->stream, x, pos, inv_freq, n_tokens, n_heads, head_dim / 2);
    mlk_launched(b, "rope");
}

/* ---- residual adds ------------------------------------------------------------------- */

__global__ void add_rows_kernel(float *y, const float *x, const float *row_scale, float gate,
                                int rows, int dim)
{
    const size_t n = (size_t)rows * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const float c = row_scale ? __fmul_rn(gate, row_scale[e / dim]) : gate;
        y[e] = __fadd_rn(y[e], __fmul_rn(c, x[e]));
    }
}

void mlk_add_rows(ml_backend *be, float *y, const float *x, const float *row_scale, float gate,
                  int rows, int dim)
{
    mlk_backend *b = mlk_of(be);
    if (rows <= 0 || dim <= 0 || mlk_enter(b))
        return;
    const size_t n = (size_t)rows * dim;
    mlk_launch(add_rows_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0,
               b->stream, y, x, row_scale, gate, rows, dim);
    mlk_launched(b, "add_rows");
}

__global__ void add_bf16_kernel(float *y, const uint16_t *w, float alpha, int rows, int period,
                                int dim)
{
    const size_t n = (size_t)rows * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / dim, i = e % dim;
        const float wv = mlk_bf16(w[(r % period) * dim + i]);
        y[e] = __fadd_rn(y[e], __fmul_rn(alpha, wv));
    }
}

void mlk_add_bf16(ml_backend *be, float *y, const uint16_t *w, float alpha, int rows, int period,
                  int dim)
{
    mlk_backend *b = mlk_of(be);
    if (rows <= 0 || dim <= 0 || mlk_enter(b))
        return;
    if (period < 1) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "add_bf16", "period %d", period);
        return;
    }
    const size_t n = (size_t)rows * dim;
    mlk_launch(add_bf16_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0,
               b->stream, y, w, alpha, rows, period, dim);
    mlk_launched(b, "add_bf16");
}

/* ---- data movement --------------------------------------------------------------------- */

void mlk_zero(ml_backend *be, float *y, size_t n)
{
    mlk_backend *b = mlk_of(be);
    if (!n || mlk_enter(b))
        return;
    mlk_cuda_failed(b, cudaMemsetAsync(y, 0, n * sizeof *y, b->stream), "zero");
}

__global__ void copy_2d_kernel(float *dst, const float *src, int rows, int cols, size_t dst_row,
                               size_t dst_col, size_t src_row)
{
    const size_t n = (size_t)rows * cols;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / cols, c = e % cols;
        dst[r * dst_row + c * dst_col] = src[r * src_row + c];
    }
}

void mlk_copy_2d(ml_backend *be, float *dst, const float *src, int rows, int cols, size_t dst_row,
                 size_t dst_col, size_t src_row)
{
    mlk_backend *b = mlk_of(be);
    if (rows <= 0 || cols <= 0 || mlk_enter(b))
        return;
    const size_t n = (size_t)rows * cols;
    mlk_launch(copy_2d_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0,
               b->stream, dst, src, rows, cols, dst_row, dst_col, src_row);
    mlk_launched(b, "copy_2d");
}

__global__ void embed_kernel(float *y, const uint16_t *table, const int32_t *ids, int n, int dim)
{
    const size_t total = (size_t)n * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / dim, d = e % dim;
        y[e] = mlk_bf16(table[(size_t)ids[i] * dim + d]);
    }
}

void mlk_embed(ml_backend *be, float *y, const uint16_t *table, const int32_t *ids, int n, int dim)
{
    mlk_backend *b = mlk_of(be);
    if (n <= 0 || dim <= 0 || mlk_enter(b))
        return;
    const size_t total = (size_t)n * dim;
    mlk_launch(embed_kernel, mlk_blocks(total, EW_THREADS), EW_THREADS, 0,
               b->stream, y, table, ids, n, dim);
    mlk_launched(b, "embed");
}

#define PATCH_CHANNELS 3

/* One thread per patch element, in the output's (image, patch, c, ky, kx)
 * order, so writes are coalesced and reads come in runs of `patch`. */
__global__ void patchify_kernel(float *patches, const float *pixels, int n_img, int side,
                                int patch, int grid)
{
    const size_t len = (size_t)PATCH_CHANNELS * patch * patch;
    const size_t per_img = (size_t)grid * grid * len;
    const size_t n = (size_t)n_img * per_img;
    const size_t plane = (size_t)side * side;
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < n;
         o += (size_t)gridDim.x * blockDim.x) {
        const size_t img = o / per_img, rem = o % per_img;
        const int p = (int)(rem / len), e = (int)(rem % len);
        const int c = e / (patch * patch), ky = e / patch % patch, kx = e % patch;
        const int py = p / grid, px = p % grid;
        patches[o] = pixels[(img * PATCH_CHANNELS + c) * plane +
                            (size_t)(py * patch + ky) * side + (size_t)(px * patch + kx)];
    }
}

void mlk_patchify(ml_backend *be, float *patches, const float *pixels, int n_img, int side,
                  int patch)
{
    mlk_backend *b = mlk_of(be);
    if (n_img <= 0 || mlk_enter(b))
        return;
    if (patch < 1 || side % patch != 0) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "patchify", "side %d is not a multiple of patch %d",
                  side, patch);
        return;
    }
    const int grid = side / patch;
    const size_t n = (size_t)n_img * grid * grid * PATCH_CHANNELS * patch * patch;
    mlk_launch(patchify_kernel, mlk_blocks(n, EW_THREADS), EW_THREADS, 0,
               b->stream, patches, pixels, n_img, side, patch, grid);
    mlk_launched(b, "patchify");
}
