/* Vision attention on the tensor cores (FlashAttention-2 structure with
 * mma.sync m16n8k16 bf16 → f32, sm_80+): the vision tower's 40 layers of
 * bidirectional attention over up to 6432 tokens are ~8.5 TFLOP per image,
 * too much for CUDA cores.
 *
 * A CTA takes MMA_BQ = 128 query rows of one (sequence, head); each of its
 * 8 warps owns 16 rows. Per tile of MMA_BK = 64 keys:
 *   K, V tile    f32 from global → bf16 in shared memory (rows padded by 8
 *                bf16 so fragment loads are bank-conflict free)
 *   S = Q·Kᵀ     Q's A fragments stay in registers for the whole kernel;
 *                K's B fragments are 32-bit loads of two adjacent dims
 *   softmax      on the S accumulators: rows g and g+8 of the warp's 16
 *                (g = lane / 4), the row max reduced over the lane quad
 *   O += P·V     P re-packed to bf16 straight from the S accumulators as
 *                the A operand (the C and A fragment layouts line up), V's
 *                B fragments by ldmatrix.trans from row-major V
 * The running max, sum and O rescaling follow the CPU's softmax_block; the
 * mask is the vision rule (masked iff query and key are both invalid).
 *
 * Numerics: Q, K, V and P are rounded to bf16 (unit roundoff 2^-8), the
 * sums are f32, exp is __expf (~2 ulp, far below P's rounding). Against
 * the f32 CPU reference the output's NMSE is about that of bf16 rounding,
 * a few 1e-6; tests/gpu holds it to 5e-5.
 * Head dims 16, 32, 64, 80 and 128 are instantiated; others use the SIMT
 * kernel. */
#include "attention.cuh"
#include "mlk_mma.cuh"

#define MMA_WARPS 8
#define MMA_THREADS (MMA_WARPS * 32)
#define MMA_ROWS_PER_WARP 16
#define MMA_BQ (MMA_WARPS * MMA_ROWS_PER_WARP)
#define MMA_BK 64
/* bf16 of padding per shared-memory row (16 bytes). */
#define MMA_PAD 8
/* kval entries: key validity of the current tile. */
#define KEY_INVALID 0
#define KEY_VALID 1
#define KEY_PAST_END 2

/* ---- device helpers ----------------------------------------------------------------- */

/* Two f32 as bf16x2, `lo` in the low half (the lower column of a fragment). */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return (uint32_t)__bfloat16_as_ushort(v.x) | (uint32_t)__bfloat16_as_ushort(v.y) << 16;
}

__device__ __forceinline__ uint32_t lds32(const __nv_bfloat16 *p)
{
    return *(const uint32_t *)p;
}

/* Four f32 as four bf16 at dst (8-byte aligned). */
__device__ __forceinline__ void store4_bf16(__nv_bfloat16 *dst, float4 v)
{
    *(uint2 *)dst = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
}

__host__ __device__ constexpr size_t mma_smem_bytes(int head_dim)
{
    return (size_t)(MMA_BQ + 2 * MMA_BK) * (head_dim + MMA_PAD) * sizeof(uint16_t) + MMA_BK;
}

/* ---- kernel -------------------------------------------------------------------------------- */

template <int HD>
__global__ void __launch_bounds__(MMA_THREADS, HD <= 80 ? 2 : 1)
    attn_vision_mma_kernel(const __grid_constant__ mlk_attn_args a)
{
    constexpr int LDS = HD + MMA_PAD;      /* bf16 per shared row */
    constexpr int KSTEPS = HD / 16;        /* k-steps of S = Q·Kᵀ */
    constexpr int DTILES = HD / 8;         /* 8-wide column tiles of O */
    constexpr int NTILES = MMA_BK / 8;     /* 8-key column tiles of S */
    constexpr int VEC = HD / 4;            /* float4 per row */
    MLK_DYNAMIC_SHARED(unsigned char, smem_raw);
    __nv_bfloat16 *q_s = (__nv_bfloat16 *)smem_raw;   /* (MMA_BQ, LDS) */
    __nv_bfloat16 *k_s = q_s + MMA_BQ * LDS;          /* (MMA_BK, LDS) */
    __nv_bfloat16 *v_s = k_s + MMA_BK * LDS;          /* (MMA_BK, LDS) */
    uint8_t *kval = (uint8_t *)(v_s + MMA_BK * LDS);  /* (MMA_BK) */

    const int h = blockIdx.x, s = blockIdx.y, q0 = blockIdx.z * MMA_BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int L = a.seq_len, H = a.n_heads;
    const size_t tok0 = (size_t)s * L;
    const float *qg = a.q, *kg = (const float *)a.k, *vg = (const float *)a.v;

    for (int e = threadIdx.x; e < MMA_BQ * VEC; e += MMA_THREADS) {
        const int r = e / VEC, d = e % VEC * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (q0 + r < L)
            v = __ldg((const float4 *)(qg + ((tok0 + q0 + r) * H + h) * HD + d));
        store4_bf16(q_s + r * LDS + d, v);
    }
    __syncthreads();

    /* A fragments of this warp's 16 query rows, for the whole kernel. */
    const int wrow = warp * MMA_ROWS_PER_WARP;
    uint32_t qa[KSTEPS][4];
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) {
        const __nv_bfloat16 *p0 = q_s + (wrow + g) * LDS + ks * 16 + 2 * t4;
        const __nv_bfloat16 *p1 = p0 + 8 * LDS;
        qa[ks][0] = lds32(p0);
        qa[ks][1] = lds32(p1);
        qa[ks][2] = lds32(p0 + 8);
        qa[ks][3] = lds32(p1 + 8);
    }

    const int r0 = q0 + wrow + g, r1 = r0 + 8; /* this lane's two rows */
    const bool inv0 = r0 < L && !a.valid[tok0 + r0];
    const bool inv1 = r1 < L && !a.valid[tok0 + r1];
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    float o[DTILES][4];
#pragma unroll
    for (int dt = 0; dt < DTILES; dt++)
        o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    for (int k0 = 0; k0 < L; k0 += MMA_BK) {
        __syncthreads(); /* every warp is done with the previous tile */
        for (int e = threadIdx.x; e < MMA_BK * VEC; e += MMA_THREADS) {
            const int r = e / VEC, d = e % VEC * 4;
            /* Past the end: zeros, so that p = 0 never meets a NaN in V. */
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vv = kv;
            if (k0 + r < L) {
                const size_t off = ((tok0 + k0 + r) * H + h) * HD + d;
                kv = __ldg((const float4 *)(kg + off));
                vv = __ldg((const float4 *)(vg + off));
            }
            store4_bf16(k_s + r * LDS + d, kv);
            store4_bf16(v_s + r * LDS + d, vv);
        }
        if (threadIdx.x < MMA_BK) {
            const int key = k0 + threadIdx.x;
            kval[threadIdx.x] = key >= L ? KEY_PAST_END
                                         : a.valid[tok0 + key] ? KEY_VALID : KEY_INVALID;
        }
        __syncthreads();

        /* S (16 x 64) = Q · Kᵀ for this warp's rows. */
        float sc[NTILES][4];
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const __nv_bfloat16 *kr = k_s + (nt * 8 + g) * LDS + 2 * t4;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++)
                mlk_mma_m16n8k16_bf16(sc[nt], qa[ks], lds32(kr + ks * 16),
                                      lds32(kr + ks * 16 + 8));
        }

        /* Mask and scale; the tile's row maxima over the lane quad. */
        float mt0 = -INFINITY, mt1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int kv = kval[nt * 8 + 2 * t4 + j];
                const bool gone0 = kv == KEY_PAST_END || (inv0 && kv == KEY_INVALID);
                const bool gone1 = kv == KEY_PAST_END || (inv1 && kv == KEY_INVALID);
                sc[nt][j] = gone0 ? -INFINITY : sc[nt][j] * a.scale;
                sc[nt][2 + j] = gone1 ? -INFINITY : sc[nt][2 + j] * a.scale;
                mt0 = fmaxf(mt0, sc[nt][j]);
                mt1 = fmaxf(mt1, sc[nt][2 + j]);
            }
        mt0 = mlk_warp_xor_reduce<1, 2>(mt0, mlk_op_fmax());
        mt1 = mlk_warp_xor_reduce<1, 2>(mt1, mlk_op_fmax());
        const float mn0 = fmaxf(m0, mt0), mn1 = fmaxf(m1, mt1);
        const float sh0 = mn0 == -INFINITY ? 0.0f : mn0, sh1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float alpha0 = __expf(m0 - sh0), alpha1 = __expf(m1 - sh1);
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                sc[nt][j] = __expf(sc[nt][j] - sh0);
                sc[nt][2 + j] = __expf(sc[nt][2 + j] - sh1);
                ps0 += sc[nt][j];
                ps1 += sc[nt][2 + j];
            }
        l0 = l0 * alpha0 + ps0; /* lane-local: alpha is the same across the quad */
        l1 = l1 * alpha1 + ps1;
#pragma unroll
        for (int dt = 0; dt < DTILES; dt++) {
            o[dt][0] *= alpha0;
            o[dt][1] *= alpha0;
            o[dt][2] *= alpha1;
            o[dt][3] *= alpha1;
        }

        /* O (16 x HD) += P (16 x 64) · V (64 x HD), 16 keys per k-step. */
#pragma unroll
        for (int kk = 0; kk < MMA_BK / 16; kk++) {
            const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                                    pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                                    pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                    pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
            const int vrow = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
            for (int dt = 0; dt < DTILES; dt += 2) {
                uint32_t vb[4];
                mlk_ldmatrix_x4_trans(vb, v_s + vrow * LDS + dt * 8 + (lane >> 4) * 8);
                mlk_mma_m16n8k16_bf16(o[dt], pa, vb[0], vb[1]);
                mlk_mma_m16n8k16_bf16(o[dt + 1], pa, vb[2], vb[3]);
            }
        }
    }

    l0 = mlk_warp_xor_reduce<1, 2>(l0, mlk_op_add());
    l1 = mlk_warp_xor_reduce<1, 2>(l1, mlk_op_add());
    float *out0 = a.out + ((tok0 + r0) * H + h) * HD + 2 * t4;
    float *out1 = a.out + ((tok0 + r1) * H + h) * HD + 2 * t4;
#pragma unroll
    for (int dt = 0; dt < DTILES; dt++) {
        if (r0 < L)
            *(float2 *)(out0 + dt * 8) = make_float2(o[dt][0] / l0, o[dt][1] / l0);
        if (r1 < L)
            *(float2 *)(out1 + dt * 8) = make_float2(o[dt][2] / l1, o[dt][3] / l1);
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

template <int HD>
static void launch(mlk_backend *b, const mlk_attn_args *a)
{
    const dim3 grid((unsigned)a->n_heads, (unsigned)a->n_seqs,
                    (unsigned)((a->seq_len + MMA_BQ - 1) / MMA_BQ));
    mlk_launch(attn_vision_mma_kernel<HD>, grid, MMA_THREADS, mma_smem_bytes(HD), b->stream, *a);
}

int mlk_attn_vision_mma(mlk_backend *b, const mlk_attn_args *a, const char *op)
{
    switch (a->head_dim) {
    case 16: launch<16>(b, a); break;
    case 32: launch<32>(b, a); break;
    case 64: launch<64>(b, a); break;
    case 80: launch<80>(b, a); break;
    case 128: launch<128>(b, a); break;
    default: return -1;
    }
    mlk_launched(b, op);
    return 0;
}

template <int HD>
static void allow_smem()
{
    cudaFuncSetAttribute((const void *)attn_vision_mma_kernel<HD>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)mma_smem_bytes(HD));
}

void mlk_attn_mma_init(void)
{
    allow_smem<16>();
    allow_smem<32>();
    allow_smem<64>();
    allow_smem<80>();
    allow_smem<128>();
}
