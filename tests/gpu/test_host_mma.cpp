/* kernels/host/host_mma: the host mma.sync m16n8k16 bf16 and ldmatrix against
 * the fragment layouts of host_mma.h, and both composed the way attn_mma.cu
 * composes them. Needs no GPU.
 *
 * The layouts are written here a second way, as the inverse map (which lane,
 * register and half holds element (i, j)), so that a mistake shared by the
 * emulation and its test would have to be made twice in different forms. */
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {
#include "harness.h"
#include "test_rand.h"
}

#include "host/host_mma.h"

namespace {

constexpr int WARP = 32;
constexpr int M = 16, N = 8, K = 16;
constexpr int HALF = 8; /* rows (or k) the upper fragment registers add */
constexpr uint32_t UNTOUCHED = 0xdeadbeefu;
constexpr double F32_UNIT_ROUNDOFF = 1.0 / (1 << 24);

/* Where element (i, j) of an operand lives: lane, register, half (0 = low). */
struct Slot {
    int lane, reg, half;
};
Slot slot_a(int i, int k)
{
    return {4 * (i % HALF) + (k % HALF) / 2, i / HALF + 2 * (k / HALF), k % 2};
}
Slot slot_b(int k, int j)
{
    return {4 * j + (k % HALF) / 2, k / HALF, k % 2};
}
Slot slot_c(int i, int j)
{
    return {4 * (i % HALF) + j / 2, 2 * (i / HALF) + j % 2, 0};
}

void put16(uint32_t &reg, int half, uint16_t v)
{
    const int shift = 16 * half;
    reg = (reg & ~(0xffffu << shift)) | (uint32_t)v << shift;
}
uint16_t get16(uint32_t reg, int half)
{
    return (uint16_t)(reg >> (16 * half));
}

/* Distribute row-major A (M, K), B (K, N) bf16 and C (M, N) f32 into the
 * warp's fragments. */
void distribute(const uint16_t *A, const uint16_t *B, const float *C, uint32_t a[WARP][4],
                uint32_t b[WARP][2], float c[WARP][4])
{
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            const Slot s = slot_a(i, k);
            put16(a[s.lane][s.reg], s.half, A[i * K + k]);
        }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) {
            const Slot s = slot_b(k, j);
            put16(b[s.lane][s.reg], s.half, B[k * N + j]);
        }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const Slot s = slot_c(i, j);
            c[s.lane][s.reg] = C[i * N + j];
        }
}

void gather_d(const float d[WARP][4], float *D)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const Slot s = slot_c(i, j);
            D[i * N + j] = d[s.lane][s.reg];
        }
}

/* ---- mma against a double reference ---------------------------------------- */

/* D = A·B + C on random bf16 A, B and f32 C. The products are exact in f32
 * and D is C plus 16 products, summed with 16 f32 additions; whatever their
 * order, |D - exact| <= γ_16 · (|C| + Σ|A·B|), γ_n = n·u / (1 - n·u) with
 * u = 2^-24 (the recursive summation bound). The double reference is exact
 * here (products of 8-bit significands, 17 terms of bounded exponent range). */
void test_mma_random(void)
{
    const double gamma16 = K * F32_UNIT_ROUNDOFF / (1 - K * F32_UNIT_ROUNDOFF);
    const int trials = 64;
    int bad = 0;
    double worst = 0;
    for (int trial = 0; trial < trials; trial++) {
        uint16_t A[M * K], B[K * N];
        float C[M * N], D[M * N], D_alias[M * N];
        fill_bf16(A, M * K, -1, 1);
        fill_bf16(B, K * N, -1, 1);
        fill(C, M * N, -1, 1);
        uint32_t a[WARP][4] = {}, b[WARP][2] = {};
        float c[WARP][4], d[WARP][4];
        distribute(A, B, C, a, b, c);
        mlk_host_mma_m16n8k16_bf16(a, b, c, d);
        gather_d(d, D);
        mlk_host_mma_m16n8k16_bf16(a, b, c, c); /* the accumulate form: d is c */
        gather_d(c, D_alias);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = C[i * N + j], mag = std::fabs(C[i * N + j]);
                for (int k = 0; k < K; k++) {
                    const double p =
                        (double)ml_bf16_to_f32(A[i * K + k]) * ml_bf16_to_f32(B[k * N + j]);
                    ref += p;
                    mag += std::fabs(p);
                }
                const double err = std::fabs(D[i * N + j] - ref);
                worst = err / (gamma16 * mag) > worst ? err / (gamma16 * mag) : worst;
                bad += !(err <= gamma16 * mag) || D_alias[i * N + j] != D[i * N + j];
            }
    }
    check(bad == 0, "mma: %d of %d elements outside γ_16·(|C| + Σ|AB|) or differing when d is c",
          bad, trials * M * N);
    fprintf(stderr, "  mma random: worst error %.3g of the bound\n", worst);
}

/* ---- ldmatrix against the layout ------------------------------------------------ */

constexpr int SMEM_ROWS = 32, SMEM_LD = 24; /* 48-byte rows: every 8th element 16-byte aligned */

void test_ldmatrix(void)
{
    alignas(16) uint16_t smem[SMEM_ROWS * SMEM_LD];
    for (int e = 0; e < SMEM_ROWS * SMEM_LD; e++)
        smem[e] = (uint16_t)(e + 1);
    /* Matrix i's top-left corner: anywhere 16-byte aligned, not in order. */
    const int row0[4] = {8, 0, 24, 16}, col0[4] = {16, 0, 8, 16};
    const int forms[] = {1, 2, 4};
    for (int n : forms)
        for (int trans = 0; trans < 2; trans++) {
            const void *addr[WARP];
            for (int l = 0; l < WARP; l++) {
                const int i = l / 8, r = l % 8;
                addr[l] = i < n ? &smem[(row0[i] + r) * SMEM_LD + col0[i]] : nullptr;
            }
            uint32_t out[WARP][4];
            for (auto &lane : out)
                for (uint32_t &reg : lane)
                    reg = UNTOUCHED;
            mlk_host_ldmatrix(n, trans, addr, out);
            int bad = 0;
            for (int i = 0; i < n; i++)
                for (int r = 0; r < 8; r++)
                    for (int col = 0; col < 8; col++) {
                        /* Stored element (r, col): lane 4r + col/2 without .trans
                         * (row g = r), lane 4col + r/2 with it (column g = col). */
                        const int lane = trans ? 4 * col + r / 2 : 4 * r + col / 2;
                        const int half = trans ? r % 2 : col % 2;
                        bad += get16(out[lane][i], half) !=
                               smem[(row0[i] + r) * SMEM_LD + col0[i] + col];
                    }
            for (int l = 0; l < WARP; l++)
                for (int i = n; i < 4; i++)
                    bad += out[l][i] != UNTOUCHED;
            check(bad == 0, "ldmatrix.x%d%s: %d wrong elements or registers", n,
                  trans ? ".trans" : "", bad);
        }
}

/* ---- composed as attn_mma.cu composes them -------------------------------------- */

/* attn_mma.cu's shared tiles at head dim HD: rows of LDS bf16 (padded by 8). */
constexpr int HD = 32, LDS = HD + 8, KEYS = 16;
constexpr int KSTEPS = HD / 16, DTILES = HD / 8, NTILES = KEYS / 8;

uint32_t lds32(const uint16_t *p)
{
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
uint32_t pack_bf16(float lo, float hi)
{
    return (uint32_t)ml_f32_to_bf16(lo) | (uint32_t)ml_f32_to_bf16(hi) << 16;
}
/* Small integers: every product and sum below is exact in f32, and S (|S| <=
 * HD·4 = 128) is exact in bf16, so the composition must match exactly. */
void fill_small_ints(uint16_t *x, int rows)
{
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < LDS; d++)
            x[r * LDS + d] = ml_f32_to_bf16(d < HD ? (float)(irand(5) - 2) : NAN);
}

void test_composed(void)
{
    alignas(16) uint16_t q_s[M * LDS], k_s[KEYS * LDS], v_s[KEYS * LDS];
    fill_small_ints(q_s, M);
    fill_small_ints(k_s, KEYS);
    fill_small_ints(v_s, KEYS);
    auto q = [&](int r, int d) {
        return (double)ml_bf16_to_f32(q_s[r * LDS + d]);
    };
    auto kk = [&](int r, int d) {
        return (double)ml_bf16_to_f32(k_s[r * LDS + d]);
    };
    auto v = [&](int r, int d) {
        return (double)ml_bf16_to_f32(v_s[r * LDS + d]);
    };

    /* Q's A fragments by 32-bit loads, as attn_mma.cu's qa; the same by
     * ldmatrix.x4 (rows 0-15 from lanes 0-15 at column 0, lanes 16-31 at 8). */
    uint32_t qa[KSTEPS][WARP][4];
    int frag_bad = 0;
    for (int ks = 0; ks < KSTEPS; ks++) {
        const void *addr[WARP];
        for (int lane = 0; lane < WARP; lane++) {
            const int g = lane >> 2, t4 = lane & 3;
            const uint16_t *p0 = q_s + g * LDS + ks * 16 + 2 * t4, *p1 = p0 + 8 * LDS;
            qa[ks][lane][0] = lds32(p0);
            qa[ks][lane][1] = lds32(p1);
            qa[ks][lane][2] = lds32(p0 + 8);
            qa[ks][lane][3] = lds32(p1 + 8);
            addr[lane] = q_s + (lane & 15) * LDS + ks * 16 + (lane >> 4) * 8;
        }
        uint32_t via_ldm[WARP][4];
        mlk_host_ldmatrix(4, 0, addr, via_ldm);
        frag_bad += std::memcmp(via_ldm, qa[ks], sizeof via_ldm) != 0;
    }

    /* S (16 x KEYS) = Q · Kᵀ, K's B fragments by 32-bit loads as attn_mma.cu
     * does, and by ldmatrix.x2 of K's rows (an 8 x 16 slice as two 8x8). */
    float sc[NTILES][WARP][4] = {};
    for (int nt = 0; nt < NTILES; nt++)
        for (int ks = 0; ks < KSTEPS; ks++) {
            uint32_t b[WARP][2];
            const void *addr[WARP];
            for (int lane = 0; lane < WARP; lane++) {
                const int g = lane >> 2, t4 = lane & 3;
                const uint16_t *kr = k_s + (nt * 8 + g) * LDS + 2 * t4;
                b[lane][0] = lds32(kr + ks * 16);
                b[lane][1] = lds32(kr + ks * 16 + 8);
                addr[lane] = k_s + (nt * 8 + (lane & 7)) * LDS + ks * 16 + ((lane >> 3) & 1) * 8;
            }
            uint32_t via_ldm[WARP][4];
            mlk_host_ldmatrix(2, 0, addr, via_ldm);
            for (int lane = 0; lane < WARP; lane++)
                frag_bad += via_ldm[lane][0] != b[lane][0] || via_ldm[lane][1] != b[lane][1];
            mlk_host_mma_m16n8k16_bf16(qa[ks], b, sc[nt], sc[nt]);
        }
    check(frag_bad == 0, "composed: %d fragments differ between 32-bit loads and ldmatrix",
          frag_bad);

    /* O (16 x HD) = P · V with P = S repacked from the accumulators and V's
     * B fragments by ldmatrix.x4.trans, exactly attn_mma.cu's loop. */
    float o[DTILES][WARP][4] = {};
    for (int kb = 0; kb < KEYS / 16; kb++) {
        uint32_t pa[WARP][4];
        for (int lane = 0; lane < WARP; lane++) {
            const float *s0 = sc[2 * kb][lane], *s1 = sc[2 * kb + 1][lane];
            pa[lane][0] = pack_bf16(s0[0], s0[1]);
            pa[lane][1] = pack_bf16(s0[2], s0[3]);
            pa[lane][2] = pack_bf16(s1[0], s1[1]);
            pa[lane][3] = pack_bf16(s1[2], s1[3]);
        }
        for (int dt = 0; dt < DTILES; dt += 2) {
            const void *addr[WARP];
            for (int lane = 0; lane < WARP; lane++) {
                const int vrow = kb * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                addr[lane] = v_s + vrow * LDS + dt * 8 + (lane >> 4) * 8;
            }
            uint32_t vb[WARP][4], b0[WARP][2], b1[WARP][2];
            mlk_host_ldmatrix(4, 1, addr, vb);
            for (int lane = 0; lane < WARP; lane++) {
                b0[lane][0] = vb[lane][0];
                b0[lane][1] = vb[lane][1];
                b1[lane][0] = vb[lane][2];
                b1[lane][1] = vb[lane][3];
            }
            mlk_host_mma_m16n8k16_bf16(pa, b0, o[dt], o[dt]);
            mlk_host_mma_m16n8k16_bf16(pa, b1, o[dt + 1], o[dt + 1]);
        }
    }

    int s_bad = 0, o_bad = 0;
    for (int i = 0; i < M; i++) {
        double s_ref[KEYS];
        for (int key = 0; key < KEYS; key++) {
            s_ref[key] = 0;
            for (int d = 0; d < HD; d++)
                s_ref[key] += q(i, d) * kk(key, d);
            const Slot s = slot_c(i, key % 8);
            s_bad += sc[key / 8][s.lane][s.reg] != s_ref[key];
        }
        for (int d = 0; d < HD; d++) {
            double ref = 0;
            for (int key = 0; key < KEYS; key++)
                ref += s_ref[key] * v(key, d);
            const Slot s = slot_c(i, d % 8);
            o_bad += o[d / 8][s.lane][s.reg] != ref;
        }
    }
    check(s_bad == 0, "composed: %d of %d elements of S = Q·Kᵀ wrong", s_bad, M * KEYS);
    check(o_bad == 0, "composed: %d of %d elements of O = S·V wrong", o_bad, M * HD);
}

} // namespace

int main(void)
{
    test_mma_random();
    test_ldmatrix();
    test_composed();
    return check_done();
}
