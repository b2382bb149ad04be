/* The tensor-core warp instructions attn_mma.cu uses, as pure functions over
 * a whole warp's registers, for the host execution of kernels/ (HOST build).
 * The caller (the device-function wrappers of the HOST build) gathers every
 * lane's operands with a warp exchange, calls one of these, and hands each
 * lane its row of the result. Nothing here knows about fibers or warps.
 *
 * Notation: a warp's lane l (0..31) is in group g = l / 4, at position
 * t = l % 4 within its group. A 32-bit register holding two 16-bit elements
 * holds the first-named one in bits 0..15 (the low half) and the second in
 * bits 16..31, which is what a 32-bit little-endian load of two adjacent
 * elements from memory gives.
 *
 * ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ------------------
 * D (16x8 f32) = A (16x16 bf16) · B (16x8 bf16) + C (16x8 f32). Lane l holds:
 *   A: a[l][0] = A[g][2t],   A[g][2t+1]       B: b[l][0] = B[2t][g],   B[2t+1][g]
 *      a[l][1] = A[g+8][2t], A[g+8][2t+1]        b[l][1] = B[2t+8][g], B[2t+9][g]
 *      a[l][2] = A[g][2t+8], A[g][2t+9]
 *      a[l][3] = A[g+8][2t+8], A[g+8][2t+9]
 *   C, D: c[l][0] = C[g][2t], c[l][1] = C[g][2t+1],
 *         c[l][2] = C[g+8][2t], c[l][3] = C[g+8][2t+1]
 * So A's and B's packed pairs are adjacent along k, the lane quad of group g
 * covers rows g and g + 8 of A, C and D and column g of B, and the C/D
 * fragments of two adjacent 8-column tiles, rounded to bf16 in pairs, are
 * the A fragment of the 16x16 matrix they form: (c[0], c[1]) and (c[2],
 * c[3]) of the left tile are a[0] and a[1], the right tile's a[2] and a[3]
 * (attn_mma.cu repacks P = softmax(S) that way).
 * "row"/"col" in the mnemonic say A is read along its rows and B along its
 * columns: B's fragment is what a row-major (N, K) matrix Bᵀ gives with
 * 32-bit loads at [g][2t] and [g][2t+8].
 *
 * Numerics: each product of two bf16 is exact in f32 (8 + 8 significand
 * bits), so the only roundings are the additions. The hardware's order and
 * internal precision for them are unspecified; this emulation starts from
 * C[i][j] and adds the 16 products in k order, each sum rounded to f32
 * (round to nearest even). Results can therefore differ from a GPU's in the
 * last bits, never by more than the f32 summation bound of 16 additions.
 *
 * ---- ldmatrix.sync.aligned.m8n8{.x1,.x2,.x4}{.trans}.shared.b16 ------------
 * Loads n = 1, 2 or 4 matrices of 8x8 16-bit elements from shared memory.
 * Lane 8i + r (i < n, r < 8) gives the address of row r of matrix i: 8
 * consecutive elements, 16 bytes, 16-byte aligned; rows may lie anywhere.
 * The addresses of lanes 8n..31 are not used. Lane l receives, in out[l][i]
 * for each matrix i (M_i[row][col] as stored):
 *   without .trans: M_i[g][2t], M_i[g][2t+1]   (row g, two adjacent columns)
 *   with .trans:    M_i[2t][g], M_i[2t+1][g]   (column g, two adjacent rows)
 * Without .trans a 16x16 row-major tile split into its four 8x8 quarters
 * (rows 0-7 / 8-15 x columns 0-7 / 8-15, in the order a[0..3] names them) is
 * exactly the A fragment; with .trans a row-major (K, N) tile gives B's
 * fragment (attn_mma.cu loads V that way).
 *
 * Both functions are pure: no state, any thread, operands owned by the caller. */
#ifndef MLK_HOST_MMA_H
#define MLK_HOST_MMA_H

#include <cstdint>

/* The warp's mma: d[l] is lane l's D fragment given every lane's a, b, c
 * fragments (layout above). d may be c (the "+f" accumulator form). */
void mlk_host_mma_m16n8k16_bf16(const uint32_t a[32][4], const uint32_t b[32][2],
                                const float c[32][4], float d[32][4]);

/* The warp's ldmatrix of n_matrices (1, 2 or 4) matrices, transposed when
 * trans != 0: row_addr[l] is lane l's address operand (lanes >= 8 *
 * n_matrices unused, may be NULL), out[l][i] lane l's destination register
 * i for i < n_matrices; out[l][i] for i >= n_matrices is left unchanged.
 * Aborts with a message on a row address that is not 16-byte aligned (a
 * misaligned-address fault on a device) or an n_matrices the instruction
 * does not have. */
void mlk_host_ldmatrix(int n_matrices, int trans, const void *const row_addr[32],
                       uint32_t out[32][4]);

#endif
