/* The per-ISA inner kernels of the CPU backend.
 *
 * The drivers (matmul.c, attention.c, elementwise.c) own tiling, packing,
 * masking and threading and are shared by every ISA; only the loops below
 * exist once per instruction set. kernels_plain.c is the readable reference
 * of what each computes; kernels_avx2.c and kernels_avx512.c are the same
 * arithmetic in vector registers (f32 throughout, with FMA), except that
 * exp and erf are vmath.h's polynomials (shared by both) instead of libm.
 * All kernels are pure functions of their arguments and thread-safe. */
#ifndef ML_CPU_KERNELS_H
#define ML_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu/cpu_features.h"

/* Largest gemm_tile shape of any ISA (drivers size buffers with these). */
#define ML_CPU_TILE_MAX_ROWS 12
#define ML_CPU_TILE_MAX_COLS 32
/* gemm_tile_amx's rows: two AMX tiles of ML_CPU_AMX_ROW_STEP rows (the
 * rows of A a tile load reads); the pairs of its chunks (one TDPBF16PS). */
#define ML_CPU_AMX_ROW_STEP 16
#define ML_CPU_AMX_TILE_ROWS (2 * ML_CPU_AMX_ROW_STEP)
#define ML_CPU_AMX_CHUNK_PAIRS 16

/* LDTILECFG's operand (palette 1), and the one configuration gemm_tile_amx
 * loads (kernels_avx512.c, x86 only): its 8 tiles of 16 rows of 64 bytes,
 * which bench_fma_peak's TDPBF16PS chains load too. Constant data: GCC's
 * _tile_loadconfig tells the compiler it reads 8 bytes, so the stores of a
 * local configuration could be dropped. */
typedef struct ml_cpu_amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ml_cpu_amx_config;
_Static_assert(sizeof(ml_cpu_amx_config) == 64, "LDTILECFG reads 64 bytes");
extern const ml_cpu_amx_config ml_cpu_amx_shape;
/* Widest strip of any ISA's packed weights (strip_cols). */
#define ML_CPU_MAX_STRIP_COLS 32
/* Largest gemv block of any ISA. */
#define ML_CPU_GEMV_MAX_ROWS 6
#define ML_CPU_GEMV_MAX_COLS 4

/* What a matmul kernel prefetches while it runs over a block of a strip
 * (matmul.c). With one row tile over each block, the tile streams it from
 * memory. With a few (a decode batch), memory must not idle while the
 * tiles compute from cache: they fetch the next block among them, each
 * its share of the lines, spread over its steps. */
typedef enum ml_cpu_prefetch_kind {
    ML_CPU_PREFETCH_NONE,
    /* The block comes from memory: its own lines, into L2
     * ML_CPU_STRIP_PREFETCH_BYTES ahead and into L1
     * ML_CPU_STRIP_PREFETCH_L1_BYTES ahead. */
    ML_CPU_PREFETCH_STREAM,
    /* The block is in cache: `bytes` from `next`, part of a block a later
     * call reads, into L2, spread evenly over the call's steps. */
    ML_CPU_PREFETCH_NEXT,
} ml_cpu_prefetch_kind;

typedef struct ml_cpu_prefetch {
    ml_cpu_prefetch_kind kind;
    const void *next; /* ML_CPU_PREFETCH_NEXT only */
    size_t bytes;
} ml_cpu_prefetch;

/* What a block gemm_packed reads holds: a packed strip's bf16 or F8_E4M3
 * codes, or their f32, as an earlier call widened them (its `widened`). */
typedef enum ml_cpu_block {
    ML_CPU_BLOCK_BF16,
    ML_CPU_BLOCK_F8,
    ML_CPU_BLOCK_F32,
} ml_cpu_block;

typedef struct ml_cpu_kernels {
    ml_cpu_isa isa;

    /* C (m, n) += A (m, k) · B (k, n) for m <= tile_rows, n <= tile_cols,
     * or with add = 0, C = A · B (C is only written: nothing to clear first).
     * A's element (i, p) is a[i * a_rs + p * a_cs] where one of a_rs, a_cs is 1
     * (A row-major or column-major); B's row p starts at b + p * ldb and is
     * contiguous; C's row i starts at c + i * ldc. The products are summed in
     * f32 over p in increasing order (per SIMD lane of C) from 0 and then
     * added to C, or stored: C = 0 + sum but for the sign of a zero. */
    void (*gemm_tile)(int m, int n, int k, const float *a, size_t a_rs, size_t a_cs,
                      const float *b, size_t ldb, float *c, size_t ldc, int add);
    int tile_rows, tile_cols;

    /* The matmul kernel (matmul.c), on weights packed at load: y[i * ldy + c]
     * += Σ_{p<k} x[i * ldx + p] · w(p, c) for i < m <= tile_rows, c < n <=
     * strip_cols. w is a block of k steps of one strip (the layout below):
     * bf16 or F8_E4M3 codes widened exactly as ml_cpu_f8_to_f32, or their
     * f32 (k, strip_cols) row-major (src). Each sum starts at 0 and takes
     * one product at a time in increasing p, with the multiply-add
     * gemm_tile uses, and is then added to y, or with add = 0 stored there
     * (gemm_tile's add): the order of every element is gemm_tile's,
     * whatever m, n or the element's place in the tile (matmul.c, batch
     * invariance). Columns past n are computed from the strip's zero
     * padding and not stored.
     * pf: what it prefetches meanwhile (NULL: nothing). widened (or NULL;
     * ignored for an ML_CPU_BLOCK_F32 block): where it also stores w's f32
     * (k, strip_cols) as it goes, for the next tiles over the block to
     * read as ML_CPU_BLOCK_F32 without widening it again. */
    void (*gemm_packed)(int m, int n, int k, const float *x, size_t ldx, const void *w,
                        ml_cpu_block src, const ml_cpu_prefetch *pf, float *widened, float *y,
                        size_t ldy, int add);
    /* Columns of a strip: the width the ISA's registers take in one step
     * (two vectors of f32). */
    int strip_cols;

    /* The opt-in bf16 activations (matmul.c, attention.c; NULL where the
     * ISA has no bf16 dot product, i.e. everywhere but AVX-512 with
     * AVX512_BF16, which the caller has checked: ml_cpu_has_avx512_bf16):
     * gemm_tile on pairs. C (m, n) += A (m, 2·kp) · B (2·kp, n) for m <=
     * tile_rows, n <= tile_cols, A and B bf16 in pairs along the sum: A's
     * pair (i, p) is the dword a[i * a_rs + p * a_cs] (one of a_rs, a_cs is
     * 1), B's pair row p the dwords b + p * ldb, column j's pair in dword j
     * (the lower index in the low half). Each sum starts at 0, takes one
     * pair of products at a time in increasing p with VDPBF16PS, and is
     * then added to C, or with add = 0 stored (gemm_tile's add). A pair's
     * two products and their addition to the sum are the instruction's,
     * which CPU makers implement differently (it is not two FMAs on every
     * CPU): a result's bits are fixed for a machine whatever the tile or its
     * place, not across machines. pf as gemm_packed's, where B is a block of
     * a packed strip (a_cs == 1 and n > half the tile; elsewhere pf is
     * NULL). */
    void (*gemm_tile_bf16)(int m, int n, int kp, const uint32_t *a, size_t a_rs, size_t a_cs,
                           const uint32_t *b, size_t ldb, const ml_cpu_prefetch *pf, float *c,
                           size_t ldc, int add);
    /* The same on FP8 weights (matmul.c; NULL as gemm_tile_bf16, and it
     * needs AVX512_VBMI too, which the caller has checked:
     * ml_cpu_has_avx512_vbmi): B a block of a strip of F8_E4M3 codes in
     * their pair layout (ml_cpu_f8_pair_index, from an even step; ldb ==
     * strip_cols, and a whole pair step is read whatever n), each code
     * widened to bf16 exactly in registers (every E4M3 value is a bf16), so
     * each sum is gemm_tile_bf16's on those bf16; A row-major (a_cs == 1)
     * only. */
    void (*gemm_tile_f8_pairs)(int m, int n, int kp, const uint32_t *a, size_t a_rs,
                               size_t a_cs, const uint16_t *b, size_t ldb,
                               const ml_cpu_prefetch *pf, float *c, size_t ldc, int add);
    /* The bf16 Linears' tile on AMX (matmul.c; NULL but on AVX-512, and it
     * needs AMX-BF16 with the kernel's leave to use the tile state, which
     * the caller has checked: ml_cpu_has_amx_bf16). C (m, n) += A (m, 2·kp)
     * · B (2·kp, n), or with add = 0 C = the product, for m <=
     * ML_CPU_AMX_TILE_ROWS and n <= strip_cols; A's pair (i, p) the dword
     * a[i * lda + p], B's pair row p the dwords b + p * ldb (a block of a
     * strip in the pair layout, or the attention's Qᵀ or weights in pairs),
     * of which the first 16, and where n > 16 the first 32, are read
     * whatever n. The sum is TDPBF16PS's: it starts from C (or 0) and
     * takes the pairs in chunks of 16, each chunk's 32 products added to
     * it by one instruction, in increasing order of chunks; a last chunk of
     * fewer pairs is padded with zero pairs. So an element's bits depend on
     * its row of A and column of B alone, whatever m, n or the call's
     * place, and two calls over consecutive chunks give one call's bits.
     * The instruction treats subnormal inputs as zero and flushes subnormal
     * results. A's rows past m, up to m rounded up to ML_CPU_AMX_ROW_STEP,
     * are read (their results are not stored): the caller's buffer holds
     * them. pf as gemm_tile_bf16's. */
    void (*gemm_tile_amx)(int m, int n, int kp, const uint32_t *a, size_t lda,
                          const uint32_t *b, size_t ldb, const ml_cpu_prefetch *pf, float *c,
                          size_t ldc, int add);
    /* Its operands rounded: pair(a, b) = the dword of ml_f32_to_bf16(a)
     * (dtype.h: RNE, NaN kept quiet, subnormals kept) in the low half and
     * of b in the high half. bf16_pairs: d[q] = pair(x[2q], x[2q + 1]) for
     * the (n + 1) / 2 pairs of n values, an odd n's last padded with 0 (a
     * row along the sum); bf16_pair_rows: d[i] = pair(lo[i], hi[i]) for i
     * < n (two rows of the sum, side by side). */
    void (*bf16_pairs)(uint32_t *d, const float *x, size_t n);
    void (*bf16_pair_rows)(uint32_t *d, const float *lo, const float *hi, size_t n);

    /* LoRA's kernel (lora.c): dots (r, j) = Σ_k w[r * ldw + k] · x[j * ldx + k]
     * for r < rows <= gemv_rows, j < cols <= gemv_cols; w bf16 (rows, K), x
     * f32 (cols, K); dots row-major (rows, cols). Reads each weight element
     * once. Each dot is summed in an order that depends on K alone (per SIMD
     * lane in increasing k, then the lanes), never on rows, cols or its
     * place in the block: a sequence's result does not depend on the batch
     * it is decoded in. */
    void (*gemv)(int rows, int cols, int K, const uint16_t *w, size_t ldw, const float *x,
                 size_t ldx, float *dots);
    int gemv_rows, gemv_cols;

    /* One key block of online softmax over the columns of s (nk, nq), row
     * stride lds, holding raw scores q·k (masked entries = -INFINITY; every
     * finite value is a score), in powers of 2: the caller folds log2 e
     * into scale, and the weights come out the same up to roundings. For
     * each column c, with x = s·scale (scale > 0):
     *   m' = max(m[c], max_j x[j][c]);  sh = m' unless m' = -inf, then 0
     *   s[j][c] = 2^(x[j][c] - sh);  alpha[c] = 2^(m[c] - sh)
     *   l[c] = l[c]·alpha[c] + Σ_j s[j][c];  m[c] = m'
     * 2^0 is exactly 1 and 2^-inf exactly 0 (results below FLT_MIN flush
     * to 0 in the vector builds: vm_exp2_below_hi of vmath.h). */
    void (*softmax_block)(float *s, size_t lds, int nk, int nq, float scale, float *m, float *l,
                          float *alpha);

    /* y[i] = exp(x[i]), y[i] = erf(x[i]) for i < n; y may be x. Plain calls
     * libm; the vector builds share vmath.h, whose header states their
     * error bounds. */
    void (*exp_n)(float *y, const float *x, size_t n);
    void (*erf_n)(float *y, const float *x, size_t n);
    /* The activations, each element in f32 in the order written:
     *   gelu:     x[i] = x · 0.5 · (1 + erf(x · (1/√2)))  in place (ACT2FN["gelu"])
     *   silu_mul: y[i] = g / (1 + exp(-g)) · up[i], g = gate[i]; y may be
     *             gate or up (silu(gate) · up of the text MLP) */
    void (*gelu)(float *x, size_t n);
    void (*silu_mul)(float *y, const float *gate, const float *up, size_t n);

    /* dst[i] = the f32 of the bf16 src[i], exactly (ml_bf16_to_f32), for
     * i < n: the bf16 K/V cache's rows widened as the attention reads them
     * (attention.c). */
    void (*bf16_widen)(float *dst, const uint16_t *src, size_t n);
    /* dst (k, strip_cols) row-major = steps [0, k) of a packed strip w
     * (bf16, or F8_E4M3 codes for f8 != 0), widened exactly as
     * gemm_packed widens them: an ML_CPU_BLOCK_F32 block that many row
     * tiles share (matmul.c, the grouped path). */
    void (*widen_strip)(float *dst, const void *w, int f8, int k);
    /* FP8 Linears with f32 activations on a CPU with AVX512_VBMI (matmul.c;
     * NULL where the ISA has no byte permutes, and the caller has checked
     * ml_cpu_has_avx512_vbmi): w a block of k steps of a strip of codes in
     * their pair layout (ml_cpu_f8_pair_index, from an even step; k may be
     * odd, the last pair's second code then unused), otherwise gemm_packed's
     * contract for an ML_CPU_BLOCK_F8 block: each code widened to the same
     * f32 and summed in the same order, so the bits of every result are
     * gemm_packed's on the strip layout. */
    void (*gemm_packed_f8_pairs)(int m, int n, int k, const float *x, size_t ldx,
                                 const uint16_t *w, const ml_cpu_prefetch *pf, float *widened,
                                 float *y, size_t ldy, int add);
    /* widen_strip for such a block. */
    void (*widen_f8_pairs)(float *dst, const uint16_t *w, int k);
} ml_cpu_kernels;

extern const ml_cpu_kernels ml_cpu_kernels_plain;
#if ML_CPU_X86
extern const ml_cpu_kernels ml_cpu_kernels_avx2;
extern const ml_cpu_kernels ml_cpu_kernels_avx512;
#endif

/* The exact widening of an F8_E4M3 code c to f32 (every E4M3 value is an
 * f32 and a bf16 value): the bits (c & 0x80) << 24 | (c & 0x7f) << 20
 * read as f32 are the value times 2^-120 (the exponent bias 7 against
 * f32's 127), a subnormal f32 for the E4M3 subnormals, and the multiply
 * by ML_CPU_F8_REBIAS restores it exactly, the subnormals included. A
 * vector kernel that has the code's sign in bit 31 and its 7 other bits
 * at 26..20 of a lane keeps them with ML_CPU_F8_F32_MASK. The NaN codes,
 * which no checkpoint holds (compressed-tensors clamps to ±448), widen to
 * ±480. */
#define ML_CPU_F8_SIGN_SHIFT 24
#define ML_CPU_F8_MAG_SHIFT 20
#define ML_CPU_F8_F32_MASK 0x87f00000u
#define ML_CPU_F8_REBIAS 0x1p120f
/* The value of code c times 2^-120: the bits before the multiply. */
static inline float ml_cpu_f8_to_f32_unbiased(uint8_t c)
{
    const uint32_t u = (uint32_t)(c & 0x80u) << ML_CPU_F8_SIGN_SHIFT |
                       (uint32_t)(c & 0x7fu) << ML_CPU_F8_MAG_SHIFT;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ml_cpu_f8_to_f32(uint8_t c)
{
    return ml_cpu_f8_to_f32_unbiased(c) * ML_CPU_F8_REBIAS;
}

/* How far ahead of its step gemm_packed prefetches its strip. A strip is
 * one sequential stream, but with few activation rows the kernel consumes
 * it faster than the hardware prefetchers run ahead, and a load that
 * misses stalls every FMA chain: measured on a 2-vCPU AMD EPYC (AVX-512),
 * K 4096 x N 14336, 2 threads, 8 activation rows went from 200 to 370-415
 * GFLOP/s with 8 KiB ahead (4 KiB: 350, 1 KiB: 230). Past the strip's end
 * it reads the next strip's lines, which a later call wants anyway. Only
 * for the first row tile over a block: for the others it is in cache, and
 * prefetching in every tile evicts it (a 6432-row GEMM, K = N = 1280, ran
 * at 290-330 GFLOP/s against 370-400 before packing). */
#define ML_CPU_STRIP_PREFETCH_BYTES 8192
/* A cache line: a streamed strip is prefetched once a line, whatever the
 * bytes of its steps (an AVX-512 bf16 step is a line, an FP8 one half; an
 * AVX2 bf16 step half, an FP8 one a quarter). */
#define ML_CPU_LINE_BYTES 64
/* And how far ahead it prefetches the same lines into L1, a second time:
 * the L2 prefetch far ahead covers memory's latency, the L1 one near ahead
 * L2's, so that the kernel's own loads find their line in L1 whatever the
 * rows. Before, each line was prefetched once, 8 KiB ahead, into L1 with 1
 * to 3 rows and into L2 with 4 and more (on the AMD EPYC into L1 from 4
 * rows was slower: the prefetches held L1's few miss buffers while their
 * lines came from memory). Measured against that on the 2-vCPU Intel Xeon
 * VM (AVX-512, 2026-12-05), `small`'s lm_head (K 1024 x N 128256) read
 * from memory, 2 threads, best of 20 calls: 1 row 0.92-0.93x the time, 2
 * rows 0.92-0.96x, 3 rows 0.87-0.88x, 4 rows 0.90-0.92x, 8 rows
 * 0.92-1.01x, 16 rows unchanged; other distances were no better
 * (tests/bench/results-log.md, "Every streamed line into L2 and then L1"). */
#define ML_CPU_STRIP_PREFETCH_L1_BYTES 2048

/* A Linear's weights packed for gemm_packed (matmul.c, ml_cpu_linear_weight):
 * the output columns in strips of strip_cols (the last one padded with
 * zeros), each strip (K, strip_cols) row-major over k, so that one step
 * of the kernel is one contiguous load whatever the batch. bf16 strips
 * pair the columns c and c + strip_cols/2 in one dword (c in the low
 * half), so that a shift and a mask widen the dwords of a step into the
 * strip's two f32 vectors with no shuffle; F8_E4M3 strips keep the
 * columns in order, one byte each. The element index of column c at step
 * p of a strip: */
static inline size_t ml_cpu_packed_index(int strip_cols, int f8, int p, int c)
{
    const int half = strip_cols / 2;
    return (size_t)p * (size_t)strip_cols + (size_t)(f8 ? c : 2 * (c % half) + c / half);
}

/* The pair layout of the bf16-activation matmul (gemm_tile_bf16 and
 * gemm_tile_f8_pairs), for bf16 and F8_E4M3 alike: the strips of
 * ml_cpu_packed_index, each (K2 / 2, strip_cols) row-major over pairs of
 * steps, K2 = K rounded up to even (a zero step pads an odd K), every
 * column's steps 2q and 2q + 1 side by side (2q first: the low half of a
 * bf16 dword), columns in order: one step of the kernel is one contiguous
 * load of strip_cols pairs, VDPBF16PS's operand as it stands (bf16) or
 * once each code is widened (FP8). The element index of column c at step
 * p of a strip: */
static inline size_t ml_cpu_pair_index(int strip_cols, int p, int c)
{
    return ((size_t)(p / 2) * (size_t)strip_cols + (size_t)c) * 2 + (size_t)(p % 2);
}

/* FP8 codes in the pair layout (bf16 activations, or f32 ones on a CPU with
 * AVX512_VBMI: gemm_tile_f8_pairs, gemm_packed_f8_pairs): a pair step's
 * 2 · strip_cols codes of ml_cpu_pair_index, its first strip_cols (the
 * first half of the columns) and its last in runs of 8 that alternate
 * within each 16 bytes: byte i of a 16-byte lane L holds code 8L + i of the
 * first half, byte 8 + i code 8L + i of the second. The kernel widens a
 * code's low and high bf16 bytes by lookups and then interleaves them into
 * words with VPUNPCKLBW and VPUNPCKHBW, which work within 16-byte lanes:
 * on this order they give the two halves' words in column order, where
 * byte permutes across the vector (VPERMI2B, two uops on the Intel Xeon
 * VMs) made the widening compute bound (tests/bench/results-log.md). */
#define ML_CPU_F8_PAIR_RUN 8
static inline size_t ml_cpu_f8_pair_index(int strip_cols, int p, int c)
{
    const size_t code = (size_t)(2 * c + p % 2), half = code / (size_t)strip_cols;
    const size_t in_half = code % (size_t)strip_cols;
    const size_t place = in_half / ML_CPU_F8_PAIR_RUN * 2 * ML_CPU_F8_PAIR_RUN +
                         half * ML_CPU_F8_PAIR_RUN + in_half % ML_CPU_F8_PAIR_RUN;
    return (size_t)(p / 2) * 2 * (size_t)strip_cols + place;
}

/* The kernel table of an ISA (which the caller has checked is supported). */
const ml_cpu_kernels *ml_cpu_kernels_for(ml_cpu_isa isa);

#endif
