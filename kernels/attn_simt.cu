/* The SIMT attention's launcher and its split-K combine kernel (the kernel
 * itself and its design notes are in attn_simt.cuh). */
#include "attn_simt.cuh"

#define COMBINE_THREADS 128

/* Merge the z_slots partial states of every single-block sequence:
 * out = Σ_z o_z·e^(m_z - M) / Σ_z l_z·e^(m_z - M), M = max_z m_z. */
__global__ void __launch_bounds__(COMBINE_THREADS)
    attn_combine_kernel(const __grid_constant__ mlk_attn_args a, int rows_per_warp, int z_slots)
{
    const int kvh = blockIdx.x, s = a.seq0 + blockIdx.y, HD = a.head_dim;
    const int rows_total = seq_tokens(a, s) * a.group;
    if (rows_total <= 0 || rows_total > rows_per_warp)
        return;
    const int first = seq_first(a, s);
    const size_t rec = (size_t)HD + 2, z_stride = (size_t)rows_per_warp * rec;
    const float *base = a.partial + ((size_t)blockIdx.y * a.n_kv_heads + kvh) * z_slots * z_stride;
    for (int e = threadIdx.x; e < rows_total * HD; e += blockDim.x) {
        const int i = e / HD, d = e % HD;
        const float *r = base + (size_t)i * rec;
        float mx = -INFINITY;
        for (int z = 0; z < z_slots; z++)
            mx = fmaxf(mx, r[z * z_stride]);
        float lsum = 0.0f, acc = 0.0f;
        for (int z = 0; z < z_slots; z++) {
            const float mz = r[z * z_stride];
            const float wt = mz == -INFINITY ? 0.0f : expf(mz - mx);
            lsum += r[z * z_stride + 1] * wt;
            acc += r[z * z_stride + 2 + d] * wt;
        }
        const int head = kvh * a.group + i % a.group;
        a.out[((size_t)(first + i / a.group) * a.n_heads + head) * HD + d] = acc / lsum;
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
        mlk_launch(attn_combine_kernel, dim3((unsigned)a->n_kv_heads, (unsigned)a->n_seqs),
                   COMBINE_THREADS, 0, b->stream, *a, rows_per_warp, z_slots);
        mlk_launched(b, op);
    }
}

void mlk_attn_simt_init(void)
{
    mlk_attn_simt_init_r4();
    mlk_attn_simt_init_r8();
}
