/* The host cuBLASLt's tile product (cublaslt_host.h: what it computes).
 *
 * The whole-model tests of the HOST build spend much of their time here, so
 * it is compiled for the widest vector ISA the CPU has (target_clones), every
 * clone computing the same bits: this library is compiled without
 * floating-point contraction (CMakeLists.txt), so no product is fused into
 * its add. SUM_ROWS rows at a time, so that a B tile row loaded once serves
 * all of them and their TILE_COLS-wide sums are independent chains of adds.
 *
 * ASan does not instrument this file (CMakeLists.txt): under the sanitizers
 * its checks made the host CUDA tests several times slower, and it reads only
 * the two tiles cublaslt_host.cpp sized for it, while the gathers that fill
 * them from the caller's memory, where an indexing mistake would show, stay
 * checked. (A file, not an attribute: clang does not combine target_clones
 * with no_sanitize.) */
#include <cstring>

#include "cublaslt_host.h"

namespace mlk_lt {

namespace {

constexpr int64_t SUM_ROWS = 4;
typedef float sum_vec __attribute__((vector_size(64)));
constexpr int64_t SUM_LANES = (int64_t)(sizeof(sum_vec) / sizeof(float));
/* A last block of rows stays within the A tile and sums. */
static_assert(TILE_ROWS % SUM_ROWS == 0 && TILE_COLS % SUM_LANES == 0, "whole blocks");

} // namespace

__attribute__((target_clones("avx512f", "avx2", "default"))) void
tile_sums(const float *at, const float *bt, int64_t k, int64_t rows, float *sums)
{
    constexpr int64_t vecs = TILE_COLS / SUM_LANES;
    for (int64_t i0 = 0; i0 < rows; i0 += SUM_ROWS) {
        sum_vec acc[SUM_ROWS][vecs] = {};
        for (int64_t kk = 0; kk < k; kk++) {
            sum_vec b[vecs];
            std::memcpy(b, &bt[(size_t)(kk * TILE_COLS)], sizeof b);
            for (int64_t r = 0; r < SUM_ROWS; r++) {
                const float a = at[(size_t)((i0 + r) * k + kk)];
                for (int64_t v = 0; v < vecs; v++)
                    acc[r][v] += a * b[v];
            }
        }
        std::memcpy(&sums[(size_t)(i0 * TILE_COLS)], acc, sizeof acc);
    }
}

} // namespace mlk_lt
