/* Flash-style attention on CUDA cores, in f32, for every kind (vision,
 * paged causal, cross). The reference GPU path: no tensor cores, no bf16
 * rounding beyond the caches' own, any head_dim that is a multiple of 8.
 *
 * A CTA has SIMT_WARPS warps and works on one (kv head, sequence) pair.
 * Each warp owns R query rows (R = 4 or 8, a template parameter) and
 * walks key tiles of 32 keys, one key per lane:
 *   scores   lane j: s[i] = q_i · k_j for its key j (q from shared memory,
 *            broadcast; k_j from global, 16 bytes per load)
 *   softmax  per row: warp max, m' = max(m, tile max), p = exp(x - m'),
 *            alpha = exp(m - m'), lane-local l = l·alpha + p
 *            (engine/cpu/kernels_plain.c softmax_block, masks as -inf)
 *   values   lane d: o[i][d] = o[i][d]·alpha + Σ_j p_ij · v_j[d], the p of
 *            the tile passed through shared memory, v rows read coalesced
 * No score matrix beyond one 32-key tile exists.
 *
 * Two shapes per CTA, chosen on the device from the sequence's row count:
 * - many rows (prefill, vision): the 4 warps take 4 consecutive groups of
 *   R rows (a block of 4R rows) and share nothing but the q load; blocks
 *   beyond gridDim.z are strided.
 * - at most R rows (decode: one token's GQA group): one row block, the
 *   4 warps split its key tiles and merge their (m, l, o) in shared memory;
 *   with args.split, the gridDim.z CTAs also split the keys and leave
 *   partial (m, l, o) for attn_combine_kernel, so a single sequence over a
 *   long context still spreads over the GPU. Neither path needs the
 *   sequence's length on the host: graphs can record it.
 *
 * The kernel template lives in this header; attn_simt_r4.cu and
 * attn_simt_r8.cu instantiate it (one file per rows-per-warp, so the
 * instantiations compile in parallel), attn_simt.cu holds the combine
 * kernel and the launcher. */
#ifndef MLK_ATTN_SIMT_CUH
#define MLK_ATTN_SIMT_CUH

#include "attention.cuh"

#define SIMT_WARPS 4
#define SIMT_THREADS (SIMT_WARPS * 32)
#define KEY_TILE 32
/* Elements per 16-byte key load (bf16), and per two float4 loads (f32). */
#define CHUNK 8
/* A lane's 16-byte loads of its bf16 key row issued before any of them is
 * used (128 bytes: head_dim 64 in one batch, 128 in two). Decode's
 * attention is latency-bound: few warps per SM, each waiting on its own
 * misses, where a load consumed at once costs a memory latency per chunk.
 * With attn_combine_kernel's weights computed once per row, on an H200
 * (2026-12-04, tests/gpu/bench_cuda, context 1,024; kernels/README.md, "On
 * an H200"): the 11B step's causal attention from 3.49 to 2.25 ms at batch
 * 1, its cross attention from 1.30 to 1.03 ms; 4-5% at batch 32. 16 loads
 * ahead, and the value loop unrolled over the tile, measured the same as
 * this in a run of their own and took more registers. */
#define K_LOADS_AHEAD 8

/* ---- device helpers --------------------------------------------------------------------- */

static __device__ __forceinline__ int seq_tokens(const mlk_attn_args &a, int s)
{
    switch (a.kind) {
    case MLK_ATTN_VISION: return a.seq_len;
    default: return a.seq_start[s + 1] - a.seq_start[s];
    }
}

/* Index of the sequence's first token in q and out. */
static __device__ __forceinline__ int seq_first(const mlk_attn_args &a, int s)
{
    switch (a.kind) {
    case MLK_ATTN_VISION: return s * a.seq_len;
    default: return a.seq_start[s];
    }
}

/* Key and value rows (element 0 of kv head kvh) of key `key` of sequence s. */
static __device__ __forceinline__ void kv_rows(const mlk_attn_args &a, int s, int kvh, int key,
                                        const void **k, const void **v)
{
    const char *kb, *vb;
    size_t row, elem;
    switch (a.kind) {
    case MLK_ATTN_VISION:
        kb = (const char *)a.k;
        vb = (const char *)a.v;
        row = (size_t)s * a.seq_len + key;
        elem = sizeof(float);
        break;
    case MLK_ATTN_CAUSAL: {
        const int32_t blk = a.block_table[(size_t)s * a.max_blocks + key / a.block_size];
        kb = (const char *)a.k;
        vb = (const char *)a.v;
        row = (size_t)blk * a.block_size + key % a.block_size;
        elem = sizeof(uint16_t);
        break;
    }
    default: {
        const char *state = (const char *)a.states[(size_t)s * a.max_images + key / a.image_keys];
        kb = state + a.k_offset;
        vb = state + a.v_offset;
        row = (size_t)(key % a.image_keys);
        elem = sizeof(uint16_t);
        break;
    }
    }
    const size_t off = (row * a.n_kv_heads + kvh) * a.head_dim * elem;
    *k = kb + off;
    *v = vb + off;
}

/* dst[0..8) = the 8 bf16 of w as f32. */
static __device__ __forceinline__ void widen8(float *dst, uint4 w)
{
    dst[0] = __uint_as_float(w.x << 16), dst[1] = __uint_as_float(w.x & 0xffff0000u);
    dst[2] = __uint_as_float(w.y << 16), dst[3] = __uint_as_float(w.y & 0xffff0000u);
    dst[4] = __uint_as_float(w.z << 16), dst[5] = __uint_as_float(w.z & 0xffff0000u);
    dst[6] = __uint_as_float(w.w << 16), dst[7] = __uint_as_float(w.w & 0xffff0000u);
}

/* dst[0..8) = row[d .. d+8), row f32. */
static __device__ __forceinline__ void load8_f32(float *dst, const float *row, int d)
{
    const float4 *p = (const float4 *)(row + d);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    dst[0] = a.x, dst[1] = a.y, dst[2] = a.z, dst[3] = a.w;
    dst[4] = b.x, dst[5] = b.y, dst[6] = b.z, dst[7] = b.w;
}

/* sc[i] += q_i[d0 .. d0+8) · kc for the R rows of a warp, whose q rows
 * start at q (stride HD): one chunk of the scores, in the chunks' order. */
template <int R>
static __device__ __forceinline__ void score_chunk(float *sc, const float *q, int HD, int d0,
                                                   const float *kc)
{
#pragma unroll
    for (int i = 0; i < R; i++) {
        const float *qr = q + (size_t)i * HD + d0;
        const float4 qa = *(const float4 *)qr, qb4 = *(const float4 *)(qr + 4);
        float acc = sc[i];
        acc = fmaf(qa.x, kc[0], acc);
        acc = fmaf(qa.y, kc[1], acc);
        acc = fmaf(qa.z, kc[2], acc);
        acc = fmaf(qa.w, kc[3], acc);
        acc = fmaf(qb4.x, kc[4], acc);
        acc = fmaf(qb4.y, kc[5], acc);
        acc = fmaf(qb4.z, kc[6], acc);
        acc = fmaf(qb4.w, kc[7], acc);
        sc[i] = acc;
    }
}

static __device__ __forceinline__ float load1(const void *row, int d, bool f32)
{
    return f32 ? __ldg((const float *)row + d) : mlk_bf16(__ldg((const unsigned short *)row + d));
}

static __device__ __forceinline__ float component(float4 v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Cross: whether no live row of a warp (tok, live, sees_all as in
 * attend_block) may see a key of the tile from key0 (< n_keys). Such a tile
 * changes nothing (every weight exp(-inf) = 0 and alpha 1, or m, l and o
 * still -inf, 0 and 0), so the warp reads none of its K and V: the padded
 * tiles of an image, which a step's rows would otherwise stream (as the CPU
 * backend's block_masked skips them). Uniform over the warp's lanes. */
template <int R>
static __device__ __forceinline__ bool cross_tile_unseen(const mlk_attn_args &a, int first,
                                                         const int *tok, uint32_t live,
                                                         uint32_t sees_all, int key0, int n_keys)
{
    const int c_lo = key0 / a.chunk_len, c_hi = (min(key0 + KEY_TILE, n_keys) - 1) / a.chunk_len;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (!(live >> i & 1u))
            continue;
        if (sees_all >> i & 1u)
            return false;
        const uint8_t *row = a.allowed + (size_t)(first + tok[i]) * a.n_chunks;
        for (int c = c_lo; c <= c_hi; c++)
            if (row[c])
                return false;
    }
    return true;
}

/* Floats of shared memory: q rows (later the merge area) then p tiles. */
__host__ __device__ constexpr size_t simt_smem_floats(int rows_per_warp, int head_dim)
{
    return (size_t)SIMT_WARPS * rows_per_warp * (head_dim + 2) +
           (size_t)SIMT_WARPS * rows_per_warp * KEY_TILE;
}

/* ---- one block of query rows ----------------------------------------------------------- */

/* Rows row0 .. row0 + cta_rows of sequence s against key tiles
 * [split·tps, (split+1)·tps) of its keys, tps = ceil(tiles / n_splits).
 * to_partial: leave (m, l, unnormalised o) in a.partial instead of out. */
template <int HDC, int R>
__device__ void attend_block(const mlk_attn_args &a, int s, int kvh, int rows_total, int qb,
                             int split, int n_splits, bool to_partial)
{
    MLK_DYNAMIC_SHARED(float, smem);
    const bool single = rows_total <= R;
    const int WR = single ? 1 : SIMT_WARPS, WK = SIMT_WARPS / WR;
    const int cta_rows = WR * R;
    const int HD = a.head_dim, group = a.group;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wr = warp % WR, wk = warp / WR;
    const int row0 = qb * cta_rows, first = seq_first(a, s);
    const bool f32 = a.kind == MLK_ATTN_VISION;
    float *q_s = smem;                                                 /* (cta_rows, HD) */
    float *p_s = smem + (size_t)SIMT_WARPS * R * (HD + 2) + (size_t)warp * R * KEY_TILE;

    __syncthreads(); /* the previous block's readers of q_s are done */
    for (int e = threadIdx.x; e < cta_rows * (HD / 4); e += blockDim.x) {
        const int r = e / (HD / 4), row = row0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < rows_total) {
            const int tok = row / group, head = kvh * group + row % group;
            v = __ldg((const float4 *)(a.q + ((size_t)(first + tok) * a.n_heads + head) * HD) +
                      e % (HD / 4));
        }
        ((float4 *)q_s)[e] = v;
    }
    __syncthreads();

    /* Keys this block may see, and this CTA's share of their tiles. */
    const int last_row = min(rows_total, row0 + cta_rows) - 1;
    int n_keys;
    switch (a.kind) {
    case MLK_ATTN_VISION: n_keys = a.seq_len; break;
    case MLK_ATTN_CAUSAL: n_keys = a.pos0[s] + last_row / group + 1; break;
    default: n_keys = a.n_images[s] * a.image_keys; break; /* 0: text only */
    }
    const int tiles = (n_keys + KEY_TILE - 1) / KEY_TILE;
    const int per_split = (tiles + n_splits - 1) / n_splits;
    const int t_lo = split * per_split, t_hi = min(tiles, t_lo + per_split);

    /* This warp's rows and their masks. */
    int tok[R];
    uint32_t live = 0, q_invalid = 0, sees_all = 0;
    const int causal_base = a.kind == MLK_ATTN_CAUSAL ? a.pos0[s] : 0;
#pragma unroll
    for (int i = 0; i < R; i++) {
        const int row = row0 + wr * R + i;
        tok[i] = row / group;
        if (row >= rows_total)
            continue;
        live |= 1u << i;
        if (a.kind == MLK_ATTN_VISION && !a.valid[(size_t)s * a.seq_len + tok[i]])
            q_invalid |= 1u << i;
        if (a.kind == MLK_ATTN_CROSS) {
            /* full_text_row_mask: a row that may see no chunk sees every key. */
            const int chunks = n_keys / a.chunk_len;
            int any = 0;
            for (int c = lane; c < chunks; c += 32)
                any |= a.allowed[(size_t)(first + tok[i]) * a.n_chunks + c];
            if (!__any_sync(0xffffffffu, any))
                sees_all |= 1u << i;
        }
    }

    float m[R], l[R], o[R][HDC];
#pragma unroll
    for (int i = 0; i < R; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < HDC; c++)
            o[i][c] = 0.0f;
    }

    for (int t = t_lo + wk; t < t_hi; t += WK) {
        if (a.kind == MLK_ATTN_CROSS &&
            cross_tile_unseen<R>(a, first, tok, live, sees_all, t * KEY_TILE, n_keys))
            continue;
        const int key = t * KEY_TILE + lane;
        const bool kin = key < n_keys;
        const void *krow = nullptr, *vrow = nullptr;
        float sc[R];
#pragma unroll
        for (int i = 0; i < R; i++)
            sc[i] = 0.0f;
        if (kin) {
            kv_rows(a, s, kvh, key, &krow, &vrow);
            const float *q_w = q_s + (size_t)wr * R * HD;
            if (f32) {
                for (int d0 = 0; d0 < HD; d0 += CHUNK) {
                    float kc[CHUNK];
                    load8_f32(kc, (const float *)krow, d0);
                    score_chunk<R>(sc, q_w, HD, d0, kc);
                }
            } else {
                /* HDC · 32 / CHUNK chunks cover any head_dim of this
                 * instantiation; those past HD are skipped. */
#pragma unroll
                for (int c0 = 0; c0 < HDC * 32 / CHUNK; c0 += K_LOADS_AHEAD) {
                    uint4 raw[K_LOADS_AHEAD];
#pragma unroll
                    for (int c = 0; c < K_LOADS_AHEAD; c++)
                        if ((c0 + c) * CHUNK < HD)
                            raw[c] = __ldg((const uint4 *)krow + c0 + c);
#pragma unroll
                    for (int c = 0; c < K_LOADS_AHEAD; c++)
                        if ((c0 + c) * CHUNK < HD) {
                            float kc[CHUNK];
                            widen8(kc, raw[c]);
                            score_chunk<R>(sc, q_w, HD, (c0 + c) * CHUNK, kc);
                        }
                }
            }
        }
        const bool key_valid = a.kind != MLK_ATTN_VISION || (kin && a.valid[(size_t)s * a.seq_len + key]);
        const int chunk = a.kind == MLK_ATTN_CROSS && kin ? key / a.chunk_len : 0;

#pragma unroll
        for (int i = 0; i < R; i++) {
            bool ok = kin && (live >> i & 1u);
            if (a.kind == MLK_ATTN_VISION)
                ok = ok && (key_valid || !(q_invalid >> i & 1u));
            else if (a.kind == MLK_ATTN_CAUSAL)
                ok = ok && key <= causal_base + tok[i];
            else
                ok = ok && ((sees_all >> i & 1u) ||
                            a.allowed[(size_t)(first + tok[i]) * a.n_chunks + chunk]);
            const float x = ok ? sc[i] * a.scale : -INFINITY;
            const float mx = fmaxf(m[i], mlk_warp_max(x));
            const float sh = mx == -INFINITY ? 0.0f : mx;
            const float p = expf(x - sh);
            const float alpha = expf(m[i] - sh);
            l[i] = l[i] * alpha + p;
            m[i] = mx;
#pragma unroll
            for (int c = 0; c < HDC; c++)
                o[i][c] *= alpha;
            p_s[i * KEY_TILE + lane] = p;
        }
        __syncwarp();

        const int nk = min(KEY_TILE, n_keys - t * KEY_TILE);
        for (int j0 = 0; j0 < nk; j0 += 4) {
            float4 pj[R];
#pragma unroll
            for (int i = 0; i < R; i++)
                pj[i] = *(const float4 *)(p_s + i * KEY_TILE + j0);
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const int j = j0 + jj;
                const void *vr = (const void *)__shfl_sync(
                    0xffffffffu, (unsigned long long)(uintptr_t)vrow, j % 32);
#pragma unroll
                for (int c = 0; c < HDC; c++) {
                    const int d = lane + 32 * c;
                    if (j < nk && d < HD) {
                        const float v = load1(vr, d, f32);
#pragma unroll
                        for (int i = 0; i < R; i++)
                            o[i][c] = fmaf(component(pj[i], jj), v, o[i][c]);
                    }
                }
            }
        }
        __syncwarp();
    }

#pragma unroll
    for (int i = 0; i < R; i++)
        l[i] = mlk_warp_sum(l[i]);

    if (WK == 1) { /* many rows: each warp finishes its own */
#pragma unroll
        for (int i = 0; i < R; i++) {
            if (!(live >> i & 1u))
                continue;
            const int row = row0 + wr * R + i;
            const int head = kvh * group + row % group;
            float *out = a.out + ((size_t)(first + tok[i]) * a.n_heads + head) * HD;
#pragma unroll
            for (int c = 0; c < HDC; c++) /* no key at all (text-only cross rows): 0, not 0/0 */
                if (lane + 32 * c < HD)
                    out[lane + 32 * c] = n_keys > 0 ? o[i][c] / l[i] : 0.0f;
        }
        return;
    }

    /* One row block split over the warps: merge their states. */
    __syncthreads(); /* every warp is done with q_s, which becomes the merge area */
    float *mg = smem; /* (SIMT_WARPS, R, HD + 2): m, l, o[HD] */
#pragma unroll
    for (int i = 0; i < R; i++) {
        float *rec = mg + ((size_t)warp * R + i) * (HD + 2);
        if (lane == 0) {
            rec[0] = m[i];
            rec[1] = l[i];
        }
#pragma unroll
        for (int c = 0; c < HDC; c++)
            if (lane + 32 * c < HD)
                rec[2 + lane + 32 * c] = o[i][c];
    }
    __syncthreads();
    if (warp != 0)
        return;
#pragma unroll
    for (int i = 0; i < R; i++) {
        if (!(live >> i & 1u))
            continue;
        float mx = -INFINITY;
        for (int w = 0; w < SIMT_WARPS; w++)
            mx = fmaxf(mx, mg[((size_t)w * R + i) * (HD + 2)]);
        float wt[SIMT_WARPS], lsum = 0.0f;
        for (int w = 0; w < SIMT_WARPS; w++) {
            const float *rec = mg + ((size_t)w * R + i) * (HD + 2);
            wt[w] = rec[0] == -INFINITY ? 0.0f : expf(rec[0] - mx);
            lsum += rec[1] * wt[w];
        }
        const int row = row0 + i; /* WR == 1: the warp's rows are the block's */
        float *dst;
        if (to_partial) {
            dst = a.partial +
                  ((((size_t)(s - a.seq0) * a.n_kv_heads + kvh) * n_splits + split) * R + i) *
                      (HD + 2);
            if (lane == 0) { /* no key at all (text-only cross rows): a zero output of weight
                                1, which attn_combine_kernel turns into exactly 0 */
                dst[0] = n_keys > 0 ? mx : 0.0f;
                dst[1] = n_keys > 0 ? lsum : 1.0f;
            }
            dst += 2;
        } else {
            dst = a.out + ((size_t)(first + tok[i]) * a.n_heads + kvh * group + row % group) * HD;
        }
        for (int d = lane; d < HD; d += 32) {
            float acc = 0.0f;
            for (int w = 0; w < SIMT_WARPS; w++)
                acc += mg[((size_t)w * R + i) * (HD + 2) + 2 + d] * wt[w];
            dst[d] = to_partial ? acc : n_keys > 0 ? acc / lsum : 0.0f;
        }
    }
}

/* ---- kernels ------------------------------------------------------------------------------- */

template <int HDC, int R>
__global__ void __launch_bounds__(SIMT_THREADS) attn_simt_kernel(const __grid_constant__ mlk_attn_args a)
{
    const int kvh = blockIdx.x, s = a.seq0 + blockIdx.y, z = blockIdx.z;
    const int rows_total = seq_tokens(a, s) * a.group;
    if (rows_total <= 0)
        return;
    if (rows_total <= R) {
        if (a.split)
            attend_block<HDC, R>(a, s, kvh, rows_total, 0, z, gridDim.z, true);
        else if (z == 0)
            attend_block<HDC, R>(a, s, kvh, rows_total, 0, 0, 1, false);
        return;
    }
    const int cta_rows = SIMT_WARPS * R;
    const int blocks = (rows_total + cta_rows - 1) / cta_rows;
    for (int qb = z; qb < blocks; qb += gridDim.z)
        attend_block<HDC, R>(a, s, kvh, rows_total, qb, 0, 1, false);
}

/* Head-dim capacity per lane: ceil(head_dim / 32), rounded up to an
 * instantiated value. */
static inline int simt_lane_dims(int head_dim)
{
    const int c = (head_dim + 31) / 32;
    return c <= 4 ? c : 8;
}

/* Launch attn_simt_kernel<·, R> for a's head_dim on b's stream. */
template <int R>
void simt_launch(mlk_backend *b, const mlk_attn_args *a, dim3 grid)
{
    const size_t smem = simt_smem_floats(R, a->head_dim) * sizeof(float);
    switch (simt_lane_dims(a->head_dim)) {
    case 1: mlk_launch(attn_simt_kernel<1, R>, grid, SIMT_THREADS, smem, b->stream, *a); break;
    case 2: mlk_launch(attn_simt_kernel<2, R>, grid, SIMT_THREADS, smem, b->stream, *a); break;
    case 3: mlk_launch(attn_simt_kernel<3, R>, grid, SIMT_THREADS, smem, b->stream, *a); break;
    case 4: mlk_launch(attn_simt_kernel<4, R>, grid, SIMT_THREADS, smem, b->stream, *a); break;
    default: mlk_launch(attn_simt_kernel<8, R>, grid, SIMT_THREADS, smem, b->stream, *a); break;
    }
}

template <int HDC, int R>
static void simt_allow_smem_one()
{
    cudaFuncSetAttribute((const void *)attn_simt_kernel<HDC, R>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)(simt_smem_floats(R, HDC * 32) * sizeof(float)));
}

/* Allow every instantiation for R the shared memory of its largest head_dim. */
template <int R>
void simt_allow_smem()
{
    simt_allow_smem_one<1, R>();
    simt_allow_smem_one<2, R>();
    simt_allow_smem_one<3, R>();
    simt_allow_smem_one<4, R>();
    simt_allow_smem_one<8, R>();
}

/* attn_simt_r4.cu, attn_simt_r8.cu */
void mlk_attn_simt_launch_r4(mlk_backend *b, const mlk_attn_args *a, dim3 grid);
void mlk_attn_simt_launch_r8(mlk_backend *b, const mlk_attn_args *a, dim3 grid);
void mlk_attn_simt_init_r4(void);
void mlk_attn_simt_init_r8(void);

#endif
