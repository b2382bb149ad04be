/* Greedy sampling: out[r] = the lowest index of the maximum of row r, a NaN
 * counting as larger than any number (the first NaN wins), as torch.argmax
 * and engine/cpu do. The order "NaN first, then larger, then lower index"
 * is total, so the tree reduction returns exactly the CPU's answer.
 * Compiled, not yet run on a GPU. */
#include "mlk_internal.cuh"

#define ARGMAX_THREADS 512

/* Is (va, ia) ahead of (vb, ib)? */
__device__ __forceinline__ bool ahead(float va, int ia, float vb, int ib)
{
    const bool na = isnan(va), nb = isnan(vb);
    if (na != nb)
        return na;
    if (!na && va != vb)
        return va > vb;
    return ia < ib;
}

/* One block per row. */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(int32_t *out, const float *logits, int vocab)
{
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    const float *x = logits + (size_t)blockIdx.x * vocab;
    float bv = -INFINITY;
    int bi = vocab; /* past the end: loses every tie */
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (ahead(x[i], i, bv, bi)) {
            bv = x[i];
            bi = i;
        }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ahead(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; w++)
            if (ahead(sv[w], si[w], bv, bi)) {
                bv = sv[w];
                bi = si[w];
            }
        out[blockIdx.x] = bi; /* < vocab: element 0 beats the initial (-inf, vocab) */
    }
}

void mlk_argmax(ml_backend *be, int32_t *out, const float *logits, int rows, int vocab)
{
    mlk_backend *b = mlk_of(be);
    if (rows <= 0 || mlk_enter(b))
        return;
    if (vocab < 1) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "argmax", "vocab %d", vocab);
        return;
    }
    argmax_kernel<<<rows, ARGMAX_THREADS, 0, b->stream>>>(out, logits, vocab);
    mlk_launched(b, "argmax");
}
