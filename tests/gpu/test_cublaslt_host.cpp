/* kernels/host/cublaslt_host.cpp: what the host cuBLASLt computes, against
 * a double reference and bit for bit against its documented f32 order (in
 * the clone this CPU runs): layouts in both orders with padded leading
 * dimensions, transposes, batches, alpha/beta, the bias epilogue, bf16 and
 * f32 outputs, E4M3 inputs under FP8's layout rules (and their refusals);
 * and the exact call sequences of kernels/matmul.cu (plain and
 * batch-invariant) for y = x·Wᵀ + bias against a naive loop. Needs no GPU.
 * (The API's contract: test_cublaslt_host_api.cpp.)
 *
 * Memory outside a matrix's elements (the ld padding, between batches) is
 * NaN in the inputs and a sentinel in D, so a wrong index shows as a NaN or
 * as a sentinel overwritten. */
#include <cmath>
#include <cstring>

#include "cublaslt_host_util.h"

namespace {

constexpr float D_SENTINEL = 12288.0f; /* 3 * 2^12: exact in bf16 too */

size_t esize(cudaDataType t)
{
    return t == CUDA_R_8F_E4M3 ? 1 : t == CUDA_R_16BF ? 2 : 4;
}

/* float8_e4m3fn's NaN codes (magnitude 0x7f). */
constexpr uint8_t E4M3_NAN = 0x7f;

/* A stored matrix: its layout parameters, its storage, and its elements as
 * doubles (row-major per batch) for the reference. */
struct Mat {
    cudaDataType type;
    cublasLtOrder_t order;
    int rows, cols, batches;
    int64_t ld, stride;
    Buf buf;
    std::vector<double> val;
    Mat(cudaDataType t, cublasLtOrder_t o, int r, int c, int pad, int nb)
        : type(t), order(o), rows(r), cols(c), batches(nb),
          ld((o == CUBLASLT_ORDER_COL ? r : c) + pad),
          stride(ld * (o == CUBLASLT_ORDER_COL ? c : r) + 3 * pad),
          buf((size_t)(stride * nb + 1) * esize(t)), val((size_t)r * c * nb)
    {
    }
    int64_t index(int b, int i, int j) const
    {
        return b * stride +
               (order == CUBLASLT_ORDER_COL ? i + (int64_t)j * ld : (int64_t)i * ld + j);
    }
    void raw_fill(float v)
    {
        const size_t n = buf.bytes / esize(type);
        for (size_t e = 0; e < n; e++)
            set_raw((int64_t)e, v);
    }
    void set_raw(int64_t idx, float v)
    {
        if (type == CUDA_R_8F_E4M3) { /* only NaN (padding) is written as a float */
            check(std::isnan(v), "E4M3 elements are set as codes");
            ((unsigned char *)buf.p)[idx] = E4M3_NAN;
        } else if (type == CUDA_R_16BF) {
            const uint16_t h = ml_f32_to_bf16(v);
            std::memcpy((char *)buf.p + idx * 2, &h, 2);
        } else {
            std::memcpy((char *)buf.p + idx * 4, &v, 4);
        }
    }
    float get_raw(int64_t idx) const
    {
        if (type == CUDA_R_8F_E4M3)
            return ml_f8e4m3_to_f32(((const unsigned char *)buf.p)[idx]);
        if (type == CUDA_R_16BF) {
            uint16_t h;
            std::memcpy(&h, (const char *)buf.p + idx * 2, 2);
            return ml_bf16_to_f32(h);
        }
        float f;
        std::memcpy(&f, (const char *)buf.p + idx * 4, 4);
        return f;
    }
    /* Padding NaN, elements random (as stored: rounded to the type). */
    void randomize(float lo, float hi)
    {
        raw_fill(NAN);
        for (int b = 0; b < batches; b++)
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < cols; j++) {
                    if (type == CUDA_R_8F_E4M3) /* a random finite code, every binade */
                        ((unsigned char *)buf.p)[index(b, i, j)] =
                            (unsigned char)((unsigned)frand(0, E4M3_NAN) |
                                            (frand(0, 1) < 0.5f ? 0x80u : 0u));
                    else
                        set_raw(index(b, i, j), frand(lo, hi));
                    val[((size_t)b * rows + i) * cols + j] = get_raw(index(b, i, j));
                }
    }
    double at(int b, int i, int j) const { return val[((size_t)b * rows + i) * cols + j]; }
    void layout(cublasLtMatrixLayoutOpaque_t *l) const
    {
        const int32_t ord = order, nb = batches;
        check(cublasLtMatrixLayoutInit(l, type, (uint64_t)rows, (uint64_t)cols, ld) ==
                      CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &ord,
                                                   sizeof ord) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nb,
                                                   sizeof nb) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof stride) == CUBLAS_STATUS_SUCCESS,
              "layout setup");
    }
};

struct Case {
    int m, n, k;
    cublasOperation_t ta, tb;
    cublasLtOrder_t oa, ob, od;
    cudaDataType ab, d;
    int pad, batches;
    bool bias, in_place;
    float alpha, beta;
};

/* One cublasLtMatmul of case c against the double reference. */
void run_case(const Case &c)
{
    const bool ta = c.ta == CUBLAS_OP_T, tb = c.tb == CUBLAS_OP_T;
    Mat A(c.ab, c.oa, ta ? c.k : c.m, ta ? c.m : c.k, c.pad, c.batches);
    Mat B(c.ab, c.ob, tb ? c.n : c.k, tb ? c.k : c.n, c.pad, c.batches);
    Mat D(c.d, c.od, c.m, c.n, c.pad, c.batches);
    Mat Cown(c.d, c.od, c.m, c.n, c.pad + 1, c.batches); /* out of place: another ld */
    Mat &C = c.in_place ? D : Cown;
    A.randomize(-1, 1);
    B.randomize(-1, 1);
    C.randomize(-1, 1);
    std::vector<double> c_val = C.val;
    if (!c.in_place) {
        D.raw_fill(D_SENTINEL);
        if (c.beta == 0.0f)
            C.raw_fill(NAN); /* beta == 0 must not read C */
    } else {
        for (int b = 0; b < c.batches; b++) /* the padding of D is the sentinel */
            for (int64_t e = b * D.stride; e < (b + 1) * D.stride; e++)
                D.set_raw(e, D_SENTINEL);
        for (int b = 0; b < c.batches; b++)
            for (int i = 0; i < c.m; i++)
                for (int j = 0; j < c.n; j++)
                    D.set_raw(D.index(b, i, j), (float)c_val[((size_t)b * c.m + i) * c.n + j]);
    }
    /* Bias: D's type, one vector of m per batch. */
    Mat bias(c.d, CUBLASLT_ORDER_COL, c.m, 1, 0, c.batches);
    bias.randomize(-1, 1);
    const int64_t bias_stride = bias.stride;

    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc, ld;
    const int32_t ta_v = c.ta, tb_v = c.tb;
    const uint32_t epi = c.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias_ptr = bias.buf.p;
    cublasStatus_t st = cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta_v, sizeof ta_v);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb_v, sizeof tb_v);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == CUBLAS_STATUS_SUCCESS && c.bias)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                            sizeof bias_ptr);
    if (st == CUBLAS_STATUS_SUCCESS && c.bias)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                            &bias_stride, sizeof bias_stride);
    A.layout(&la);
    B.layout(&lb);
    C.layout(&lc);
    D.layout(&ld);
    const int before = g_enqueued;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(g_lt, &desc, &c.alpha, A.buf.p, &la, B.buf.p, &lb, &c.beta, C.buf.p,
                            &lc, D.buf.p, &ld, nullptr, nullptr, 0, TEST_STREAM);
    char what[160];
    snprintf(what, sizeof what,
             "%dx%dx%d op%c%c order %c%c%c %s->%s pad %d batches %d%s%s alpha %g beta %g", c.m, c.n,
             c.k, ta ? 'T' : 'N', tb ? 'T' : 'N', "CR"[c.oa], "CR"[c.ob], "CR"[c.od],
             c.ab == CUDA_R_8F_E4M3 ? "e4m3" : c.ab == CUDA_R_16BF ? "bf16" : "f32",
             c.d == CUDA_R_16BF ? "bf16" : "f32", c.pad,
             c.batches, c.bias ? " bias" : "", c.in_place ? " in-place" : "", c.alpha, c.beta);
    check(st == CUBLAS_STATUS_SUCCESS && g_enqueued == before + 1 && g_last_stream == TEST_STREAM,
          "%s: status %d, %d work items on the stream", what, (int)st, g_enqueued - before);

    /* Within f32 summation error of the exact value, and bit for bit the
     * documented order: f32(f32 sum in k order of the rounded products, then
     * alpha·, + beta·C, + bias, each rounded). A float product is exact in
     * double, so (float)(double product) is the rounded f32 product whether
     * or not the compiler would fuse a float multiply into its add. */
    int bad = 0, order_bad = 0, padding_bad = 0;
    double worst = 0;
    const double g = gamma_n(c.k + 4);
    for (int b = 0; b < c.batches; b++)
        for (int i = 0; i < c.m; i++)
            for (int j = 0; j < c.n; j++) {
                double sum = 0, mag = 0;
                float fsum = 0.0f;
                for (int kk = 0; kk < c.k; kk++) {
                    const double p = (ta ? A.at(b, kk, i) : A.at(b, i, kk)) *
                                     (tb ? B.at(b, j, kk) : B.at(b, kk, j));
                    sum += p;
                    mag += std::fabs(p);
                    fsum += (float)p;
                }
                double ref = c.alpha * sum;
                mag = std::fabs(c.alpha) * mag;
                float emu = (float)((double)c.alpha * fsum);
                if (c.beta != 0.0f) {
                    const double cv = c_val[((size_t)b * c.m + i) * c.n + j];
                    ref += c.beta * cv;
                    mag += std::fabs(c.beta * cv);
                    emu += (float)((double)c.beta * cv);
                }
                if (c.bias) {
                    ref += bias.at(b, i, 0);
                    mag += std::fabs(bias.at(b, i, 0));
                    emu += (float)bias.at(b, i, 0);
                }
                if (c.d == CUDA_R_16BF)
                    emu = ml_bf16_to_f32(ml_f32_to_bf16(emu));
                double tol = g * mag;
                if (c.d == CUDA_R_16BF)
                    tol += BF16_U * (std::fabs(ref) + tol);
                const float got = D.get_raw(D.index(b, i, j));
                const double err = std::fabs(got - ref);
                bad += !(err <= tol);
                order_bad += std::memcmp(&got, &emu, sizeof got) != 0;
                if (tol > 0 && err / tol > worst)
                    worst = err / tol;
            }
    /* Everything of D's storage that is no element stays the sentinel. */
    std::vector<char> is_elem(D.buf.bytes / esize(c.d), 0);
    for (int b = 0; b < c.batches; b++)
        for (int i = 0; i < c.m; i++)
            for (int j = 0; j < c.n; j++)
                is_elem[(size_t)D.index(b, i, j)] = 1;
    for (size_t e = 0; e < (size_t)(D.stride * c.batches); e++)
        padding_bad += !is_elem[e] && D.get_raw((int64_t)e) != D_SENTINEL;
    check(bad == 0 && order_bad == 0 && padding_bad == 0,
          "%s: %d elements beyond the bound (worst %.3g of it), %d not the f32 sum in k "
          "order, %d padding elements written",
          what, bad, worst, order_bad, padding_bad);
}

void test_cases(void)
{
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    const cublasLtOrder_t orders[] = {CUBLASLT_ORDER_COL, CUBLASLT_ORDER_ROW};
    const cudaDataType types[][2] = {
        {CUDA_R_16BF, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_32F, CUDA_R_32F}};
    const float alphas[] = {1.0f, -0.5f, 2.0f}, betas[] = {0.0f, 1.0f, 0.75f};
    int n_case = 0;
    for (cublasOperation_t ta : ops)
        for (cublasOperation_t tb : ops)
            for (cublasLtOrder_t oa : orders)
                for (cublasLtOrder_t ob : orders)
                    for (cublasLtOrder_t od : orders)
                        for (const auto &t : types) {
                            Case c = {13,
                                      7,
                                      37,
                                      ta,
                                      tb,
                                      oa,
                                      ob,
                                      od,
                                      t[0],
                                      t[1],
                                      n_case % 3 == 0 ? 0 : 3,
                                      n_case % 4 == 1 ? 3 : 1,
                                      (n_case / 2) % 2 == 0,
                                      n_case % 5 == 2,
                                      alphas[n_case % 3],
                                      betas[(n_case / 3) % 3]};
                            run_case(c);
                            n_case++;
                        }
    /* Larger than one output tile each way, and k past a tile row. */
    run_case({70, 41, 130, CUBLAS_OP_T, CUBLAS_OP_N, CUBLASLT_ORDER_COL, CUBLASLT_ORDER_COL,
              CUBLASLT_ORDER_COL, CUDA_R_16BF, CUDA_R_32F, 5, 2, true, false, 1.0f, 1.0f});
    run_case({3, 100, 9, CUBLAS_OP_N, CUBLAS_OP_T, CUBLASLT_ORDER_ROW, CUBLASLT_ORDER_COL,
              CUBLASLT_ORDER_ROW, CUDA_R_16BF, CUDA_R_16BF, 0, 1, true, true, 1.0f, 1.0f});
    fprintf(stderr, "  %d layout/type/epilogue cases\n", n_case + 2);
}

/* A D = A·B call of E4M3 operands, column-major, without running it:
 * cublasLtMatmul's status. */
cublasStatus_t fp8_status(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                          bool bias)
{
    const bool t_a = ta == CUBLAS_OP_T, t_b = tb == CUBLAS_OP_T;
    Mat A(CUDA_R_8F_E4M3, CUBLASLT_ORDER_COL, t_a ? k : m, t_a ? m : k, 0, 1);
    Mat B(CUDA_R_8F_E4M3, CUBLASLT_ORDER_COL, t_b ? n : k, t_b ? k : n, 0, 1);
    Mat D(CUDA_R_32F, CUBLASLT_ORDER_COL, m, n, 0, 1);
    Buf bias_v((size_t)m * sizeof(float));
    const void *bias_ptr = bias_v.p;
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    const int32_t ta_v = ta, tb_v = tb;
    const uint32_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    check(cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta_v,
                                             sizeof ta_v) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb_v,
                                             sizeof tb_v) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                             sizeof epi) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                             sizeof bias_ptr) == CUBLAS_STATUS_SUCCESS,
          "fp8 descriptor");
    A.layout(&la);
    B.layout(&lb);
    D.layout(&ld);
    const float one = 1.0f, zero = 0.0f;
    const int before = g_enqueued;
    const cublasStatus_t st = cublasLtMatmul(g_lt, &desc, &one, A.buf.p, &la, B.buf.p, &lb, &zero,
                                             D.buf.p, &ld, D.buf.p, &ld, nullptr, nullptr, 0,
                                             TEST_STREAM);
    check(st == CUBLAS_STATUS_SUCCESS || g_enqueued == before, "a refused call queues nothing");
    return st;
}

/* E4M3 x E4M3: the TN form with every FP8 layout rule met computes D to
 * f32 summation error (exact products), f32 or bf16 D, padded leading
 * dimensions that stay multiples of 16 bytes, C in place (run_case's
 * separate C has an odd ld); everything else the FP8
 * kernels do not run is CUBLAS_STATUS_NOT_SUPPORTED. */
void test_fp8(void)
{
    const float alphas[] = {1.0f, -0.5f}, betas[] = {0.0f, 0.75f};
    const cudaDataType outs[] = {CUDA_R_32F, CUDA_R_16BF};
    int n_case = 0;
    for (cudaDataType d : outs)
        for (float alpha : alphas)
            for (float beta : betas) {
                /* pad 16: lda, ldb 64 + 16 bytes; ldd (20 + 16) · 4 or 2 bytes. */
                run_case({d == CUDA_R_32F ? 20 : 24, 9, 64, CUBLAS_OP_T, CUBLAS_OP_N,
                          CUBLASLT_ORDER_COL, CUBLASLT_ORDER_COL, CUBLASLT_ORDER_COL,
                          CUDA_R_8F_E4M3, d, n_case % 2 ? 16 : 0, 1, false, true, alpha, beta});
                n_case++;
            }
    run_case({68, 40, 160, CUBLAS_OP_T, CUBLAS_OP_N, CUBLASLT_ORDER_COL, CUBLASLT_ORDER_COL,
              CUBLASLT_ORDER_COL, CUDA_R_8F_E4M3, CUDA_R_32F, 0, 1, false, true, 1.0f, 0.0f});
    const struct {
        cublasOperation_t ta, tb;
        int m, n, k;
        bool bias;
        const char *what;
    } refused[] = {
        {CUBLAS_OP_N, CUBLAS_OP_N, 16, 8, 32, false, "the NN form"},
        {CUBLAS_OP_T, CUBLAS_OP_T, 16, 8, 32, false, "the TT form"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 16, 8, 40, false, "k = 40 (not 16-byte)"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 6, 8, 32, false, "m = 6 f32 (24 bytes)"},
        {CUBLAS_OP_T, CUBLAS_OP_N, 16, 8, 32, true, "the bias epilogue"},
    };
    for (const auto &r : refused) {
        const cublasStatus_t st = fp8_status(r.ta, r.tb, r.m, r.n, r.k, r.bias);
        check(st == CUBLAS_STATUS_NOT_SUPPORTED, "fp8 with %s: %s, want NOT_SUPPORTED", r.what,
              cublasLtGetStatusName(st));
    }
    check(fp8_status(CUBLAS_OP_T, CUBLAS_OP_N, 16, 8, 32, false) == CUBLAS_STATUS_SUCCESS,
          "fp8 control case");
    fprintf(stderr, "  %d fp8 cases, %d refusals\n", n_case + 1,
            (int)(sizeof refused / sizeof refused[0]));
}

/* ---- kernels/matmul.cu's calls ---------------------------------------------------- */

/* matmul.cu's alignment(): the largest power of two dividing p, capped. */
uint32_t alignment(const void *p, uint32_t cap)
{
    const uintptr_t v = (uintptr_t)p;
    uint32_t a = 1;
    while (a < cap && (v & a) == 0)
        a <<= 1;
    return a;
}

/* The plan of matmul.cu's plan_build, call for call; batch_invariant as in
 * the batch-invariant backend (heuristic asked at ref_rows, then checked). */
struct Plan {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t w_layout, x_layout, y_layout;
    cublasLtMatmulAlgo_t algo;
};

cublasStatus_t plan_build(Plan *p, int rows, int K, int N, const float *bias_f32, uint32_t align_w,
                          uint32_t align_y, bool batch_invariant)
{
    const int32_t trans_w = CUBLAS_OP_T;
    const uint32_t epilogue = bias_f32 ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const uint64_t ws_bytes = (size_t)32 << 20;
    const uint32_t align_x = 256, no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    const int ref_rows = 64;
    cublasLtMatmulPreferenceOpaque_t pref;
    cublasLtMatmulHeuristicResult_t found;
    int n_found = 0;
    cublasStatus_t st = cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w,
                                            sizeof trans_w);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                            sizeof epilogue);
    if (st == CUBLAS_STATUS_SUCCESS && bias_f32)
        st = cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_f32,
                                            sizeof bias_f32);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->w_layout, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->x_layout, CUDA_R_16BF, (uint64_t)K, (uint64_t)rows, K);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&p->y_layout, CUDA_R_32F, (uint64_t)N, (uint64_t)rows, N);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceInit(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws_bytes, sizeof ws_bytes);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &align_w, sizeof align_w);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &align_x, sizeof align_x);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &align_y, sizeof align_y);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &align_y, sizeof align_y);
    if (st == CUBLAS_STATUS_SUCCESS && batch_invariant)
        st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &no_reduction, sizeof no_reduction);
    cublasLtMatrixLayoutOpaque_t x_ref, y_ref;
    cublasLtMatrixLayout_t x_ask = &p->x_layout, y_ask = &p->y_layout;
    if (st == CUBLAS_STATUS_SUCCESS && batch_invariant) {
        st = cublasLtMatrixLayoutInit(&x_ref, CUDA_R_16BF, (uint64_t)K, ref_rows, K);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutInit(&y_ref, CUDA_R_32F, (uint64_t)N, ref_rows, N);
        x_ask = &x_ref;
        y_ask = &y_ref;
    }
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(g_lt, &p->desc, &p->w_layout, x_ask, y_ask, y_ask,
                                            &pref, 1, &found, &n_found);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = n_found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : found.state;
    if (st == CUBLAS_STATUS_SUCCESS && batch_invariant) {
        cublasLtMatmulHeuristicResult_t checked;
        int32_t splits = 0;
        size_t written = 0;
        st = cublasLtMatmulAlgoConfigGetAttribute(&found.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                  &splits, sizeof splits, &written);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoCheck(g_lt, &p->desc, &p->w_layout, &p->x_layout, &p->y_layout,
                                         &p->y_layout, &found.algo, &checked);
        if (st == CUBLAS_STATUS_SUCCESS &&
            (splits != 1 || written != sizeof splits || checked.workspaceSize > ws_bytes))
            st = CUBLAS_STATUS_NOT_SUPPORTED;
    }
    p->algo = found.algo;
    return st;
}

/* matmul.cu's gemm() for one tile: y (rows, N) = [y +] bf16(x) (rows, K) ·
 * w (N, K)ᵀ [+ bias], through cuBLASLt. */
cublasStatus_t gemm(Plan &p, float *y, const uint16_t *x_bf16, const uint16_t *w, bool accumulate)
{
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    static Buf workspace((size_t)32 << 20);
    return cublasLtMatmul(g_lt, &p.desc, &alpha, w, &p.w_layout, x_bf16, &p.x_layout, &beta, y,
                          &p.y_layout, y, &p.y_layout, &p.algo, workspace.p, workspace.bytes,
                          TEST_STREAM);
}

void test_matmul_cu(bool batch_invariant)
{
    const int M = 37, K = 48, N = 70;
    const char *mode = batch_invariant ? "batch-invariant" : "plain";
    Buf w_buf((size_t)N * K * 2), x_buf((size_t)M * K * 2), y_buf((size_t)M * N * 4),
        bias_buf((size_t)N * 4);
    uint16_t *w = (uint16_t *)w_buf.p, *x = (uint16_t *)x_buf.p;
    float *y = (float *)y_buf.p, *bias = (float *)bias_buf.p;
    std::vector<float> x_f32((size_t)M * K), y0((size_t)M * N);
    fill_bf16(w, (size_t)N * K, -1, 1);
    fill(x_f32.data(), x_f32.size(), -2, 2);
    for (size_t e = 0; e < x_f32.size(); e++) /* to_bf16_kernel */
        x[e] = ml_f32_to_bf16(x_f32[e]);
    for (int n = 0; n < N; n++) /* widen_bias_kernel of a bf16 bias */
        bias[n] = ml_round_bf16(frand(-1, 1));
    fill(y0.data(), y0.size(), -1, 1);
    const uint32_t cap = batch_invariant ? 16 : 256;

    for (int accumulate = 0; accumulate < 2; accumulate++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            std::memcpy(y, y0.data(), y0.size() * sizeof(float));
            Plan p;
            cublasStatus_t st = plan_build(&p, M, K, N, with_bias ? bias : nullptr,
                                           alignment(w, cap), alignment(y, cap), batch_invariant);
            if (st == CUBLAS_STATUS_SUCCESS)
                st = gemm(p, y, x, w, accumulate);
            check(st == CUBLAS_STATUS_SUCCESS, "matmul.cu %s sequence: %s", mode,
                  cublasLtGetStatusString(st));
            int bad = 0;
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    double ref =
                        (accumulate ? y0[(size_t)m * N + n] : 0.0) + (with_bias ? bias[n] : 0.0);
                    double mag = std::fabs(ref);
                    for (int k = 0; k < K; k++) {
                        const double prod = (double)ml_bf16_to_f32(x[(size_t)m * K + k]) *
                                            ml_bf16_to_f32(w[(size_t)n * K + k]);
                        ref += prod;
                        mag += std::fabs(prod);
                    }
                    bad += !(std::fabs(y[(size_t)m * N + n] - ref) <= gamma_n(K + 4) * mag);
                }
            check(bad == 0, "matmul.cu %s y = %sx·Wᵀ%s: %d of %d elements off the naive loop", mode,
                  accumulate ? "y + " : "", with_bias ? " + bias" : "", bad, M * N);
        }

    /* A row's value does not depend on the rows beside it (one f32 sum per
     * element, in k order): row r alone equals row r of the M-row call. */
    Plan full, one;
    std::vector<float> y_full((size_t)M * N);
    cublasStatus_t st =
        plan_build(&full, M, K, N, bias, alignment(w, cap), alignment(y, cap), batch_invariant);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = gemm(full, y, x, w, false);
    std::memcpy(y_full.data(), y, y_full.size() * sizeof(float));
    const int r = M / 2;
    float *y_row = y + (size_t)r * N;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = plan_build(&one, 1, K, N, bias, alignment(w, cap), alignment(y_row, cap),
                        batch_invariant);
    std::memset(y_row, 0, (size_t)N * sizeof(float));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = gemm(one, y_row, x + (size_t)r * K, w, false);
    check(st == CUBLAS_STATUS_SUCCESS &&
              std::memcmp(y_row, &y_full[(size_t)r * N], (size_t)N * sizeof(float)) == 0,
          "matmul.cu %s: row %d alone differs from row %d of %d", mode, r, r, M);

    /* A plan reused for a less aligned y than it promised is refused. */
    if (!batch_invariant) {
        const int before = g_enqueued;
        st = gemm(one, y + 1, x, w, false); /* 4-byte aligned, promised 256 */
        check(st == CUBLAS_STATUS_INVALID_VALUE && g_enqueued == before,
              "misaligned D against the promise: %s", cublasLtGetStatusName(st));
    }
}

} // namespace

int main(void)
{
    check(cublasLtCreate(&g_lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
    test_cases();
    test_fp8();
    test_matmul_cu(false);
    test_matmul_cu(true);
    check(cublasLtDestroy(g_lt) == CUBLAS_STATUS_SUCCESS, "cublasLtDestroy");
    return check_done();
}
