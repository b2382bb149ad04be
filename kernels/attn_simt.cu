/* The SIMT attention's launcher and its split-K combine kernel (the kernel
 * itself and its design notes are in attn_simt.cuh). */
#include "attn_simt.cuh"

#define COMBINE_THREADS 128

/* Merge the z_slots partial states of every single-block sequence, one CTA
 * per (kv head, sequence, row):
 * out = Σ_z o_z·e^(m_z - M) / Σ_z l_z·e^(m_z - M), M = max_z m_z.
 * The weights e^(m_z - M) and the denominator are computed once per row
 * (in z order, as each element's sum is), so each thread's sum over z is
 * independent loads, not a chain of exps and loads per element. */
__global__ void __launch_bounds__(COMBINE_THREADS)
    attn_combine_kernel(const __grid_constant__ mlk_attn_args a, int rows_per_warp, int z_slots)
{
    __shared__ float wt_s[MLK_ATTN_MAX_SPLITS], l_s[MLK_ATTN_MAX_SPLITS];
    __shared__ float lsum_s;
    const int kvh = blockIdx.x, s = a.seq0 + blockIdx.y, i = blockIdx.z, HD = a.head_dim;
    const int rows_total = seq_tokens(a, s) * a.group;
    if (rows_total <= 0 || rows_total > rows_per_warp || i >= rows_total)
        return;
    const int first = seq_first(a, s);
    const size_t rec = (size_t)HD + 2, z_stride = (size_t)rows_per_warp * rec;
    const float *r =
        a.partial + ((size_t)blockIdx.y * a.n_kv_heads + kvh) * z_slots * z_stride + i * rec;
    if (threadIdx.x < 32) {
        float mx = -INFINITY;
        for (int z = threadIdx.x; z < z_slots; z += 32)
            mx = fmaxf(mx, r[z * z_stride]);
        mx = mlk_warp_max(mx);
        for (int z = threadIdx.x; z < z_slots; z += 32) {
            const float mz = r[z * z_stride];
            wt_s[z] = mz == -INFINITY ? 0.0f : expf(mz - mx);
            l_s[z] = r[z * z_stride + 1];
        }
        __syncwarp();
        if (threadIdx.x == 0) {
            float lsum = 0.0f;
            for (int z = 0; z < z_slots; z++)
                lsum += l_s[z] * wt_s[z];
            lsum_s = lsum;
        }
    }
    __syncthreads();
    const int head = kvh * a.group + i % a.group;
    float *out = a.out + ((size_t)(first + i / a.group) * a.n_heads + head) * HD;
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 16
        for (int z = 0; z < z_slots; z++)
            acc += r[z * z_stride + 2 + d] * wt_s[z];
        out[d] = acc / lsum_s;
    }
}

/* ---- host launcher --------------------------------------------------------------------------- */

void mlk_attn_simt(mlk_backend *b, const mlk_attn_args *a, int rows_per_warp, int z_slots,
                   const char *op)
{
    const dim3 grid((unsigned)a->n_kv_heads, (unsigned)a->n_seqs, (unsigned)z_slots);
    if (rows_per_warp == 4)
        mlk_attn_simt_launch_r4(b, a, grid);
    else
        mlk_attn_simt_launch_r8(b, a, grid);
    mlk_launched(b, op);
    if (a->split) {
        mlk_launch(attn_combine_kernel,
                   dim3((unsigned)a->n_kv_heads, (unsigned)a->n_seqs, (unsigned)rows_per_warp),
                   COMBINE_THREADS, 0, b->stream, *a, rows_per_warp, z_slots);
        mlk_launched(b, op);
    }
}

void mlk_attn_simt_init(void)
{
    mlk_attn_simt_init_r4();
    mlk_attn_simt_init_r8();
}
