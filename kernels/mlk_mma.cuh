/* The tensor-core instructions of attn_mma.cu as device functions over this
 * lane's fragments: the PTX in the CUDA build; in the HOST build the warp's
 * fragments are exchanged (a warp barrier, as the .sync.aligned
 * instructions are) and the instruction is computed by kernels/host/host_mma.h
 * with the PTX ISA's fragment layouts. Both need all 32 lanes of the warp. */
#ifndef MLK_MMA_CUH
#define MLK_MMA_CUH

#include <cstdint>

#include "mlk_internal.cuh"

#ifdef MLK_HOST
#include "host_mma.h"

/* The .sync.aligned instructions need every lane of the warp. */
static inline unsigned mlk_host_whole_warp()
{
    if (__activemask() != 0xffffffffu) {
        fprintf(stderr, "mlk host: a .sync.aligned mma instruction without the whole warp\n");
        abort();
    }
    return 0xffffffffu;
}
#endif

/* d (16x8 f32) += a (16x16 bf16, row) · b (16x8 bf16, col):
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with d as C and D. */
__device__ __forceinline__ void mlk_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                      uint32_t b0, uint32_t b1)
{
#ifdef MLK_HOST
    /* In: this lane's A, B and C fragments; out: its D fragment in c. */
    struct lane_frags {
        uint32_t a[4], b[2];
        float c[4];
    };
    const lane_frags mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
    const lane_frags out = mlk_host_warp_compute(
        mlk_host_whole_warp(), mine, [](lane_frags *all) {
            uint32_t wa[MLK_HOST_WARP][4], wb[MLK_HOST_WARP][2];
            float wc[MLK_HOST_WARP][4], wd[MLK_HOST_WARP][4];
            for (int l = 0; l < MLK_HOST_WARP; l++) {
                memcpy(wa[l], all[l].a, sizeof wa[l]);
                memcpy(wb[l], all[l].b, sizeof wb[l]);
                memcpy(wc[l], all[l].c, sizeof wc[l]);
            }
            mlk_host_mma_m16n8k16_bf16(wa, wb, wc, wd);
            for (int l = 0; l < MLK_HOST_WARP; l++)
                memcpy(all[l].c, wd[l], sizeof wd[l]);
        });
    memcpy(d, out.c, sizeof d);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Four 8x8 bf16 matrices from shared memory, transposed
 * (ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16): lanes 8i .. 8i+7 give
 * the row addresses of matrix i, and r[i] receives this lane's fragment of it. */
__device__ __forceinline__ void mlk_ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16 *row)
{
#ifdef MLK_HOST
    /* In: this lane's row address; out: its four registers. */
    union lane_regs {
        const void *row;
        uint32_t r[4];
    };
    lane_regs mine;
    memset(&mine, 0, sizeof mine);
    mine.row = row;
    const lane_regs out = mlk_host_warp_compute(
        mlk_host_whole_warp(), mine, [](lane_regs *all) {
            const void *rows[MLK_HOST_WARP];
            uint32_t regs[MLK_HOST_WARP][4];
            for (int l = 0; l < MLK_HOST_WARP; l++)
                rows[l] = all[l].row;
            mlk_host_ldmatrix(4, 1, rows, regs);
            for (int l = 0; l < MLK_HOST_WARP; l++)
                memcpy(all[l].r, regs[l], sizeof regs[l]);
        });
    memcpy(r, out.r, sizeof r);
#else
    const unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

#endif
