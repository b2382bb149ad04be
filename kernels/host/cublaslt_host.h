/* Internals of the host cuBLASLt (cublaslt_host.cpp: the product and the
 * algorithm; cublaslt_host_desc.cpp: the handle and the descriptors;
 * cublaslt_host_sums.cpp: the tile product): the state each opaque
 * descriptor holds, and the tile product. Included by those files only. */
#ifndef MLK_CUBLASLT_HOST_H
#define MLK_CUBLASLT_HOST_H

#include <cublasLt.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

/* The handle cublasLtCreate returns (cublasLtHandle_t is a pointer to it). */
struct cublasLtContext {
    uint32_t magic;
};

namespace mlk_lt {

/* Marks storage initialised by the matching *Init (or *Create). */
constexpr uint32_t HANDLE_MAGIC = 0x4c54484eu;
constexpr uint32_t LAYOUT_MAGIC = 0x4c54594cu;
constexpr uint32_t DESC_MAGIC = 0x4c544453u;
constexpr uint32_t PREF_MAGIC = 0x4c545046u;
constexpr uint32_t ALGO_MAGIC = 0x4c54414cu;
/* Unset BIAS_DATA_TYPE / EPILOGUE_AUX_DATA_TYPE: D's type. */
constexpr int32_t TYPE_OF_D = -1;

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

/* h is a handle cublasLtCreate returned and cublasLtDestroy did not end. */
inline bool handle_ok(cublasLtHandle_t h)
{
    return h && h->magic == HANDLE_MAGIC;
}

/* ---- the product (cublaslt_host_sums.cpp) --------------------------------- */

/* The host GEMM's output tiles: D rows gathered per pass, D columns summed
 * together. */
constexpr int64_t TILE_ROWS = 64, TILE_COLS = 32;

/* sums[ii][jj] = the f32 sum of at[ii][kk]·bt[kk][jj] over kk in k order,
 * each product rounded before it is added (cublaslt_host.cpp's numerics),
 * for the first `rows` rows of an A tile (TILE_ROWS x k, row-major) against
 * a B tile (k x TILE_COLS); sums is TILE_ROWS x TILE_COLS. Rows are summed
 * in whole blocks, so a few rows past `rows` may be too, from whatever the
 * A tile holds there: their sums are not the caller's. */
void tile_sums(const float *at, const float *bt, int64_t k, int64_t rows, float *sums);

} // namespace mlk_lt

#endif
