/* cuBLASLt on the host, for the HOST build of the CUDA backend: the subset of
 * the toolkit's cublasLt.h that kernels/ calls, with the documented semantics,
 * computed here so that a layout, leading-dimension, transpose, type or
 * epilogue mistake in kernels/ gives a wrong answer (or a refusal) in CI as
 * it would on a device.
 *
 * What it implements:
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
 * - a heuristic that always answers one algorithm (this one) unless the
 *   preference excludes it, cublasLtMatmulAlgoCheck, the algorithm's
 *   configuration (split-K 1, no reduction scheme: every preference's
 *   CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK admits it) and capabilities.
 * Anything else that changes the result (other epilogues, scale pointers,
 * other types and orders, pointer-array batches, split-K, ...) is refused
 * with CUBLAS_STATUS_NOT_SUPPORTED, never approximated.
 *
 * Numerics: each D element is one f32 sum of its k products in k order
 * (bf16 products are exact in f32), then alpha·sum, + beta·C, + bias, each
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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "host_bf16.h"
#include "host_stream.h"

/* The handle cublasLtCreate returns (cublasLtHandle_t is a pointer to it). */
struct cublasLtContext {
    uint32_t magic;
};

namespace {

/* Marks storage initialised by the matching *Init (or *Create). */
constexpr uint32_t HANDLE_MAGIC = 0x4c54484eu;
constexpr uint32_t LAYOUT_MAGIC = 0x4c54594cu;
constexpr uint32_t DESC_MAGIC = 0x4c544453u;
constexpr uint32_t PREF_MAGIC = 0x4c545046u;
constexpr uint32_t ALGO_MAGIC = 0x4c54414cu;
/* The one algorithm there is. */
constexpr int32_t HOST_ALGO_ID = 0;
/* cuBLASLt's default alignment promise for every operand. */
constexpr uint32_t DEFAULT_MIN_ALIGNMENT = 256;
/* "Usually only values that can be expressed as int32_t are supported." */
constexpr uint64_t MAX_DIM = INT32_MAX;
/* Unset BIAS_DATA_TYPE / EPILOGUE_AUX_DATA_TYPE: D's type. */
constexpr int32_t TYPE_OF_D = -1;
/* Output tiles of the host GEMM: D rows gathered per pass, D columns summed
 * together (independent accumulators the compiler can vectorise). */
constexpr int64_t TILE_ROWS = 64, TILE_COLS = 32;

/* ---- descriptor state, stored in the caller's opaque storage -------------- */

struct Layout {
    uint64_t rows, cols;
    int64_t ld, batch_stride, plane_offset;
    uint32_t type; /* cudaDataType */
    int32_t order; /* cublasLtOrder_t */
    int32_t batch_count;
    uint32_t batch_mode;
    uint32_t magic;
};

struct Desc {
    const void *bias_pointer, *a_scale_pointer, *b_scale_pointer, *c_scale_pointer,
        *d_scale_pointer;
    void *epilogue_aux_pointer, *amax_d_pointer, *epilogue_aux_scale_pointer,
        *epilogue_aux_amax_pointer, *d_out_scale_pointer;
    cublasLtEmulationDesc_t emulation_descriptor;
    int64_t bias_batch_stride, epilogue_aux_ld, epilogue_aux_batch_stride,
        alpha_vector_batch_stride;
    int32_t compute_type, scale_type, pointer_mode, transa, transb, transc, fill_mode;
    uint32_t epilogue;
    int32_t sm_count_target, epilogue_aux_data_type, bias_data_type;
    int32_t a_scale_mode, b_scale_mode, c_scale_mode, d_scale_mode, epilogue_aux_scale_mode,
        d_out_scale_mode;
    int8_t fast_accum;
    uint32_t magic;
};

struct Pref {
    uint64_t max_workspace_bytes, impl_mask;
    uint32_t search_mode, reduction_scheme_mask;
    uint32_t min_alignment_a, min_alignment_b, min_alignment_c, min_alignment_d;
    float max_waves_count;
    uint32_t magic;
};

/* The algorithm's configuration, and the operand alignment (bytes) it
 * relies on, in cublasLtMatmulAlgo_t. */
struct Algo {
    int32_t id;
    uint32_t tile_id, reduction_scheme, cta_swizzling, custom_option, stages_id;
    int32_t splitk_num;
    uint16_t inner_shape_id, cluster_shape_id;
    uint32_t align_a, align_b, align_c, align_d;
    uint32_t magic;
};

static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout storage");
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor storage");
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference storage");
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t), "algorithm storage");

/* The state lives in the opaque bytes; copied in and out (no aliasing). */
template <class State, class Opaque> State load(const Opaque *o)
{
    static_assert(std::is_trivially_copyable<State>::value, "state is plain bytes");
    State s;
    std::memcpy(&s, o, sizeof s);
    return s;
}
template <class State, class Opaque> void store(Opaque *o, const State &s)
{
    std::memcpy(o, &s, sizeof s);
}
/* *out = the state of o, if o is one that *Init set up. */
template <class State, class Opaque> bool valid(const Opaque *o, uint32_t magic, State *out)
{
    if (!o)
        return false;
    *out = load<State>(o);
    return out->magic == magic;
}

/* ---- attributes: one table per descriptor kind ------------------------------ */

struct Field {
    int attr;
    size_t offset, size;
};
#define MLK_FIELD(S, ATTR, member)                                                                 \
    {                                                                                              \
        ATTR, offsetof(S, member), sizeof(S::member)                                               \
    }

const Field LAYOUT_FIELDS[] = {
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_TYPE, type),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_ORDER, order),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_ROWS, rows),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_COLS, cols),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_LD, ld),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch_count),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, plane_offset),
    MLK_FIELD(Layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, batch_mode),
};

const Field DESC_FIELDS[] = {
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute_type),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale_type),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_TRANSA, transa),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_TRANSB, transb),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_TRANSC, transc),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_FILL_MODE, fill_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, epilogue_aux_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, epilogue_aux_ld),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, epilogue_aux_batch_stride),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, alpha_vector_batch_stride),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, sm_count_target),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, c_scale_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax_d_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, epilogue_aux_data_type),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, epilogue_aux_scale_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, epilogue_aux_amax_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_data_type),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_scale_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_scale_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_C_SCALE_MODE, c_scale_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_D_SCALE_MODE, d_scale_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, epilogue_aux_scale_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, d_out_scale_pointer),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, d_out_scale_mode),
    MLK_FIELD(Desc, CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, emulation_descriptor),
};

const Field PREF_FIELDS[] = {
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, search_mode),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace_bytes),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_scheme_mask),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, min_alignment_a),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, min_alignment_b),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, min_alignment_c),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, min_alignment_d),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, max_waves_count),
    MLK_FIELD(Pref, CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask),
};

/* CUBLASLT_ALGO_CONFIG_ID is read-only: set by cublasLtMatmulAlgoInit. */
const Field ALGO_FIELDS[] = {
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_ID, id),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_TILE_ID, tile_id),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, splitk_num),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, reduction_scheme),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, cta_swizzling),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, custom_option),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, stages_id),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, inner_shape_id),
    MLK_FIELD(Algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, cluster_shape_id),
};
#undef MLK_FIELD

template <size_t N> const Field *find_field(const Field (&fields)[N], int attr)
{
    for (const Field &f : fields)
        if (f.attr == attr)
            return &f;
    return nullptr;
}

/* *SetAttribute: the value must have the attribute's exact size. */
template <class State, class Opaque, size_t N>
cublasStatus_t set_attr(Opaque *o, uint32_t magic, const Field (&fields)[N], int attr,
                        const void *buf, size_t size)
{
    State s;
    if (!valid(o, magic, &s))
        return CUBLAS_STATUS_INVALID_VALUE;
    const Field *f = find_field(fields, attr);
    if (!f || !buf || size != f->size)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(reinterpret_cast<unsigned char *>(&s) + f->offset, buf, size);
    store(o, s);
    return CUBLAS_STATUS_SUCCESS;
}

/* *GetAttribute: size 0 asks for the size (in *written); otherwise the
 * buffer must have the attribute's exact size. */
cublasStatus_t get_bytes(const void *value, size_t value_size, void *buf, size_t size,
                         size_t *written)
{
    if (size == 0) {
        if (!written)
            return CUBLAS_STATUS_INVALID_VALUE;
        *written = value_size;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!buf || size != value_size)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, value, value_size);
    if (written)
        *written = value_size;
    return CUBLAS_STATUS_SUCCESS;
}

template <class State, class Opaque, size_t N>
cublasStatus_t get_attr(const Opaque *o, uint32_t magic, const Field (&fields)[N], int attr,
                        void *buf, size_t size, size_t *written)
{
    State s;
    if (!valid(o, magic, &s))
        return CUBLAS_STATUS_INVALID_VALUE;
    const Field *f = find_field(fields, attr);
    if (!f)
        return CUBLAS_STATUS_INVALID_VALUE;
    return get_bytes(reinterpret_cast<const unsigned char *>(&s) + f->offset, f->size, buf, size,
                     written);
}

/* ---- *Init defaults ------------------------------------------------------------- */

Layout layout_defaults(cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld)
{
    Layout l = {};
    l.rows = rows;
    l.cols = cols;
    l.ld = ld;
    l.type = (uint32_t)type;
    l.order = CUBLASLT_ORDER_COL;
    l.batch_count = 1;
    l.batch_mode = CUBLASLT_BATCH_MODE_STRIDED;
    l.magic = LAYOUT_MAGIC;
    return l;
}

Desc desc_defaults(cublasComputeType_t compute, cudaDataType_t scale)
{
    Desc d = {};
    d.compute_type = compute;
    d.scale_type = scale;
    d.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    d.transa = d.transb = d.transc = CUBLAS_OP_N;
    d.fill_mode = CUBLAS_FILL_MODE_FULL;
    d.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d.epilogue_aux_data_type = d.bias_data_type = TYPE_OF_D;
    d.magic = DESC_MAGIC;
    return d;
}

Pref pref_defaults()
{
    Pref p = {};
    p.search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p.reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    p.min_alignment_a = p.min_alignment_b = p.min_alignment_c = p.min_alignment_d =
        DEFAULT_MIN_ALIGNMENT;
    p.impl_mask = ~(uint64_t)0;
    p.magic = PREF_MAGIC;
    return p;
}

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
};

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

    /* bf16 x bf16 -> bf16 or f32, f32 x f32 -> f32; C is D's type. */
    const bool ab_bf16 = p->a.type == CUDA_R_16BF && p->b.type == CUDA_R_16BF;
    const bool ab_f32 = p->a.type == CUDA_R_32F && p->b.type == CUDA_R_32F;
    if ((!ab_bf16 && !ab_f32) || (ab_f32 && p->d.type != CUDA_R_32F) || p->c.type != p->d.type)
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
    return (p.a.type == CUDA_R_16BF
                ? CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                : CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F) |
           CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F;
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

/* Element (row, col) of batch `batch` of an operand with layout l. */
float load_elem(const Layout &l, const void *base, int64_t batch, int64_t row, int64_t col)
{
    const int64_t idx = batch * l.batch_stride +
                        (l.order == CUBLASLT_ORDER_ROW ? row * l.ld + col : row + col * l.ld);
    const unsigned char *p = static_cast<const unsigned char *>(base);
    if (l.type == CUDA_R_16BF) {
        uint16_t h;
        std::memcpy(&h, p + idx * (int64_t)sizeof h, sizeof h);
        return mlk_host_bf16_to_f32(h);
    }
    float f;
    std::memcpy(&f, p + idx * (int64_t)sizeof f, sizeof f);
    return f;
}

void store_elem(const Layout &l, void *base, int64_t batch, int64_t row, int64_t col, float v)
{
    const int64_t idx = batch * l.batch_stride +
                        (l.order == CUBLASLT_ORDER_ROW ? row * l.ld + col : row + col * l.ld);
    unsigned char *p = static_cast<unsigned char *>(base);
    if (l.type == CUDA_R_16BF) {
        const uint16_t h = mlk_host_f32_to_bf16(v);
        std::memcpy(p + idx * (int64_t)sizeof h, &h, sizeof h);
    } else {
        std::memcpy(p + idx * (int64_t)sizeof v, &v, sizeof v);
    }
}

float load_vec(uint32_t type, const void *base, int64_t i)
{
    const Layout flat = layout_defaults((cudaDataType)type, 1, 1, 1);
    return load_elem(flat, base, 0, 0, i);
}

struct Operands {
    const void *a, *b, *c, *bias;
    void *d;
};

/* D = alpha·op(A)·op(B) + beta·C (+ bias) for every batch (numerics: top of
 * file). op(A) rows and op(B) columns are gathered into f32 tiles first;
 * each D element still sums its products alone, in k order. */
void run(const Problem &p, const Operands &x, float alpha, float beta)
{
    const bool ta = p.desc.transa == CUBLAS_OP_T, tb = p.desc.transb == CUBLAS_OP_T;
    const bool bias = p.desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
    std::vector<float> at((size_t)(TILE_ROWS * p.k)), bt((size_t)(p.k * TILE_COLS));
    for (int64_t batch = 0; batch < p.batches; batch++)
        for (int64_t i0 = 0; i0 < p.m; i0 += TILE_ROWS) {
            const int64_t rows = std::min(TILE_ROWS, p.m - i0);
            for (int64_t ii = 0; ii < rows; ii++) /* at[ii][kk] = op(A)(i0 + ii, kk) */
                for (int64_t kk = 0; kk < p.k; kk++)
                    at[(size_t)(ii * p.k + kk)] = ta ? load_elem(p.a, x.a, batch, kk, i0 + ii)
                                                     : load_elem(p.a, x.a, batch, i0 + ii, kk);
            for (int64_t j0 = 0; j0 < p.n; j0 += TILE_COLS) {
                const int64_t cols = std::min(TILE_COLS, p.n - j0);
                for (int64_t kk = 0; kk < p.k; kk++) /* bt[kk][jj] = op(B)(kk, j0 + jj) */
                    for (int64_t jj = 0; jj < TILE_COLS; jj++)
                        bt[(size_t)(kk * TILE_COLS + jj)] =
                            jj >= cols ? 0.0f
                            : tb       ? load_elem(p.b, x.b, batch, j0 + jj, kk)
                                       : load_elem(p.b, x.b, batch, kk, j0 + jj);
                for (int64_t ii = 0; ii < rows; ii++) {
                    float acc[TILE_COLS] = {};
                    const float *arow = &at[(size_t)(ii * p.k)];
                    for (int64_t kk = 0; kk < p.k; kk++) {
                        const float av = arow[kk], *brow = &bt[(size_t)(kk * TILE_COLS)];
                        for (int64_t jj = 0; jj < TILE_COLS; jj++)
                            acc[jj] += av * brow[jj];
                    }
                    const int64_t i = i0 + ii;
                    const float bias_i =
                        bias ? load_vec(p.bias_type, x.bias, batch * p.desc.bias_batch_stride + i)
                             : 0.0f;
                    for (int64_t jj = 0; jj < cols; jj++) {
                        float v = alpha * acc[jj];
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

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new (std::nothrow) cublasLtContext{HANDLE_MAGIC};
    return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    if (!handle || handle->magic != HANDLE_MAGIC)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "the functionality requested is not supported (by the host emulation of cuBLASLt)";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    }
    return "unknown error";
}

/* ---- matrix layouts ---- */

cublasStatus_t cublasLtMatrixLayoutInit_internal(cublasLtMatrixLayout_t layout, size_t size,
                                                 cudaDataType type, uint64_t rows, uint64_t cols,
                                                 int64_t ld)
{
    if (!layout)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(Layout))
        return CUBLAS_STATUS_ALLOC_FAILED;
    store(layout, layout_defaults(type, rows, cols, ld));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!layout)
        return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new (std::nothrow) cublasLtMatrixLayoutOpaque_t;
    if (!*layout)
        return CUBLAS_STATUS_ALLOC_FAILED;
    return cublasLtMatrixLayoutInit(*layout, type, rows, cols, ld);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size)
{
    return set_attr<Layout>(layout, LAYOUT_MAGIC, LAYOUT_FIELDS, attr, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                size_t size, size_t *written)
{
    return get_attr<Layout>(layout, LAYOUT_MAGIC, LAYOUT_FIELDS, attr, buf, size, written);
}

/* ---- matmul descriptors ---- */

cublasStatus_t cublasLtMatmulDescInit_internal(cublasLtMatmulDesc_t desc, size_t size,
                                               cublasComputeType_t compute, cudaDataType_t scale)
{
    if (!desc)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(Desc))
        return CUBLAS_STATUS_ALLOC_FAILED;
    store(desc, desc_defaults(compute, scale));
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale)
{
    if (!desc)
        return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new (std::nothrow) cublasLtMatmulDescOpaque_t;
    if (!*desc)
        return CUBLAS_STATUS_ALLOC_FAILED;
    return cublasLtMatmulDescInit(*desc, compute, scale);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t size)
{
    return set_attr<Desc>(desc, DESC_MAGIC, DESC_FIELDS, attr, buf, size);
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t size, size_t *written)
{
    return get_attr<Desc>(desc, DESC_MAGIC, DESC_FIELDS, attr, buf, size, written);
}

/* ---- preferences ---- */

cublasStatus_t cublasLtMatmulPreferenceInit_internal(cublasLtMatmulPreference_t pref, size_t size)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (size < sizeof(Pref))
        return CUBLAS_STATUS_ALLOC_FAILED;
    store(pref, pref_defaults());
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t;
    if (!*pref)
        return CUBLAS_STATUS_ALLOC_FAILED;
    return cublasLtMatmulPreferenceInit(*pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size)
{
    return set_attr<Pref>(pref, PREF_MAGIC, PREF_FIELDS, attr, buf, size);
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void *buf, size_t size, size_t *written)
{
    return get_attr<Pref>(pref, PREF_MAGIC, PREF_FIELDS, attr, buf, size, written);
}

/* ---- algorithms ---- */

cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                               cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                               cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                               cublasLtMatmulPreference_t preference, int requested,
                               cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!handle || handle->magic != HANDLE_MAGIC)
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
    store(&results[0].algo, algo_with(usable_alignment(pref.min_alignment_a, p.a),
                                      usable_alignment(pref.min_alignment_b, p.b),
                                      usable_alignment(pref.min_alignment_c, p.c),
                                      usable_alignment(pref.min_alignment_d, p.d)));
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
    if (!handle || handle->magic != HANDLE_MAGIC)
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
    if (!handle || handle->magic != HANDLE_MAGIC)
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
    if (!handle || handle->magic != HANDLE_MAGIC)
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

cublasStatus_t cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                 cublasLtMatmulAlgoCapAttributes_t attr, void *buf,
                                                 size_t size, size_t *written)
{
    Algo a;
    if (!valid(algo, ALGO_MAGIC, &a))
        return CUBLAS_STATUS_INVALID_VALUE;
    int32_t i32 = 0;
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    switch (attr) {
    case CUBLASLT_ALGO_CAP_SPLITK_SUPPORT:
    case CUBLASLT_ALGO_CAP_UPLO_SUPPORT:
    case CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX:
    case CUBLASLT_ALGO_CAP_CUSTOM_MEMORY_ORDER:
    case CUBLASLT_ALGO_CAP_LD_NEGATIVE:
    case CUBLASLT_ALGO_CAP_POINTER_ARRAY_BATCH_SUPPORT:
    case CUBLASLT_ALGO_CAP_FLOATING_POINT_EMULATION_SUPPORT:
        return get_bytes(&i32, sizeof i32, buf, size, written);
    case CUBLASLT_ALGO_CAP_STRIDED_BATCH_SUPPORT:
    case CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT:
        i32 = 1;
        return get_bytes(&i32, sizeof i32, buf, size, written);
    case CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK: /* NONE only: no bit set */
    case CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT:
        return get_bytes(&u32, sizeof u32, buf, size, written);
    case CUBLASLT_ALGO_CAP_TILE_IDS:
        u32 = CUBLASLT_MATMUL_TILE_UNDEFINED;
        return get_bytes(&u32, sizeof u32, buf, size, written);
    case CUBLASLT_ALGO_CAP_STAGES_IDS:
        u32 = CUBLASLT_MATMUL_STAGES_UNDEFINED;
        return get_bytes(&u32, sizeof u32, buf, size, written);
    case CUBLASLT_ALGO_CAP_POINTER_MODE_MASK:
        u32 = CUBLASLT_POINTER_MODE_MASK_HOST | CUBLASLT_POINTER_MODE_MASK_DEVICE;
        return get_bytes(&u32, sizeof u32, buf, size, written);
    case CUBLASLT_ALGO_CAP_EPILOGUE_MASK:
        u32 = CUBLASLT_EPILOGUE_DEFAULT | CUBLASLT_EPILOGUE_BIAS;
        return get_bytes(&u32, sizeof u32, buf, size, written);
    case CUBLASLT_ALGO_CAP_NUMERICAL_IMPL_FLAGS:
        u64 = CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA |
              CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
              CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
        return get_bytes(&u64, sizeof u64, buf, size, written);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_A_BYTES:
        return get_bytes(&a.align_a, sizeof a.align_a, buf, size, written);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_B_BYTES:
        return get_bytes(&a.align_b, sizeof a.align_b, buf, size, written);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_C_BYTES:
        return get_bytes(&a.align_c, sizeof a.align_c, buf, size, written);
    case CUBLASLT_ALGO_CAP_MIN_ALIGNMENT_D_BYTES:
        return get_bytes(&a.align_d, sizeof a.align_d, buf, size, written);
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    const void *buf, size_t size)
{
    if (attr == CUBLASLT_ALGO_CONFIG_ID)
        return CUBLAS_STATUS_INVALID_VALUE;
    return set_attr<Algo>(algo, ALGO_MAGIC, ALGO_FIELDS, attr, buf, size);
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void *buf, size_t size, size_t *written)
{
    return get_attr<Algo>(algo, ALGO_MAGIC, ALGO_FIELDS, attr, buf, size, written);
}

/* ---- the product ---- */

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a_desc, const void *B,
                              cublasLtMatrixLayout_t b_desc, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c_desc, void *D, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t *algo, void * /* workspace: unused */,
                              size_t, cudaStream_t stream)
{
    if (!handle || handle->magic != HANDLE_MAGIC)
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
