/* cuBLASLt on the host, for the HOST build of the CUDA backend: the subset of
 * the toolkit's cublasLt.h that kernels/ calls, with the documented semantics,
 * computed here so that a layout, leading-dimension, transpose, type or
 * epilogue mistake in kernels/ gives a wrong answer (or a refusal) in CI as
 * it would on a device.
 *
 * What it implements (this file: the product and the algorithm;
 * cublaslt_host_desc.cpp: the handle and the descriptors):
 * - the handle; matrix layouts, matmul descriptors and preferences, in the
 *   caller's opaque storage (the *Init forms) or allocated (*Create /
 *   *Destroy), each storing every attribute the header defines, read back
 *   by the *GetAttribute functions;
 * - D = alpha·op(A)·op(B) + beta·C (+ bias[row] with CUBLASLT_EPILOGUE_BIAS),
 *   op = N or T; column-major unless CUBLASLT_MATRIX_LAYOUT_ORDER is ROW;
 *   leading dimensions; strided batches (bias batch stride too); A and B
 *   both bf16 (C and D f32 or bf16) or all f32; CUBLAS_COMPUTE_32F with f32
 *   scale; alpha and beta by host pointer (read at the call) or by device
 *   pointer (read when the work runs). beta == 0 reads no C (C may be NaN).
 * - FP8: A and B both CUDA_R_8F_E4M3 (C = D f32 or bf16, no bias epilogue
 *   and no scale pointers here: the scales default to 1), under the
 *   requirements cublasLtMatmul documents for FP8 kernels: the TN form
 *   (A transposed, B not), and the Tensor Core usage rules, i.e. k (the
 *   leading extent of A and B), m·sizeof(D) and every leading dimension a
 *   multiple of 16 bytes, and 16-byte aligned pointers (an algorithm is
 *   only found for a 16-byte alignment promise). Violations are
 *   CUBLAS_STATUS_NOT_SUPPORTED, as a device's missing algorithm is.
 * - a heuristic that always answers one algorithm (this one) unless the
 *   preference excludes it, cublasLtMatmulAlgoCheck, the algorithm's
 *   configuration (split-K 1, no reduction scheme: every preference's
 *   CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK admits it) and capabilities.
 * Anything else that changes the result (other epilogues, scale pointers,
 * other types and orders, pointer-array batches, split-K, ...) is refused
 * with CUBLAS_STATUS_NOT_SUPPORTED, never approximated.
 *
 * Numerics: each D element is one f32 sum of its k products in k order
 * (bf16 and E4M3 products are exact in f32), then alpha·sum, + beta·C, + bias, each
 * rounded to f32, then rounded to D's type (bf16: to nearest even). A GPU's
 * kernels sum in another, tile-dependent order: results agree to f32
 * summation error, not bit for bit, and the algorithm choice (hence split-K
 * and batch dependence) is not emulated at all.
 *
 * Alignment: the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES are
 * promises about the pointers later passed to cublasLtMatmul. The algorithm
 * the heuristic returns relies on them (on the promise, capped by what the
 * layouts' leading dimensions and batch strides allow), and cublasLtMatmul
 * refuses (CUBLAS_STATUS_INVALID_VALUE) a pointer that breaks it: a plan
 * reused for a less aligned operand shows here, not only on some device.
 *
 * Asynchrony: cublasLtMatmul validates everything at the call, then queues
 * the computation with mlk_host_stream_enqueue, with copies of the
 * descriptors (and, host pointer mode, of alpha and beta), so a captured
 * graph replays the call as it was made. The workspace is not used.
 *
 * Thread safety: as cuBLASLt's, a handle and descriptors serve one thread at
 * a time; distinct ones are independent. */
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cublaslt_host.h"
#include "host_bf16.h"
#include "host_stream.h"

using namespace mlk_lt;

namespace {

/* The one algorithm there is. */
constexpr int32_t HOST_ALGO_ID = 0;
/* "Usually only values that can be expressed as int32_t are supported." */
constexpr uint64_t MAX_DIM = INT32_MAX;
/* FP8 kernels: leading dimensions, the k extent, m·sizeof(D) and pointers
 * in multiples of this many bytes ("Tensor Core usage"). */
constexpr uint32_t FP8_ALIGN = 16;

/* The algorithm with its default configuration, relying on the given
 * operand alignments. */
Algo algo_with(uint32_t align_a, uint32_t align_b, uint32_t align_c, uint32_t align_d)
{
    Algo a = {};
    a.id = HOST_ALGO_ID;
    a.tile_id = CUBLASLT_MATMUL_TILE_UNDEFINED;
    a.reduction_scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    a.stages_id = CUBLASLT_MATMUL_STAGES_UNDEFINED;
    a.splitk_num = 1;
    a.align_a = align_a;
    a.align_b = align_b;
    a.align_c = align_c;
    a.align_d = align_d;
    a.magic = ALGO_MAGIC;
    return a;
}

/* ---- the problem: validated descriptors ---------------------------------------- */

size_t type_size(uint32_t type)
{
    switch (type) {
    case CUDA_R_8F_E4M3: return sizeof(uint8_t);
    case CUDA_R_16BF: return sizeof(uint16_t);
    case CUDA_R_32F: return sizeof(float);
    default: return 0;
    }
}

/* What a D = alpha·op(A)·op(B) + beta·C call computes, validated. */
struct Problem {
    Desc desc;
    Layout a, b, c, d;
    int64_t m, n, k, batches;
    uint32_t bias_type;
    bool fp8; /* A and B E4M3 */
};

/* An E4M3 (float8_e4m3fn) code's exact value; 0x7f and 0xff are NaN. */
float e4m3_to_f32(uint8_t c)
{
    const int e = (c >> 3) & 0xf, m = c & 0x7;
    float v;
    if (e == 0xf && m == 0x7)
        v = NAN;
    else if (e == 0)
        v = std::ldexp((float)m, -9);
    else
        v = std::ldexp((float)(8 + m), e - 10);
    return (c & 0x80) ? -v : v;
}

/* The FP8 kernels' layout rules (top of file), for problem p. */
bool fp8_layouts_ok(const Problem &p)
{
    const Layout *ls[] = {&p.a, &p.b, &p.c, &p.d};
    for (const Layout *l : ls)
        if (((uint64_t)l->ld * type_size(l->type)) % FP8_ALIGN != 0)
            return false;
    return p.desc.transa == CUBLAS_OP_T && p.desc.transb == CUBLAS_OP_N &&
           (uint64_t)p.k % FP8_ALIGN == 0 && ((uint64_t)p.m * type_size(p.d.type)) % FP8_ALIGN == 0;
}

cublasStatus_t check_layout(const Layout &l)
{
    if (type_size(l.type) == 0 ||
        (l.order != CUBLASLT_ORDER_COL && l.order != CUBLASLT_ORDER_ROW) ||
        l.batch_mode != CUBLASLT_BATCH_MODE_STRIDED || l.plane_offset != 0 || l.rows == 0 ||
        l.cols == 0 || l.rows > MAX_DIM || l.cols > MAX_DIM)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* Columns (COL) or rows (ROW) must not overlap. */
    const uint64_t min_ld = l.order == CUBLASLT_ORDER_COL ? l.rows : l.cols;
    if (l.ld < 0 || (uint64_t)l.ld < min_ld || l.batch_count < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

/* Everything of the descriptor that is not at its default must be
 * something this emulation computes. */
cublasStatus_t check_desc(const Desc &d)
{
    const bool transposes_ok = (d.transa == CUBLAS_OP_N || d.transa == CUBLAS_OP_T) &&
                               (d.transb == CUBLAS_OP_N || d.transb == CUBLAS_OP_T) &&
                               d.transc == CUBLAS_OP_N;
    const bool pointer_mode_ok = d.pointer_mode == CUBLASLT_POINTER_MODE_HOST ||
                                 d.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
    const bool epilogue_ok =
        d.epilogue == CUBLASLT_EPILOGUE_DEFAULT || d.epilogue == CUBLASLT_EPILOGUE_BIAS;
    const bool no_scaling = !d.a_scale_pointer && !d.b_scale_pointer && !d.c_scale_pointer &&
                            !d.d_scale_pointer && !d.amax_d_pointer && !d.d_out_scale_pointer &&
                            !d.a_scale_mode && !d.b_scale_mode && !d.c_scale_mode &&
                            !d.d_scale_mode && !d.d_out_scale_mode;
    const bool no_aux = !d.epilogue_aux_pointer && !d.epilogue_aux_scale_pointer &&
                        !d.epilogue_aux_amax_pointer && !d.epilogue_aux_scale_mode;
    if (d.compute_type != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F || !transposes_ok ||
        !pointer_mode_ok || d.fill_mode != CUBLAS_FILL_MODE_FULL || !epilogue_ok || !no_scaling ||
        !no_aux || d.fast_accum || d.emulation_descriptor)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t make_problem(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a_desc,
                            cublasLtMatrixLayout_t b_desc, cublasLtMatrixLayout_t c_desc,
                            cublasLtMatrixLayout_t d_desc, Problem *p)
{
    if (!valid(op, DESC_MAGIC, &p->desc) || !valid(a_desc, LAYOUT_MAGIC, &p->a) ||
        !valid(b_desc, LAYOUT_MAGIC, &p->b) || !valid(c_desc, LAYOUT_MAGIC, &p->c) ||
        !valid(d_desc, LAYOUT_MAGIC, &p->d))
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = check_desc(p->desc);
    const Layout *layouts[] = {&p->a, &p->b, &p->c, &p->d};
    for (const Layout *l : layouts)
        if (st == CUBLAS_STATUS_SUCCESS)
            st = check_layout(*l);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;

    /* bf16 x bf16 or E4M3 x E4M3 -> bf16 or f32, f32 x f32 -> f32; C is
     * D's type. */
    const bool ab_bf16 = p->a.type == CUDA_R_16BF && p->b.type == CUDA_R_16BF;
    const bool ab_f32 = p->a.type == CUDA_R_32F && p->b.type == CUDA_R_32F;
    p->fp8 = p->a.type == CUDA_R_8F_E4M3 && p->b.type == CUDA_R_8F_E4M3;
    if ((!ab_bf16 && !ab_f32 && !p->fp8) || (ab_f32 && p->d.type != CUDA_R_32F) ||
        p->c.type != p->d.type || (p->fp8 && p->desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->bias_type =
        p->desc.bias_data_type == TYPE_OF_D ? p->d.type : (uint32_t)p->desc.bias_data_type;
    if (p->desc.epilogue == CUBLASLT_EPILOGUE_BIAS && p->bias_type != p->d.type)
        return CUBLAS_STATUS_NOT_SUPPORTED;

    /* op(A) is m x k, op(B) k x n, C and D m x n. */
    const bool ta = p->desc.transa == CUBLAS_OP_T, tb = p->desc.transb == CUBLAS_OP_T;
    p->m = (int64_t)(ta ? p->a.cols : p->a.rows);
    p->k = (int64_t)(ta ? p->a.rows : p->a.cols);
    p->n = (int64_t)(tb ? p->b.rows : p->b.cols);
    const int64_t kb = (int64_t)(tb ? p->b.cols : p->b.rows);
    if (kb != p->k || (int64_t)p->d.rows != p->m || (int64_t)p->d.cols != p->n ||
        p->c.rows != p->d.rows || p->c.cols != p->d.cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* One batch count for all four (no broadcasting of a single matrix). */
    if (p->a.batch_count != p->d.batch_count || p->b.batch_count != p->d.batch_count ||
        p->c.batch_count != p->d.batch_count)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->batches = p->d.batch_count;
    if (p->fp8 && !fp8_layouts_ok(*p))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

/* The largest power of two dividing v (bytes), at most cap; cap when v is 0. */
uint32_t pow2_dividing(uint64_t v, uint32_t cap)
{
    uint32_t a = 1;
    while (a < cap && v % (2 * (uint64_t)a) == 0)
        a *= 2;
    return a;
}

/* The alignment an algorithm may rely on for an operand: the promise, as far
 * as the layout's leading dimension and batch stride keep it for every
 * column (row) and batch. */
uint32_t usable_alignment(uint32_t promised, const Layout &l)
{
    const uint64_t es = type_size(l.type);
    uint32_t a = pow2_dividing((uint64_t)l.ld * es, std::max(promised, 1u));
    if (l.batch_count > 1)
        a = std::min(
            a, pow2_dividing((uint64_t)(l.batch_stride < 0 ? -l.batch_stride : l.batch_stride) * es,
                             a));
    return std::min(a, std::max(promised, 1u));
}

/* The preference filters an algorithm by its numerics and utilisation. */
uint64_t impl_flags(const Problem &p)
{
    const uint64_t input = p.fp8 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA |
                                       CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3
                           : p.a.type == CUDA_R_16BF
                               ? CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA |
                                     CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                               : CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA |
                                     CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
    return input | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F;
}
/* "wavesCount 1.0 suggests the kernel fully occupies the GPU". */
constexpr float HOST_WAVES = 1.0f;

/* The configuration must be one this emulation computes: no split-K. */
cublasStatus_t check_algo(const cublasLtMatmulAlgo_t *algo, Algo *out)
{
    if (!valid(algo, ALGO_MAGIC, out) || out->id != HOST_ALGO_ID)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (out->splitk_num != 1 || out->reduction_scheme != CUBLASLT_REDUCTION_SCHEME_NONE)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

void fill_result(cublasLtMatmulHeuristicResult_t *r)
{
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = HOST_WAVES;
    std::memset(r->reserved, 0, sizeof r->reserved);
}

/* ---- the computation -------------------------------------------------------------- */

/* Element idx of an array of `type` (E4M3, bf16 or f32), widened to f32. */
float load_at(uint32_t type, const void *base, int64_t idx)
{
    const unsigned char *p = static_cast<const unsigned char *>(base);
    if (type == CUDA_R_8F_E4M3)
        return e4m3_to_f32(p[idx]);
    if (type == CUDA_R_16BF) {
        uint16_t h;
        std::memcpy(&h, p + idx * (int64_t)sizeof h, sizeof h);
        return mlk_host_bf16_to_f32(h);
    }
    float f;
    std::memcpy(&f, p + idx * (int64_t)sizeof f, sizeof f);
    return f;
}

/* Where element (row, col) of batch `batch` lies, in elements. */
int64_t elem_index(const Layout &l, int64_t batch, int64_t row, int64_t col)
{
    return batch * l.batch_stride +
           (l.order == CUBLASLT_ORDER_ROW ? row * l.ld + col : row + col * l.ld);
}

float load_elem(const Layout &l, const void *base, int64_t batch, int64_t row, int64_t col)
{
    return load_at(l.type, base, elem_index(l, batch, row, col));
}

/* n elements from (row, col) on, along the row or (down) the column. */
void load_line(const Layout &l, const void *base, int64_t batch, int64_t row, int64_t col,
               bool down, int64_t n, float *out)
{
    const int64_t first = elem_index(l, batch, row, col);
    const int64_t step = (l.order == CUBLASLT_ORDER_ROW) == down ? l.ld : 1;
    for (int64_t e = 0; e < n; e++)
        out[e] = load_at(l.type, base, first + e * step);
}

/* Rounded to the layout's type (bf16: to nearest even). */
void store_elem(const Layout &l, void *base, int64_t batch, int64_t row, int64_t col, float v)
{
    unsigned char *p = static_cast<unsigned char *>(base) +
                       elem_index(l, batch, row, col) * (int64_t)type_size(l.type);
    if (l.type == CUDA_R_16BF) {
        const uint16_t h = mlk_host_f32_to_bf16(v);
        std::memcpy(p, &h, sizeof h);
    } else {
        std::memcpy(p, &v, sizeof v);
    }
}

struct Operands {
    const void *a, *b, *c, *bias;
    void *d;
};

/* D = alpha·op(A)·op(B) + beta·C (+ bias) for every batch (numerics: top of
 * file). op(A) rows and op(B) columns are gathered into f32 tiles first,
 * then summed by tile_sums (cublaslt_host_sums.cpp). */
void run(const Problem &p, const Operands &x, float alpha, float beta)
{
    const bool ta = p.desc.transa == CUBLAS_OP_T, tb = p.desc.transb == CUBLAS_OP_T;
    const bool bias = p.desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
    std::vector<float> at((size_t)(TILE_ROWS * p.k)), bt((size_t)(p.k * TILE_COLS)),
        sums((size_t)(TILE_ROWS * TILE_COLS));
    for (int64_t batch = 0; batch < p.batches; batch++)
        for (int64_t i0 = 0; i0 < p.m; i0 += TILE_ROWS) {
            const int64_t rows = std::min(TILE_ROWS, p.m - i0);
            for (int64_t ii = 0; ii < rows; ii++) /* at[ii][kk] = op(A)(i0 + ii, kk) */
                load_line(p.a, x.a, batch, ta ? 0 : i0 + ii, ta ? i0 + ii : 0, ta, p.k,
                          &at[(size_t)(ii * p.k)]);
            for (int64_t j0 = 0; j0 < p.n; j0 += TILE_COLS) {
                const int64_t cols = std::min(TILE_COLS, p.n - j0);
                for (int64_t kk = 0; kk < p.k; kk++) { /* bt[kk][jj] = op(B)(kk, j0 + jj) */
                    float *line = &bt[(size_t)(kk * TILE_COLS)];
                    load_line(p.b, x.b, batch, tb ? j0 : kk, tb ? kk : j0, tb, cols, line);
                    std::fill(line + cols, line + TILE_COLS, 0.0f);
                }
                tile_sums(at.data(), bt.data(), p.k, rows, sums.data());
                for (int64_t ii = 0; ii < rows; ii++) {
                    const int64_t i = i0 + ii;
                    const float bias_i =
                        bias ? load_at(p.bias_type, x.bias, batch * p.desc.bias_batch_stride + i)
                             : 0.0f;
                    for (int64_t jj = 0; jj < cols; jj++) {
                        float v = alpha * sums[(size_t)(ii * TILE_COLS + jj)];
                        if (beta != 0.0f)
                            v += beta * load_elem(p.c, x.c, batch, i, j0 + jj);
                        if (bias)
                            v += bias_i;
                        store_elem(p.d, x.d, batch, i, j0 + jj, v);
                    }
                }
            }
        }
}

bool aligned_to(const void *ptr, uint32_t align)
{
    return align <= 1 || (uintptr_t)ptr % align == 0;
}

/* The operand keeps the alignment the algorithm relies on. */
bool keeps(const void *ptr, const Layout &l, uint32_t align)
{
    return aligned_to(ptr, align) && usable_alignment(align, l) == align;
}

} // namespace

/* ---- the API ------------------------------------------------------------------------ */

extern "C" {

/* ---- algorithms ---- */

cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                               cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                               cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                               cublasLtMatmulPreference_t preference, int requested,
                               cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!handle_ok(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    Pref pref;
    if (requested <= 0 || !results || !returned || !valid(preference, PREF_MAGIC, &pref))
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    Problem p;
    const cublasStatus_t st = make_problem(op, a_desc, b_desc, c_desc, d_desc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (pref.search_mode != CUBLASLT_SEARCH_BEST_FIT)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* Excluded by the preference: no algorithm at all. */
    if ((impl_flags(p) & ~pref.impl_mask) != 0 ||
        (pref.max_waves_count > 0.0f && pref.max_waves_count < HOST_WAVES))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const Algo found = algo_with(usable_alignment(pref.min_alignment_a, p.a),
                                 usable_alignment(pref.min_alignment_b, p.b),
                                 usable_alignment(pref.min_alignment_c, p.c),
                                 usable_alignment(pref.min_alignment_d, p.d));
    if (p.fp8 && std::min({found.align_a, found.align_b, found.align_c, found.align_d}) <
                     FP8_ALIGN)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    store(&results[0].algo, found);
    fill_result(&results[0]);
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* The one algorithm serves every type combination make_problem accepts. */
cublasStatus_t cublasLtMatmulAlgoGetIds(cublasLtHandle_t handle, cublasComputeType_t,
                                        cudaDataType_t, cudaDataType_t, cudaDataType_t,
                                        cudaDataType_t, cudaDataType_t, int requested, int ids[],
                                        int *returned)
{
    if (!handle_ok(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requested <= 0 || !ids || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    ids[0] = HOST_ALGO_ID;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoInit(cublasLtHandle_t handle, cublasComputeType_t, cudaDataType_t,
                                      cudaDataType_t a_type, cudaDataType_t b_type,
                                      cudaDataType_t c_type, cudaDataType_t d_type, int id,
                                      cublasLtMatmulAlgo_t *algo)
{
    if (!handle_ok(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!algo || id != HOST_ALGO_ID)
        return CUBLAS_STATUS_INVALID_VALUE;
    const size_t sa = type_size(a_type), sb = type_size(b_type), sc = type_size(c_type),
                 sd = type_size(d_type);
    if (!sa || !sb || !sc || !sd)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* Initialised without a preference: it relies on element alignment only. */
    store(algo, algo_with((uint32_t)sa, (uint32_t)sb, (uint32_t)sc, (uint32_t)sd));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                       cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                       cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                       const cublasLtMatmulAlgo_t *algo,
                                       cublasLtMatmulHeuristicResult_t *result)
{
    if (!handle_ok(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!result)
        return CUBLAS_STATUS_INVALID_VALUE;
    Problem p;
    Algo a;
    cublasStatus_t st = make_problem(op, a_desc, b_desc, c_desc, d_desc, &p);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = check_algo(algo, &a);
    /* The layouts must keep what the algorithm relies on. */
    if (st == CUBLAS_STATUS_SUCCESS && (usable_alignment(a.align_a, p.a) != a.align_a ||
                                        usable_alignment(a.align_b, p.b) != a.align_b ||
                                        usable_alignment(a.align_c, p.c) != a.align_c ||
                                        usable_alignment(a.align_d, p.d) != a.align_d))
        st = CUBLAS_STATUS_INVALID_VALUE;
    if (st == CUBLAS_STATUS_SUCCESS)
        fill_result(result); /* result->algo is never written, as documented */
    return st;
}

/* ---- the product ---- */

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a_desc, const void *B,
                              cublasLtMatrixLayout_t b_desc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c_desc, void *D, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t *algo, void * /* workspace: unused */,
                              size_t, cudaStream_t stream)
{
    if (!handle_ok(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    Problem p;
    cublasStatus_t st = make_problem(op, a_desc, b_desc, c_desc, d_desc, &p);
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    /* Without an algorithm cuBLASLt chooses one itself, promised nothing. */
    Algo a = algo_with((uint32_t)type_size(p.a.type), (uint32_t)type_size(p.b.type),
                       (uint32_t)type_size(p.c.type), (uint32_t)type_size(p.d.type));
    if (algo && (st = check_algo(algo, &a)) != CUBLAS_STATUS_SUCCESS)
        return st;

    const bool host_scalars = p.desc.pointer_mode == CUBLASLT_POINTER_MODE_HOST;
    if (!alpha || !beta || !A || !B || !D)
        return CUBLAS_STATUS_INVALID_VALUE;
    /* beta == 0 reads no C; with device scalars beta is not known yet. */
    float alpha_v = 0.0f, beta_v = 0.0f;
    if (host_scalars) {
        std::memcpy(&alpha_v, alpha, sizeof alpha_v);
        std::memcpy(&beta_v, beta, sizeof beta_v);
    }
    const bool reads_c = !host_scalars || beta_v != 0.0f;
    if ((reads_c && !C) || (p.desc.epilogue == CUBLASLT_EPILOGUE_BIAS && !p.desc.bias_pointer))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* In place (C == D) needs one layout for both. */
    if (C == D && (p.c.order != p.d.order || p.c.ld != p.d.ld ||
                   (p.batches > 1 && p.c.batch_stride != p.d.batch_stride)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!keeps(A, p.a, a.align_a) || !keeps(B, p.b, a.align_b) ||
        (reads_c && !keeps(C, p.c, a.align_c)) || !keeps(D, p.d, a.align_d))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (p.fp8 && (!aligned_to(A, FP8_ALIGN) || !aligned_to(B, FP8_ALIGN) ||
                  (reads_c && !aligned_to(C, FP8_ALIGN)) || !aligned_to(D, FP8_ALIGN)))
        return CUBLAS_STATUS_NOT_SUPPORTED;

    const Operands x = {A, B, C, p.desc.bias_pointer, D};
    if (host_scalars) {
        mlk_host_stream_enqueue(stream, [p, x, alpha_v, beta_v] { run(p, x, alpha_v, beta_v); });
    } else {
        const float *alpha_d = static_cast<const float *>(alpha);
        const float *beta_d = static_cast<const float *>(beta);
        mlk_host_stream_enqueue(stream, [p, x, alpha_d, beta_d] { run(p, x, *alpha_d, *beta_d); });
    }
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
