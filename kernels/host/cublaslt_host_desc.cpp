/* The host cuBLASLt's handle and descriptors (cublaslt_host.cpp has the
 * contract): matrix layouts, matmul descriptors, preferences and the
 * algorithm's configuration, each storing every attribute cublasLt.h
 * defines for it, with the exact size it documents, in the caller's opaque
 * storage (*Init) or an allocated one (*Create / *Destroy). */
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "cublaslt_host.h"

using namespace mlk_lt;

namespace {

/* cuBLASLt's default alignment promise for every operand. */
constexpr uint32_t DEFAULT_MIN_ALIGNMENT = 256;

/* ---- attributes: one table per descriptor kind ------------------------------ */

struct Field {
    int attr;
    size_t offset, size;
};
#define MLK_FIELD(S, ATTR, member) {ATTR, offsetof(S, member), sizeof(S::member)}

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

} // namespace

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
    if (!handle_ok(handle))
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

} // extern "C"
