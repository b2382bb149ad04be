/* kernels/host/cublaslt_host*.cpp: the host cuBLASLt's API contract: every
 * attribute stored with the size cublasLt.h documents and read back, the
 * documented defaults; what is not implemented refused (NOT_SUPPORTED) and
 * what is inconsistent refused (INVALID_VALUE), with nothing queued; work
 * queued on the stream with the call's values, so a recording replays the
 * call as made. Needs no GPU. (What it computes: test_cublaslt_host.cpp.) */
#include <cstring>
#include <initializer_list>

#include "cublaslt_host_util.h"

namespace {

/* ---- attributes ----------------------------------------------------------------- */

/* Each attribute with the size cublasLt.h documents for it: set to a
 * distinctive value and read back; a wrong size is refused; size 0 asks. */
struct AttrCase {
    int attr;
    size_t size;
};

template <class SetFn, class GetFn>
void round_trip(const char *what, const AttrCase *cases, size_t n, SetFn set, GetFn get)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char in[8], out[8] = {}, wrong[9] = {};
        for (size_t b = 0; b < cases[i].size; b++)
            in[b] = (unsigned char)(0x11 * (b + 1) + i);
        size_t written = 0, asked = 0;
        bad += set(cases[i].attr, in, cases[i].size) != CUBLAS_STATUS_SUCCESS;
        bad += get(cases[i].attr, out, cases[i].size, &written) != CUBLAS_STATUS_SUCCESS ||
               written != cases[i].size || std::memcmp(in, out, cases[i].size) != 0;
        bad += get(cases[i].attr, nullptr, 0, &asked) != CUBLAS_STATUS_SUCCESS ||
               asked != cases[i].size;
        bad += set(cases[i].attr, wrong, cases[i].size + 1) != CUBLAS_STATUS_INVALID_VALUE;
        if (bad)
            fprintf(stderr, "  %s attribute %d failed\n", what, cases[i].attr);
    }
    check(bad == 0, "%s attributes: %d failures", what, bad);
}

void test_attributes(void)
{
    const size_t I32 = 4, U32 = 4, U64 = 8, I64 = 8, PTR = sizeof(void *), I8 = 1, F32 = 4, U16 = 2;
    const AttrCase layout_attrs[] = {{CUBLASLT_MATRIX_LAYOUT_TYPE, U32},
                                     {CUBLASLT_MATRIX_LAYOUT_ORDER, I32},
                                     {CUBLASLT_MATRIX_LAYOUT_ROWS, U64},
                                     {CUBLASLT_MATRIX_LAYOUT_COLS, U64},
                                     {CUBLASLT_MATRIX_LAYOUT_LD, I64},
                                     {CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, I32},
                                     {CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, I64},
                                     {CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, I64},
                                     {CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, U32}};
    const AttrCase desc_attrs[] = {{CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, I32},
                                   {CUBLASLT_MATMUL_DESC_SCALE_TYPE, I32},
                                   {CUBLASLT_MATMUL_DESC_POINTER_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_TRANSA, I32},
                                   {CUBLASLT_MATMUL_DESC_TRANSB, I32},
                                   {CUBLASLT_MATMUL_DESC_TRANSC, I32},
                                   {CUBLASLT_MATMUL_DESC_FILL_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE, U32},
                                   {CUBLASLT_MATMUL_DESC_BIAS_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, I64},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, I64},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, I64},
                                   {CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE, I64},
                                   {CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, I32},
                                   {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, I32},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_FAST_ACCUM, I8},
                                   {CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, I32},
                                   {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_C_SCALE_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_D_SCALE_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER, PTR},
                                   {CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, I32},
                                   {CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, PTR}};
    const AttrCase pref_attrs[] = {{CUBLASLT_MATMUL_PREF_SEARCH_MODE, U32},
                                   {CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, U64},
                                   {CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, U32},
                                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, U32},
                                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, U32},
                                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, U32},
                                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, U32},
                                   {CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, F32},
                                   {CUBLASLT_MATMUL_PREF_IMPL_MASK, U64}};
    const AttrCase algo_attrs[] = {
        {CUBLASLT_ALGO_CONFIG_TILE_ID, U32},          {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, I32},
        {CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, U32}, {CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, U32},
        {CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, U32},    {CUBLASLT_ALGO_CONFIG_STAGES_ID, U32},
        {CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, U16},   {CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, U16}};

    cublasLtMatrixLayout_t layout = nullptr;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulAlgo_t algo;
    check(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 4, 5, 6) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
                  CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulAlgoInit(g_lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF,
                                     CUDA_R_32F, CUDA_R_32F, 0, &algo) == CUBLAS_STATUS_SUCCESS,
          "create descriptors");

    /* Defaults as documented. */
    int32_t order = -1, batch = -1, trans = -1, id = -1, splits = -1;
    uint32_t epilogue = 0, mask = 0, align = 0, scheme = 99;
    uint64_t rows = 0;
    int64_t ld = 0;
    size_t w = 0;
    cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order,
                                     &w);
    cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                     sizeof batch, &w);
    cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, &w);
    cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld, &w);
    cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans, sizeof trans, &w);
    cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue,
                                   &w);
    cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                         sizeof mask, &w);
    cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align,
                                         sizeof align, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                         sizeof splits, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                         sizeof scheme, &w);
    check(order == CUBLASLT_ORDER_COL && batch == 1 && rows == 4 && ld == 6 &&
              trans == CUBLAS_OP_N && epilogue == CUBLASLT_EPILOGUE_DEFAULT &&
              mask == CUBLASLT_REDUCTION_SCHEME_MASK && align == 256 && id == 0 && splits == 1 &&
              scheme == CUBLASLT_REDUCTION_SCHEME_NONE,
          "documented defaults");
    uint32_t cap_mask = 99;
    check(cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                            &cap_mask, sizeof cap_mask,
                                            &w) == CUBLAS_STATUS_SUCCESS &&
              cap_mask == 0,
          "the algorithm supports no reduction scheme (no split-K)");
    const int32_t new_id = 1;
    check(cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &new_id,
                                               sizeof new_id) == CUBLAS_STATUS_INVALID_VALUE,
          "CUBLASLT_ALGO_CONFIG_ID is read-only");

    round_trip(
        "layout", layout_attrs, sizeof layout_attrs / sizeof *layout_attrs,
        [&](int a, const void *b, size_t s) {
            return cublasLtMatrixLayoutSetAttribute(layout, (cublasLtMatrixLayoutAttribute_t)a, b,
                                                    s);
        },
        [&](int a, void *b, size_t s, size_t *wr) {
            return cublasLtMatrixLayoutGetAttribute(layout, (cublasLtMatrixLayoutAttribute_t)a, b,
                                                    s, wr);
        });
    round_trip(
        "matmul descriptor", desc_attrs, sizeof desc_attrs / sizeof *desc_attrs,
        [&](int a, const void *b, size_t s) {
            return cublasLtMatmulDescSetAttribute(desc, (cublasLtMatmulDescAttributes_t)a, b, s);
        },
        [&](int a, void *b, size_t s, size_t *wr) {
            return cublasLtMatmulDescGetAttribute(desc, (cublasLtMatmulDescAttributes_t)a, b, s,
                                                  wr);
        });
    round_trip(
        "preference", pref_attrs, sizeof pref_attrs / sizeof *pref_attrs,
        [&](int a, const void *b, size_t s) {
            return cublasLtMatmulPreferenceSetAttribute(
                pref, (cublasLtMatmulPreferenceAttributes_t)a, b, s);
        },
        [&](int a, void *b, size_t s, size_t *wr) {
            return cublasLtMatmulPreferenceGetAttribute(
                pref, (cublasLtMatmulPreferenceAttributes_t)a, b, s, wr);
        });
    round_trip(
        "algorithm configuration", algo_attrs, sizeof algo_attrs / sizeof *algo_attrs,
        [&](int a, const void *b, size_t s) {
            return cublasLtMatmulAlgoConfigSetAttribute(
                &algo, (cublasLtMatmulAlgoConfigAttributes_t)a, b, s);
        },
        [&](int a, void *b, size_t s, size_t *wr) {
            return cublasLtMatmulAlgoConfigGetAttribute(
                &algo, (cublasLtMatmulAlgoConfigAttributes_t)a, b, s, wr);
        });
    cublasLtMatrixLayoutDestroy(layout);
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatmulPreferenceDestroy(pref);
}

/* ---- refusals --------------------------------------------------------------------- */

/* A valid small problem (D 8x6 = op(A) 8x4 · B 4x6, bf16 -> f32), changed by
 * `tweak`, must be refused with `want` by the heuristic (when given) and by
 * cublasLtMatmul, and queue nothing. */
struct Small {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc, ld;
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulAlgo_t algo;
    bool use_algo = false;
    Buf a{256}, b{256}, c{256}, d{256}, bias{256};
    float alpha = 1.0f, beta = 0.0f;
    Small()
    {
        cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatrixLayoutInit(&la, CUDA_R_16BF, 8, 4, 8);
        cublasLtMatrixLayoutInit(&lb, CUDA_R_16BF, 4, 6, 4);
        cublasLtMatrixLayoutInit(&lc, CUDA_R_32F, 8, 6, 8);
        cublasLtMatrixLayoutInit(&ld, CUDA_R_32F, 8, 6, 8);
        cublasLtMatmulPreferenceInit(&pref);
        std::memset(a.p, 0, 256);
        std::memset(b.p, 0, 256);
    }
    template <class T> void desc_set(cublasLtMatmulDescAttributes_t attr, T v)
    {
        check(cublasLtMatmulDescSetAttribute(&desc, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS,
              "set %d", (int)attr);
    }
    template <class T>
    void layout_set(cublasLtMatrixLayoutOpaque_t *l, cublasLtMatrixLayoutAttribute_t attr, T v)
    {
        check(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof v) == CUBLAS_STATUS_SUCCESS,
              "set %d", (int)attr);
    }
    cublasStatus_t heuristic()
    {
        cublasLtMatmulHeuristicResult_t r;
        int n = -1;
        const cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(g_lt, &desc, &la, &lb, &lc, &ld, &pref, 1, &r, &n);
        if (st == CUBLAS_STATUS_SUCCESS)
            algo = r.algo;
        return st;
    }
    cublasStatus_t matmul(const void *c_ptr = nullptr)
    {
        return cublasLtMatmul(g_lt, &desc, &alpha, a.p, &la, b.p, &lb, &beta, c_ptr ? c_ptr : c.p,
                              &lc, d.p, &ld, use_algo ? &algo : nullptr, nullptr, 0, TEST_STREAM);
    }
};

void expect_refused(const char *what, cublasStatus_t want,
                    const std::function<void(Small &)> &tweak, bool heuristic_too = true)
{
    Small s;
    tweak(s);
    const int before = g_enqueued;
    const cublasStatus_t h = heuristic_too ? s.heuristic() : want;
    const cublasStatus_t m = s.matmul();
    check(h == want && m == want && g_enqueued == before, "%s: heuristic %s, matmul %s (want %s)",
          what, cublasLtGetStatusName(h), cublasLtGetStatusName(m), cublasLtGetStatusName(want));
}

void test_refusals(void)
{
    const cublasStatus_t NS = CUBLAS_STATUS_NOT_SUPPORTED, IV = CUBLAS_STATUS_INVALID_VALUE;
    {
        Small s;
        check(s.heuristic() == CUBLAS_STATUS_SUCCESS && s.matmul() == CUBLAS_STATUS_SUCCESS,
              "the unchanged small problem runs");
    }
    const uint32_t unsupported_epilogues[] = {
        CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS,
        CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_BGRADB};
    for (uint32_t e : unsupported_epilogues)
        expect_refused("epilogue", NS, [e](Small &s) {
            s.desc_set(CUBLASLT_MATMUL_DESC_EPILOGUE, e);
            s.desc_set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (const void *)s.bias.p);
        });
    expect_refused("TF32 compute", NS, [](Small &s) {
        cublasLtMatmulDescInit(&s.desc, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F);
    });
    expect_refused("bf16 scale type", NS, [](Small &s) {
        cublasLtMatmulDescInit(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_16BF);
    });
    expect_refused("alpha vector pointer mode", NS, [](Small &s) {
        s.desc_set(CUBLASLT_MATMUL_DESC_POINTER_MODE, (int32_t)CUBLASLT_POINTER_MODE_DEVICE_VECTOR);
    });
    expect_refused("conjugate transpose", NS,
                   [](Small &s) { s.desc_set(CUBLASLT_MATMUL_DESC_TRANSB, (int32_t)CUBLAS_OP_C); });
    expect_refused("transposed C", NS,
                   [](Small &s) { s.desc_set(CUBLASLT_MATMUL_DESC_TRANSC, (int32_t)CUBLAS_OP_T); });
    expect_refused("triangular fill", NS, [](Small &s) {
        s.desc_set(CUBLASLT_MATMUL_DESC_FILL_MODE, (int32_t)CUBLAS_FILL_MODE_LOWER);
    });
    expect_refused("A scale pointer", NS, [](Small &s) {
        s.desc_set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, (const void *)s.bias.p);
    });
    expect_refused("amax of D", NS,
                   [](Small &s) { s.desc_set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, s.bias.p); });
    expect_refused("epilogue aux buffer", NS, [](Small &s) {
        s.desc_set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, s.bias.p);
    });
    expect_refused("fast accumulation", NS,
                   [](Small &s) { s.desc_set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, (int8_t)1); });
    expect_refused("bias of another type than D", NS, [](Small &s) {
        s.desc_set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BIAS);
        s.desc_set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, (const void *)s.bias.p);
        s.desc_set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, (int32_t)CUDA_R_16BF);
    });
    expect_refused("COL32 order", NS, [](Small &s) {
        s.layout_set(&s.lb, CUBLASLT_MATRIX_LAYOUT_ORDER, (int32_t)CUBLASLT_ORDER_COL32);
    });
    expect_refused("pointer-array batches", NS, [](Small &s) {
        s.layout_set(&s.la, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE,
                     (uint32_t)CUBLASLT_BATCH_MODE_POINTER_ARRAY);
    });
    expect_refused("planar complex", NS, [](Small &s) {
        s.layout_set(&s.la, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, (int64_t)64);
    });
    expect_refused("f16 inputs", NS, [](Small &s) {
        s.layout_set(&s.la, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)CUDA_R_16F);
        s.layout_set(&s.lb, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)CUDA_R_16F);
    });
    expect_refused("mixed bf16 x f32 inputs", NS, [](Small &s) {
        s.layout_set(&s.lb, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)CUDA_R_32F);
    });
    expect_refused("C of another type than D", NS, [](Small &s) {
        s.layout_set(&s.lc, CUBLASLT_MATRIX_LAYOUT_TYPE, (uint32_t)CUDA_R_16BF);
    });
    expect_refused("broadcast batch (A alone unbatched)", NS, [](Small &s) {
        for (cublasLtMatrixLayoutOpaque_t *l : {&s.lb, &s.lc, &s.ld})
            s.layout_set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (int32_t)2);
    });
    expect_refused(
        "split-K configuration", NS,
        [](Small &s) {
            check(s.heuristic() == CUBLAS_STATUS_SUCCESS, "heuristic");
            const int32_t splits = 2;
            cublasLtMatmulAlgoConfigSetAttribute(&s.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                 sizeof splits);
            cublasLtMatmulHeuristicResult_t r;
            check(cublasLtMatmulAlgoCheck(g_lt, &s.desc, &s.la, &s.lb, &s.lc, &s.ld, &s.algo, &r) ==
                      CUBLAS_STATUS_NOT_SUPPORTED,
                  "AlgoCheck refuses split-K");
            s.use_algo = true;
        },
        false);
    expect_refused(
        "a reduction scheme", NS,
        [](Small &s) {
            check(s.heuristic() == CUBLAS_STATUS_SUCCESS, "heuristic");
            const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_INPLACE;
            cublasLtMatmulAlgoConfigSetAttribute(&s.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &scheme, sizeof scheme);
            s.use_algo = true;
        },
        false);
    {
        Small s;
        const uint32_t by_id = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
        cublasLtMatmulPreferenceSetAttribute(&s.pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &by_id,
                                             sizeof by_id);
        check(s.heuristic() == NS, "search limited by algorithm id is refused");
        const uint64_t fma_only = CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA |
                                  CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
                                  CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF;
        Small t;
        cublasLtMatmulPreferenceSetAttribute(&t.pref, CUBLASLT_MATMUL_PREF_IMPL_MASK, &fma_only,
                                             sizeof fma_only);
        check(t.heuristic() == NS, "an implementation mask without HMMA leaves no bf16 algorithm");
    }

    expect_refused("k of A and B differ", IV, [](Small &s) {
        s.layout_set(&s.lb, CUBLASLT_MATRIX_LAYOUT_ROWS, (uint64_t)5);
        s.layout_set(&s.lb, CUBLASLT_MATRIX_LAYOUT_LD, (int64_t)5);
    });
    expect_refused("ld < rows", IV,
                   [](Small &s) { s.layout_set(&s.la, CUBLASLT_MATRIX_LAYOUT_LD, (int64_t)7); });
    expect_refused(
        "bias epilogue without a bias", IV,
        [](Small &s) {
            s.desc_set(CUBLASLT_MATMUL_DESC_EPILOGUE, (uint32_t)CUBLASLT_EPILOGUE_BIAS);
        },
        false);
    expect_refused("uninitialised layout", IV,
                   [](Small &s) { std::memset(&s.lc, 0, sizeof s.lc); });
    {
        Small s;
        s.beta = 1.0f;
        s.layout_set(&s.lc, CUBLASLT_MATRIX_LAYOUT_LD, (int64_t)16);
        const int before = g_enqueued;
        check(s.matmul(s.d.p) == IV && g_enqueued == before,
              "in place (C == D) with different layouts refused");
    }
}

/* ---- the stream: values of the call, replayed ------------------------------------ */

void test_recorded(void)
{
    Small s;
    const int M = 8, N = 6, K = 4;
    uint16_t *A = (uint16_t *)s.a.p, *B = (uint16_t *)s.b.p;
    for (int e = 0; e < M * K; e++)
        A[e] = ml_f32_to_bf16((float)(e % 5) - 2.0f);
    for (int e = 0; e < K * N; e++)
        B[e] = ml_f32_to_bf16((float)(e % 3) - 1.0f);
    auto expect = [&](float alpha) {
        int bad = 0;
        const float *D = (const float *)s.d.p;
        for (int j = 0; j < N; j++)
            for (int i = 0; i < M; i++) {
                float ref = 0; /* small integers: exact */
                for (int k = 0; k < K; k++)
                    ref += ml_bf16_to_f32(A[i + k * M]) * ml_bf16_to_f32(B[k + j * K]);
                bad += D[i + j * M] != alpha * ref;
            }
        return bad;
    };
    g_defer = true;
    g_recorded.clear();
    s.alpha = 2.0f;
    check(s.matmul() == CUBLAS_STATUS_SUCCESS && g_recorded.size() == 1, "recorded");
    /* After the call: other alpha, other descriptors. The recording keeps
     * the call's. */
    s.alpha = 3.0f;
    s.desc_set(CUBLASLT_MATMUL_DESC_TRANSA, (int32_t)CUBLAS_OP_T);
    s.layout_set(&s.ld, CUBLASLT_MATRIX_LAYOUT_LD, (int64_t)9);
    std::memset(s.d.p, 0, 256);
    g_recorded[0]();
    check(expect(2.0f) == 0, "a recorded call computes with the call's alpha and descriptors");
    std::memset(s.d.p, 0, 256);
    g_recorded[0]();
    check(expect(2.0f) == 0, "and again on replay");

    /* Device pointer mode: alpha is read when the work runs. */
    Small t;
    std::memcpy(t.a.p, s.a.p, 256);
    std::memcpy(t.b.p, s.b.p, 256);
    t.desc_set(CUBLASLT_MATMUL_DESC_POINTER_MODE, (int32_t)CUBLASLT_POINTER_MODE_DEVICE);
    float *alpha_dev = (float *)t.bias.p, *beta_dev = alpha_dev + 1;
    *alpha_dev = 2.0f;
    *beta_dev = 0.0f;
    g_recorded.clear();
    check(cublasLtMatmul(g_lt, &t.desc, alpha_dev, t.a.p, &t.la, t.b.p, &t.lb, beta_dev, t.c.p,
                         &t.lc, t.d.p, &t.ld, nullptr, nullptr, 0,
                         TEST_STREAM) == CUBLAS_STATUS_SUCCESS,
          "device pointer mode");
    *alpha_dev = -1.0f;
    g_recorded[0]();
    std::memcpy(s.d.p, t.d.p, 256);
    check(expect(-1.0f) == 0, "device pointer mode reads alpha at execution");
    g_defer = false;
    g_recorded.clear();
}

} // namespace

int main(void)
{
    check(cublasLtCreate(&g_lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    test_attributes();
    test_refusals();
    test_recorded();
    check(cublasLtDestroy(g_lt) == CUBLAS_STATUS_SUCCESS, "cublasLtDestroy");
    return check_done();
}
