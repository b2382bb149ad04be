/* Which instruction set the CPU backend's kernels use.
 *
 * The kernels exist in three builds (kernels_plain.c, kernels_avx2.c,
 * kernels_avx512.c); only the last two are compiled with wider instruction
 * flags, and they run only after this module has checked that both the CPU
 * and the OS (saved vector state) support them. */
#ifndef ML_CPU_FEATURES_H
#define ML_CPU_FEATURES_H

#include <stddef.h>

#include "status.h"

#if defined(__x86_64__) || defined(_M_X64)
#define ML_CPU_X86 1
#else
#define ML_CPU_X86 0
#endif

/* Ordered: a higher value needs everything a lower one needs. */
typedef enum ml_cpu_isa {
    ML_CPU_ISA_PLAIN,  /* portable C: the readable reference */
    ML_CPU_ISA_AVX2,   /* AVX2 + FMA */
    ML_CPU_ISA_AVX512, /* AVX-512 F, BW, VL, DQ */
} ml_cpu_isa;

/* The widest ISA that this CPU and OS support. Never fails. */
ml_cpu_isa ml_cpu_isa_detect(void);

/* Nonzero when this CPU and OS run AVX-512 BF16 (VDPBF16PS: f32 += the
 * dot of two bf16 pairs), which the opt-in bf16-activation matmul needs
 * (ml_backend_cpu_bf16_activations). */
int ml_cpu_has_avx512_bf16(void);

/* Nonzero when this CPU and OS run AVX512_VBMI (byte permutes across a
 * vector), which the FP8 Linears' bf16-activation kernel needs
 * (gemm_tile_f8_pairs, cpu_kernels.h). */
int ml_cpu_has_avx512_vbmi(void);

/* Nonzero when this CPU runs AMX-BF16 (TDPBF16PS on tiles) and the OS lets
 * this process use the tile state: on Linux the process must ask for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM), which the first call does for every
 * thread of the process; later calls return the first's answer. The
 * bf16-activation matmul's AMX kernel needs it (gemm_tile_amx). */
int ml_cpu_has_amx_bf16(void);

/* "plain", "avx2" or "avx512". Never NULL. */
const char *ml_cpu_isa_name(ml_cpu_isa isa);

/* The ISA a new backend uses: the one named by the environment variable
 * ML_CPU_ISA when it is set (to compare paths or force a lower one), else
 * ml_cpu_isa_detect(). Returns ML_ERR_INVALID_ARG for an unknown name and
 * ML_ERR_UNSUPPORTED for an ISA this machine lacks; *out is then unchanged. */
ml_status ml_cpu_isa_select(ml_cpu_isa *out, char *err, size_t errlen);

/* Whether the bf16-activation matmul of a new backend runs on AMX: as
 * ML_CPU_AMX says when it is set ("0": no, to compare paths or pin the
 * vector kernel's bits; "1": yes), else ml_cpu_has_amx_bf16(). Returns
 * ML_ERR_INVALID_ARG for another value and ML_ERR_UNSUPPORTED for "1" on a
 * machine without AMX; *out is then unchanged. */
ml_status ml_cpu_amx_select(int *out, char *err, size_t errlen);

#endif
