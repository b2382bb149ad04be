/* matmul: y (M, N) = x (M, K) · wᵀ + bias, w (N, K) bf16 or F8_E4M3 packed
 * at load (ml_cpu_linear_weight), x and y f32, f32 accumulation. Weights
 * are widened to f32 exactly and activations are not rounded, as in the
 * f32 golden references, unless the backend runs the opt-in bf16
 * activations (below).
 *
 * Packed weights. Each Linear's weights are laid out once, at load, in the
 * order the kernel reads them (cpu_kernels.h ml_cpu_packed_index): strips
 * of strip_cols output columns, each (K, strip_cols) row-major over k. One
 * step of the kernel is then one contiguous load of a strip's row, widened
 * to f32 in registers, whatever the number of activation rows: decode and
 * prefill read the same layout with no per-step transpose and no packing
 * of panels, and a decode step reads every weight byte once, in order.
 * The packed copy replaces the checkpoint's for the matmul: the model
 * gives the mapped pages back once every Linear is packed (model.c).
 *
 * One driver for every M. Threads form a grid over (M, N) in whole row
 * tiles and strips, preferring to split N so that no two threads read the
 * same weights (with few row tiles, the columns in parts the threads claim
 * in turn: run). Each thread walks its columns in blocks of GEMM_NC (one
 * strip when its rows fit one tile: then it streams each strip from start
 * to end), its K in blocks of GEMM_KC, and its rows in tiles of at most
 * tile_rows. With a few row tiles (decode) every tile runs over a strip's
 * K block, which stays in L1 for all of them, before the next strip's
 * (matmul_strips); with f32 activations the first widens it and leaves
 * its f32 in the thread's scratch for the others. A thread with many row
 * tiles (prefill, the vision tower) first widens each block of its
 * columns to f32 in its scratch, once, and runs the kernel on that copy
 * (ML_CPU_BLOCK_F32): the widening is then paid once for all the tiles
 * instead of once per tile (measured: a 6432-row GEMM, K = N = 1280, 330
 * against 385 GFLOP/s), and the sums are the same. A thread with many
 * row tiles also runs each tile over a group of K blocks
 * (GEMM_GROUP_BYTES of the weights as the kernel reads them, held in L2)
 * before the next, so that its y stays in L1 from one K block to the
 * next; an element's K blocks still come in increasing order.
 *
 * Batch invariance: an output element is summed in one order, which
 * depends on K and the ISA only: y = (y or 0) + bias, then for each KC
 * block in turn, y += (the block's products summed from 0 in increasing
 * k). gemm_packed sums so for every tile shape and place (cpu_kernels.h),
 * so a row of x gets the same bits whatever M is, i.e. whatever else the
 * step computes (test_cpu_matmul checks it), and whatever the thread
 * count. It is the order the kernels summed in before the weights were
 * packed, so every result kept its bits.
 *
 * FP8 weights (matmul_f8, W8A16): w is F8_E4M3 (N, K) with a scale per
 * output row, packed as bf16 is. Every E4M3 value is an f32 (and a bf16)
 * value, widened exactly in registers; the sum starts from y = 0 and the
 * scale then multiplies each finished sum and the bias is added: y = s ·
 * Σ x·q + b. Per element that is one sum in the bf16 order (whatever M or
 * the threads) and two operations after it, so batch invariance holds as
 * for bf16. Where the scale goes: the weight is q · s exactly (a 4-bit by
 * 8-bit product), as the float32 reference decompresses it
 * (compressed-tensors' dequantize in the float32 scale dtype of an f32
 * model); applying s to the sum is that product summed in another order,
 * within the f32 rounding of the bf16 path. Applying it per element in
 * bf16, bf16(q · s), would instead match a bf16 model's decompression and
 * be 2^-9 relative per weight away from the f32 reference.
 *
 * W8A8 (matmul_f8 with quant_x): the rows of x are first quantized once
 * per call, in parallel by rows (ml_cpu_quantize_rows), to E4M3 values
 * held as f32 in the backend's act buffer with their scales s_x; the FP8
 * driver above then runs on them unchanged, and the finish multiplies
 * each sum by s_x[m] · scale[n] instead of scale[n]. A row's quantization
 * reads that row only and its sum is the driver's, so batch invariance
 * holds as for W8A16. qx · q is exact in f32 (two 4-bit significands), so
 * the only rounding past the quantization is the f32 sum's.
 *
 * bf16 activations (cb->bf16_x, ml_backend_cpu_bf16_activations): bf16
 * Linears are packed in the pair layout (cpu_kernels.h ml_cpu_pair_index),
 * each call rounds the rows of x to bf16 pairs once, in parallel by rows,
 * into the act buffer, and the driver above runs gemm_tile_bf16 on them and
 * the strips as they are (no widening). The blocks, tiles and threads are
 * the f32 path's and each element's sum is over pairs in increasing order
 * per KC block, so batch invariance holds as above. FP8 Linears too, on a
 * CPU with AVX512_VBMI (cb->f8_pairs): their codes are packed in pairs
 * too (ml_cpu_f8_pair_index) and gemm_tile_f8_pairs widens them to bf16
 * in registers (exact), so an FP8 Linear's sum is the bf16 Linear's of
 * its codes, then the scale as above, and its multiplies run at the bf16
 * dot's rate rather than f32 FMA's (at 8 rows and more a decode step of
 * FP8 was compute bound in f32). W8A8's quantized rows are E4M3 values,
 * which bf16 holds exactly: their rounding to pairs changes nothing.
 * Without VBMI (Cooper Lake) FP8 Linears keep their f32 activations and
 * layout.
 *
 * With f32 activations too, a CPU with AVX512_VBMI (cb->f8_pairs) packs
 * FP8 Linears in the pair layout: gemm_packed_f8_pairs widens a pair of
 * steps by byte lookups in fewer uops than the strip layout's widening,
 * to the same f32, summed in the same order (the same bits). An odd K's
 * padding step is never multiplied: its calls take the true steps
 * (tile_steps). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_internal.h"
#include "dtype.h"

/* K block: a block of GEMM_NC columns (GEMM_KC x GEMM_NC weights, 128 KiB
 * of bf16) stays in L2 while a thread's row tiles run over it, and one
 * strip's block (16 KiB at 32 columns) in L1 across the tiles. Changing it
 * changes the order of every sum, i.e. the bits of every result. */
#define GEMM_KC 256
#define GEMM_NC 256
/* The weights of a column block over a group of K blocks, read by every
 * row tile of a thread in turn from L2 (1-2 MiB a core on current x86
 * server cores). Measured (6432 x 1280 x 1280 and 6432 x 5120 x 1280, one
 * thread, 2026-12-03, the development VM), bf16 activations: groups of one
 * K block 150-160 GFLOP/s, of 256 KiB 164-179, 512 KiB 172-189, 1 MiB
 * 184-199, 2 and 4 MiB no faster; f32 (widened), K = 1280: 92 -> 97-102,
 * K = 5120 unchanged (79-87). */
#define GEMM_GROUP_BYTES ((size_t)1024 * 1024)
/* Row tiles from which a thread groups K blocks (above), and with f32
 * activations widens each block to f32 first: below it the y of a column
 * block (tiles x 12 rows x GEMM_NC f32) stays in cache between K blocks
 * anyway, and from it the tiles share one widening (about 1/400 of their
 * FMAs). */
#define GROUP_MIN_TILES 16
_Static_assert(GEMM_GROUP_BYTES >= (size_t)GEMM_KC * GEMM_NC * sizeof(float),
               "a group holds at least one widened K block");
/* Threads split N only while each keeps at least this many columns;
 * otherwise they split M (and each reads the same weights). */
#define GEMM_MIN_COLS_PER_THREAD 64
/* A decode-sized matmul split by columns (matmul_strips) cuts them into
 * up to this many parts a thread, which the threads claim in turn, and no
 * part narrower than a column block (GEMM_NC). */
#define CLAIMED_PARTS_PER_THREAD 4
/* Steps of a strip packed per pass over its columns at load: runs of
 * 64 contiguous source elements per column. */
#define PACK_STEPS 64
/* Room for the first Linears in the backend's list of packed weights
 * (it doubles from there): a model has a few hundred. */
#define PACKED_LIST_FIRST 256
/* A thread's scratch: one group of widened blocks, each GEMM_KC x GEMM_NC
 * f32. */
#define PANEL_FLOATS (GEMM_GROUP_BYTES / sizeof(float))

size_t ml_cpu_matmul_scratch_floats(void)
{
    return PANEL_FLOATS;
}

typedef struct matmul_job {
    float *y;                 /* (M, N) */
    const float *x;           /* (M, K) */
    /* bf16 activations (cb->bf16_x): x rounded to bf16 in pairs, (M, Kp / 2)
     * dwords, rows xb_stride(K) dwords apart; NULL: the f32 x above. */
    const uint32_t *xb;
    int Kp;                   /* steps of a packed strip: K, or K rounded up to even in the
                               * pair layout (xb, or FP8 with cb->f8_pairs) */
    const unsigned char *w;   /* packed (ml_cpu_linear_weight) */
    int f8;                   /* w holds F8_E4M3 codes (else bf16) */
    int amx;                  /* bf16 w times xb on gemm_tile_amx (cb->amx) */
    const float *scale;       /* (N) of FP8 weights */
    const float *xscale;      /* (M) s_x of W8A8 (x holds the quantized rows), or NULL */
    const uint16_t *bias;     /* (N) bf16 or NULL */
    int M, K, N, accumulate;  /* accumulate is 0 for FP8 */
    const ml_cpu_backend *cb;
    int grid_m, grid_n;       /* thread grid */
    /* > 0: the columns in this many parts, claimed from *next_part (the
     * grid is then 1 x grid_n) */
    int claimed_parts;
    atomic_int *next_part;
} matmul_job;

static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

/* K rounded up to even: the steps of a strip in the pair layout. */
static int pair_steps(int K)
{
    return K + K % 2;
}

/* Dwords from one row of x's pairs to the next: whole cache lines, an odd
 * number of them, so that a tile's 16 rows fall on 16 L1 sets (at K 5120,
 * 160 lines apart, they fell on 2 of them and left L1 before the next
 * strip reused them). */
static size_t xb_stride(int K)
{
    const size_t per_line = ML_CPU_LINE_BYTES / sizeof(uint32_t);
    const size_t lines = ((size_t)pair_steps(K) / 2 + per_line - 1) / per_line;
    return (lines | 1) * per_line;
}

/* Rows of the job's kernel tile. */
static int tile_rows(const matmul_job *j)
{
    return j->amx ? ML_CPU_AMX_TILE_ROWS : j->cb->kern->tile_rows;
}

static inline float bias_at(const uint16_t *bias, int n)
{
    return bias ? ml_bf16_to_f32(bias[n]) : 0.0f;
}

/* Bytes of `steps` steps of packed strips. */
static size_t strip_bytes(const matmul_job *j, size_t steps)
{
    return steps * (size_t)j->cb->kern->strip_cols * (j->f8 ? 1 : sizeof(uint16_t));
}

/* The strip holding column col, from step pc: a block of the packed w. */
static const void *strip_at(const matmul_job *j, int col, int pc)
{
    const int s = j->cb->kern->strip_cols;
    return j->w + strip_bytes(j, (size_t)(col / s) * (size_t)j->Kp + (size_t)pc);
}

/* Whether the job is FP8 in the pair layout with f32 activations
 * (gemm_packed_f8_pairs). */
static int f8_pairs_f32(const matmul_job *j)
{
    return j->f8 && !j->xb && j->cb->f8_pairs;
}

/* Of the kc steps of a strip's block from step pc, those an f32 x has
 * values for: all but an odd K's padding step in the pair layout. */
static int tile_steps(const matmul_job *j, int pc, int kc)
{
    return j->xb ? kc : imin(kc, j->K - pc);
}

/* Whether every element's sum starts at 0: no bias and nothing
 * accumulated, or FP8 (whose bias comes after the scale). */
static int starts_at_zero(const matmul_job *j)
{
    return j->f8 || (!j->accumulate && !j->bias);
}

/* Whether the kernels store the first K block's sums rather than add them
 * to a y set to 0 (init_block): where y starts at 0 and there is a block.
 * 0 + sum and the sum differ only in the sign of an exact zero (0 + -0 is
 * +0), which no later op turns into another value (none divides by a
 * Linear's output). Zeroing y first was 1.5-2.1% of a 32-sequence decode
 * step of `small`, and it read y once more a K block. */
static int stores_first(const matmul_job *j)
{
    return j->Kp > 0 && starts_at_zero(j);
}

/* y[m0..m1, n0..n1] = (y or 0) + bias, or 0 for FP8: the start of every
 * element's sum, unless the kernels store the first block's (above).
 * Called per column block, just before the kernels add to it, so the
 * block is still in L1 when they do (at M = 16 the whole of lm_head's y is
 * 8 MB); the three cases are separate loops because one loop with the
 * choice per element stayed scalar (5% of a 16-row decode step). 0 + b,
 * not b, keeps the sum's first addition: a bias of -0 gives +0, as it did. */
static void init_block(const matmul_job *j, int m0, int m1, int n0, int n1)
{
    if (stores_first(j))
        return;
    const size_t width = (size_t)(n1 - n0);
    for (int m = m0; m < m1; m++) {
        float *yr = j->y + (size_t)m * j->N + n0;
        if (starts_at_zero(j)) { /* K = 0: a sum of nothing */
            memset(yr, 0, width * sizeof(float));
        } else if (!j->bias) {
            for (size_t n = 0; n < width; n++)
                yr[n] += 0.0f;
        } else {
            const uint16_t *b = j->bias + n0;
            if (j->accumulate)
                for (size_t n = 0; n < width; n++)
                    yr[n] += ml_bf16_to_f32(b[n]);
            else
                for (size_t n = 0; n < width; n++)
                    yr[n] = 0.0f + ml_bf16_to_f32(b[n]);
        }
    }
}

/* FP8: y[m0..m1, n0..n1] = (s_x · scale) · (the finished sum) + bias, s_x
 * = 1 for W8A16 (1 · scale is scale exactly). */
static void finish_block(const matmul_job *j, int m0, int m1, int n0, int n1)
{
    if (!j->f8)
        return;
    for (int m = m0; m < m1; m++) {
        float *yr = j->y + (size_t)m * j->N;
        const float sx = j->xscale ? j->xscale[m] : 1.0f;
        for (int n = n0; n < n1; n++)
            yr[n] = sx * j->scale[n] * yr[n] + bias_at(j->bias, n);
    }
}

/* panel = the f32 of the strips over columns [col0, col0 + nc) from step
 * pc, kc steps: per strip (kc, strip_cols) row-major, an ML_CPU_BLOCK_F32
 * block of gemm_packed. Exact. */
static void widen_block(const matmul_job *j, float *panel, int col0, int nc, int pc, int kc)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const int sc = kn->strip_cols;
    for (int col = col0; col < col0 + nc; col += sc) {
        float *dst = panel + (size_t)((col - col0) / sc) * (size_t)kc * (size_t)sc;
        if (f8_pairs_f32(j))
            kn->widen_f8_pairs(dst, strip_at(j, col, pc), tile_steps(j, pc, kc));
        else
            kn->widen_strip(dst, strip_at(j, col, pc), j->f8, kc);
    }
}

/* The rows of a thread's part of a matmul, in tiles of equal height (16 =
 * 8 + 8, not 12 + 4: a short tile has too few FMA chains to hide their
 * latency). */
typedef struct row_tiles {
    int m0, m1; /* the rows */
    int tiles;  /* how many */
    int mr;     /* rows of each tile (the last may have fewer) */
} row_tiles;

/* One kernel call: y[ic.., col..] += the m rows of x from ic times the kc
 * steps from pc of the strip holding col (n of its columns), or of its
 * f32 copy wb (NULL: the packed strip); widen_to (or NULL): where the
 * call leaves that f32 copy (f32 activations only). */
static void tile_call(const matmul_job *j, int m, int n, int kc, int ic, int col, int pc,
                      const float *wb, const ml_cpu_prefetch *pf, float *widen_to)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const size_t K = (size_t)j->K, N = (size_t)j->N, ldxb = xb_stride(j->K);
    const size_t sc = (size_t)kn->strip_cols;
    const float *x = j->x + (size_t)ic * K + (size_t)pc;
    float *y = j->y + (size_t)ic * N + (size_t)col;
    const int add = pc > 0 || !stores_first(j);
    if (wb)
        kn->gemm_packed(m, n, tile_steps(j, pc, kc), x, K, wb, ML_CPU_BLOCK_F32, pf, NULL, y, N,
                        add);
    else if (j->amx)
        kn->gemm_tile_amx(m, n, kc / 2, j->xb + (size_t)ic * ldxb + (size_t)pc / 2, ldxb,
                          strip_at(j, col, pc), sc, pf, y, N, add);
    else if (j->xb && j->f8)
        kn->gemm_tile_f8_pairs(m, n, kc / 2, j->xb + (size_t)ic * ldxb + (size_t)pc / 2, ldxb, 1,
                               strip_at(j, col, pc), sc, pf, y, N, add);
    else if (j->xb)
        kn->gemm_tile_bf16(m, n, kc / 2, j->xb + (size_t)ic * ldxb + (size_t)pc / 2, ldxb, 1,
                           strip_at(j, col, pc), sc, pf, y, N, add);
    else if (f8_pairs_f32(j))
        kn->gemm_packed_f8_pairs(m, n, tile_steps(j, pc, kc), x, K, strip_at(j, col, pc), pf,
                                 widen_to, y, N, add);
    else
        kn->gemm_packed(m, n, kc, x, K, strip_at(j, col, pc),
                        j->f8 ? ML_CPU_BLOCK_F8 : ML_CPU_BLOCK_BF16, pf, widen_to, y, N, add);
}

/* The block matmul_strips runs over after the one of the strip holding
 * col from step pc, in the column block [jc, jc + nc) of a thread's
 * columns [.., n1): the next strip's, or the first strip's of the next K
 * block or column block; NULL after the last. *kc: its steps. */
static const void *block_after(const matmul_job *j, int jc, int nc, int n1, int pc, int col,
                               int *kc)
{
    const int sc = j->cb->kern->strip_cols;
    if (col + sc < jc + nc) {
        *kc = imin(GEMM_KC, j->Kp - pc);
        return strip_at(j, col + sc, pc);
    }
    if (pc + GEMM_KC < j->Kp) {
        *kc = imin(GEMM_KC, j->Kp - pc - GEMM_KC);
        return strip_at(j, jc, pc + GEMM_KC);
    }
    *kc = imin(GEMM_KC, j->Kp);
    return jc + nc < n1 ? strip_at(j, jc + nc, 0) : NULL;
}

/* Share `share` of `shares` equal ones, in order and in whole lines, of
 * the block (next, kc steps) as a tile's prefetch. */
static ml_cpu_prefetch next_share(const matmul_job *j, const void *next, int kc, int share,
                                  int shares)
{
    const size_t bytes = strip_bytes(j, (size_t)kc);
    const size_t lines = next ? (bytes + ML_CPU_LINE_BYTES - 1) / ML_CPU_LINE_BYTES : 0;
    const size_t l0 = lines * (size_t)share / (size_t)shares;
    const size_t l1 = lines * (size_t)(share + 1) / (size_t)shares;
    return (ml_cpu_prefetch){.kind = l1 > l0 ? ML_CPU_PREFETCH_NEXT : ML_CPU_PREFETCH_NONE,
                             .next = (const char *)next + l0 * ML_CPU_LINE_BYTES,
                             .bytes = (l1 - l0) * ML_CPU_LINE_BYTES};
}

/* A few row tiles (decode, up to GROUP_MIN_TILES - 1): every tile runs over
 * a strip's K block, from L1 after the first, before the next strip's
 * (against every tile over the column block's 8 strips, from L2, before
 * the next tile, 2026-12-05: `1b`, 16 sequences, bf16 activations and
 * cache, 0.91-0.99x the step; `small`, f32, 16 sequences 0.91-0.99x, 32
 * sequences 0.87-1.07x; on the AVX2 kernels, 16 sequences 0.84-1.00x and
 * 32 sequences 0.92-1.02x). With one tile a column block is one strip,
 * streamed from its start to its end.
 *
 * With more, the tiles fetch among them, into L2, the block they run over
 * next (block_after): tile t the t-th of equal shares of its lines,
 * spread over the tile's steps (ML_CPU_PREFETCH_NEXT), so that the lines
 * leave for memory at the pace the tiles compute, all the while they do.
 * The first block of a thread's part, which no call fetched, its first
 * tile streams, and the others share the next. Measured against the first
 * tile streaming every block and the last fetching the whole next block,
 * a line a step, i.e. memory idle while the other tiles computed
 * (2026-12-06, the Intel Xeon VM, 2 threads): `small`'s lm_head from
 * memory (K 1024 x N 128256, three copies of the weights in turn), 16
 * rows 0.84-0.86x the time, 32 rows 0.98-1.02x; decode steps of `small`
 * (alternating processes, the median step), 16 sequences 0.86-0.88x, with
 * an image 0.88-0.90x, bf16 activations 0.98-0.99x, FP8 0.93x; 32
 * sequences 0.94-1.00x.
 *
 * With f32 activations the first tile over a block also leaves the
 * block's f32 in the panel (32 KiB at GEMM_KC steps of 32 columns, most of
 * L1 beside the tile's rows of x), and the others read it as it stands:
 * widening a step's two vectors is a shift and a mask on the ports the
 * FMAs issue on (an 8-row tile: 18 uops there for 16 FMAs), which a tile
 * on f32 does not pay. Measured against every tile widening (the same
 * day and host): lm_head from memory, 24 rows 0.92x the time, 32 rows
 * 0.93-0.94x, 16 rows 0.98-1.03x (AVX2: 16 rows 0.88-0.95x, 32 rows
 * 0.91-0.93x); decode steps of `small`, 32 sequences 0.92-0.99x, with an
 * image 0.92-0.99x, FP8 (eight uops a step to widen) 0.88-0.90x; 16
 * sequences, FP8 0.92-0.95x, f32 within a noisy minute's spread
 * (0.89-1.21x). */
static void matmul_strips(const matmul_job *j, const row_tiles *rt, int n0, int n1,
                          float *panel)
{
    const int sc = j->cb->kern->strip_cols;
    const int nc_max = rt->tiles == 1 ? sc : GEMM_NC;
    const ml_cpu_prefetch stream = {.kind = ML_CPU_PREFETCH_STREAM};
    /* with f32 activations: the first tile's widened block, the others' B */
    float *const f32_copy = j->xb ? NULL : panel;
    for (int jc = n0; jc < n1; jc += nc_max) {
        const int nc = imin(nc_max, n1 - jc);
        init_block(j, rt->m0, rt->m1, jc, jc + nc);
        for (int pc = 0; pc < j->Kp; pc += GEMM_KC) {
            const int kc = imin(GEMM_KC, j->Kp - pc);
            for (int col = jc; col < jc + nc; col += sc) {
                const int n = imin(sc, jc + nc - col);
                if (rt->tiles == 1) {
                    tile_call(j, rt->m1 - rt->m0, n, kc, rt->m0, col, pc, NULL, &stream, NULL);
                    continue;
                }
                int next_kc;
                const void *next = block_after(j, jc, nc, n1, pc, col, &next_kc);
                const int streams = jc == n0 && pc == 0 && col == n0;
                const int sharers = rt->tiles - streams;
                for (int t = 0; t < rt->tiles; t++) {
                    const int ic = rt->m0 + t * rt->mr;
                    const ml_cpu_prefetch pf =
                        t < streams ? stream : next_share(j, next, next_kc, t - streams, sharers);
                    tile_call(j, imin(rt->mr, rt->m1 - ic), n, kc, ic, col, pc,
                              t > 0 ? f32_copy : NULL, &pf, t == 0 ? f32_copy : NULL);
                }
            }
        }
        finish_block(j, rt->m0, rt->m1, jc, jc + nc);
    }
}

/* Many row tiles (prefill, the vision tower): each tile runs over a group
 * of K blocks (GEMM_GROUP_BYTES of weights as the kernel reads them, held
 * in L2) before the next tile, so that its y stays in L1 across the group;
 * one K block a pass would bring every y of the column block back from
 * memory once a block (at 6432 rows, 6.6 MB). With f32 activations each
 * block of the group is first widened to f32 in the panel (the thread's
 * scratch), once for all the tiles; with bf16 activations the kernel
 * multiplies the bf16 weights as they are. */
static void matmul_grouped(const matmul_job *j, const row_tiles *rt, int n0, int n1, float *panel)
{
    const int sc = j->cb->kern->strip_cols;
    const int widened = !j->xb;
    const size_t elem = widened ? sizeof(float) : j->f8 ? 1 : sizeof(uint16_t);
    const int kc_group = (int)(GEMM_GROUP_BYTES / ((size_t)GEMM_NC * GEMM_KC * elem)) * GEMM_KC;
    const ml_cpu_prefetch stream = {.kind = ML_CPU_PREFETCH_STREAM};
    for (int jc = n0; jc < n1; jc += GEMM_NC) {
        const int nc = imin(GEMM_NC, n1 - jc);
        for (int pg = 0; pg < j->Kp; pg += kc_group) {
            const int pg_end = imin(pg + kc_group, j->Kp);
            if (widened)
                for (int pc = pg; pc < pg_end; pc += GEMM_KC)
                    widen_block(j, panel + (size_t)(pc - pg) * GEMM_NC, jc, nc, pc,
                                imin(GEMM_KC, pg_end - pc));
            for (int ic = rt->m0; ic < rt->m1; ic += rt->mr) {
                const int m = imin(rt->mr, rt->m1 - ic);
                if (pg == 0)
                    init_block(j, ic, ic + m, jc, jc + nc);
                for (int pc = pg; pc < pg_end; pc += GEMM_KC) {
                    const int kc = imin(GEMM_KC, pg_end - pc);
                    const float *wb = widened ? panel + (size_t)(pc - pg) * GEMM_NC : NULL;
                    for (int col = jc; col < jc + nc; col += sc)
                        tile_call(j, m, imin(sc, jc + nc - col), kc, ic, col, pc,
                                  wb ? wb + (size_t)((col - jc) / sc) * (size_t)kc * (size_t)sc
                                     : NULL,
                                  wb || ic > rt->m0 ? NULL : &stream, NULL);
                }
            }
        }
        finish_block(j, rt->m0, rt->m1, jc, jc + nc);
    }
}

/* y[m0..m1, n0..n1], n0 at a strip's start; panel: the thread's scratch. */
static void matmul_block(const matmul_job *j, int m0, int m1, int n0, int n1, float *panel)
{
    const int tiles = (m1 - m0 + tile_rows(j) - 1) / tile_rows(j);
    const row_tiles rt = {.m0 = m0, .m1 = m1, .tiles = tiles, .mr = (m1 - m0 + tiles - 1) / tiles};
    if (tiles >= GROUP_MIN_TILES)
        matmul_grouped(j, &rt, n0, n1, panel);
    else
        matmul_strips(j, &rt, n0, n1, panel);
}

/* [lo, hi) of part `part` of `parts` over n elements, in whole units. */
static void split_units(int n, int unit, int parts, int part, int *lo, int *hi)
{
    const int64_t units = (n + unit - 1) / unit;
    *lo = imin(n, (int)(units * part / parts) * unit);
    *hi = imin(n, (int)(units * (part + 1) / parts) * unit);
}

static void matmul_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const matmul_job *j = ctx;
    const ml_cpu_kernels *kn = j->cb->kern;
    if (j->claimed_parts) {
        int part, n0, n1;
        while ((part = atomic_fetch_add_explicit(j->next_part, 1, memory_order_relaxed)) <
               j->claimed_parts) {
            split_units(j->N, kn->strip_cols, j->claimed_parts, part, &n0, &n1);
            if (n0 < n1)
                matmul_block(j, 0, j->M, n0, n1, ml_cpu_scratch(j->cb, tid));
        }
        return;
    }
    for (int64_t part = begin; part < end; part++) {
        int m0, m1, n0, n1;
        split_units(j->M, tile_rows(j), j->grid_m, (int)(part / j->grid_n), &m0, &m1);
        split_units(j->N, kn->strip_cols, j->grid_n, (int)(part % j->grid_n), &n0, &n1);
        if (m0 < m1 && n0 < n1)
            matmul_block(j, m0, m1, n0, n1, ml_cpu_scratch(j->cb, tid));
    }
}

static void run(ml_cpu_backend *cb, matmul_job job)
{
    const int M = job.M, K = job.K, N = job.N;
    if (M <= 0 || N <= 0)
        return;
    const int64_t want = (int64_t)((double)M * N * K / ML_CPU_MIN_WORK_PER_THREAD);
    const int pool_threads = ml_cpu_pool_threads(cb->pool);
    const int threads = want < 1 ? 1 : want < pool_threads ? (int)want : pool_threads;
    int grid_n = 1;
    for (int d = threads; d > 1; d--) {
        if (threads % d == 0 && N >= d * GEMM_MIN_COLS_PER_THREAD) {
            grid_n = d;
            break;
        }
    }
    job.grid_n = grid_n;
    job.grid_m = threads / grid_n;
    /* Decode: each thread's columns are a stream of weights no other thread
     * reads, cut into parts that the threads claim, so that a thread the
     * host slows (another VM on its core, the worker's I/O threads) streams
     * fewer of them instead of holding the step. A part's first block is
     * fetched on demand (matmul_strips), hence parts of a column block or
     * more. The grouped path (many row tiles) keeps its static grid: cut
     * finer, its vision and prefill shapes took 1.03-1.05x the time. */
    atomic_int next_part;
    atomic_init(&next_part, 0);
    const int tiles = (M + tile_rows(&job) - 1) / tile_rows(&job);
    if (job.grid_m == 1 && grid_n > 1 && tiles < GROUP_MIN_TILES) {
        const int blocks = N / GEMM_NC, parts = grid_n * CLAIMED_PARTS_PER_THREAD;
        if (blocks > grid_n) {
            job.claimed_parts = parts < blocks ? parts : blocks;
            job.next_part = &next_part;
        }
    }
    ml_cpu_pool_for(cb->pool, threads, 1, matmul_part, &job);
}

typedef struct round_job {
    uint32_t *xb;
    const float *x;
    int K;
    const ml_cpu_kernels *kn;
} round_job;

/* Rows [begin, end) of x rounded to bf16 (RNE, as torch's .to(bfloat16))
 * in pairs, an odd K's last pair padded with 0. */
static void round_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const round_job *r = ctx;
    for (int64_t m = begin; m < end; m++)
        r->kn->bf16_pairs(r->xb + (size_t)m * xb_stride(r->K), r->x + (size_t)m * (size_t)r->K,
                          (size_t)r->K);
}

/* Floats of the act buffer that x (M, K) rounded to bf16 pairs takes. */
static size_t rounded_floats(int M, int K)
{
    return (size_t)M * xb_stride(K);
}

/* Run job; with xb (rounded_floats of the act buffer) its x is first
 * rounded there and the pair kernels run. */
static void run_rounded(ml_cpu_backend *cb, matmul_job job, uint32_t *xb)
{
    if (xb) {
        job.Kp = pair_steps(job.K);
        round_job r = {.xb = xb, .x = job.x, .K = job.K, .kn = cb->kern};
        ml_cpu_pool_for(cb->pool, job.M, ml_cpu_grain((double)job.K), round_part, &r);
        job.xb = xb;
    }
    run(cb, job);
}

void ml_cpu_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w,
                   const uint16_t *bias, int M, int K, int N, int accumulate)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    matmul_job job = {.y = y, .x = x, .w = (const unsigned char *)w, .bias = bias, .M = M,
                      .K = K, .Kp = K, .N = N, .accumulate = accumulate, .cb = cb,
                      .amx = cb->amx};
    if (M <= 0 || N <= 0)
        return;
    /* gemm_tile_amx reads up to a tile load's rows past the last */
    const int rows_read = job.amx ? M + ML_CPU_AMX_ROW_STEP - 1 : M;
    float *buf = NULL;
    if (cb->bf16_x && !(buf = ml_cpu_act_buffer(cb, rounded_floats(rows_read, K), "matmul")))
        return;
    run_rounded(cb, job, (uint32_t *)buf);
}

/* ---- packing at load ------------------------------------------------------- */

typedef struct pack_job {
    unsigned char *dst;
    const unsigned char *src; /* (rows, cols) row-major */
    int rows, cols, f8, strip_cols;
    int pairs;                /* the pair layout (bf16 activations, or FP8 on VBMI) */
    int steps;                /* per strip: cols, rounded up to even for pairs */
} pack_job;

/* Strips [begin, end): each column's source run of PACK_STEPS elements
 * at a time, written to its place in each step (zeros past the last row
 * and column). */
static void pack_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const pack_job *pj = ctx;
    const size_t K = (size_t)pj->cols, P = (size_t)pj->steps, S = (size_t)pj->strip_cols;
    for (int64_t s = begin; s < end; s++) {
        for (size_t p0 = 0; p0 < P; p0 += PACK_STEPS) {
            const size_t p1 = p0 + PACK_STEPS < P ? p0 + PACK_STEPS : P;
            for (int c = 0; c < pj->strip_cols; c++) {
                const int64_t n = s * pj->strip_cols + c;
                if (pj->f8) {
                    uint8_t *d = pj->dst + (size_t)s * P * S;
                    const uint8_t *r = pj->src + (size_t)n * K;
                    for (size_t p = p0; p < p1; p++)
                        d[pj->pairs ? ml_cpu_f8_pair_index(pj->strip_cols, (int)p, c)
                                    : ml_cpu_packed_index(pj->strip_cols, 1, (int)p, c)] =
                            n < pj->rows && p < K ? r[p] : 0;
                } else {
                    uint16_t *d = (uint16_t *)pj->dst + (size_t)s * P * S;
                    const uint16_t *r = (const uint16_t *)pj->src + (size_t)n * K;
                    for (size_t p = p0; p < p1; p++)
                        d[pj->pairs ? ml_cpu_pair_index(pj->strip_cols, (int)p, c)
                                    : ml_cpu_packed_index(pj->strip_cols, 0, (int)p, c)] =
                            n < pj->rows && p < K ? r[p] : 0;
                }
            }
        }
    }
}

const void *ml_cpu_linear_weight(ml_backend *be, const void *host, int rows, int cols,
                                 size_t elem_size)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    const int sc = cb->kern->strip_cols;
    if (!host || rows <= 0 || cols <= 0 || (elem_size != 1 && elem_size != sizeof(uint16_t))) {
        ml_cpu_latch(cb, ML_ERR_INVALID_ARG, "linear_weight",
                     "%d x %d of %zu-byte elements", rows, cols, elem_size);
        return NULL;
    }
    const int pairs = elem_size == 1 ? cb->f8_pairs : cb->bf16_x;
    const int steps = pairs ? pair_steps(cols) : cols;
    const int64_t strips = ((int64_t)rows + sc - 1) / sc;
    const size_t bytes = (size_t)strips * (size_t)sc * (size_t)steps * elem_size;
    if (cb->n_packed == cb->cap_packed) {
        const size_t cap = cb->cap_packed ? 2 * cb->cap_packed : PACKED_LIST_FIRST;
        ml_cpu_packed *list = realloc(cb->packed, cap * sizeof *list);
        if (!list) {
            ml_cpu_latch(cb, ML_ERR_NOMEM, "linear_weight", "the list of packed weights");
            return NULL;
        }
        cb->packed = list;
        cb->cap_packed = cap;
    }
    unsigned char *packed = ml_cpu_alloc_streamed(be, bytes);
    if (!packed) {
        ml_cpu_latch(cb, ML_ERR_NOMEM, "linear_weight", "%zu bytes of packed weights", bytes);
        return NULL;
    }
    pack_job pj = {.dst = packed, .src = host, .rows = rows, .cols = cols,
                   .f8 = elem_size == 1, .strip_cols = sc, .pairs = pairs, .steps = steps};
    ml_cpu_pool_for(cb->pool, strips, ml_cpu_grain((double)sc * steps), pack_part, &pj);
    cb->packed[cb->n_packed++] = (ml_cpu_packed){.p = packed, .bytes = bytes};
    return packed;
}

void ml_cpu_linear_weight_free(ml_backend *be, const void *w)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    for (size_t i = 0; w && i < cb->n_packed; i++)
        if (cb->packed[i].p == w) {
            cb->packed[i] = cb->packed[--cb->n_packed];
            break;
        }
    ml_cpu_free(be, (void *)w);
}

/* ---- W8A8: the activation quantizer ---------------------------------------- */

void ml_cpu_quantize_rows(float *qx, float *sx, const float *x, int m0, int m1, int K)
{
    for (int m = m0; m < m1; m++) {
        const float *xr = x + (size_t)m * K;
        float *qr = qx + (size_t)m * K;
        float amax = 0.0f;
        for (int k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(xr[k]));
        const float s = amax > 0.0f ? amax / ML_F8E4M3_MAX : 1.0f;
        for (int k = 0; k < K; k++)
            qr[k] = ml_f8e4m3_to_f32(ml_f32_to_f8e4m3(xr[k] / s));
        sx[m] = s;
    }
}

typedef struct quant_job {
    float *qx, *sx;
    const float *x;
    int K;
} quant_job;

static void quant_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    (void)tid;
    const quant_job *q = ctx;
    ml_cpu_quantize_rows(q->qx, q->sx, q->x, (int)begin, (int)end, q->K);
}

void ml_cpu_matmul_f8(ml_backend *be, float *y, const float *x, const uint8_t *w,
                      const float *scale, const uint16_t *bias, int M, int K, int N,
                      int quant_x)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    matmul_job job = {.y = y, .x = x, .w = w, .f8 = 1, .scale = scale, .bias = bias, .M = M, .K = K,
                      .Kp = cb->f8_pairs ? pair_steps(K) : K, .N = N, .cb = cb};
    if (M <= 0 || N <= 0)
        return;
    /* one buffer: the quantized rows and their scales, then their pairs */
    const size_t quant = quant_x ? (size_t)M * K + (size_t)M : 0;
    const size_t pairs = cb->bf16_x && cb->f8_pairs ? rounded_floats(M, K) : 0;
    float *buf = NULL;
    if ((quant || pairs) && !(buf = ml_cpu_act_buffer(cb, quant + pairs, "matmul_f8")))
        return;
    if (quant_x) {
        quant_job q = {.qx = buf, .sx = buf + (size_t)M * K, .x = x, .K = K};
        ml_cpu_pool_for(cb->pool, M, ml_cpu_grain((double)K), quant_part, &q);
        job.x = q.qx;
        job.xscale = q.sx;
    }
    run_rounded(cb, job, pairs ? (uint32_t *)(buf + quant) : NULL);
}
