/* The warp's mma and ldmatrix on the host (contract and layouts: host_mma.h). */
#include "host_mma.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "host_bf16.h"

namespace {

constexpr int WARP = 32;
constexpr int LANES_PER_GROUP = 4; /* t = l % 4, g = l / 4 */
constexpr int MMA_M = 16, MMA_N = 8, MMA_K = 16;
/* 32-bit registers per lane of each operand. */
constexpr int A_REGS = 4, B_REGS = 2, C_REGS = 4;
/* Rows of A (and C) the lower registers of a fragment hold; the upper
 * registers hold the row (or k) 8 further. */
constexpr int HALF = 8;
/* ldmatrix: matrices of LDM_DIM x LDM_DIM 16-bit elements, one row per
 * address, each row LDM_ROW_BYTES long and so aligned. */
constexpr int LDM_DIM = 8;
constexpr uintptr_t LDM_ROW_BYTES = LDM_DIM * sizeof(uint16_t);
constexpr int LDM_MAX_MATRICES = 4;

uint16_t lo_half(uint32_t r)
{
    return (uint16_t)(r & 0xffffu);
}
uint16_t hi_half(uint32_t r)
{
    return (uint16_t)(r >> 16);
}
uint32_t pack(uint16_t lo, uint16_t hi)
{
    return (uint32_t)lo | (uint32_t)hi << 16;
}

} // namespace

void mlk_host_mma_m16n8k16_bf16(const uint32_t a[32][4], const uint32_t b[32][2],
                                const float c[32][4], float d[32][4])
{
    /* Gather the warp's fragments into whole matrices (host_mma.h). */
    float A[MMA_M][MMA_K], B[MMA_K][MMA_N], C[MMA_M][MMA_N];
    for (int l = 0; l < WARP; l++) {
        const int g = l / LANES_PER_GROUP, t = l % LANES_PER_GROUP;
        for (int r = 0; r < A_REGS; r++) {
            const int row = g + (r % 2) * HALF, col = 2 * t + (r / 2) * HALF;
            A[row][col] = mlk_host_bf16_to_f32(lo_half(a[l][r]));
            A[row][col + 1] = mlk_host_bf16_to_f32(hi_half(a[l][r]));
        }
        for (int r = 0; r < B_REGS; r++) {
            const int k = 2 * t + r * HALF;
            B[k][g] = mlk_host_bf16_to_f32(lo_half(b[l][r]));
            B[k + 1][g] = mlk_host_bf16_to_f32(hi_half(b[l][r]));
        }
        for (int r = 0; r < C_REGS; r++)
            C[g + (r / 2) * HALF][2 * t + r % 2] = c[l][r];
    }
    /* C first, then the products in k order, each sum rounded to f32. The
     * products are exact, so contraction into an fma would not change them. */
    float D[MMA_M][MMA_N];
    for (int i = 0; i < MMA_M; i++)
        for (int j = 0; j < MMA_N; j++) {
            float acc = C[i][j];
            for (int k = 0; k < MMA_K; k++)
                acc += A[i][k] * B[k][j];
            D[i][j] = acc;
        }
    /* c is fully read above, so d may alias it. */
    for (int l = 0; l < WARP; l++) {
        const int g = l / LANES_PER_GROUP, t = l % LANES_PER_GROUP;
        for (int r = 0; r < C_REGS; r++)
            d[l][r] = D[g + (r / 2) * HALF][2 * t + r % 2];
    }
}

void mlk_host_ldmatrix(int n_matrices, int trans, const void *const row_addr[32],
                       uint32_t out[32][4])
{
    if (n_matrices != 1 && n_matrices != 2 && n_matrices != LDM_MAX_MATRICES) {
        std::fprintf(stderr, "ldmatrix: .x%d is not an ldmatrix form\n", n_matrices);
        std::abort();
    }
    /* M[i][row][col]: matrix i as stored, row r read from lane 8i + r. */
    uint16_t M[LDM_MAX_MATRICES][LDM_DIM][LDM_DIM];
    for (int i = 0; i < n_matrices; i++)
        for (int r = 0; r < LDM_DIM; r++) {
            const void *p = row_addr[i * LDM_DIM + r];
            if ((uintptr_t)p % LDM_ROW_BYTES != 0) {
                std::fprintf(stderr, "ldmatrix: lane %d's row address %p is not %zu-byte aligned\n",
                             i * LDM_DIM + r, p, (size_t)LDM_ROW_BYTES);
                std::abort();
            }
            std::memcpy(M[i][r], p, LDM_ROW_BYTES);
        }
    for (int l = 0; l < WARP; l++) {
        const int g = l / LANES_PER_GROUP, t = l % LANES_PER_GROUP;
        for (int i = 0; i < n_matrices; i++)
            out[l][i] = trans ? pack(M[i][2 * t][g], M[i][2 * t + 1][g])
                              : pack(M[i][g][2 * t], M[i][g][2 * t + 1]);
    }
}
